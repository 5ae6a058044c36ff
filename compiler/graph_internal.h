// The IR behind a public kiln::Graph, for kiln's own passes, runtime and
// tools. Not installed: embedders see only include/kiln/.
#pragma once

#include <memory>

#include "compiler/ir.h"
#include "kiln/graph.h"

namespace kiln {

struct Graph::Internal {
  static const ir::Graph& ir(const Graph& g) { return *g.ir_; }
  static Graph make(std::shared_ptr<const ir::Graph> ir) { return Graph(std::move(ir)); }
};

inline const ir::Graph& ir_of(const Graph& g) { return Graph::Internal::ir(g); }

}  // namespace kiln
