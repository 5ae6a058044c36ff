// NCHW convolutions as NHWC ones: every conv2d with "layout": "NCHW" (any
// groups, depthwise included) reads its input and weights through
// transposes into channels-last order, runs as an NHWC conv, and its result
// is transposed back:
//   y = conv2d_nchw(x, w)
//   ->  y = transpose(conv2d_nhwc(transpose(x, [0,2,3,1]),
//                                 transpose(w, [0,2,3,1])), [0,3,1,2])
//
// A row of the rewrite table (rewrite_table.h), after patch_convolutions
// (an NCHW conv whose windows tile its input is a matmul there, not here)
// and before layout_sinking, which then moves the transposes past the ops
// between convolutions until they cancel.
//
// Expects: a constructed Graph (graph_construction.cpp).
// Guarantees: a Graph that computes exactly what the given one computes (the
// same products summed over the same taps and channels: a transpose moves
// no value; an implementation's order of the f32 sums may differ, numerics
// rule 4), with the same inputs and outputs under the same ids; no conv2d
// left with layout NCHW. The conv's result keeps its id, now made by the
// transpose back; the NHWC conv's result is a new tensor of its dtype and
// rounding.
//
// Why. An NCHW conv's implicit GEMM reads its channels H*W elements apart:
// every input and weight element is loaded alone (issue 46: ResNet-50 NCHW
// ran 10x slower than Inductor, its channels-last twin 0.76x). As NHWC
// convs, consecutive convs' transposes meet across the ops between them
// (layout_sinking.h) and cancel: every tensor between convs stays NHWC in
// memory, and the transposes are left at the network's input, its weights
// and its outputs.
#pragma once

#include "compiler/rewrite_table.h"

namespace kiln::ir {

// The matcher: each NCHW conv2d, a site.
RowMatches find_nchw_convs(const Graph& g);
// The replacement: each site's conv as transposes around an NHWC conv.
Graph nchw_convs_as_nhwc(const Graph& g, const RowMatches& m);

}  // namespace kiln::ir
