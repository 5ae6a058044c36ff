// The reference interpreter: the CPU oracle every GPU result is checked
// against. It follows graph-format.md's numerics exactly (f32 arithmetic,
// sums accumulated in f64, rounding to f16/bf16 only where the graph says).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/graph.h"
#include "kiln/host_tensor.h"

namespace kiln {

// `inputs` in binding order (Graph::inputs()); shapes and dtypes must match.
// Returns the graph outputs in the document's order.
Expected<std::vector<HostTensor>> run_reference(const Graph& graph,
                                                const std::vector<HostTensor>& inputs);

// Where a reference run stands, reported after each op and, within matmul,
// conv and attention, after each output row: ops finished of all, and the
// share of the graph's estimated work done (anchors weighed by their flops,
// other ops by the elements they touch), rising to 1 at the last op.
struct ReferenceProgress {
  size_t ops_done = 0;
  size_t op_count = 0;
  double work_done = 0;
};
// The same, calling `on_op` as above (on the calling thread). With
// `cancel`, the run stops soon after it is set (from any thread, or a signal
// handler): it is read before each op and, within matmul, conv and attention,
// before each output row; the run then returns an ErrorCode::Interrupted error.
Expected<std::vector<HostTensor>> run_reference(const Graph& graph, const std::vector<HostTensor>& inputs,
                                                const std::function<void(const ReferenceProgress&)>& on_op,
                                                const std::atomic<bool>* cancel = nullptr);

// The most host memory run_reference holds at once for `graph` (its copies
// of the inputs, then each result while its operands are alive), in bytes:
// what a caller adds to its own buffers before deciding the run fits.
int64_t reference_host_bytes(const Graph& graph);

}  // namespace kiln
