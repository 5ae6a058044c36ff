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

}  // namespace kiln::ir
