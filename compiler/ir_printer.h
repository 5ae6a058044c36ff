// The IR as text: what `kiln dump --stage ir` prints and golden tests check.
//
//   graph "conv_bias_relu": 3 ops, 3 inputs, 1 output, hash 9f1c...
//   input %x : bf16[2,8,8,16]
//   op 0 %c = conv2d(%x, %w) {layout="NHWC", ...} : bf16[2,8,8,16] f32-values
//   op 2 %y = relu(%cb) : bf16[2,8,8,16] rounded
//   outputs %y
//
// Each op line ends with its result type and how its values are held:
// `rounded` (numerics rule 2 rounds them to the dtype), or `f32-values` (a
// narrow nominal dtype whose values stay f32, rule 4).
#pragma once

#include <string>

#include "compiler/ir.h"

namespace kiln::ir {

std::string print_ir(const Graph& graph);
std::string type_string(const Tensor& t);  // "bf16[2,8,8,16]"

}  // namespace kiln::ir
