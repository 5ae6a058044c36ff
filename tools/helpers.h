// Helpers the commands share: the default arch, code generation with errors
// as values, and disassembly.
#pragma once

#include <string>

#include "codegen/kernel_codegen.h"
#include "kiln/graph.h"
#include "kiln/status.h"

namespace kiln::cli {

// --arch's default: the GPU present, else sm_90.
std::string default_arch();
struct CommonOptions;
// Code generation with kiln's errors turned into values; with `common`, the
// kernels are built with the tile choices an autotuning run recorded in the
// cache for this graph and arch, as a compile would build them.
Expected<codegen::GeneratedProgram> generate(const Graph& graph, const ir::Plan& plan, const std::string& arch,
                                             const CommonOptions* common = nullptr);
// SASS of a cubin through cuobjdump or nvdisasm, where one is installed.
Expected<std::string> disassemble(const std::string& cubin);

}  // namespace kiln::cli
