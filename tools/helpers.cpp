#include "tools/helpers.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "compiler/graph_internal.h"
#include "compiler/error.h"
#include "runtime/tuning_record.h"
#include "runtime/cuda_driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/program_cache.h"
#include "runtime/temp_files.h"
#include "tools/external_tool.h"
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
  for (const char* candidate : {"cuobjdump", "/usr/local/cuda/bin/cuobjdump", "nvdisasm", "/usr/local/cuda/bin/nvdisasm"})
    if (tool_exists(candidate)) {
      tool = candidate;
      break;
    }
  if (tool.empty())
    return Error{ErrorCode::CompileOrDevice,
                 "--stage sass needs cuobjdump or nvdisasm (CUDA toolkit); neither is installed here. "
                 "--stage ptx shows the code before assembly"};
  Expected<std::filesystem::path> dir = runtime::make_private_folder("kiln-sass-");
  if (!dir) return dir.error();
  const std::filesystem::path path = *dir / "kernel.cubin";
  const bool objdump = tool.find("cuobjdump") != std::string::npos;
  const Expected<bool> written = runtime::write_new_file(path, cubin);
  Expected<ToolResult> run = written ? run_tool(objdump ? std::vector<std::string>{tool, "--dump-sass", path.string()}
                                                        : std::vector<std::string>{tool, path.string()})
                                     : Expected<ToolResult>(written.error());
  std::error_code ec;
  std::filesystem::remove_all(*dir, ec);
  if (!run) return run.error();
  return run->output;
}

}  // namespace kiln::cli
