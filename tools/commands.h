// The `kiln` commands (cli.md). Each registers its sub-command on the app and
// runs it, returning the process exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "kiln/status.h"

namespace kiln::cli {

// Options every command takes.
struct CommonOptions {
  std::string cache_dir;
  std::string remote_cache;  // --remote-cache URL (cli.md, "Remote cache")
  bool no_cache = false;
  bool verbose = false;
};

using Runner = std::function<int()>;

// Prints `kiln: error: <message>` to stderr and returns the error's exit code.
int report(const Error& error);

Runner add_validate(CLI::App& app, const CommonOptions& common);
Runner add_run(CLI::App& app, const CommonOptions& common);
Runner add_dump(CLI::App& app, const CommonOptions& common);
Runner add_plan(CLI::App& app, const CommonOptions& common);
Runner add_compile(CLI::App& app, const CommonOptions& common);
Runner add_warm(CLI::App& app, const CommonOptions& common);
Runner add_cache(CLI::App& app, const CommonOptions& common);
Runner add_bench(CLI::App& app, const CommonOptions& common);

}  // namespace kiln::cli
