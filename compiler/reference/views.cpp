// The reference for views and concatenation: each result element read from
// where it lives in its input (no arithmetic).
#include <fmt/format.h>

#include "compiler/error.h"
#include "compiler/op_table.h"
#include "compiler/reference/evaluate.h"

namespace kiln::reference {

std::vector<float> eval_view(const ir::Op& op, const Shape& out_shape, const Operands& in) {
  const Strides in_strides = contiguous_strides(in[0]->shape);
  Strides read(out_shape.size());
  int64_t base = 0;
  switch (op.kind) {
    case ir::OpKind::Reshape: return in[0]->data;  // row-major order is unchanged
    case ir::OpKind::Transpose:  // output dimension d reads input dimension perm[d]
      for (size_t d = 0; d < read.size(); ++d) read[d] = in_strides[static_cast<size_t>(op.attrs.perm[d])];
      break;
    case ir::OpKind::Expand: read = broadcast_strides(in[0]->shape, out_shape); break;
    case ir::OpKind::Slice: {
      const size_t axis = static_cast<size_t>(op.attrs.axis);
      read = in_strides;
      base = op.attrs.start * in_strides[axis];
      read[axis] *= op.attrs.step;
      break;
    }
#define KILN_OP(kind, name, family, ...) KILN_CASE_UNLESS(family, View, kind)
#include "compiler/ops.def"
#undef KILN_OP
      KILN_UNREACHABLE(fmt::format("{} is not a view", ir::op_name(op.kind)));
  }
  std::vector<float> out(static_cast<size_t>(element_count(out_shape)));
  for_each_index(out_shape, {read}, [&](int64_t i, const std::vector<int64_t>& at) {
    out[static_cast<size_t>(i)] = in[0]->data[static_cast<size_t>(base + at[0])];
  });
  return out;
}

std::vector<float> eval_concat(const ir::Op& op, const Shape& out_shape, const Operands& in) {
  const size_t axis = static_cast<size_t>(op.attrs.axis);
  // Rows of the result: the dimensions before the axis; each row is the
  // inputs' rows one after another.
  int64_t rows = 1;
  for (size_t d = 0; d < axis; ++d) rows *= out_shape[d];
  std::vector<float> out;
  out.reserve(static_cast<size_t>(element_count(out_shape)));
  for (int64_t r = 0; r < rows; ++r)
    for (const Value* v : in) {
      const int64_t row = static_cast<int64_t>(v->data.size()) / rows;
      out.insert(out.end(), v->data.begin() + r * row, v->data.begin() + (r + 1) * row);
    }
  return out;
}

}  // namespace kiln::reference
