// Strides of views: how a tensor laid out in memory with some strides is
// seen through a reshape, without a copy.
#pragma once

#include <optional>

#include "kiln/types.h"

namespace kiln::ir {

// Strides of `to`, a reshape of a tensor of shape `from` laid out with
// `strides`, where every group of dimensions it merges or splits is laid
// out contiguously; nullopt where it is not (a copy would be needed).
std::optional<Strides> reshaped_strides(const Shape& from, const Strides& strides, const Shape& to);

// Dims `sizes` laid out with `strides`, walked as one linear index: the
// stride between consecutive indices (0 where every dim broadcasts), or
// nullopt where they are not evenly spaced. Dims of one element are skipped.
std::optional<int64_t> one_stride(const Shape& sizes, const Strides& strides);

// A rows x columns matrix laid out with these strides as a BLAS reads it in
// place: one stride 1, the other (the leading dimension) at least as long
// as that dim; a dim of one element takes whichever fits. Row-major where
// column_stride is 1. nullopt where neither layout is.
struct BlasMatrix {
  int64_t row_stride, column_stride;
};
std::optional<BlasMatrix> blas_matrix(int64_t rows, int64_t columns, int64_t row_stride, int64_t column_stride);

}  // namespace kiln::ir
