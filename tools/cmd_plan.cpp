// kiln plan GRAPH [--json] [--dot] [--no-fusion]: print the fusion plan.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "codegen/kernel_codegen.h"
#include "compiler/graph_internal.h"
#include "compiler/plan_printer.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "kiln/graph.h"
#include "runtime/nvrtc.h"
#include "runtime/temp_files.h"
#include "tools/helpers.h"
#include "tools/external_tool.h"
#include "tools/commands.h"

namespace kiln::cli {

Runner add_plan(CLI::App& app, const CommonOptions& common) {
  CLI::App* cmd = app.add_subcommand("plan", "print the fusion plan: kernels, their ops, reads, writes, and why groups were split");
  struct Args {
    std::string path;
    bool json = false, dot = false, svg = false, no_fusion = false;
    std::string arch;
    std::vector<std::string> dims;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("GRAPH", args->path, "graph file")->required();
  auto* json = cmd->add_flag("--json", args->json, "the plan as JSON (cli.md)");
  auto* dot = cmd->add_flag("--dot", args->dot, "the plan as Graphviz, one cluster per kernel")->excludes(json);
  cmd->add_flag("--svg", args->svg, "the plan as an SVG picture (needs Graphviz's dot)")->excludes(json)->excludes(dot);
  cmd->add_flag("--no-fusion", args->no_fusion, "one kernel per op");
  cmd->add_option("--arch", args->arch, "plan for this target, sm_XX (default: the GPU present, else sm_90)");
  add_dim_option(cmd, args->dims);
  return [args] {
    Expected<Graph> graph = load_sized(args->path, args->dims);
    if (!graph) return report(graph.error());
    const ir::Graph& g = ir_of(*graph);
    const std::string arch = args->arch.empty() ? default_arch() : args->arch;
    if (std::string problem = runtime::arch_problem(arch); !problem.empty())
      return report({ErrorCode::InvalidInput, "--arch: " + problem});
    const ir::Plan plan = ir::plan_fusion(g, {.fuse = !args->no_fusion, .sm = codegen::sm_of(arch)});
    if (std::string problem = ir::verify_plan(g, plan); !problem.empty())
      return report({ErrorCode::Internal, "internal error: the planner produced an invalid plan: " + problem +
                                              " (this is a bug in kiln; please report it)"});
    if (args->svg) {
      if (!tool_exists("dot"))
        return report({ErrorCode::CompileOrDevice,
                       "--svg needs Graphviz's dot, which is not installed (apt-get install graphviz); --dot prints the "
                       "same picture as text"});
      Expected<std::filesystem::path> dir = runtime::make_private_folder("kiln-plan-");
      if (!dir) return report(dir.error());
      const std::filesystem::path path = *dir / "plan.dot";
      const Expected<bool> written = runtime::write_new_file(path, ir::plan_to_dot(g, plan));
      Expected<ToolResult> run = written ? run_tool({"dot", "-Tsvg", path.string()}) : Expected<ToolResult>(written.error());
      std::error_code ec;
      std::filesystem::remove_all(*dir, ec);
      if (!run) return report(run.error());
      if (run->exit_status != 0)
        return report({ErrorCode::CompileOrDevice, "Graphviz's dot failed on the plan: " + run->output});
      fmt::print("{}", run->output);
      return 0;
    }
    if (args->json) fmt::print("{}", ir::plan_to_json(g, plan));
    else if (args->dot) fmt::print("{}", ir::plan_to_dot(g, plan));
    else fmt::print("{}", ir::plan_to_text(g, plan));
    return 0;
  };
}

}  // namespace kiln::cli
