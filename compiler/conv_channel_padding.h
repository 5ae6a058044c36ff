// Channel padding of thin convolutions: a channels-last conv2d whose input
// channels are not a multiple of 8 (ResNet's stem: 3) reads its input and
// weights padded with zero channels to the next multiple of 8.
//
// A row of the rewrite table (rewrite_table.h).
//
// Expects: a constructed Graph (graph_construction.cpp), after layout
// sinking (the row after it in the table).
// Guarantees: a Graph that computes what the given one computes (the added
// channels contribute products 0 * 0 to each sum: the same f32 values, up to
// the sign of a zero sum), with the same inputs and outputs under the same
// ids; each padded operand is concat(operand, zeros) along its channel axis,
// the zeros an expanded constant cast to the operand's dtype (ops the JSON
// format does not let a user write, and that kiln's passes, codegen and
// reference interpreter take).
//
// Why. A conv's implicit GEMM gathers its input 16 bytes (8 channels) at a
// time; with 3 channels it reads each element alone on mma.sync, and its
// weights' rows (147 elements) cannot be copied by the tensor memory
// accelerator (H100, ResNet-50's stem at batch 32: 1.02 ms; cuDNN 0.23).
// The planner writes the padded input once (a concat is not a conv's
// prologue), and the conv takes the Hopper kernel: 8/3 of the multiply-adds,
// all on wgmma.
#pragma once

#include "compiler/rewrite_table.h"

namespace kiln::ir {

// The matcher: each conv that qualifies, a site.
RowMatches find_thin_convs(const Graph& g);
// The replacement: each site's input and weights padded.
Graph pad_conv_channels(const Graph& g, const RowMatches& m);

}  // namespace kiln::ir
