// Channel padding of thin convolutions: a channels-last conv2d whose input
// channels are not a multiple of 8 (ResNet's stem: 3) reads its input and
// weights padded with zero channels to the next multiple of 8.
//
// Expects: a constructed Graph (graph_construction.cpp), after layout
// sinking.
// Guarantees: a Graph that computes what the given one computes (the added
// channels contribute products 0 * 0 to each sum: the same f32 values, up to
// the sign of a zero sum), with the same inputs and outputs under the same
// ids; each padded operand is concat(operand, zeros) along its channel axis,
// the zeros an expanded constant cast to the operand's dtype (ops the JSON
// format does not let a user write, and that kiln's passes, codegen and
// reference interpreter take). Nothing changes (the given graph is returned)
// when no conv qualifies.
//
// Why. A conv's implicit GEMM gathers its input 16 bytes (8 channels) at a
// time; with 3 channels it reads each element alone on mma.sync, and its
// weights' rows (147 elements) cannot be copied by the tensor memory
// accelerator (H100, ResNet-50's stem at batch 32: 1.02 ms; cuDNN 0.23).
// The planner writes the padded input once (a concat is not a conv's
// prologue), and the conv takes the Hopper kernel: 8/3 of the multiply-adds,
// all on wgmma.
#pragma once

#include <memory>

#include "compiler/ir.h"

namespace kiln::ir {

std::shared_ptr<const Graph> pad_conv_channels(const std::shared_ptr<const Graph>& graph);

}  // namespace kiln::ir
