// Strided operands written once by a copy kernel (strided_operands.h).
#include "compiler/planner/strided_operands.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "compiler/strides.h"

namespace kiln::ir::planner {
namespace {

// Strides of `op`'s result (a reshape, slice, expand or transpose) from
// its input's; nullopt where a reshape would need a copy.
std::optional<Strides> view_strides(const Graph& g, const Op& op, const Strides& from) {
  const Shape &in = g.operand(op, 0).shape, &out_shape = g.result(op).shape;
  if (op.kind == OpKind::Reshape) return reshaped_strides(in, from, out_shape);
  if (op.kind == OpKind::Expand) {  // new leading dims and size-1 ones repeat: stride 0
    const size_t lead = out_shape.size() - in.size();
    Strides out(out_shape.size(), 0);
    for (size_t d = 0; d < in.size(); ++d) out[lead + d] = in[d] == 1 && out_shape[lead + d] != 1 ? 0 : from[d];
    return out;
  }
  Strides out = from;
  if (op.kind == OpKind::Slice) {
    out[static_cast<size_t>(op.attrs.axis)] *= op.attrs.step;
    return out;
  }
  for (size_t d = 0; d < out.size(); ++d) out[d] = from[static_cast<size_t>(op.attrs.perm[d])];
  return out;
}

// The element strides `t` has in memory, read through views from a tensor
// that is not one: transposes alone where `transposes_only`, else
// transposes, reshapes, slices and expands; nullopt where another view
// stands in the chain or a reshape would need a copy.
std::optional<Strides> strides_through_views(const Graph& g, TensorId t, bool transposes_only = false) {
  const Tensor& tensor = g.tensor(t);
  if (tensor.kind != TensorKind::OpResult) return tensor.strides;
  const Op& op = g.ops[static_cast<size_t>(tensor.producer)];
  if (op_info(op.kind).family != OpFamily::View) return contiguous_strides(tensor.shape);
  const bool followed = op.kind == OpKind::Transpose || (!transposes_only && (op.kind == OpKind::Reshape || op.kind == OpKind::Slice ||
                                                                              op.kind == OpKind::Expand));
  if (!followed) return std::nullopt;
  const std::optional<Strides> from = strides_through_views(g, op.inputs[0], transposes_only);
  return from ? view_strides(g, op, *from) : std::nullopt;
}

// Whether `strides` (of `shape`) lay the tensor out as rows: every
// dimension but the last merges into one row index of a uniform stride, and
// the last is stride 1 (or one element).
bool rows_in_memory(const Shape& shape, const Strides& strides) {
  const size_t rank = shape.size();
  if (rank == 0 || (shape[rank - 1] > 1 && strides[rank - 1] != 1)) return false;
  for (size_t d = 0; d + 2 < rank; ++d)
    if (shape[d] > 1 && strides[d] != strides[d + 1] * shape[d + 1]) return false;
  return true;
}

// The op that makes `t`, or nullptr for a graph input or constant.
const Op* producer_of(const Graph& g, TensorId t) {
  const Tensor& tensor = g.tensor(t);
  return tensor.kind == TensorKind::OpResult ? &g.ops[static_cast<size_t>(tensor.producer)] : nullptr;
}

// The transpose `t` is read through: t itself or, back through at most
// `reshapes` reshapes, a transpose's result whose last dimension is t's.
std::optional<TensorId> transpose_behind(const Graph& g, TensorId t, int reshapes) {
  TensorId at = t;
  for (const Op* op = producer_of(g, at); op && op->kind == OpKind::Reshape && reshapes-- > 0; op = producer_of(g, at))
    at = op->inputs[0];
  const Op* op = producer_of(g, at);
  const Shape &shape = g.tensor(at).shape, &read = g.tensor(t).shape;
  if (!op || op->kind != OpKind::Transpose || shape.empty() || read.empty() || shape.back() != read.back())
    return std::nullopt;
  return at;
}

// A matmul operand that is a reshape to rows of a transpose (a pointwise
// conv's pixel rows read through an NCHW network's NHWC transpose): the
// transpose's result, where it does not lie as rows in memory.
std::optional<TensorId> transposed_rows(const Graph& g, TensorId operand) {
  const Op* reshape = producer_of(g, operand);
  if (!reshape || reshape->kind != OpKind::Reshape) return std::nullopt;
  const std::optional<TensorId> source = transpose_behind(g, operand, 1);
  if (!source || g.tensor(*source).shape.size() < 3) return std::nullopt;
  const std::optional<Strides> strides = strides_through_views(g, *source, /*transposes_only=*/true);
  if (!strides || rows_in_memory(g.tensor(*source).shape, *strides)) return std::nullopt;
  return source;
}

// A mask or bias read through reshapes of a transpose that leaves its last
// axis strided in memory (T5's position bias, an embedding's [q, k, heads]
// read as [heads, q, k]): the transpose's result, and that axis's stride.
struct StridedTranspose {
  TensorId tensor;
  int64_t last_stride;
};
std::optional<StridedTranspose> transposed_mask(const Graph& g, TensorId mask) {
  const std::optional<TensorId> t = transpose_behind(g, mask, std::numeric_limits<int>::max());
  if (!t || g.tensor(*t).shape.back() == 1) return std::nullopt;
  const std::optional<Strides> strides = strides_through_views(g, *t, /*transposes_only=*/true);
  if (!strides || strides->back() == 1) return std::nullopt;
  return StridedTranspose{*t, strides->back()};
}

// The matmul whose result reaches `t` through views and constant scales
// (attention scores written out: q·kᵀ reshaped, times a scale), if any.
const Op* matmul_behind(const Graph& g, TensorId t) {
  for (const Op* op = producer_of(g, t); op; op = producer_of(g, op->inputs[0])) {
    if (op->kind == OpKind::Matmul) return op;
    const bool scale = (op->kind == OpKind::Mul || op->kind == OpKind::Div) && op->inputs.size() == 2 &&
                       g.tensor(op->inputs[1]).kind == TensorKind::Constant;
    if (op_info(op->kind).family != OpFamily::View && !scale) return nullptr;
  }
  return nullptr;
}

// Whether cuBLASLt reads a matrix operand of `shape` laid out with
// `strides` in place: one of its two inner dims stride 1 (the other at
// least as far apart as that dim is long), its batch dims one stride apart.
bool one_strided_matrix(const Shape& shape, const Strides& strides) {
  const size_t rank = shape.size();
  return rank >= 2 && blas_matrix(shape[rank - 2], shape[rank - 1], strides[rank - 2], strides[rank - 1]) &&
         one_stride(Shape(shape.begin(), shape.end() - 2), Strides(strides.begin(), strides.end() - 2));
}

// The strides a chain of views (innermost first) gives a tensor of `shape`
// laid out with `strides`; nullopt where a reshape would need a copy.
std::optional<Strides> through(const Graph& g, const std::vector<const Op*>& views, std::optional<Strides> strides) {
  for (const Op* op : views)
    if (strides) strides = view_strides(g, *op, *strides);
  return strides;
}

// A matmul operand read through reshapes, slices and expands of a
// transpose that cuBLASLt cannot read in place (a reshape needs a copy, or
// the result is no matrix of one batch stride) but could were the
// transpose written out: the transpose's result (q, k and v sliced from one
// transposed projection share its copy).
std::optional<TensorId> not_one_strided(const Graph& g, TensorId operand) {
  std::vector<const Op*> views;  // innermost last, reversed below
  TensorId at = operand;
  for (const Op* op = producer_of(g, at);
       op && (op->kind == OpKind::Reshape || op->kind == OpKind::Slice || op->kind == OpKind::Expand); op = producer_of(g, at)) {
    views.push_back(op);
    at = op->inputs[0];
  }
  std::reverse(views.begin(), views.end());
  const Op* transpose = producer_of(g, at);
  if (!transpose || transpose->kind != OpKind::Transpose) return std::nullopt;
  const Shape& shape = g.tensor(operand).shape;
  const std::optional<Strides> in_place = through(g, views, strides_through_views(g, at));
  if (in_place && one_strided_matrix(shape, *in_place)) return std::nullopt;
  const std::optional<Strides> copied = through(g, views, contiguous_strides(g.tensor(at).shape));
  if (!copied || !one_strided_matrix(shape, *copied)) return std::nullopt;  // (a copy would not help: a broadcast)
  return at;
}

}  // namespace

bool cublaslt_f32_matmul(const Graph& g, const Op& op) {
  return op.kind == OpKind::Matmul && g.operand(op, 0).value_dtype() == DType::f32 &&
         g.operand(op, 1).value_dtype() == DType::f32 && op.attrs.precision != Precision::bf16 &&
         op.attrs.precision != Precision::f16;
}

std::map<TensorId, std::string> strided_operands(const Graph& g, bool cublaslt_f32_matmuls) {
  std::map<TensorId, std::string> out;
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::Add && op.inputs.size() == 2) {  // a bias on written-out attention scores
      for (size_t slot = 0; slot < 2; ++slot) {
        const Op* scores = matmul_behind(g, op.inputs[1 - slot]);
        if (const std::optional<StridedTranspose> t = scores ? transposed_mask(g, op.inputs[slot]) : std::nullopt)
          out.emplace(t->tensor, fmt::format("'{}' is written once by a copy: it is added to the products of matmul '{}' "
                                             "through a transpose that leaves its last axis {} elements apart, and the "
                                             "matmul's epilogue would load each element alone",
                                             g.tensor(t->tensor).name, g.result(*scores).name, t->last_stride));
      }
      continue;
    }
    if (op.kind == OpKind::Sdpa && op.inputs.size() > 3) {
      if (const std::optional<StridedTranspose> t = transposed_mask(g, op.inputs[3]))
        out.emplace(t->tensor, fmt::format("'{}' is written once by a copy: attention '{}' reads it as its mask through a "
                                           "transpose that leaves the key axis {} elements apart, and would load each "
                                           "score's element alone",
                                           g.tensor(t->tensor).name, g.result(op).name, t->last_stride));
      continue;
    }
    if (op.kind == OpKind::Matmul) {
      for (size_t slot = 0; cublaslt_f32_matmuls && cublaslt_f32_matmul(g, op) && slot < 2; ++slot)
        if (const std::optional<TensorId> t = not_one_strided(g, op.inputs[slot]))
          out.emplace(*t, fmt::format("'{}' is written once by a copy: cuBLASLt computes matmul '{}', which reads a "
                                      "matrix of one batch stride in place, and this transpose leaves none",
                                      g.tensor(*t).name, g.result(op).name));
      for (size_t slot = 0; slot < 2; ++slot)
        if (const std::optional<TensorId> t = transposed_rows(g, op.inputs[slot]))
          out.emplace(*t, fmt::format("'{}' is written once in rows by a copy: matmul '{}' reads it as rows "
                                      "of a transpose that spreads them apart, and would load it element by element",
                                      g.tensor(*t).name, g.result(op).name));
      continue;
    }
    if (op.kind != OpKind::Conv2d || op.attrs.layout != Layout::NHWC) continue;
    for (size_t slot = 0; slot < 2; ++slot) {
      const TensorId t = op.inputs[slot];
      const Tensor& operand = g.tensor(t);
      if (!transpose_behind(g, t, 0)) continue;
      const std::optional<Strides> strides = strides_through_views(g, t, /*transposes_only=*/true);
      if (!strides || operand.shape[3] == 1 || (*strides)[3] == 1) continue;
      out.emplace(t, fmt::format("'{}' is written once in channels-last order by a copy: read through its transpose, "
                                 "its channels lie {} elements apart and conv '{}' would load it element by element",
                                 operand.name, (*strides)[3], g.result(op).name));
    }
  }
  return out;
}

}  // namespace kiln::ir::planner
