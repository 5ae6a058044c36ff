// Layout sinking: transposes move past the ops that do not care about the
// order of dimensions, so that tensors stay in the layout they were made in.
//
// A row of the rewrite table (rewrite_table.h). Its matcher runs the whole
// pass (a value is carried through every op after its transpose) and its
// one site is the graph sunk.
//
// Expects: a constructed Graph (graph_construction.cpp).
// Guarantees: a Graph that computes exactly what the given one computes, bit
// for bit (a transpose moves no value and changes no arithmetic), with the
// same inputs (same ids, names, shapes, strides) and the same outputs (same
// ids, names, shapes, dtypes); ops may be rewritten and intermediates added.
//
// Why. A framework's channels-last model is NCHW in its graph and NHWC in
// memory: each convolution reads transpose(x) and its result is transposed
// back before batch_norm, relu, the residual add and the pooling, all over
// NCHW. Planned as written, every kernel between two convolutions writes
// NCHW and the next convolution reads it back through a transpose, element by
// element. Sunk, those ops run over NHWC, the transposes meet and cancel at
// the next convolution's input, and every tensor stays NHWC in memory.
//
// What moves. A value that is transpose(a, P) is carried as (a, P) and only
// materialised (a transpose op, folded into its readers' indexing like any
// view) for an op that cannot take it. These take it and are rewritten over
// a: pointwise ops whose tensor operands are all (·, P) with the same P or
// hold a single value; batch_norm (its axis follows P); reductions (their
// axes follow P); pooling, when P swaps NHWC for NCHW (its layout flips);
// concat, when every operand is (·, P) with the same P (its axis follows P:
// a DenseNet block's channel concat runs over NHWC); a transpose of (a, P) is (a, P composed with its own perm), nothing when
// that is the identity. An op whose result is a graph output is not
// rewritten (the output would become a view, written by a copy).
#pragma once

#include "compiler/rewrite_table.h"

namespace kiln::ir {

// The matcher: one site, the graph with its transposes sunk, when one moves.
RowMatches find_sinkable_transposes(const Graph& g);
// The replacement: that graph.
Graph sink_transposes(const Graph& g, const RowMatches& m);

}  // namespace kiln::ir
