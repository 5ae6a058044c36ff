// The rewritten graph against the graph before it (rewrite_check.h).
#include "compiler/rewrite_check.h"

#include <fmt/format.h>

#include "compiler/error.h"
#include "compiler/shape_inference.h"

namespace kiln::ir {
namespace {

std::string same_inputs_and_outputs(const Graph& before, const Graph& after) {
  if (after.inputs != before.inputs) return "the inputs changed";
  for (TensorId id : before.inputs) {
    const Tensor &a = before.tensor(id), &b = after.tensor(id);
    if (b.kind != TensorKind::Input || a.name != b.name || a.shape != b.shape || a.strides != b.strides || a.dtype != b.dtype)
      return fmt::format("input {} changed", detail::quoted(a.name));
  }
  if (after.outputs != before.outputs) return "the outputs changed (ids or order)";
  for (TensorId id : before.outputs) {
    const Tensor &a = before.tensor(id), &b = after.tensor(id);
    if (a.shape != b.shape || a.dtype != b.dtype || a.value_dtype() != b.value_dtype() || !b.is_output)
      return fmt::format("output {} changed: {}{} ({} values) became {}{} ({} values)", detail::quoted(a.name),
                         to_string(a.dtype), to_string(a.shape), to_string(a.value_dtype()), to_string(b.dtype),
                         to_string(b.shape), to_string(b.value_dtype()));
  }
  return {};
}

std::string evaluation_order(const Graph& g) {
  std::vector<bool> made(g.tensors.size(), false);
  for (size_t t = 0; t < g.tensors.size(); ++t) made[t] = g.tensors[t].kind != TensorKind::OpResult;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    for (TensorId in : op.inputs)
      if (in < 0 || static_cast<size_t>(in) >= g.tensors.size() || !made[static_cast<size_t>(in)])
        return fmt::format("{} reads a tensor no earlier op makes (id {})", g.describe(static_cast<int32_t>(i)), in);
    if (op.output < 0 || static_cast<size_t>(op.output) >= g.tensors.size() || made[static_cast<size_t>(op.output)])
      return fmt::format("op {} writes a tensor made before it (id {})", i, op.output);
    if (g.tensor(op.output).producer != static_cast<int32_t>(i) || g.tensor(op.output).kind != TensorKind::OpResult)
      return fmt::format("{}: its result does not name it as its producer", g.describe(static_cast<int32_t>(i)));
    made[static_cast<size_t>(op.output)] = true;
  }
  for (TensorId t : g.outputs)
    if (!made[static_cast<size_t>(t)]) return fmt::format("output {} is not made", detail::quoted(g.tensor(t).name));
  Graph indexed;
  indexed.tensors = g.tensors;
  indexed.ops = g.ops;
  indexed.index_users();
  if (indexed.users != g.users) return "the users index is stale";
  return {};
}

// Bool values only where graph-format.md rule 3 lets them be read.
bool reads_bool_legally(const Op& op, size_t slot) {
  const OpFamily family = op_info(op.kind).family;
  return (family == OpFamily::Select && slot == 0) || op.kind == OpKind::Cast || (op.kind == OpKind::Sdpa && slot == 3) ||
         family == OpFamily::View || family == OpFamily::Concat;
}

std::string op_problem(const Graph& g, int32_t index) {
  const Op& op = g.ops[static_cast<size_t>(index)];
  std::vector<const Tensor*> operands;
  for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
    const Tensor& t = g.tensor(op.inputs[slot]);
    operands.push_back(&t);
    if (t.dtype == DType::boolean && !reads_bool_legally(op, slot))
      return fmt::format("{} reads bool {} as input {}", g.describe(index), describe_tensor(t), slot);
  }
  Attributes attrs = op.attrs;
  try {
    const InferredResult inferred = infer_result(op.kind, operands, attrs, ~AttrSet{0}, g.describe(index));
    if (inferred.shape != g.result(op).shape)
      return fmt::format("{} makes {} where shape inference gives {}", g.describe(index), to_string(g.result(op).shape),
                         to_string(inferred.shape));
  } catch (const detail::UserError& e) {
    return e.what();
  }
  return {};
}

}  // namespace

std::string rewritten_graph_problem(const Graph& before, const Graph& after) {
  if (std::string p = same_inputs_and_outputs(before, after); !p.empty()) return p;
  if (std::string p = evaluation_order(after); !p.empty()) return p;
  for (size_t i = 0; i < after.ops.size(); ++i)
    if (std::string p = op_problem(after, static_cast<int32_t>(i)); !p.empty()) return p;
  return {};
}

}  // namespace kiln::ir
