// The kernel generators, one per kernel kind of the plan.
//
// Expects: a verified plan's kernel and the program state its kernels share.
// Guarantees: generator_for(kind) is the one generator of every kind in
// compiler/kernel_kinds.def (checked at build time): it builds the kernel's
// generator class (a KernelBuilder of its own kind), lets it decide and
// write, and returns the kernel. Adding a kernel kind touches its line in
// kernel_kinds.def, the planner's strategy for it, its generator (a header
// and a source file), its template, and its entry here.
#pragma once

#include "codegen/kernel_builder.h"

namespace kiln::codegen {

struct GeneratorInput {
  const ir::Graph& graph;
  const ir::PlannedKernel& kernel;
  ProgramState& state;
  int sm;
  Tuning wanted;  // requested choices (empty: the heuristic's)
};

struct KernelGenerator {
  ir::KernelKind kind;
  const char* what;  // the kernels it makes, in words
  GeneratedKernel (*generate)(const GeneratorInput&);
};

const KernelGenerator& generator_for(ir::KernelKind kind);

}  // namespace kiln::codegen
