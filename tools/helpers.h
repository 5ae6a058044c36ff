// Helpers the commands share: the options of a compile, and disassembly.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kiln/executable.h"
#include "kiln/status.h"

namespace kiln::cli {

struct CommonOptions;
// The options of the compile that a command shows, warms or does: `arch`
// (empty: the GPU present, else sm_90), fusion, and the cache (--cache-dir,
// --no-cache, whose autotuning records choose the tiles). Every command
// passes them to runtime::compile_target and runtime::run_pipeline, or to
// Executable::compile, which does the same.
CompileOptions compile_options(const CommonOptions& common, const std::string& arch, bool fuse = true);
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

// `path`'s graph where it is symbolic and one compile serves every size in
// its range (runtime::per_size_reason): the graph itself, to compile once;
// nullopt for an integer graph, or a symbolic one compiled per size (then
// `why` says why, and load_sized binds its sizes).
Expected<std::optional<Graph>> load_symbolic_once(const std::string& path, const CompileOptions& options,
                                                  std::string* why = nullptr);

// SASS of a cubin through cuobjdump or nvdisasm, where one is installed.
Expected<std::string> disassemble(const std::string& cubin);

}  // namespace kiln::cli
