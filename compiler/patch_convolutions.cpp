// Patch convolutions as matmuls (patch_convolutions.h): one pass over the
// ops in order, each site's conv replaced by its views and matmul.
#include "compiler/patch_convolutions.h"

#include <set>

#include <fmt/format.h>

#include "compiler/graph_rewrite.h"

namespace kiln::ir {
namespace {

constexpr int64_t kRunMultiple = 8;  // 16 bytes of a 16-bit type

// Whether `t` reaches a pooling op through pointwise ops, batch norms and
// views alone: the conv kernel pools 2 x 2 windows in its epilogue, which a
// matmul's does not, so such a pointwise conv stays a conv.
bool feeds_a_pool(const Graph& g, TensorId t, int depth = 0) {
  if (depth > 8) return false;
  for (int32_t u : g.users[static_cast<size_t>(t)]) {
    const Op& op = g.ops[static_cast<size_t>(u)];
    const OpFamily family = op_info(op.kind).family;
    if (family == OpFamily::Pool) return true;
    if ((is_pointwise(family) || family == OpFamily::View || op.kind == OpKind::BatchNorm) &&
        feeds_a_pool(g, op.output, depth + 1))
      return true;
  }
  return false;
}

bool qualifies(const Graph& g, const Op& op) {
  if (op.kind != OpKind::Conv2d || op.attrs.groups != 1) return false;
  const Tensor& x = g.operand(op, 0);
  const Tensor& w = g.operand(op, 1);
  if (!(x.dtype == DType::bf16 || x.dtype == DType::f16) || w.dtype != x.dtype || !x.rounded || !w.rounded) return false;
  const bool nchw = op.attrs.layout == Layout::NCHW;
  // Filter [K, C, R, S] (NCHW) or [K, R, S, C] (NHWC); input height and width.
  const int64_t r = nchw ? w.shape[2] : w.shape[1], s = nchw ? w.shape[3] : w.shape[2];
  const int64_t c = nchw ? x.shape[1] : x.shape[3];
  const int64_t h = nchw ? x.shape[2] : x.shape[1], wd = nchw ? x.shape[3] : x.shape[2];
  if (op.attrs.stride[0] != r || op.attrs.stride[1] != s || op.attrs.padding[0] != 0 ||
      op.attrs.padding[1] != 0 || op.attrs.dilation[0] != 1 || op.attrs.dilation[1] != 1 || h % r != 0 || wd % s != 0)
    return false;
  // A pointwise conv: rows of [pixels, C] by [C, K]; except a narrow one (K <= 64) over many pixels,
  // where the conv kernel's tile is the faster (H100, the zoo's convs: 1.36x slower as matmuls), and
  // one whose result is pooled (feeds_a_pool).
  if (r * s == 1)
    return !nchw && c % kRunMultiple == 0 && !(w.shape[0] <= 64 && x.shape[0] * h * wd > 6272) &&
           !feeds_a_pool(g, op.output);
  if (nchw) return s % kRunMultiple == 0;
  return c % kRunMultiple != 0 && (s * c) % kRunMultiple == 0;
}

class Rewriter {
 public:
  Rewriter(const Graph& g, const RowMatches& m) : g_(g), out_(g) {
    for (const RewriteSite& s : m.sites) convs_.insert(s.op);
  }

  Graph run() {
    for (size_t i = 0; i < g_.ops.size(); ++i) {
      if (convs_.count(static_cast<int32_t>(i)))
        as_matmul(g_.ops[i]);
      else
        out_.emit(g_.ops[i]);
    }
    return out_.take();
  }

