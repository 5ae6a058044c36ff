#include "codegen/kernel_codegen.h"

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
    if (k.tactics.empty()) continue;
    ir::KernelTactics& t = out[k.plan_kernel];
    t.arch = arch;
    t.chosen = k.tactics.chosen;
    for (const TacticRecord::Rejected& r : k.tactics.rejected) t.rejected.emplace_back(r.tactic, r.reason);
  }
  return out;
}

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
    state.program.kernels.push_back(generator_for(k.kind).generate({g, k, state, sm, requested}));
    for (ir::TensorId t : k.writes)
      if (!g.tensor(t).is_output) state.program.intermediates.push_back(t);
  }
  return std::move(state.program);
}

}  // namespace kiln::codegen
