// How much arithmetic an op is: the anchors' useful floating-point
// operations (what benchmarks divide by time), and a rough count of the
// element operations of every op (what a progress line weighs ops by).
#pragma once

#include <cstdint>

#include "compiler/ir.h"

namespace kiln::ir {

// 2*M*N*K for matmul and conv, 4*B*H*Sq*Skv*D for attention (halved when
// causal); 0 for every other op.
int64_t anchor_flops(const Graph& g, const Op& op);

// The anchors' flops, or for any other op the elements it reads and writes:
// a weight, not a promise of time.
int64_t estimated_work(const Graph& g, const Op& op);

}  // namespace kiln::ir
