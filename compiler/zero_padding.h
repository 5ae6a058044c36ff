// A tensor extended with zeros along one axis, as a rewrite emits it
// (conv_channel_padding.h, matmul_k_padding.h): concat(t, expand(0)).
//
// Expects: `t` a tensor of `out` (given or already emitted), `axis` one of
// its dimensions, `to` at least its size there.
// Guarantees: emits two ops into `out`, the zeros (an expanded constant, of
// t's dtype: a zero is exact in every type) and their concatenation after
// t's values; returns the padded tensor, named "<t>.<padded_suffix>" (the
// zeros "<t>.<zeros_suffix>"), contiguous, of t's dtype and rounded.
#pragma once

#include <string>

#include "compiler/graph_rewrite.h"

namespace kiln::ir {

TensorId zero_padded(GraphRewrite& out, TensorId t, size_t axis, int64_t to, const std::string& zeros_suffix,
                     const std::string& padded_suffix);

}  // namespace kiln::ir
