// Host tensors to device storage bytes and back (the layouts of
// codegen/kernel_codegen.h: inputs with their declared strides, results
// contiguous; bf16/f16 bits; bool as one byte).
#pragma once

#include <string>
#include <vector>

#include "kiln/host_tensor.h"

namespace kiln::runtime {

std::string to_storage(const HostTensor& t, const Strides& strides);
// A byte other than 0/1 in a bool tensor (never written) reads as NaN.
std::vector<float> from_storage(const std::string& bytes, DType dtype, int64_t count);
int64_t span_elements(const Shape& shape, const Strides& strides);

}  // namespace kiln::runtime
