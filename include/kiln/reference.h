// The reference interpreter: the CPU oracle every GPU result is checked
// against. It follows graph-format.md's numerics exactly (f32 arithmetic,
// sums accumulated in f64, rounding to f16/bf16 only where the graph says).
#pragma once

#include <vector>

#include "kiln/graph.h"
#include "kiln/host_tensor.h"

namespace kiln {

// `inputs` in binding order (Graph::inputs()); shapes and dtypes must match.
// Returns the graph outputs in the document's order.
Expected<std::vector<HostTensor>> run_reference(const Graph& graph,
                                                const std::vector<HostTensor>& inputs);

}  // namespace kiln
