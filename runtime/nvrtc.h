// NVRTC: CUDA C++ source to a cubin (or PTX) for one architecture.
//
// Expects: a translation unit that includes only the embedded templates.
// Guarantees: a cubin for `arch` ("sm_90"), or an Error (code
// CompileOrDevice) carrying NVRTC's log. Thread-safe (NVRTC is).
#pragma once

#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::runtime {

struct NvrtcOutput {
  std::string binary;  // cubin, or PTX text when asked for PTX
  std::string log;
  double milliseconds = 0;
};

// The options kiln passes; part of every kernel's cache key.
std::vector<std::string> nvrtc_options(const std::string& arch, bool ptx);
std::string nvrtc_version();  // "13.0"
bool is_valid_arch(const std::string& arch);  // "sm_80", "sm_90", "sm_90a", ...
// Why `arch` cannot be compiled for (not sm_XX, or not one this NVRTC
// knows, with the ones it does); empty when it can.
std::string arch_problem(const std::string& arch);

Expected<NvrtcOutput> nvrtc_compile(const std::string& source, const std::string& arch, bool ptx = false);

// ptxas's resource report for the kernel: registers, shared memory, spills
// ("ptxas info : Used 40 registers, ..."), one line per function.
Expected<std::string> nvrtc_resource_usage(const std::string& source, const std::string& arch);

// Writes a folder that reproduces a failed compile (the graph, the source,
// the NVRTC options and log) and returns a message naming it and a command
// that reproduces the failure.
std::string write_repro(const std::string& graph_json, const std::string& source, const std::string& arch,
                        const std::string& log);

}  // namespace kiln::runtime
