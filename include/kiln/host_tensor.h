// A tensor in host memory, as the reference interpreter and the `kiln run`
// files see it: the logical row-major values, widened to f32. A bf16/f16
// tensor holds values exactly representable in its dtype; a bool tensor holds
// 0 and 1.
#pragma once

#include <vector>

#include "kiln/types.h"

namespace kiln {

struct HostTensor {
  Shape shape;
  DType dtype = DType::f32;
  std::vector<float> values;  // element_count(shape) values, row-major
};

}  // namespace kiln
