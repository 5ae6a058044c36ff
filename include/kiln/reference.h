// The reference interpreter: the CPU oracle every GPU result is checked
// against. It follows graph-format.md's numerics exactly (f32 arithmetic,
// sums accumulated in f64, rounding to f16/bf16 only where the graph says).
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/graph.h"
#include "kiln/host_tensor.h"

namespace kiln {

// `inputs` in binding order (Graph::inputs()); shapes and dtypes must match.
// Returns the graph outputs in the document's order.
Expected<std::vector<HostTensor>> run_reference(const Graph& graph,
                                                const std::vector<HostTensor>& inputs);

// The most host memory run_reference holds at once for `graph` (its copies
// of the inputs, then each result while its operands are alive), in bytes:
// what a caller adds to its own buffers before deciding the run fits.
int64_t reference_host_bytes(const Graph& graph);

}  // namespace kiln
