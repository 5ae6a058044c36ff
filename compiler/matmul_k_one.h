// Matmuls over K = 1 as products: a matmul whose operands meet along one
// element (a [..., M, 1] @ b [..., 1, N], an outer product: rotary
// embeddings' inv_freq[:, None] @ positions[None, :]) is the broadcast
// product a * b, a pointwise op the planner fuses into its readers instead
// of a GEMM kernel of one slice.
//
// A row of the rewrite table (rewrite_table.h).
//
// Expects: a constructed Graph (graph_construction.cpp).
// Guarantees: a Graph that computes what the given one computes, with the
// same inputs and outputs under the same ids: the matmul's result is the
// mul's, with its dtype and rounding. The matmul's one f32 product per
// element, added to a zero accumulator, is the mul's f32 product (16-bit
// values are exact in f32; f32 operands at precision f32 round once either
// way), up to the sign of a zero product (0 + -0 is +0). Batch dimensions
// broadcast alike in both. Near misses, with why: a matmul whose precision
// rounds f32 operands first (tf32, bf16, f16), and one with an operand made
// by a transpose (layout sinking, a later row, would move that transpose
// through the product and back again without end).
//
// Why. Such a matmul takes the SIMT kernel where its operands are f32 (as
// rotary tables are computed), which spells its sizes as integers, so a
// graph with one is compiled per size (runtime/pipeline.h); as a kernel of
// its own it writes its M x N result to memory for its reader.
#pragma once

#include "compiler/rewrite_table.h"

namespace kiln::ir {

// The matcher: each matmul over K = 1 at precision f32 or of 16-bit operands, a site.
RowMatches find_k_one_matmuls(const Graph& g);
// The replacement: each site's matmul as a mul of its operands.
Graph k_one_matmuls_as_products(const Graph& g, const RowMatches& m);

}  // namespace kiln::ir
