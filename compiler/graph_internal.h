// The IR behind a public kiln::Graph, for kiln's own passes, runtime and
// tools. Not installed: embedders see only include/kiln/.
#pragma once

#include <memory>

#include "compiler/ir.h"
#include "compiler/rewrite_table.h"
#include "kiln/graph.h"

namespace kiln {

struct Graph::Internal {
  static const ir::Graph& ir(const Graph& g) { return *g.planned_; }
  static const ir::Graph& as_written(const Graph& g) { return *g.ir_; }
  // The graph planned as written, the rewrites skipped (tests compare the two).
  static Graph unsunk(const Graph& g) { return Graph(g.ir_, g.ir_); }
  // The graph as written planned as `planned` (tests apply a row at the sites they choose).
  static Graph with_planned(const Graph& g, std::shared_ptr<const ir::Graph> planned) {
    return Graph(g.ir_, std::move(planned));
  }
  // The graph as written, and for everything after it the graph the rewrite
  // table makes of it (compiler/rewrite_table.h: patch convolutions as
  // matmuls, written-out attention as sdpa, transposes sunk, thin
  // convolutions' channels padded, odd-K matmuls' operands padded).
  // A symbolic graph is not rewritten: specialize() makes the integer
  // graph that is (compiler/specialize.h).
  static Graph make(std::shared_ptr<const ir::Graph> ir) {
    if (ir->is_symbolic()) return Graph(ir, ir);
    std::shared_ptr<const ir::Graph> planned = ir::run_rewrites(ir);
    return Graph(std::move(ir), std::move(planned));
  }
};

// The IR the planner, codegen, runtime and reference interpreter take: the
// graph the rewrite table made (the same values, up to what each row's
// header allows; the same inputs and outputs under the same ids). The hash,
// JSON and `dump --stage ir` are of the graph as written.
inline const ir::Graph& ir_of(const Graph& g) { return Graph::Internal::ir(g); }

}  // namespace kiln
