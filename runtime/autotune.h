// Autotuning: `kiln compile --autotune`, CompileOptions::autotune.
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
// (tuning_record.h), and the returned Executable is built with them; its
// report lists the trials. Fails with CompileOrDevice without a GPU of the
// arch.
#pragma once

#include "codegen/kernel_codegen.h"
#include "codegen/tuning.h"
#include "compiler/graph_hash.h"
#include "compiler/plan.h"
#include "kiln/executable.h"
#include "runtime/pipeline.h"

namespace kiln {

namespace runtime {

Expected<Executable> autotune(const Graph& graph, const CompileOptions& options);

// The choices recorded for a program in the cache at `cache_dir` (empty
// when none or the cache is unusable), remembered by this process;
// remember_tuning() replaces them (after an autotuning run).
codegen::ProgramTuning recorded_tuning(const std::string& cache_dir, const ir::Hash128& program_key);
void remember_tuning(const std::string& cache_dir, const ir::Hash128& program_key, const codegen::ProgramTuning& tuning);
// Forgets what this process read, so that the next compile reads the
// records again (after another process autotuned).
void forget_recorded_tunings();

}  // namespace runtime
}  // namespace kiln
