// The compiler's pipeline, and the compile around it.
//
// run_pipeline() is the one way from a graph to kernels: graph -> plan ->
// verified plan -> CUDA C++, for one target. Every entry point goes through
// it (Executable::compile and autotune below; `kiln plan`, `dump`, `warm`,
// `cache explain`; the Python module), with the target that
// compile_target() resolves, so what they show and build is what runs.
//
// compile_program() wraps the pipeline in this process's memory, the disk
// cache's recipes and cubins, and NVRTC.
// It expects: a constructed graph and the options of one compile.
// It guarantees: an Executable::Impl whose every kernel has a cubin for the
// arch, or an Error: InvalidInput (the arch), CompileOrDevice (NVRTC, with
// a repro folder; or compiling forbidden by fail_if_compiling), Internal (a
// plan that does not verify). In order:
//   1. this process compiled the program already (memory);
//   2. the disk holds its recipe and every cubin: no planning, no codegen;
//   3. run_pipeline; each kernel from memory, disk, or NVRTC;
//      new cubins and the recipe are stored, the cache evicted to its limit.
// Dumps (Options::dump) bypass 1 and 2, since planning and codegen must run.
#pragma once

#include <memory>
#include <string>

#include "codegen/kernel_codegen.h"
#include "codegen/tuning.h"
#include "compiler/plan.h"
#include "kiln/executable.h"
#include "kiln/options.h"
#include "runtime/executable_impl.h"
#include "runtime/program_cache.h"

namespace kiln::runtime {

// What one run of the pipeline is for.
struct Target {
  std::string arch;              // sm_XX, checked
  bool fuse = true;              // false: one kernel per op
  codegen::ProgramTuning tuning;  // tile choices by plan kernel; empty: the heuristic's
  codegen::VendorLibraries vendors;  // what the GEMM tactics may call (vendor_libraries)
  ir::Hash128 program_key;       // the graph's, for this arch and fuse (program_cache.h)
};

// The vendor libraries a compile under `settings` offers its matmul
// kernels (Options::vendor): under kAuto, cuBLASLt where it loads here.
codegen::VendorLibraries vendor_libraries(const Options& settings);

// The arch a compile with `options` targets: the options', else the GPU's
// (CompileOptions::device, else 0), else sm_90.
std::string target_arch(const CompileOptions& options);

// The target of a compile with `options`: the arch (target_arch;
// InvalidInput where NVRTC cannot compile for it), and
// the tile choices: `chosen`, else (with options.use_cache) those an
// autotuning run recorded in the cache for this graph and arch, else none.
Expected<Target> compile_target(const Graph& graph, const CompileOptions& options,
                                const codegen::ProgramTuning* chosen = nullptr);

// How far run_pipeline goes: the verified plan alone, or its kernels too
// (the stages `kiln dump --stage` and KILN_DUMP name; ptx and sass are NVRTC's).
enum class Stage { plan, cuda };

// The verified plan and, up to Stage::cuda, the kernels generated for it.
struct Planned {
  ir::Plan plan;
  codegen::GeneratedProgram program;
  // A symbolic graph's: the probe its plan and kernels were made at
  // (compiler/size_probe.h), and the graph at that probe, whose tensor ids
  // the plan and the kernels' arguments name.
  std::shared_ptr<const ir::SizeProbe> probe;
  std::shared_ptr<const Graph> probe_graph;
};

// The pipeline, in order (pipeline.cpp reads as this list; step 0, the
// graph's rewrites before planning, ran when the graph was built):
//   1. plan fusion for the target's sm (compiler/planner/planner.h; below
//      sm_90 a matmul or conv may take a prologue, so plans differ by arch);
//   2. verify the plan (compiler/plan_verifier.h): Internal error if not;
//   3. generate CUDA C++ per kernel with the target's tile choices
//      (codegen/kernel_codegen.h).
// NVRTC comes after, in compile_program (and `kiln warm`, `kiln dump`).
//
// A symbolic graph runs the same steps on its probe graph (size_probe.h),
// twice, at two probes of different primes; one compile serves every size
// in its range when both give the same plan and the same kernels, byte for
// byte (every size a kernel reads is a parameter, and no choice depended on
// the probe's magnitude). This slice covers graphs without anchors whose
// kernels are pointwise, copy and norm kernels without workspaces. Any other
// symbolic graph is compiled per size: run_pipeline returns an InvalidInput
// error saying why (per_size_reason), and callers specialize it
// (Graph::specialize, `--dim`).
Expected<Planned> run_pipeline(const Graph& graph, const Target& target, Stage until = Stage::cuda);

// For a symbolic graph: "" when one compile serves every size in its range,
// else why it is compiled per size; an Error for what fails otherwise.
Expected<std::string> per_size_reason(const Graph& graph, const Target& target);

// The same, and whether it is a limit met at the range's largest sizes alone
// (codegen::NotSymbolic::range_limit), which a narrower range may avoid.
struct PerSize {
  std::string why;
  bool range_limit = false;
};
Expected<PerSize> per_size(const Graph& graph, const Target& target);

// Compiles `graph` with `tuning` instead of the choices recorded in the
// cache (nullptr: the recorded ones; an empty map: the heuristic's).
Expected<std::unique_ptr<Executable::Impl>> compile_program(const Graph& graph, const CompileOptions& options,
                                                            const codegen::ProgramTuning* tuning);
// The same, as an Executable.
Expected<Executable> compile_executable(const Graph& graph, const CompileOptions& options,
                                        const codegen::ProgramTuning* tuning);

}  // namespace kiln::runtime
