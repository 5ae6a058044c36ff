// Launch geometry: the one function that says how a generated kernel is
// launched at given sizes. An integer graph's kernels launch as generated;
// a symbolic graph's kernels take grid[0] from their GridRule evaluated at
// the bound sizes (block and shared memory do not depend on the sizes in
// the kernels symbolic codegen covers).
//
// Expects: `values` with every symbol the kernel's rule reads (none for an
// integer graph's kernels), inside the graph's ranges.
// Guarantees: grid entries in [1, 2^20] times the rule's multiplier and `times`, below 2^31.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "codegen/kernel_codegen.h"
#include "compiler/symbolic_dims.h"

namespace kiln::codegen {

struct LaunchGeometry {
  std::array<uint32_t, 3> grid{1, 1, 1};
  std::array<uint32_t, 3> block{1, 1, 1};
  uint32_t shared_bytes = 0;
};

LaunchGeometry launch_geometry(const GeneratedKernel& k, const ir::DimValues& values);

// "grid [7,1,1] block [256,1,1]" (and shared memory where any), as `kiln plan --dim` shows it.
std::string to_string(const LaunchGeometry& g);

}  // namespace kiln::codegen
