// NCHW convolutions as NHWC ones (nchw_convs_as_nhwc.h): one pass over the
// ops in order, each site's conv replaced by transposes around an NHWC conv.
#include "compiler/nchw_convs_as_nhwc.h"

#include <set>

#include <fmt/format.h>

#include "compiler/graph_rewrite.h"

namespace kiln::ir {
namespace {

const std::vector<int64_t> kNchwAsNhwc = {0, 2, 3, 1};  // [N,C,H,W] -> [N,H,W,C]; [K,C,R,S] -> [K,R,S,C]
const std::vector<int64_t> kNhwcAsNchw = {0, 3, 1, 2};  // [N,P,Q,K] -> [N,K,P,Q]

class Rewriter {
 public:
  Rewriter(const Graph& g, const RowMatches& m) : g_(g), out_(g) {
    for (const RewriteSite& s : m.sites) convs_.insert(s.op);
  }

  Graph run() {
    for (size_t i = 0; i < g_.ops.size(); ++i) {
      if (convs_.count(static_cast<int32_t>(i)))
        as_nhwc(g_.ops[i]);
      else
        out_.emit(g_.ops[i]);
    }
    return out_.take();
  }

 private:
  void as_nhwc(const Op& conv) {
    const std::string& name = g_.result(conv).name;
    Op nhwc = conv;
    nhwc.attrs.layout = Layout::NHWC;
    nhwc.inputs = {transposed(conv.inputs[0], kNchwAsNhwc, name + ".input_nhwc"),
                   transposed(conv.inputs[1], kNchwAsNhwc, name + ".weights_ohwi")};
    const TensorId result = permuted(conv.output, kNchwAsNhwc, name + ".nhwc");  // the conv's own dtype and rounding
    nhwc.output = result;
    out_.emit(std::move(nhwc));
    Op back{OpKind::Transpose, {result}, conv.output, {}, false, nullptr};
    back.attrs.perm = kNhwcAsNchw;
    out_.emit(std::move(back));
  }

  // A new tensor holding `t`'s values in the order `perm` reads them: t's
  // type and rounding, shape permuted, contiguous, not an output.
  TensorId permuted(TensorId t, const std::vector<int64_t>& perm, const std::string& name) {
    Tensor p = out_.tensor(t);
    Shape shape;
    for (int64_t d : perm) shape.push_back(p.shape[static_cast<size_t>(d)]);
    p.kind = TensorKind::OpResult;
    p.name = name;
    p.shape = shape;
    p.strides = contiguous_strides(shape);
    p.is_output = false;
    return out_.add(std::move(p));
  }

  TensorId transposed(TensorId t, const std::vector<int64_t>& perm, const std::string& name) {
    const TensorId result = permuted(t, perm, name);
    Op transpose{OpKind::Transpose, {t}, result, {}, false, nullptr};
    transpose.attrs.perm = perm;
    out_.emit(std::move(transpose));
    return result;
  }

  const Graph& g_;
  GraphRewrite out_;
  std::set<int32_t> convs_;
};

}  // namespace

RowMatches find_nchw_convs(const Graph& g) {
  RowMatches m;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.kind != OpKind::Conv2d || op.attrs.layout != Layout::NCHW) continue;
    m.sites.push_back({static_cast<int32_t>(i),
                       fmt::format("{} -> NHWC conv2d between transposes", op_named(g, static_cast<int32_t>(i))), {}});
  }
  return m;
}

Graph nchw_convs_as_nhwc(const Graph& g, const RowMatches& m) { return Rewriter(g, m).run(); }

}  // namespace kiln::ir
