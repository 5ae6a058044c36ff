// The fusion planner: turns a Graph into a Plan (plan.h).
//
// Expects: a constructed Graph, as the rewrite table left it
// (rewrite_table.h: written-out attention is an sdpa by then).
// Guarantees: a Plan that verify_plan() accepts: every op in a kernel, a
// valid order, each graph output written once, no materialised intermediate
// beyond what the kernels' boundaries need, and a reason for every boundary.
//
// How, in order (planner.cpp):
//  1. (written-out attention became an sdpa before planning: the
//     rewrite table's attention_as_sdpa row);
//  2. greedy fusion in op order: each op joins the kernel of one of its
//     producers when that kernel's strategy takes it (strategies.h) and no
//     cycle between kernels would follow; else it starts a kernel (a
//     depthwise or narrowly grouped conv2d a depthwise_conv kernel, which
//     takes pointwise ops as its epilogue). Views join the kernels that read them (folded into
//     indexing), except a transpose that would spread an NHWC conv's
//     channels apart in memory: a copy kernel writes it once and the conv
//     reads it as a plain tensor (planner/strided_operands.h);
//  3. prologues (matmul and conv only below sm_90, where they run on the
//     same mma.sync kernel either way; measured on H100, computing an
//     operand in the loads ran 1.4-5.9x slower than writing it once and
//     loading it by TMA, from 64 to 16384 rows): a pointwise kernel whose
//     only result is only an anchor's operand is applied while the anchor
//     loads it; a layer_norm/rms_norm
//     whose only result is a matmul's A becomes a row-statistics kernel plus
//     the normalisation applied in the matmul's prologue; a kernel holding
//     rows (a norm written op by op) whose only result is a narrow matmul's
//     A writes the finished row values its tail reads, and the tail (cheap
//     pointwise ops after the reductions) becomes the prologue;
//  3b. recompute instead of materialise: a value a kernel writes only for
//     other kernels, made by cheap pointwise ops (ops.def's cost Free or
//     Cheap) from tensors in memory anyway (an anchor's result among them), is
//     computed again by each kernel that reads it in pointwise ops or a
//     concat, when the inputs it then reads besides those it reads already
//     are no more bytes than the value (its readers read no more than
//     before, its kernel writes it no more; a kernel left with nothing to
//     write goes). RoPE after a projection is one kernel this way.
//     The plan notes what each kernel recomputes, and a boundary that stays
//     says why it is not recomputed (a costly op, more bytes to read);
//  3c. horizontal fusion: kernels with no path between them over the same
//     domain (pointwise over one shape; reductions of one shape over the
//     same axes) become one: one launch, the same bytes;
//  4. order the kernels; record reads, writes and the reasons for boundaries.
//
// A worked example, x -> conv2d -> add(b) -> relu -> y:
//   conv2d starts a conv kernel; add reads its output on the same 128x56x56
//   output space, so the conv strategy takes it as an epilogue; so is relu.
//   One kernel: reads x, w, b; writes y.
#pragma once

#include "compiler/plan.h"

namespace kiln::ir {

struct PlanOptions {
  bool fuse = true;  // false: one kernel per op (views still fold into readers)
  // The target's compute capability (90: sm_90). From 90 on, a matmul's or
  // conv's operands are never computed in its loads (step 3): the anchor
  // then loads them by TMA into wgmma, which a prologue would forgo.
  int sm = 90;
  // cuBLASLt computes matmuls of f32 operands (in full f32 or TF32: the
  // rule of codegen's cublasLt tactic, where the library is loaded): their
  // kernels take no prologue or epilogue (the library would not run them);
  // the ops around them fuse into the neighbouring kernels.
  bool cublaslt_f32_matmuls = false;
};

Plan plan_fusion(const Graph& graph, const PlanOptions& options = {});

}  // namespace kiln::ir
