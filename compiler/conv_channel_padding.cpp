// Channel padding of thin convolutions (conv_channel_padding.h): one pass
// over the ops in order, the padding's ops emitted just before their conv.
#include "compiler/conv_channel_padding.h"

#include <map>
#include <optional>

#include <fmt/format.h>

#include "compiler/error.h"
#include "compiler/graph_rewrite.h"

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
  explicit Padder(const Graph& g) : g_(g), out_(g) {}

  std::optional<Graph> run() {
    bool padded = false;
    for (const Op& op : g_.ops) {
      Op copy = op;
      if (qualifies(g_, op)) {
        copy.inputs[0] = padded_channels(op.inputs[0]);
        copy.inputs[1] = padded_channels(op.inputs[1]);
        padded = true;
      }
      out_.emit(std::move(copy));
    }
    if (!padded) return std::nullopt;
    return out_.take();
  }

 private:
  // concat(t, expand(0)) along the last (channel) axis; once per tensor.
  TensorId padded_channels(TensorId t) {
    if (auto it = padded_.find(t); it != padded_.end()) return it->second;
    const Tensor source = out_.tensor(t);
    const int64_t channels = source.shape.back();
    Shape zeros_shape = source.shape;
    zeros_shape.back() = (channels + kChannelMultiple - 1) / kChannelMultiple * kChannelMultiple - channels;
    Shape padded_shape = source.shape;
    padded_shape.back() += zeros_shape.back();

    Tensor zero;
    zero.kind = TensorKind::Constant;
    zero.rounded = true;
    const TensorId zero_id = out_.add(zero);
    auto result = [&](const std::string& suffix, const Shape& shape, DType dtype, bool rounded) {
      Tensor r;
      r.kind = TensorKind::OpResult;
      r.name = fmt::format("{}.{}", source.name, suffix);
      r.shape = shape;
      r.strides = contiguous_strides(shape);
      r.dtype = dtype;
      r.rounded = rounded;
      return out_.add(std::move(r));
    };
    // (A zero is exact in every type: the expanded constant is of the operand's.)
    Op expand{OpKind::Expand, {zero_id}, result("zero_channels", zeros_shape, source.dtype, true), {}, false};
    expand.attrs.shape = zeros_shape;
    const TensorId zeros = expand.output;
    out_.emit(std::move(expand));
    Op concat{OpKind::Concat, {t, zeros}, result(fmt::format("channels{}", padded_shape.back()), padded_shape, source.dtype, true),
              {}, false};
    concat.attrs.axis = static_cast<int64_t>(padded_shape.size()) - 1;
    const TensorId padded = concat.output;
    out_.emit(std::move(concat));
    padded_.emplace(t, padded);
    return padded;
  }

  const Graph& g_;
  GraphRewrite out_;
  std::map<TensorId, TensorId> padded_;
};

}  // namespace

std::shared_ptr<const Graph> pad_conv_channels(const std::shared_ptr<const Graph>& graph) {
  std::optional<Graph> padded = Padder(*graph).run();
  if (!padded) return graph;
  return std::make_shared<const Graph>(std::move(*padded));
}

}  // namespace kiln::ir
