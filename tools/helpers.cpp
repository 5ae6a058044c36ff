#include "tools/helpers.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "compiler/graph_internal.h"
#include "compiler/error.h"
#include "runtime/autotune.h"
#include "runtime/cuda_driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/program_cache.h"
#include "tools/commands.h"

namespace kiln::cli {

std::string default_arch() {
  if (std::optional<std::string> arch = runtime::device_arch()) return *arch;
  return "sm_90";
}

Expected<codegen::GeneratedProgram> generate(const Graph& graph, const ir::Plan& plan, const std::string& arch,
                                             const CommonOptions* common) {
  codegen::ProgramTuning tuning;
  if (common && !common->no_cache)
    tuning = runtime::recorded_tuning(common->cache_dir.empty() ? runtime::default_cache_dir() : common->cache_dir,
                                      runtime::program_key(graph.to_json(), arch, /*fuse=*/true));
  return detail::catch_errors([&] { return codegen::generate_program(ir_of(graph), plan, codegen::sm_of(arch), tuning); });
}

Expected<std::string> disassemble(const std::string& cubin) {
  std::string tool;
  for (const char* candidate : {"cuobjdump", "/usr/local/cuda/bin/cuobjdump", "nvdisasm", "/usr/local/cuda/bin/nvdisasm"}) {
    const std::string probe = fmt::format("command -v {} >/dev/null 2>&1", candidate);
    if (std::system(probe.c_str()) == 0) {
      tool = candidate;
      break;
    }
  }
  if (tool.empty())
    return Error{ErrorCode::CompileOrDevice,
                 "--stage sass needs cuobjdump or nvdisasm (CUDA toolkit); neither is installed here. "
                 "--stage ptx shows the code before assembly"};
  const auto dir = std::filesystem::temp_directory_path();
  const std::string path = (dir / fmt::format("kiln-sass-{}.cubin", ::getpid())).string();
  std::ofstream(path, std::ios::binary) << cubin;
  const bool objdump = tool.find("cuobjdump") != std::string::npos;
  const std::string command = fmt::format("{} {} {} 2>&1", tool, objdump ? "--dump-sass" : "", path);
  std::string out;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
    pclose(pipe);
  }
  std::filesystem::remove(path);
  return out;
}

}  // namespace kiln::cli
