// The reference interpreter (include/kiln/reference.h): evaluates ops in
// order, rounds each result where numerics rule 2 says, and frees each
// intermediate after its last reader.
#include <algorithm>
#include <optional>

#include "compiler/graph_internal.h"
#include "compiler/error.h"
#include "compiler/ir_printer.h"
#include "compiler/memory_budget.h"
#include "compiler/numerics.h"
#include "compiler/op_work.h"
#include "compiler/reference/evaluate.h"
#include "kiln/reference.h"

namespace kiln {

namespace reference {
void stop_if_cancelled(const std::atomic<bool>* cancel) {
  if (cancel && cancel->load(std::memory_order_relaxed))
    throw_user_error("the reference interpreter was interrupted", ErrorCode::Interrupted);
}
}  // namespace reference

namespace {

using reference::Value;

std::vector<float> evaluate(const ir::Graph& g, const ir::Op& op, const reference::Operands& in,
                            const reference::OpProgress& progress) {
  const Shape& shape = g.result(op).shape;
  switch (ir::op_info(op.kind).family) {
    case ir::OpFamily::Unary:
    case ir::OpFamily::Binary:
    case ir::OpFamily::Compare:
    case ir::OpFamily::Select: return reference::eval_pointwise(op, shape, in);
    case ir::OpFamily::Reduce: return reference::eval_reduce(op, shape, in);
    case ir::OpFamily::Norm: return reference::eval_norm(op, in);
    case ir::OpFamily::Matmul: return reference::eval_matmul(g, op, shape, in, progress);
    case ir::OpFamily::Conv: return reference::eval_conv(g, op, shape, in, progress);
    case ir::OpFamily::Pool: return reference::eval_pool(op, shape, in);
    case ir::OpFamily::View: return reference::eval_view(op, shape, in);
    case ir::OpFamily::Attention: return reference::eval_sdpa(g, op, in, progress);
    case ir::OpFamily::Concat: return reference::eval_concat(op, shape, in);
  }
  KILN_UNREACHABLE("unknown op family");
}

// The most host memory the interpretation holds at once (its copies of the
// inputs, then each result while its operands are alive), and the tensor
// being computed then.
std::pair<int64_t, ir::TensorId> peak_bytes(const ir::Graph& g) {
  std::vector<size_t> readers_left(g.tensors.size());
  for (size_t id = 0; id < g.tensors.size(); ++id) readers_left[id] = g.users[id].size();
  auto bytes = [&](ir::TensorId id) { return element_count(g.tensor(id).shape) * int64_t{sizeof(float)}; };
  int64_t live = 0;
  for (ir::TensorId id : g.inputs) live += bytes(id);
  std::pair<int64_t, ir::TensorId> peak{live, g.inputs.empty() ? -1 : g.inputs.front()};
  for (const ir::Op& op : g.ops) {
    live += bytes(op.output);
    if (live > peak.first) peak = {live, op.output};
    std::vector<ir::TensorId> read(op.inputs);
    std::sort(read.begin(), read.end());
    read.erase(std::unique(read.begin(), read.end()), read.end());
    for (ir::TensorId id : read)
      if (--readers_left[static_cast<size_t>(id)] == 0 && !g.tensor(id).is_output &&
          g.tensor(id).kind != ir::TensorKind::Constant)
        live -= bytes(id);
  }
  return peak;
}

std::vector<HostTensor> interpret(const ir::Graph& g, const std::vector<HostTensor>& inputs,
                                  const std::function<void(const ReferenceProgress&)>& on_op,
                                  const std::atomic<bool>* cancel) {
  if (const auto [peak, at] = peak_bytes(g); at >= 0)
    require_host_memory(peak, fmt::format("the reference interpreter (at '{}', {})", g.tensor(at).name,
                                          ir::type_string(g.tensor(at))));
  KILN_USER_CHECK(inputs.size() == g.inputs.size(), "the graph has {} inputs but {} were given",
                  g.inputs.size(), inputs.size());
  std::vector<std::optional<Value>> values(g.tensors.size());
  std::vector<size_t> readers_left(g.tensors.size());
  for (size_t id = 0; id < g.tensors.size(); ++id) readers_left[id] = g.users[id].size();

  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const ir::Tensor& t = g.tensor(g.inputs[i]);
    const HostTensor& given = inputs[i];
    KILN_USER_CHECK(given.shape == t.shape && given.dtype == t.dtype,
                    "input '{}': expected {}, got {}{}", t.name, ir::type_string(t),
                    to_string(given.dtype), to_string(given.shape));
    KILN_USER_CHECK(given.values.size() == static_cast<size_t>(element_count(t.shape)),
                    "input '{}': {} values for shape {}", t.name, given.values.size(), to_string(t.shape));
    Value v{t.shape, given.values};
    for (float& x : v.data) x = round_to(t.dtype, x);
    values[static_cast<size_t>(g.inputs[i])] = std::move(v);
  }
  for (size_t id = 0; id < g.tensors.size(); ++id)
    if (g.tensors[id].kind == ir::TensorKind::Constant) values[id] = Value{{}, {g.tensors[id].constant}};

