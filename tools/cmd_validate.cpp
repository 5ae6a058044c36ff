// kiln validate GRAPH: load and check a graph; print
// `ok: <ops> ops, <inputs> inputs, <outputs> outputs, hash <hex>`.
#include <fmt/format.h>

#include "kiln/graph.h"
#include "tools/commands.h"

namespace kiln::cli {

Runner add_validate(CLI::App& app, const CommonOptions& common) {
  CLI::App* cmd = app.add_subcommand("validate", "load and check a graph; print its size and hash");
  auto path = std::make_shared<std::string>();
  cmd->add_option("GRAPH", *path, "graph file (graph-format.md)")->required();
  return [path] {
    Expected<Graph> graph = Graph::load(*path);
    if (!graph) return report(graph.error());
    fmt::print("ok: {} ops, {} inputs, {} outputs, hash {}\n", graph->op_count(), graph->inputs().size(),
               graph->outputs().size(), graph->hash());
    return 0;
  };
}

}  // namespace kiln::cli
