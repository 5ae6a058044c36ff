// External programs the CLI uses (Graphviz's dot, cuobjdump or nvdisasm),
// run without a shell.
//
// Expects: an argument vector; nothing in it is interpreted.
// Guarantees: the program is looked up on PATH and started with
// posix_spawnp; its standard output and error are returned with its exit
// status; a program that cannot start is an Error, never an abort.
#pragma once

#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::cli {

struct ToolResult {
  int exit_status = -1;  // the program's exit code, or -1 if a signal ended it
  std::string output;    // standard output and standard error, interleaved
};

// Whether `name` is an executable file: on PATH, or at that path if it has a '/'.
bool tool_exists(const std::string& name);

Expected<ToolResult> run_tool(const std::vector<std::string>& argv);

}  // namespace kiln::cli
