// The JSON graph format (graph-format.md) in and out.
//
// graph_from_json expects any text and guarantees either a checked ir::Graph
// or a UserError naming what is wrong and where: JSON syntax (line, column),
// duplicate keys, nesting deeper than 64, unknown keys, wrong value types,
// and every rule GraphConstructor enforces.
// graph_to_json writes the canonical form: attributes resolved and spelt out,
// one input or op per line; loading it gives back an equal graph and hash.
#pragma once

#include <string>
#include <string_view>

#include "compiler/ir.h"

namespace kiln::ir {

Graph graph_from_json(std::string_view text, std::string_view source);
std::string graph_to_json(const Graph& graph);

}  // namespace kiln::ir
