// The fusion plan: what the planner decides and codegen consumes.
//
// A Plan is an ordered list of kernels. Each kernel computes a set of graph
// ops (`ops`, in evaluation order, views included), reads some tensors from
// device memory and writes others. Every op is in exactly one kernel, except
// where the plan recomputes it on purpose (`recomputed`, e.g. a normalisation
// split into a row-statistics kernel and the prologue of the matmul that
// applies it). Kernels are in a valid execution order: a kernel reads only
// graph inputs and tensors written by earlier kernels, and every graph output
// is written by exactly one kernel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/ir.h"

namespace kiln::ir {

enum class KernelKind : uint8_t {
#define KILN_KERNEL_KIND(e, name) e,
#include "compiler/kernel_kinds.def"
#undef KILN_KERNEL_KIND
};
inline constexpr size_t kKernelKindCount = 0
#define KILN_KERNEL_KIND(e, name) +1
#include "compiler/kernel_kinds.def"
#undef KILN_KERNEL_KIND
    ;
std::string_view to_string(KernelKind kind);

// The bytes a tensor occupies in device memory (its value dtype, rule 4;
// an input as declared).
int64_t materialised_bytes(const Tensor& t);

// How a row-wise kernel (norm, reduction over trailing axes) holds a row.
enum class RowStrategy : uint8_t {
  Warp,     // a warp per row, in registers
  Block,    // a block per row, in registers
  Cluster,  // a thread-block cluster per row, in distributed shared memory
  TwoPass,  // too long to keep on chip: the row is read twice
};
std::string_view to_string(RowStrategy s);

// Launch-relevant parameters of a kernel, chosen by the planner from shapes
// alone (codegen adds the device-specific ones). Part of the kernel's cache
// key and of the plan dump.
struct KernelParams {
  // The iteration space: the anchor's output, the pointwise domain, or the
  // domain being reduced or normalised.
  Shape domain;
  // Reductions and norms: the domain viewed as [outer, reduced, inner].
  int64_t outer = 1, reduced = 1, inner = 1;
  RowStrategy row = RowStrategy::Block;
  // Reductions: the kernel holds each row and reads its finished
  // reductions back at the row's elements (several passes over one read).
  bool holds_rows = false;
  // Anchors: the GEMM view. matmul: batch x M x N x K; conv: implicit GEMM
  // with M = N*P*Q, N = K, K = C/groups*R*S per group.
  int64_t batch = 1, m = 1, n = 1, k = 1;
  int64_t epilogue_reductions = 0;  // reductions of the anchor output (atomics)
  // Conv anchors whose epilogue pools: the window's side (2). M then runs
  // window by window over [N, P/2, Q/2] (codegen orders a window's pixels).
  int64_t pool_window = 0;

  bool operator==(const KernelParams&) const = default;
  std::string to_string(KernelKind kind) const;
};

struct PlannedKernel {
  int id = 0;
  KernelKind kind = KernelKind::Pointwise;
  int32_t anchor = -1;                // op index of the anchor, or -1
  std::vector<int32_t> ops;           // op indices, evaluation order
  std::vector<int32_t> recomputed;    // ops also computed by another kernel, on purpose
  std::vector<TensorId> reads;        // from device memory
  std::vector<TensorId> writes;       // to device memory
  KernelParams params;
  std::vector<std::string> notes;     // decisions worth telling (splits, recomputation)
  std::vector<std::string> workspace; // scratch kiln allocates (e.g. row statistics), by name
};

// Why a tensor crosses device memory between two kernels.
struct Boundary {
  TensorId tensor;
  int from_kernel, to_kernel;
  std::string reason;
};

struct Plan {
  std::vector<PlannedKernel> kernels;
  std::vector<Boundary> boundaries;
  bool fused = true;  // false for --no-fusion
};

// The bytes a plan's kernels read and write in device memory, each kernel's reads and writes counted.
int64_t bytes_through_memory(const Graph& g, const Plan& plan);

}  // namespace kiln::ir
