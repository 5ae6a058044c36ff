// The IR behind a public kiln::Graph, for kiln's own passes, runtime and
// tools. Not installed: embedders see only include/kiln/.
#pragma once

#include <memory>

#include "compiler/ir.h"
#include "compiler/conv_channel_padding.h"
#include "compiler/layout_sinking.h"
#include "compiler/patch_convolutions.h"
#include "kiln/graph.h"

namespace kiln {

struct Graph::Internal {
  static const ir::Graph& ir(const Graph& g) { return *g.planned_; }
  static const ir::Graph& as_written(const Graph& g) { return *g.ir_; }
  // The graph planned as written, layout sinking skipped (tests compare the two).
  static Graph unsunk(const Graph& g) { return Graph(g.ir_, g.ir_); }
  // The graph as written, and for everything after it: patch convolutions
  // as matmuls, then its layout-sunk form with thin convolutions' channels
  // padded (compiler/patch_convolutions.h, compiler/layout_sinking.h,
  // compiler/conv_channel_padding.h).
  static Graph make(std::shared_ptr<const ir::Graph> ir) {
    std::shared_ptr<const ir::Graph> planned = ir::pad_conv_channels(ir::sink_transposes(ir::patch_convs_as_matmuls(ir)));
    return Graph(std::move(ir), std::move(planned));
  }
};

// The IR the planner, codegen, runtime and reference interpreter take: the
// graph with patch convolutions as matmuls, its transposes sunk and thin
// convolutions' channels padded
// (the same values; the same inputs and outputs under the same ids). The hash, JSON and `dump --stage
// ir` are of the graph as written.
inline const ir::Graph& ir_of(const Graph& g) { return Graph::Internal::ir(g); }

}  // namespace kiln
