// Comparing a GPU result with the reference (`kiln run --check`, GPU tests).
#pragma once

#include "compiler/ir.h"
#include "kiln/host_tensor.h"

namespace kiln::runtime {

// cli.md: the tolerance of the narrowest precision an output depends on: its
// own dtype, any rounded intermediate upstream, any anchor precision
// upstream (f32 1e-4, tf32 1e-3, f16 2e-3, bf16 1e-2).
double default_tolerance(const ir::Graph& g, ir::TensorId output);

struct Comparison {
  double relative_error = 0;   // ||out - ref|| / ||ref|| over finite elements
  bool nonfinite_match = true;  // NaN and +-inf at the same places
  int64_t first_mismatch = -1;  // an element where non-finite values differ
  bool passes(double tolerance) const { return nonfinite_match && relative_error <= tolerance; }
};

Comparison compare(const HostTensor& out, const HostTensor& ref);

}  // namespace kiln::runtime
