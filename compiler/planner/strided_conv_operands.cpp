// Conv operands written once in channels-last order (strided_conv_operands.h).
#include "compiler/planner/strided_conv_operands.h"

#include <fmt/format.h>

namespace kiln::ir::planner {
namespace {

// The element strides operand `t` has in memory, read through its chain of
// transposes from a tensor that is not a view; nullopt where another view
// (a reshape, slice or expand) stands in the chain.
std::optional<Strides> strides_through_transposes(const Graph& g, TensorId t) {
  const Tensor& tensor = g.tensor(t);
  if (tensor.kind != TensorKind::OpResult) return tensor.strides;
  const Op& op = g.ops[static_cast<size_t>(tensor.producer)];
  if (op_info(op.kind).family != OpFamily::View) return contiguous_strides(tensor.shape);
  if (op.kind != OpKind::Transpose) return std::nullopt;
  const std::optional<Strides> from = strides_through_transposes(g, op.inputs[0]);
  if (!from) return std::nullopt;
  Strides out(op.attrs.perm.size());
  for (size_t d = 0; d < out.size(); ++d) out[d] = (*from)[static_cast<size_t>(op.attrs.perm[d])];
  return out;
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

// A matmul operand that is a reshape to rows of a transpose (a pointwise
// conv's pixel rows read through an NCHW network's NHWC transpose): the
// transpose's result, where it does not lie as rows in memory.
std::optional<TensorId> transposed_rows(const Graph& g, TensorId operand) {
  const Tensor& t = g.tensor(operand);
  if (t.kind != TensorKind::OpResult || g.ops[static_cast<size_t>(t.producer)].kind != OpKind::Reshape) return std::nullopt;
  const TensorId source = g.ops[static_cast<size_t>(t.producer)].inputs[0];
  const Tensor& s = g.tensor(source);
  if (s.kind != TensorKind::OpResult || g.ops[static_cast<size_t>(s.producer)].kind != OpKind::Transpose ||
      s.shape.size() < 3 || s.shape.back() != t.shape.back())
    return std::nullopt;
  const std::optional<Strides> strides = strides_through_transposes(g, source);
  if (!strides || rows_in_memory(s.shape, *strides)) return std::nullopt;
  return source;
}

// An attention mask read through reshapes of a transpose that leaves its
// key axis strided in memory (T5's position bias, an embedding's [q, k,
// heads] read as [heads, q, k]): the transpose's result.
std::optional<TensorId> transposed_mask(const Graph& g, TensorId mask) {
  TensorId t = mask;
  while (g.tensor(t).kind == TensorKind::OpResult && g.ops[static_cast<size_t>(g.tensor(t).producer)].kind == OpKind::Reshape)
    t = g.ops[static_cast<size_t>(g.tensor(t).producer)].inputs[0];
  const Tensor& s = g.tensor(t);
  if (s.kind != TensorKind::OpResult || g.ops[static_cast<size_t>(s.producer)].kind != OpKind::Transpose ||
      s.shape.empty() || s.shape.back() != g.tensor(mask).shape.back() || s.shape.back() == 1)
    return std::nullopt;
  const std::optional<Strides> strides = strides_through_transposes(g, t);
  if (!strides || strides->back() == 1) return std::nullopt;
  return t;
}

// The matmul whose result reaches `t` through views and constant scales
// (attention scores written out: q·kᵀ reshaped, times a scale), if any.
const Op* matmul_behind(const Graph& g, TensorId t) {
  while (g.tensor(t).kind == TensorKind::OpResult) {
    const Op& op = g.ops[static_cast<size_t>(g.tensor(t).producer)];
    if (op.kind == OpKind::Matmul) return &op;
    const bool scale = (op.kind == OpKind::Mul || op.kind == OpKind::Div) && op.inputs.size() == 2 &&
                       g.tensor(op.inputs[1]).kind == TensorKind::Constant;
    if (op_info(op.kind).family != OpFamily::View && !scale) return nullptr;
    t = op.inputs[0];
  }
  return nullptr;
}

}  // namespace

std::map<TensorId, std::string> strided_conv_operands(const Graph& g) {
  std::map<TensorId, std::string> out;
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::Add && op.inputs.size() == 2) {  // a bias on written-out attention scores, the same
      for (size_t slot = 0; slot < 2; ++slot) {
        const Op* scores = matmul_behind(g, op.inputs[1 - slot]);
        const std::optional<TensorId> t = scores ? transposed_mask(g, op.inputs[slot]) : std::nullopt;
        if (t)
          out.emplace(*t, fmt::format("'{}' is written once by a copy: it is added to the products of matmul '{}' "
                                      "through a transpose that leaves its last axis {} elements apart, and the "
                                      "matmul's epilogue would load each element alone",
                                      g.tensor(*t).name, g.result(*scores).name, strides_through_transposes(g, *t)->back()));
      }
      continue;
    }
    if (op.kind == OpKind::Sdpa && op.inputs.size() > 3) {
      if (const std::optional<TensorId> t = transposed_mask(g, op.inputs[3]))
        out.emplace(*t, fmt::format("'{}' is written once by a copy: attention '{}' reads it as its mask through a "
                                    "transpose that leaves the key axis {} elements apart, and would load each score's "
                                    "element alone",
                                    g.tensor(*t).name, g.result(op).name, strides_through_transposes(g, *t)->back()));
      continue;
    }
    if (op.kind == OpKind::Matmul) {
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
      if (operand.kind != TensorKind::OpResult || g.ops[static_cast<size_t>(operand.producer)].kind != OpKind::Transpose)
        continue;
      const std::optional<Strides> strides = strides_through_transposes(g, t);
      if (!strides || operand.shape[3] == 1 || (*strides)[3] == 1) continue;
      out.emplace(t, fmt::format("'{}' is written once in channels-last order by a copy: read through its transpose, "
                                 "its channels lie {} elements apart and conv '{}' would load it element by element",
                                 operand.name, (*strides)[3], g.result(op).name));
    }
  }
  return out;
}

}  // namespace kiln::ir::planner
