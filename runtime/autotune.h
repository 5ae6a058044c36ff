// Autotuning: `kiln compile --autotune`, CompileOptions::autotune. A step
// before the pipeline's compile: it asks the pipeline for each kernel's
// alternatives and for the candidates' executables, times them, records the
// winners, and returns them; the caller compiles with them (Executable::compile).
//
// Expects: a graph and options whose arch is the GPU present's.
// Guarantees: every kernel whose generator offers alternatives
// (GeneratedKernel::tuning_space: tile width, cluster shape, tile order, K
// split) is tried with each of them, one kernel at a time with the others
// at their best so far. Each candidate is the whole graph, compiled (in
// parallel; the kernel cache keeps every one) and timed on one set of
// device buffers (bench.h) in 5 interleaved rounds, so that a GPU clocking
// down as it warms slows all candidates alike; a candidate's time is the
// median of its rounds. The heuristic's choice stays unless another is at
// least 1% faster. The winners and every trial are recorded in the cache
// (tuning_record.h). Fails with CompileOrDevice without a GPU of the arch.
#pragma once

#include <string>
#include <vector>

#include "codegen/tuning.h"
#include "kiln/executable.h"
#include "runtime/tuning_record.h"

namespace kiln::runtime {

struct TunedProgram {
  std::string arch;               // the GPU's, which the choices were measured on
  codegen::ProgramTuning choice;  // the winners, by plan kernel
  std::vector<MeasuredTrial> trials;
};

Expected<TunedProgram> autotune(const Graph& graph, const CompileOptions& options);

}  // namespace kiln::runtime
