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

// The kind of group an op starts when it fuses into nothing.
KernelKind kind_for(OpKind kind);

// Pointwise ops and batch_norm (the inference form: a per-channel affine
// map), which fuse and are read like any pointwise op.
bool pointwise_like(OpKind kind);

// Parameters of a finished group (see KernelParams).
KernelParams params_for(const Graph& g, const Group& group);

// How a row of `elements` values is held (RowStrategy).
RowStrategy row_strategy(int64_t elements);

}  // namespace kiln::ir::planner
