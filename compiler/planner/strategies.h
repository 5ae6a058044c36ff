// The fusion strategies, one per kind of kernel: what each can take, and the
// parameters it needs. The planner asks the strategy of a group's kind
// whether the group can take an op that reads its results.
//
// Expects: `op` reads at least one value of `group` (`stage` is the stage of
// those values; a mix of stages was already refused), and the op is not a
// view. Guarantees: a yes only where one kernel of that kind can compute the
// op with no extra pass over device memory; a no always says why, in words
// that name the tensors and the kernel kinds involved.
#pragma once

#include "compiler/ir.h"
#include "compiler/planner/group.h"

namespace kiln::ir::planner {

Verdict can_take(const Graph& g, const Group& group, const Op& op, int stage);

// The kind of group an op starts when it fuses into nothing; with the op
// itself, a depthwise conv2d (below) starts a DepthwiseConv group.
KernelKind kind_for(OpKind kind);
KernelKind kind_for(const Graph& g, const Op& op);

// The depthwise and grouped convs that the depthwise_conv kernel computes
// (codegen/depthwise_generator.h): conv2d in NHWC with one group per input
// channel (groups = C > 1; K = multiplier x C), or groups of 2, 4 or 8
// input channels that one 16-byte load holds in their storage type (the
// narrow groups of a ResNeXt), the output channels of a group (the
// multiplier) at most kMaxDepthwiseMultiplier, at most kMaxDepthwiseTaps taps along each side
// and a window at most kMaxDepthwiseSpan pixels across (dilation
// included), so that a thread's accumulators and a filter row fit in
// registers and a tile's input halo in shared memory, and sides, channels
// and padding below 2^30 (32-bit indexing). Other convs (NCHW depthwise
// ones among them) stay on the implicit-GEMM conv kernel.
inline constexpr int64_t kMaxDepthwiseMultiplier = 8, kMaxDepthwiseTaps = 15, kMaxDepthwiseSpan = 32;
bool depthwise_conv(const Graph& g, const Op& op);

// Pointwise ops and batch_norm (the inference form: a per-channel affine
// map), which fuse and are read like any pointwise op.
bool pointwise_like(OpKind kind);

// Parameters of a finished group (see KernelParams).
KernelParams params_for(const Graph& g, const Group& group);

// How a row of `elements` values is held (RowStrategy).
RowStrategy row_strategy(int64_t elements);

}  // namespace kiln::ir::planner
