#include "tools/helpers.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "compiler/error.h"
#include "runtime/pipeline.h"
#include "runtime/temp_files.h"
#include "tools/external_tool.h"
#include "tools/commands.h"

namespace kiln::cli {

CompileOptions compile_options(const CommonOptions& common, const std::string& arch, bool fuse) {
  return {.arch = arch, .fuse = fuse, .use_cache = !common.no_cache, .cache_dir = common.cache_dir};
}

void add_dim_option(CLI::App* cmd, std::vector<std::string>& dims) {
  cmd->add_option("--dim", dims, "the size of a symbolic dimension, NAME=VALUE (repeatable)")->allow_extra_args(false);
}

Expected<Graph::DimValues> parse_dims(const std::vector<std::string>& dims) {
  Graph::DimValues values;
  for (const std::string& entry : dims) {
    const size_t eq = entry.find('=');
    const std::string name = entry.substr(0, eq == std::string::npos ? 0 : eq);
    const std::string value = eq == std::string::npos ? "" : entry.substr(eq + 1);
    const bool digits = !value.empty() && value.size() <= 18 && value.find_first_not_of("0123456789") == std::string::npos;
    if (name.empty() || !digits || std::stoll(value) < 1)
      return Error{ErrorCode::InvalidInput,
                   fmt::format("--dim {}: expected NAME=VALUE with VALUE a positive integer (e.g. --dim B=8)", detail::quoted(entry))};
    if (!values.emplace(name, std::stoll(value)).second)
      return Error{ErrorCode::InvalidInput, fmt::format("--dim: symbol {} is given twice", detail::quoted(name))};
  }
  return values;
}

Expected<Graph> load_sized(const std::string& path, const std::vector<std::string>& dims, bool symbolic_ok) {
  Expected<Graph> graph = Graph::load(path);
  if (!graph) return graph;
  Expected<Graph::DimValues> values = parse_dims(dims);
  if (!values) return values.error();
  if (!graph->is_symbolic() && !values->empty())
    return Error{ErrorCode::InvalidInput, fmt::format("{}: --dim {}: the graph has no symbolic dimensions", path,
                                                      detail::quoted(values->begin()->first))};
  if (!graph->is_symbolic() || (symbolic_ok && values->empty())) return graph;
  std::vector<std::string> missing;
  for (const Graph::Dim& d : graph->dims())
    if (!values->count(d.name)) missing.push_back(fmt::format("--dim {}=N ({} to {}{})", d.name, d.min, d.max,
                                                             d.multiple_of > 1 ? fmt::format(", a multiple of {}", d.multiple_of) : ""));
  if (!missing.empty())
    return Error{ErrorCode::Usage, fmt::format("{}: the graph has symbolic dimensions; give each a size: {}", path,
                                               fmt::join(missing, ", "))};
  Expected<Graph> sized = graph->specialize(*values);
  if (!sized) return Error{sized.error().code, fmt::format("{}: {}", path, sized.error().message)};
  return sized;
}

Expected<std::optional<Graph>> load_symbolic_once(const std::string& path, const CompileOptions& options,
                                                  std::string* why) {
  Expected<Graph> graph = Graph::load(path);
  if (!graph) return graph.error();
  if (!graph->is_symbolic()) return std::optional<Graph>();
  const codegen::ProgramTuning no_tuning;
  Expected<runtime::Target> target = runtime::compile_target(*graph, options, &no_tuning);
  if (!target) return target.error();
  Expected<std::string> reason = runtime::per_size_reason(*graph, *target);
  if (!reason) return Error{reason.error().code, fmt::format("{}: {}", path, reason.error().message)};
  if (why) *why = *reason;
  if (!reason->empty()) return std::optional<Graph>();
  return std::optional<Graph>(std::move(*graph));
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
