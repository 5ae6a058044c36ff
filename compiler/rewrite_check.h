// The check the rewrite driver (rewrite_table.h) runs after each rewrite:
// the rewritten graph against the graph before it.
//
// Expects: `before`, a checked graph; `after`, what a rewrite made of it.
// Guarantees: returns the first violation found, empty if none:
//   - the same inputs (ids, names, shapes, strides, dtypes) and outputs
//     (ids, shapes, dtypes, rounding: the values a caller reads);
//   - ops in evaluation order: each reads inputs, constants or results of
//     earlier ops, each result made by one op (its producer), every output
//     made; `users` indexed;
//   - every op of the shape shape inference gives it (shape_inference.h,
//     its attributes taken as given);
//   - bool values read only as where's condition, by cast, as sdpa's mask,
//     through views and concat (graph-format.md rule 3).
// Dtypes inside the graph are not compared with inference: a rewrite may
// give a result the type of the tensor it replaces (channel padding's zeros
// take their operand's).
#pragma once

#include <string>

#include "compiler/ir.h"

namespace kiln::ir {

std::string rewritten_graph_problem(const Graph& before, const Graph& after);

}  // namespace kiln::ir
