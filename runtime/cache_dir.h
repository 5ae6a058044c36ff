// The kernel cache directory as a trust boundary: kiln loads machine code
// from it, so it must be the user's own.
//
// Expects: a directory path (it may not exist yet).
// Guarantees: on success the directory exists, is a real directory (the
// path may pass through symlinks above it, as ~/.cache often does), is
// owned by this process's effective user and is writable by no one else;
// its `kernels`, `graphs` and `tuning` folders, where present, are real directories
// too. A directory kiln creates is created 0700. Otherwise an Error says
// what is wrong and how to fix it; callers compile in memory (a warning)
// or, for cache commands, stop.
#pragma once

#include <optional>
#include <string>

#include "kiln/status.h"

namespace kiln::runtime {

Status secure_cache_dir(const std::string& dir);

// Reads a regular file without following a symlink at `path` itself;
// false on anything else.
bool read_regular_file(const std::string& path, std::string& out);

// Writes `text` to `path` atomically: a temporary file beside it (0600,
// never through a symlink), fsync, rename over `path`. False on any
// failure, with no file left behind; readers see the old file or the new.
bool write_file_atomically(const std::string& path, const std::string& text);

// The small JSON documents of the cache (graph recipes, tuning records):
// the first line is the XXH3-64 (16 hex digits) of the rest.
std::string with_checksum(const std::string& body);
// The body of such a text; nullopt when the checksum does not match.
std::optional<std::string> checked_body(const std::string& text);

}  // namespace kiln::runtime
