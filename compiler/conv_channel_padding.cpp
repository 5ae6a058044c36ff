// Channel padding of thin convolutions (conv_channel_padding.h): one pass
// over the ops in order, the padding's ops emitted just before their conv.
#include "compiler/conv_channel_padding.h"

#include <map>
#include <set>

#include <fmt/format.h>

#include "compiler/error.h"
#include "compiler/graph_rewrite.h"
#include "compiler/zero_padding.h"

namespace kiln::ir {
namespace {

constexpr int64_t kChannelMultiple = 8;  // 16 bytes of a 16-bit type

bool qualifies(const Graph& g, const Op& op) {
  if (op.kind != OpKind::Conv2d || op.attrs.layout != Layout::NHWC || op.attrs.groups != 1) return false;
  const Tensor& x = g.operand(op, 0);
  const Tensor& w = g.operand(op, 1);
  const bool sixteen_bit = (x.dtype == DType::bf16 || x.dtype == DType::f16) && w.dtype == x.dtype;
  return sixteen_bit && x.rounded && w.rounded && x.shape[3] % kChannelMultiple != 0;
}

class Padder {
 public:
  Padder(const Graph& g, const RowMatches& m) : g_(g), out_(g) {
    for (const RewriteSite& s : m.sites) convs_.insert(s.op);
  }

  Graph run() {
    for (size_t i = 0; i < g_.ops.size(); ++i) {
      Op copy = g_.ops[i];
      if (convs_.count(static_cast<int32_t>(i))) {
        copy.inputs[0] = padded_channels(copy.inputs[0]);
        copy.inputs[1] = padded_channels(copy.inputs[1]);
      }
      out_.emit(std::move(copy));
    }
    return out_.take();
  }

 private:
  // concat(t, expand(0)) along the last (channel) axis; once per tensor.
  TensorId padded_channels(TensorId t) {
    if (auto it = padded_.find(t); it != padded_.end()) return it->second;
    const Shape shape = out_.tensor(t).shape;
    const int64_t to = (shape.back() + kChannelMultiple - 1) / kChannelMultiple * kChannelMultiple;
    const TensorId padded = zero_padded(out_, t, shape.size() - 1, to, "zero_channels", fmt::format("channels{}", to));
    padded_.emplace(t, padded);
    return padded;
  }

  const Graph& g_;
  GraphRewrite out_;
  std::map<TensorId, TensorId> padded_;
  std::set<int32_t> convs_;
};

}  // namespace

RowMatches find_thin_convs(const Graph& g) {
  RowMatches m;
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (qualifies(g, g.ops[i])) {
      const int64_t c = g.operand(g.ops[i], 0).shape[3];
      m.sites.push_back({static_cast<int32_t>(i),
                         fmt::format("{}: input and weights read with {} channels padded to {}",
                                     op_named(g, static_cast<int32_t>(i)), c,
                                     (c + kChannelMultiple - 1) / kChannelMultiple * kChannelMultiple),
                         {}});
    }
  return m;
}

Graph pad_conv_channels(const Graph& g, const RowMatches& m) { return Padder(g, m).run(); }

}  // namespace kiln::ir
