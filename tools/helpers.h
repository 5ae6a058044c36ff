// Helpers the commands share: the default arch, code generation with errors
// as values, and disassembly.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

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
// --dim NAME=VALUE (repeatable), for a graph with symbolic dimensions.
void add_dim_option(CLI::App* cmd, std::vector<std::string>& dims);
// The sizes --dim gave, by symbol: an entry that is not NAME=VALUE (VALUE a
// positive integer), or a symbol given twice, is an invalid option value.
Expected<Graph::DimValues> parse_dims(const std::vector<std::string>& dims);
// The graph at `path` with --dim's sizes bound (Graph::specialize). A
// symbolic graph given without all of its sizes is a usage error naming the
// missing symbols, unless `symbolic_ok` (then it comes back symbolic when no
// --dim is given at all).
Expected<Graph> load_sized(const std::string& path, const std::vector<std::string>& dims, bool symbolic_ok = false);

// SASS of a cubin through cuobjdump or nvdisasm, where one is installed.
Expected<std::string> disassemble(const std::string& cubin);

}  // namespace kiln::cli