 private:
  void as_matmul(const Op& conv) {
    const Tensor x = g_.operand(conv, 0), w = g_.operand(conv, 1), y = g_.result(conv);
    const bool nchw = conv.attrs.layout == Layout::NCHW;
    const int64_t n = x.shape[0], k = w.shape[0];
    const int64_t r = nchw ? w.shape[2] : w.shape[1], s = nchw ? w.shape[3] : w.shape[2];
    const int64_t c = nchw ? x.shape[1] : x.shape[3];
    const int64_t hp = (nchw ? x.shape[2] : x.shape[1]) / r, wp = (nchw ? x.shape[3] : x.shape[2]) / s;
    const std::string& name = y.name;
    // A: [N*Hp*Wp, patch] with the patch's elements in the filter's order (a pointwise conv's
    // pixels are its rows as they lie).
    TensorId a;
    if (r * s == 1) {
      a = reshape(conv.inputs[0], {n * hp * wp, c}, name + ".pixel_rows");
    } else {
      const TensorId windows = reshape(conv.inputs[0], nchw ? Shape{n, c, hp, r, wp, s} : Shape{n, hp, r, wp, s, c},
                                       name + ".windows");
      const TensorId patches = transpose(windows, nchw ? std::vector<int64_t>{0, 2, 4, 1, 3, 5}
                                                      : std::vector<int64_t>{0, 1, 3, 2, 4, 5},
                                         name + ".patches");
      a = reshape(patches, {n * hp * wp, c * r * s}, name + ".patch_rows");
    }
    // B: the filter's rows, transposed.
    const TensorId b = transpose(reshape(conv.inputs[1], {k, c * r * s}, name + ".filter_rows"), {1, 0}, name + ".filter_columns");
    Tensor product = y;
    product.name = name + ".matmul";
    product.shape = {n * hp * wp, k};
    product.strides = contiguous_strides(product.shape);
    product.is_output = false;
    const TensorId mm = out_.add(std::move(product));
    Op matmul{OpKind::Matmul, {a, b}, mm, {}, false};
    matmul.attrs.precision = conv.attrs.precision;
    out_.emit(std::move(matmul));
    if (!nchw) {
      emit_view(OpKind::Reshape, mm, conv.output, {n, hp, wp, k}, {});
      return;
    }
    const TensorId pixels = reshape(mm, {n, hp, wp, k}, name + ".pixels");
    emit_view(OpKind::Transpose, pixels, conv.output, {}, {0, 3, 1, 2});
  }

  // A view's result: `source`'s type and rounding in a new shape.
  TensorId view_result(TensorId source, const Shape& shape, const std::string& name) {
    Tensor t = out_.tensor(source);
    t.kind = TensorKind::OpResult;
    t.name = name;
    t.shape = shape;
    t.strides = contiguous_strides(shape);
    t.is_output = false;
    return out_.add(std::move(t));
  }
  void emit_view(OpKind kind, TensorId source, TensorId result, const Shape& shape, const std::vector<int64_t>& perm) {
    Op op{kind, {source}, result, {}, false};
    op.attrs.shape = shape;
    op.attrs.perm = perm;
    out_.emit(std::move(op));
  }
  TensorId reshape(TensorId source, const Shape& shape, const std::string& name) {
    const TensorId result = view_result(source, shape, name);
    emit_view(OpKind::Reshape, source, result, shape, {});
    return result;
  }
  TensorId transpose(TensorId source, const std::vector<int64_t>& perm, const std::string& name) {
    const Shape& from = out_.tensor(source).shape;
    Shape shape;
    for (int64_t d : perm) shape.push_back(from[static_cast<size_t>(d)]);
    const TensorId result = view_result(source, shape, name);
    emit_view(OpKind::Transpose, source, result, {}, perm);
    return result;
  }

  const Graph& g_;
  GraphRewrite out_;
  std::set<int32_t> convs_;
};

}  // namespace

RowMatches find_patch_convs(const Graph& g) {
  RowMatches m;
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (qualifies(g, g.ops[i])) {
      const Shape& w = g.operand(g.ops[i], 1).shape;
      const bool nchw = g.ops[i].attrs.layout == Layout::NCHW;
      m.sites.push_back({static_cast<int32_t>(i),
                         fmt::format("{} -> matmul of its {}x{} patches", op_named(g, static_cast<int32_t>(i)),
                                     nchw ? w[2] : w[1], nchw ? w[3] : w[2]),
                         {}});
    }
  return m;
}

Graph patch_convs_as_matmuls(const Graph& g, const RowMatches& m) { return Rewriter(g, m).run(); }

}  // namespace kiln::ir
