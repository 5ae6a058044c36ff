// Patch convolutions as matmuls: a conv2d whose windows tile its input
// exactly (stride equal to the filter, no padding, no dilation, one group:
// ViT's patch embedding, 16 x 16 patches at stride 16) is a matmul of the
// input's patches, read in place through views, by the weights.
//
// A row of the rewrite table (rewrite_table.h).
//
// Expects: a constructed Graph (graph_construction.cpp), as written (before
// layout sinking, which then moves the result's transpose).
// Guarantees: a Graph that computes what the given one computes (the same
// exact products summed in f32 in another order: numerics rule 5's
// reassociation), with the same inputs and outputs under the same ids; the
// conv's result is the same tensor, now made by reshape -> transpose ->
// reshape (A), reshape -> transpose (B), matmul, reshape (and for NCHW a
// transpose back).
//
// Which convs. 16-bit input and weights, a filter of more than one tap,
// height and width multiples of the filter's, and a patch row (the filter
// width of NCHW, filter width times channels of NHWC) a multiple of 8
// elements, so that the matmul's A is read in 16-byte runs (the Hopper
// kernel gathers it; codegen/wgmma_codegen.cpp). An NHWC conv whose channels
// are a multiple of 8 already gathers 16 bytes a tap and stays a conv.
//
// Why. An NCHW conv's implicit GEMM reads its channels HW apart, one element
// at a time, on mma.sync: ViT-S's patch embedding (batch 32, 3 -> 384,
// 3.7 GFLOP) took 434 us on an H100.
#pragma once

#include "compiler/rewrite_table.h"

namespace kiln::ir {

// The matcher: each conv that qualifies, a site.
RowMatches find_patch_convs(const Graph& g);
// The replacement: each site's conv as views and a matmul.
Graph patch_convs_as_matmuls(const Graph& g, const RowMatches& m);

}  // namespace kiln::ir
