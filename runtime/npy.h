// NumPy .npy files, as `kiln run --inputs/--outputs` use them (cli.md).
//
// read_npy accepts any NumPy float (f2, f4, f8), integer (1 to 8 bytes,
// signed or not) or bool array, either byte order, C or Fortran order, format
// versions 1 to 3; it returns the logical row-major values converted to
// `dtype` with round to nearest even. write_npy writes float32 ('<f4'), or
// bool ('|b1') for a bool tensor.
#pragma once

#include <string>

#include "kiln/host_tensor.h"
#include "kiln/status.h"

namespace kiln {

Expected<HostTensor> read_npy(const std::string& path, DType dtype);
Status write_npy(const std::string& path, const HostTensor& tensor);

// Rounds an f64 to `dtype` in one step (no double rounding through f32).
float round_from_f64(DType dtype, double value);

}  // namespace kiln
