// Binding sizes to a symbolic graph (graph-format.md, "Symbolic
// dimensions"): check values for its symbols, read them from the inputs'
// shapes, and make the integer graph of those sizes.
//
// Expects: a graph built by GraphConstructor (symbolic or integer).
// Guarantees:
//  - check_dim_values returns a value for every symbol of the graph's `dims`
//    table, or throws a UserError naming the symbol, the value and its range
//    (a symbol given no value, an unknown one, a value outside [min, max] or
//    not a multiple of multiple_of); an integer graph takes no values.
//  - dim_values_from_shapes reads each symbol from the inputs where it
//    stands alone and checks that all readings agree, lie in range, and that
//    every input's shape is its expressions' value; otherwise a UserError
//    naming the symbol or input and the sizes (a binding error).
//  - specialize returns the integer graph with those values: the same
//    names, inputs, ops, attributes and outputs, every expression replaced by
//    its value, built again through GraphConstructor (so checked as a loaded
//    graph is); its hash is that of the same graph written with integers.
//    An integer graph comes back as it is.
//
// How the one-compile path uses it (runtime/pipeline.h): a graph it covers
// is compiled once, its launches check their sizes with
// dim_values_from_shapes first; any other symbolic graph is specialized
// and compiled per size. specialize_unchecked makes the probe graphs
// (size_probe.h).
#pragma once

#include <vector>

#include "compiler/ir.h"
#include "compiler/symbolic_dims.h"

namespace kiln::ir {

DimValues check_dim_values(const Graph& graph, const DimValues& values);
DimValues dim_values_from_shapes(const Graph& graph, const std::vector<Shape>& input_shapes);
Graph specialize(const Graph& graph, const DimValues& values);
// specialize() without the range check, for values outside the ranges on
// purpose (size_probe.h); every symbol must have a value.
Graph specialize_unchecked(const Graph& graph, const DimValues& values);

}  // namespace kiln::ir
