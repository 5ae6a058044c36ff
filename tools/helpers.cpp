#include "tools/helpers.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "compiler/error.h"
#include "runtime/temp_files.h"
#include "tools/external_tool.h"
#include "tools/commands.h"

namespace kiln::cli {

CompileOptions compile_options(const CommonOptions& common, const std::string& arch, bool fuse) {
  return {.arch = arch, .fuse = fuse, .use_cache = !common.no_cache, .cache_dir = common.cache_dir};
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
