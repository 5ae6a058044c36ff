// Patch convolutions as matmuls: a conv2d whose windows tile its input
// exactly (stride equal to the filter, no padding, no dilation, one group:
// ViT's patch embedding, 16 x 16 patches at stride 16; a pointwise 1x1 conv)
// is a matmul of the input's patches, read in place through views, by the
// weights.
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
// Which convs. 16-bit input and weights, height and width multiples of the
// filter's, and either
// - a filter of more than one tap whose patch row (the filter width of NCHW,
//   filter width times channels of NHWC) is a multiple of 8 elements, so
//   that the matmul's A is read in 16-byte runs (the Hopper kernel gathers
//   it; codegen/wgmma_codegen.cpp), where an NHWC conv's channels are not
//   (with them, it gathers 16 bytes a tap and stays a conv); or
// - a pointwise conv (1x1, stride 1) of NHWC with channels a multiple of 8:
//   its input is the matmul's A as it lies, [pixels, C], read by TMA; unless
//   it is narrow (at most 64 output channels) over more than 6272 pixels
//   (the conv kernel's tile was faster there on an H100: 1.36x geomean over
//   14 of the zoo's convs, where the other 140 pointwise convs ran 0.82-0.94x
//   the conv kernel's time as matmuls), or
//   its result reaches a pooling op through pointwise ops, batch norms and
//   views (DenseNet's transitions): the conv kernel pools 2 x 2 windows in
//   its epilogue, a matmul's does not.
//
// Why. An NCHW conv's implicit GEMM reads its channels HW apart, one element
// at a time, on mma.sync: ViT-S's patch embedding (batch 32, 3 -> 384,
// 3.7 GFLOP) took 434 us on an H100. A pointwise conv is a plain GEMM
// whose A needs no gather: as a matmul it takes the matmul kernels' tiles
// and K splits, which serve the small maps of late stages better (H100, the
// zoo's convs with their epilogues: 7x7 320 -> 1280 0.021 -> 0.012 ms,
// DenseNet's 14x14 1x1s to 128 channels 0.64x their conv-kernel time).
#pragma once

#include "compiler/rewrite_table.h"

namespace kiln::ir {

// The matcher: each conv that qualifies, a site.
RowMatches find_patch_convs(const Graph& g);
// The replacement: each site's conv as views and a matmul.
Graph patch_convs_as_matmuls(const Graph& g, const RowMatches& m);

}  // namespace kiln::ir