  std::vector<double> op_work;  // each op's estimated work, for the progress reports
  double total_work = 0, work = 0;
  if (on_op)
    for (const ir::Op& op : g.ops) total_work += op_work.emplace_back(static_cast<double>(ir::estimated_work(g, op)));
  ReferenceProgress progress{.ops_done = 0, .op_count = g.ops.size(), .work_done = 0};

  for (const ir::Op& op : g.ops) {
    reference::stop_if_cancelled(cancel);
    reference::Operands operands;
    for (ir::TensorId id : op.inputs) operands.push_back(&*values[static_cast<size_t>(id)]);
    const ir::Tensor& result = g.result(op);
    const double this_work = on_op ? op_work[progress.ops_done] : 0;
    reference::OpProgress within;
    if (on_op || cancel)
      within = reference::OpProgress(on_op ? std::function<void(double)>([&](double share) {
        progress.work_done = std::min((work + share * this_work) / std::max(total_work, 1.0), 1.0);
        on_op(progress);
      }) : nullptr, cancel);
    Value out{result.shape, evaluate(g, op, operands, within)};
    KILN_INTERNAL_CHECK(out.data.size() == static_cast<size_t>(element_count(result.shape)));
    if (result.rounded)
      for (float& x : out.data) x = round_to(result.dtype, x);
    values[static_cast<size_t>(op.output)] = std::move(out);
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const ir::TensorId id = op.inputs[i];
      if (std::find(op.inputs.begin(), op.inputs.begin() + static_cast<ptrdiff_t>(i), id) !=
          op.inputs.begin() + static_cast<ptrdiff_t>(i))
        continue;  // `users` counts an op once however many operands it reads
      const auto slot = static_cast<size_t>(id);
      if (--readers_left[slot] == 0 && !g.tensor(id).is_output) values[slot].reset();
    }
    if (on_op) {
      work += this_work;
      ++progress.ops_done;
      progress.work_done = progress.ops_done == g.ops.size() ? 1.0 : std::min(work / std::max(total_work, 1.0), 1.0);
      on_op(progress);
    }
  }

  std::vector<HostTensor> outputs;
  for (ir::TensorId id : g.outputs) {
    const ir::Tensor& t = g.tensor(id);
    outputs.push_back(HostTensor{t.shape, t.dtype, values[static_cast<size_t>(id)]->data});
  }
  return outputs;
}

}  // namespace

int64_t reference_host_bytes(const Graph& graph) { return peak_bytes(ir_of(graph)).first; }

Expected<std::vector<HostTensor>> run_reference(const Graph& graph, const std::vector<HostTensor>& inputs) {
  return run_reference(graph, inputs, nullptr);
}

Expected<std::vector<HostTensor>> run_reference(const Graph& graph, const std::vector<HostTensor>& inputs,
                                                const std::function<void(const ReferenceProgress&)>& on_op,
                                                const std::atomic<bool>* cancel) {
  if (graph.is_symbolic()) {  // the sizes come from the inputs' shapes
    std::vector<Shape> shapes;
    for (const HostTensor& t : inputs) shapes.push_back(t.shape);
    Expected<Graph::DimValues> sizes = graph.dims_from_shapes(shapes);
    if (!sizes) return sizes.error();
    Expected<Graph> sized = graph.specialize(*sizes);
    if (!sized) return sized.error();
    return run_reference(*sized, inputs, on_op, cancel);
  }
  return detail::catch_errors([&] { return interpret(ir_of(graph), inputs, on_op, cancel); });
}

}  // namespace kiln
