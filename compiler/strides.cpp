#include "compiler/strides.h"

namespace kiln::ir {

std::optional<Strides> reshaped_strides(const Shape& from, const Strides& strides, const Shape& to) {
  Shape sizes;
  Strides steps;
  for (size_t d = 0; d < from.size(); ++d)
    if (from[d] != 1) sizes.push_back(from[d]), steps.push_back(strides[d]);
  Strides out(to.size(), 0);
  size_t old_dim = 0, new_dim = 0;
  while (new_dim < to.size()) {
    if (to[new_dim] == 1) {
      ++new_dim;
      continue;
    }
    if (old_dim >= sizes.size()) return std::nullopt;
    // The smallest groups of old and new dimensions with equal products.
    size_t old_end = old_dim + 1, new_end = new_dim + 1;
    int64_t old_count = sizes[old_dim], new_count = to[new_dim];
    while (old_count != new_count) {
      if (new_count < old_count) {
        if (new_end >= to.size()) return std::nullopt;
        new_count *= to[new_end++];
      } else {
        if (old_end >= sizes.size() || steps[old_end - 1] != steps[old_end] * sizes[old_end]) return std::nullopt;
        old_count *= sizes[old_end++];
      }
    }
    int64_t step = steps[old_end - 1];
    for (size_t d = new_end; d-- > new_dim;) {
      out[d] = step;
      step *= to[d];
    }
    old_dim = old_end, new_dim = new_end;
  }
  return out;
}


std::optional<int64_t> one_stride(const Shape& sizes, const Strides& strides) {
  std::optional<int64_t> step;  // the stride of the innermost dim of more than one element
  int64_t span = 1;            // consecutive indices so far, innermost first
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 1) continue;
    if (!step)
      step = strides[d];
    else if (strides[d] != *step * span)
      return std::nullopt;
    span *= sizes[d];
  }
  return step.value_or(0);
}

std::optional<BlasMatrix> blas_matrix(int64_t rows, int64_t columns, int64_t row_stride, int64_t column_stride) {
  if (columns == 1) column_stride = 1;
  if (rows == 1) row_stride = column_stride == 1 ? columns : 1;
  if (column_stride == 1 && row_stride >= columns) return BlasMatrix{row_stride, 1};
  if (row_stride == 1 && column_stride >= rows) return BlasMatrix{1, column_stride};
  return std::nullopt;
}

}  // namespace kiln::ir
