#include "compiler/memory_budget.h"
#include "compiler/plan_printer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "compiler/error.h"
#include "compiler/graph_hash.h"
#include "compiler/rewrite_table.h"

namespace kiln::ir {
namespace {

std::vector<std::string> op_names(const Graph& g, const std::vector<int32_t>& ops) {
  std::vector<std::string> out;
  for (int32_t oi : ops) out.push_back(g.result(g.ops[static_cast<size_t>(oi)]).name);
  return out;
}

std::vector<std::string> tensor_names(const Graph& g, const std::vector<TensorId>& ids) {
  std::vector<std::string> out;
  for (TensorId id : ids) out.push_back(g.tensor(id).name);
  return out;
}

}  // namespace

std::string plan_to_text(const Graph& g, const Plan& plan, const PlanTactics& tactics) {
  const int64_t moved = bytes_through_memory(g, plan);
  std::string out = fmt::format("plan for {}: {} ops in {} kernel{}{}, {} through device memory\n",
                                detail::quoted(g.name), g.ops.size(), plan.kernels.size(),
                                plan.kernels.size() == 1 ? "" : "s", plan.fused ? "" : " (fusion off)",
                                human_bytes(moved));
  out += rewrite_notes_text(g);
  for (const PlannedKernel& k : plan.kernels) {
    out += fmt::format("\nkernel {}: {}", k.id, to_string(k.kind));
    if (k.anchor >= 0) out += fmt::format(", anchor {}", g.result(g.ops[static_cast<size_t>(k.anchor)]).name);
    out += "\n";
    out += fmt::format("  ops: {}\n", fmt::join(op_names(g, k.ops), ", "));
    if (!k.recomputed.empty())
      out += fmt::format("  recomputed (also in another kernel): {}\n", fmt::join(op_names(g, k.recomputed), ", "));
    out += fmt::format("  reads: {}\n", fmt::join(tensor_names(g, k.reads), ", "));
    out += fmt::format("  writes: {}\n", fmt::join(tensor_names(g, k.writes), ", "));
    if (!k.workspace.empty()) out += fmt::format("  workspace: {}\n", fmt::join(k.workspace, ", "));
    out += fmt::format("  params: {}\n", k.params.to_string(k.kind));
    for (const std::string& note : k.notes) out += fmt::format("  note: {}\n", note);
    for (const Boundary& b : plan.boundaries)
      if (b.to_kernel == k.id)
        out += fmt::format("  boundary: '{}' ({}) from kernel {}: {}\n", g.tensor(b.tensor).name,
                           human_bytes(materialised_bytes(g.tensor(b.tensor))), b.from_kernel, b.reason);
    if (const auto t = tactics.find(k.id); t != tactics.end()) {
      out += fmt::format("  tactic for {}: {}\n", t->second.arch, t->second.chosen);
      for (const auto& [tactic, why] : t->second.rejected) out += fmt::format("  rejected {}: {}\n", tactic, why);
    }
  }
  return out;
}

std::string plan_to_json(const Graph& g, const Plan& plan, const PlanTactics& tactics) {
  using json = nlohmann::ordered_json;
  json doc;
  doc["graph"] = g.name;
  doc["graph_hash"] = graph_hash(g).hex();
  json kernels = json::array();
  for (const PlannedKernel& k : plan.kernels) {
    json entry;
    entry["id"] = k.id;
    // cli.md's kinds are a closed list: a kernel kind of kiln's own beyond them
    // is named by the contract's kind it specialises, and by itself beside it.
    const KernelKind contract = k.kind == KernelKind::DepthwiseConv ? KernelKind::Conv : k.kind;
    entry["kind"] = std::string(to_string(contract));
    if (contract != k.kind) entry["kernel_kind"] = std::string(to_string(k.kind));
    entry["anchor"] = k.anchor >= 0 ? json(g.result(g.ops[static_cast<size_t>(k.anchor)]).name) : json(nullptr);
    entry["ops"] = op_names(g, k.ops);
    entry["reads"] = tensor_names(g, k.reads);
    entry["writes"] = tensor_names(g, k.writes);
    if (const auto t = tactics.find(k.id); t != tactics.end()) {
      json rejected = json::array();
      for (const auto& [tactic, why] : t->second.rejected) rejected.push_back({{"tactic", tactic}, {"reason", why}});
      entry["tactic"] = {{"arch", t->second.arch}, {"chosen", t->second.chosen}, {"rejected", std::move(rejected)}};
    }
    kernels.push_back(std::move(entry));
  }
  doc["kernels"] = std::move(kernels);
  return doc.dump(2) + "\n";
}

std::string plan_to_dot(const Graph& g, const Plan& plan) {
  // Node ids are generated ("t<id>"); user names appear only inside quoted,
  // escaped labels.
  auto label = [](const std::string& text) { return nlohmann::json(text).dump(); };
  std::string out = fmt::format("digraph plan {{\n  label={};\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n",
                                label("plan for " + g.name));
  std::vector<int> kernel_of_tensor(g.tensors.size(), -1);
  for (const PlannedKernel& k : plan.kernels)
    for (int32_t oi : k.ops)
      if (kernel_of_tensor[static_cast<size_t>(g.ops[static_cast<size_t>(oi)].output)] < 0)
        kernel_of_tensor[static_cast<size_t>(g.ops[static_cast<size_t>(oi)].output)] = k.id;
  for (const PlannedKernel& k : plan.kernels) {
    out += fmt::format("  subgraph cluster_k{} {{\n    label={};\n    style=rounded;\n", k.id,
                       label(fmt::format("kernel {} ({})", k.id, to_string(k.kind))));
    for (int32_t oi : k.ops) {
      const Op& op = g.ops[static_cast<size_t>(oi)];
      if (kernel_of_tensor[static_cast<size_t>(op.output)] != k.id) continue;
      const bool anchor = oi == k.anchor;
      out += fmt::format("    t{} [label={}{}];\n", op.output,
                         label(fmt::format("{} = {}", g.result(op).name, op_name(op.kind))),
                         anchor ? ", style=filled, fillcolor=\"#ffd27f\"" : "");
    }
    out += "  }\n";
  }
  for (TensorId id : g.inputs)
    out += fmt::format("  t{} [label={}, shape=ellipse];\n", id, label(g.tensor(id).name));
  // Edges: inside a kernel plain; across device memory labelled with bytes.
  for (const PlannedKernel& k : plan.kernels)
    for (int32_t oi : k.ops) {
      const Op& op = g.ops[static_cast<size_t>(oi)];
      if (kernel_of_tensor[static_cast<size_t>(op.output)] != k.id) continue;
      for (TensorId in : op.inputs) {
        const Tensor& t = g.tensor(in);
        if (t.kind == TensorKind::Constant) continue;
        const bool crosses = t.kind == TensorKind::Input || kernel_of_tensor[static_cast<size_t>(in)] != k.id;
        if (crosses)
          out += fmt::format("  t{} -> t{} [label={}, color=\"#c0392b\"];\n", in, op.output,
                             label(human_bytes(materialised_bytes(t))));
        else
          out += fmt::format("  t{} -> t{};\n", in, op.output);
      }
    }
  for (TensorId id : g.outputs)
    out += fmt::format("  out{} [label={}, shape=ellipse, style=bold];\n  t{} -> out{};\n", id,
                       label(g.tensor(id).name + " (output)"), id, id);
  out += "}\n";
  return out;
}

}  // namespace kiln::ir
