// The kernel cache directory as a trust boundary: kiln loads machine code
// from it, so it must be the user's own.
//
// Expects: a directory path (it may not exist yet).
// Guarantees: on success the directory exists, is a real directory (the
// path may pass through symlinks above it, as ~/.cache often does), is
// owned by this process's effective user and is writable by no one else;
// its `kernels` and `graphs` folders, where present, are real directories
// too. A directory kiln creates is created 0700. Otherwise an Error says
// what is wrong and how to fix it; callers compile in memory (a warning)
// or, for cache commands, stop.
#pragma once

#include <string>

#include "kiln/status.h"

namespace kiln::runtime {

Status secure_cache_dir(const std::string& dir);

// Reads a regular file without following a symlink at `path` itself;
// nullopt-like empty optional on anything else.
bool read_regular_file(const std::string& path, std::string& out);

}  // namespace kiln::runtime
