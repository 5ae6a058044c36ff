// Helpers the commands share: the options of a compile, and disassembly.
#pragma once

#include <string>

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
// SASS of a cubin through cuobjdump or nvdisasm, where one is installed.
Expected<std::string> disassemble(const std::string& cubin);

}  // namespace kiln::cli
