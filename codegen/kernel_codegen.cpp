#include "codegen/kernel_codegen.h"

#include "codegen/generator_registry.h"

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

GeneratedProgram generate_program(const ir::Graph& g, const ir::Plan& plan, int sm, const ProgramTuning& tuning) {
  ProgramState state;
  for (const ir::PlannedKernel& k : plan.kernels) {
    if (k.writes.empty() && k.workspace.empty()) continue;  // computes nothing anyone reads
    const auto wanted = tuning.find(k.id);
    const Tuning requested = wanted == tuning.end() ? Tuning{} : wanted->second;
    state.program.kernels.push_back(generator_for(k.kind).generate({g, k, state, sm, requested}));
    for (ir::TensorId t : k.writes)
      if (!g.tensor(t).is_output) state.program.intermediates.push_back(t);
  }
  return std::move(state.program);
}

}  // namespace kiln::codegen
