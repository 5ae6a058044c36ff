// Tensor maps (CUtensorMap) for the bulk tensor copy engine: encoded at
// launch from a kernel's TensorMapSpec and the pointer bound to its tensor.
#pragma once

#include <cuda.h>

#include "codegen/kernel_codegen.h"
#include "kiln/status.h"
#include "runtime/cuda_driver.h"

namespace kiln::runtime {

// The map of `spec` over the tensor at `pointer`; all zero when the pointer
// is not 16-byte aligned (the kernel sees that and loads the tensor element
// by element). An Error when the driver refuses the map.
Expected<CUtensorMap> encode_tensor_map(const Driver& cu, const codegen::TensorMapSpec& spec, CUdeviceptr pointer);

}  // namespace kiln::runtime
