// The compile pipeline: graph -> plan -> verified plan -> CUDA C++ -> cubins,
// with this process's memory, the disk cache's recipes and the disk cache's
// cubins wrapped around it.
//
// Expects: a constructed graph and the options of one compile.
// Guarantees: an Executable::Impl whose every kernel has a cubin for the
// arch, or an Error: InvalidInput (the arch), CompileOrDevice (NVRTC, with
// a repro folder; or compiling forbidden by fail_if_compiling), Internal (a
// plan that does not verify). In order:
//   1. this process compiled the program already (memory);
//   2. the disk holds its recipe and every cubin: no planning, no codegen;
//   3. plan, verify, generate; each kernel from memory, disk, or NVRTC;
//      new cubins and the recipe are stored, the cache evicted to its limit.
// Dumps (Options::dump) bypass 1 and 2, since planning and codegen must run.
#pragma once

#include <memory>

#include "codegen/kernel_codegen.h"
#include "codegen/tuning.h"
#include "compiler/plan.h"
#include "kiln/executable.h"
#include "runtime/executable_impl.h"

namespace kiln::runtime {

// The checked plan and the kernels generated for it (`tuning`: the
// requested choices, empty for the heuristic's), as every compile makes them.
struct Planned {
  ir::Plan plan;
  codegen::GeneratedProgram program;
};
Expected<Planned> plan_and_generate(const Graph& graph, bool fuse, const std::string& arch,
                                    const codegen::ProgramTuning& tuning);

// The arch a compile targets: the options', else the GPU's, else sm_90.
std::string target_arch(const CompileOptions& options);

// Compiles `graph` with `tuning` instead of the choices recorded in the
// cache (nullptr: the recorded ones; an empty map: the heuristic's).
Expected<std::unique_ptr<Executable::Impl>> compile_program(const Graph& graph, const CompileOptions& options,
                                                            const codegen::ProgramTuning* tuning);
// The same, as an Executable.
Expected<Executable> compile_executable(const Graph& graph, const CompileOptions& options,
                                        const codegen::ProgramTuning* tuning);

}  // namespace kiln::runtime
