// Codegen: CUDA C++ for every kernel of a plan.
//
// Expects: a verified plan of a constructed graph.
// Guarantees: one self-contained CUDA translation unit per planned kernel
// (it includes only kiln/common.cuh), deterministic for a given kernel, with
// one entry point `kiln_kernel` whose parameters are device pointers in the
// order of `args`. Shapes, strides and dtypes are compile-time constants in
// the source. User-provided text appears only as validated tensor names in
// `//` comments; `canonical` drops comment lines, so two graphs that differ
// only in names share compiled kernels.
//
// Storage (numerics rule 4): graph inputs as declared; every materialised
// result as its value dtype (rounded results in their dtype, everything else
// f32, bool as one byte), contiguous.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "compiler/ir.h"
#include "compiler/plan.h"

namespace kiln::codegen {

struct KernelArg {
  enum class Role : uint8_t { Input, Output, Intermediate, Workspace };
  Role role;
  ir::TensorId tensor = -1;  // Input, Output, Intermediate
  int workspace = -1;        // Workspace
};

// Scratch memory kiln owns: `words` 32-bit words set to `fill` before the
// kernels that use it run.
struct WorkspaceSpec {
  std::string name;
  int64_t words = 0;
  uint32_t fill = 0;
};

struct GeneratedKernel {
  int plan_kernel = 0;
  std::string source;     // what NVRTC compiles (annotated)
  std::string canonical;  // the source without comment lines: the cache key's text
  std::vector<KernelArg> args;
  std::array<uint32_t, 3> grid{1, 1, 1};
  std::array<uint32_t, 3> block{1, 1, 1};
  uint32_t shared_bytes = 0;  // dynamic shared memory per block
  std::vector<int> reset_workspaces;  // filled before this kernel launches
};

struct GeneratedProgram {
  std::vector<GeneratedKernel> kernels;
  std::vector<WorkspaceSpec> workspaces;
  std::vector<ir::TensorId> intermediates;  // materialised results that are not graph outputs
};

// `sm`: the target's compute capability (80 for sm_80): tensor-core kernels
// from 80 on, SIMT before.
GeneratedProgram generate_program(const ir::Graph& g, const ir::Plan& plan, int sm);

// The compute capability of an arch name: sm_90a -> 90.
int sm_of(const std::string& arch);

// How a materialised tensor is stored.
DType storage_dtype(const ir::Tensor& t);

}  // namespace kiln::codegen
