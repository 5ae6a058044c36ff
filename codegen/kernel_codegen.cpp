#include "codegen/kernel_codegen.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "codegen/generator_registry.h"
#include "codegen/size_text.h"

namespace kiln::codegen {

int sm_of(const std::string& arch) {
  int sm = 0;
  for (char c : arch)
    if (c >= '0' && c <= '9') sm = sm * 10 + (c - '0');
  return sm;
}

DType storage_dtype(const ir::Tensor& t) {
  if (t.kind == ir::TensorKind::Input) return t.dtype;
  return t.value_dtype();
}

namespace {

// The kernels whose generators spell every size through SizeText (this
// slice of one compile for every size): pointwise, copies, normalisations,
// row reductions (held rows included), matmuls and attention, without
// workspaces. (The generators refuse their other paths themselves: the
// reduction generator column reductions, pools, row statistics and
// symbolic reduced extents; of the matmul and attention kernels only the
// Hopper kernels spell their sizes so (matmul: a symbolic M; attention: a
// symbolic batch and sequence), and the others' sources differ between the
// two probes, which refuses them.)
void check_symbolic_scope(const ir::PlannedKernel& k) {
  const bool covered = k.kind == ir::KernelKind::Pointwise || k.kind == ir::KernelKind::Copy ||
                       k.kind == ir::KernelKind::Norm || k.kind == ir::KernelKind::Reduction ||
                       k.kind == ir::KernelKind::Matmul || k.kind == ir::KernelKind::Attention ||
                       k.kind == ir::KernelKind::Conv || k.kind == ir::KernelKind::DepthwiseConv;
  if (!covered)
    throw NotSymbolic(fmt::format("kernel {} is a {} kernel; symbolic kernels cover pointwise, copy, norm, row "
                                  "reduction, matmul, conv and attention kernels so far",
                                  k.id, ir::to_string(k.kind)));
  if (!k.workspace.empty())
    throw NotSymbolic(fmt::format("kernel {} uses a workspace ({}); symbolic kernels have none so far", k.id,
                                  fmt::join(k.workspace, ", ")));
}

}  // namespace

ir::PlanTactics plan_tactics(const GeneratedProgram& program, const std::string& arch) {
  ir::PlanTactics out;
  for (const GeneratedKernel& k : program.kernels) {
    if (k.tactics.empty() || k.when) continue;  // (a size bucket's variant: its plan kernel's last says it)
    ir::KernelTactics& t = out[k.plan_kernel];
    t.arch = arch;
    t.chosen = k.tactics.chosen;
    for (const TacticRecord::Rejected& r : k.tactics.rejected) t.rejected.emplace_back(r.tactic, r.reason);
  }
  return out;
}

std::vector<uint8_t> kernels_run_at(const std::vector<GeneratedKernel>& kernels, const ir::DimValues& values) {
  std::set<int> found;
  std::vector<uint8_t> runs;
  for (const GeneratedKernel& k : kernels) {
    const bool run = !found.count(k.plan_kernel) && (!k.when || k.when->holds(values));
    if (run) found.insert(k.plan_kernel);
    runs.push_back(run);
  }
  return runs;
}

bool SizeCondition::holds(const ir::DimValues& values) const {
  const int64_t v = ir::evaluate(extent, values);
  return std::ranges::any_of(ranges, [v](const auto& r) { return r.first <= v && v <= r.second; });
}

std::string SizeCondition::to_string() const {
  std::vector<std::string> parts;
  for (const auto& [lo, hi] : ranges) parts.push_back(lo == hi ? std::to_string(lo) : fmt::format("{}..{}", lo, hi));
  return fmt::format("{} in {}", ir::to_string(extent), fmt::join(parts, ", "));
}

namespace {

// A size bucket of kernel k (GeneratedKernel::other_sizes): the tiles the heuristic takes at those
// sizes, built as a variant run there; nullopt where that build is not what was asked for, or
// uses a workspace (one named slot serves every variant of a kernel: its size is the first's).
std::optional<GeneratedKernel> size_bucket_variant(const ir::Graph& g, const ir::PlannedKernel& k, ProgramState& state, int sm,
                                                   const GeneratedKernel& kernel, const Tuning& other, const SizeCondition& where) {
  const size_t workspaces = state.program.workspaces.size();
  GeneratedKernel variant = generator_for(k.kind).generate({g, k, state, sm, other});
  const bool uses_workspace =
      std::ranges::any_of(variant.args, [](const KernelArg& a) { return a.role == KernelArg::Role::Workspace; });
  // (its generator may settle what the tuning left open, a field asked as 0: the epilogue's loop,
  // an attention's key tiles; asked for rows of its tiles, another tactic may build it: an
  // attention's flash kernel beside flash decoding)
  const auto settled = [](int asked, int got) { return asked == 0 || asked == got; };
  const bool as_asked = settled(other.tile_n, variant.tuning.tile_n) && variant.tuning.tile_m == other.tile_m &&
                        settled(other.cluster, variant.tuning.cluster) &&
                        (variant.tactics.chosen == kernel.tactics.chosen || other.tile_m != 0);
  if (!as_asked || uses_workspace || state.program.workspaces.size() != workspaces) return std::nullopt;
  variant.other_sizes.clear();
  variant.when = where;
  variant.decisions = fmt::format("where {}: {}", variant.when->to_string(), variant.decisions);
  variant.source = fmt::format("// a size bucket's variant ({}): launched where {}, kernel {}'s other build elsewhere\n{}",
                               variant.tuning.to_string(), variant.when->to_string(), k.id, variant.source);
  return variant;
}

}  // namespace

GeneratedProgram generate_program(const ir::Graph& g, const ir::Plan& plan, int sm, const ProgramTuning& tuning,
                                  const ir::SizeProbe* probe, const VendorLibraries& vendors) {
  ProgramState state;
  state.probe = probe;
  state.vendors = vendors;
  for (const ir::PlannedKernel& k : plan.kernels) {
    if (k.writes.empty() && k.workspace.empty()) continue;  // computes nothing anyone reads
    if (probe) check_symbolic_scope(k);
    const auto wanted = tuning.find(k.id);
    const Tuning requested = wanted == tuning.end() ? Tuning{} : wanted->second;
    GeneratedKernel kernel = generator_for(k.kind).generate({g, k, state, sm, requested});
    if (wanted == tuning.end())  // (a recorded tuning is the kernel's at every size)
      for (const auto& [other, where] : kernel.other_sizes)
        if (std::optional<GeneratedKernel> variant = size_bucket_variant(g, k, state, sm, kernel, other, where))
          state.program.kernels.push_back(std::move(*variant));
    kernel.other_sizes.clear();
    state.program.kernels.push_back(std::move(kernel));
    for (ir::TensorId t : k.writes)
      if (!g.tensor(t).is_output) state.program.intermediates.push_back(t);
  }
  return std::move(state.program);
}

}  // namespace kiln::codegen
