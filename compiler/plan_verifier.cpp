#include "compiler/plan_verifier.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace kiln::ir {
namespace {

// A kernel holding rows: its reductions reduce the last axes of its domain,
// and what it computes from them lies on the domain or on the rows.
std::string verify_held_rows(const Graph& g, const PlannedKernel& k) {
  const KernelParams& p = k.params;
  const int64_t count = element_count(p.domain), rows = p.outer;
  if (p.inner != 1 || rows * p.reduced != count)
    return fmt::format("kernel {} holds rows but its domain {} is not [rows={}, {}]", k.id, to_string(p.domain), rows, p.reduced);
  std::set<TensorId> after;
  for (int32_t oi : k.ops) {
    const Op& op = g.ops[static_cast<size_t>(oi)];
    const int64_t n = element_count(g.result(op).shape);
    if (op_info(op.kind).family == OpFamily::Reduce) {
      const Shape& in = g.operand(op, 0).shape;
      const auto kept = static_cast<int64_t>(in.size() - op.attrs.axes.size());
      bool trailing = in == p.domain;
      for (size_t i = 0; i < op.attrs.axes.size(); ++i) trailing = trailing && op.attrs.axes[i] == kept + static_cast<int64_t>(i);
      if (!trailing) return fmt::format("kernel {} holds rows but {} does not reduce its rows", k.id, g.describe(oi));
      after.insert(op.output);
      continue;
    }
    const bool reads_after = std::any_of(op.inputs.begin(), op.inputs.end(), [&](TensorId t) { return after.count(t) > 0; });
    if (!reads_after) continue;
    if (n != count && n != rows)
      return fmt::format("kernel {} holds rows but {} has {} elements, neither the domain's {} nor the rows' {}", k.id,
                         g.describe(oi), n, count, rows);
    after.insert(op.output);
  }
  return {};
}

}  // namespace

std::string verify_plan(const Graph& g, const Plan& plan) {
  std::vector<int> times_computed(g.ops.size(), 0), times_recomputed(g.ops.size(), 0);
  std::vector<int> written_by(g.tensors.size(), -1);
  std::vector<bool> available(g.tensors.size(), false);
  for (TensorId id : g.inputs) available[static_cast<size_t>(id)] = true;
  for (const PlannedKernel& k : plan.kernels) {
    std::vector<bool> in_kernel(g.ops.size(), false);
    for (int32_t oi : k.ops) {
      if (oi < 0 || static_cast<size_t>(oi) >= g.ops.size()) return fmt::format("kernel {}: bad op index {}", k.id, oi);
      in_kernel[static_cast<size_t>(oi)] = true;
      ++times_computed[static_cast<size_t>(oi)];
    }
    for (int32_t oi : k.recomputed) ++times_recomputed[static_cast<size_t>(oi)];
    if (!std::is_sorted(k.ops.begin(), k.ops.end())) return fmt::format("kernel {}: ops out of order", k.id);
    if (k.params.holds_rows)
      if (std::string problem = verify_held_rows(g, k); !problem.empty()) return problem;
    for (TensorId t : k.reads)
      if (!available[static_cast<size_t>(t)])
        return fmt::format("kernel {} reads '{}' before any kernel writes it", k.id, g.tensor(t).name);
    for (int32_t oi : k.ops)  // every operand is computed here or read
      for (TensorId t : g.ops[static_cast<size_t>(oi)].inputs) {
        const Tensor& tensor = g.tensor(t);
        const bool here = tensor.kind == TensorKind::OpResult && in_kernel[static_cast<size_t>(tensor.producer)];
        const bool read = std::find(k.reads.begin(), k.reads.end(), t) != k.reads.end();
        if (tensor.kind != TensorKind::Constant && !here && !read)
          return fmt::format("kernel {}: {} needs '{}', which it neither computes nor reads", k.id,
                             g.describe(oi), tensor.name);
      }
    for (TensorId t : k.writes) {
      const Tensor& tensor = g.tensor(t);
      if (tensor.kind != TensorKind::OpResult || !in_kernel[static_cast<size_t>(tensor.producer)])
        return fmt::format("kernel {} writes '{}', which it does not compute", k.id, tensor.name);
      if (written_by[static_cast<size_t>(t)] >= 0)
        return fmt::format("'{}' is written by kernels {} and {}", tensor.name, written_by[static_cast<size_t>(t)], k.id);
      written_by[static_cast<size_t>(t)] = k.id;
      available[static_cast<size_t>(t)] = true;
    }
  }
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const bool view = op_info(g.ops[i].kind).family == OpFamily::View;
    if (times_computed[i] == 0 && !(view && !g.result(g.ops[i]).is_output))
      return fmt::format("{} is in no kernel", g.describe(static_cast<int32_t>(i)));
    if (times_computed[i] > 1 && !view && times_recomputed[i] < times_computed[i])
      return fmt::format("{} is computed by {} kernels without being marked as recomputed",
                         g.describe(static_cast<int32_t>(i)), times_computed[i]);
  }
  for (TensorId id : g.outputs) {
    const Tensor& t = g.tensor(id);
    if (t.kind == TensorKind::OpResult && written_by[static_cast<size_t>(id)] < 0)
      return fmt::format("graph output '{}' is written by no kernel", t.name);
  }
  return {};
}

}  // namespace kiln::ir
