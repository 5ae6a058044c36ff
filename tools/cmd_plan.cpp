// kiln plan GRAPH [--json] [--dot] [--svg] [--no-fusion] [--arch sm_XX]: print the
// fusion plan for the target, as a compile plans it (runtime::run_pipeline).
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "compiler/graph_internal.h"
#include "compiler/plan_printer.h"
#include "kiln/graph.h"
#include "runtime/pipeline.h"
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
  return [args, &common] {
    Expected<Graph> graph = load_sized(args->path, args->dims);
    if (!graph) return report(graph.error());
    const ir::Graph& g = ir_of(*graph);
    // The plan does not depend on the tile choices: none are read from the cache.
    const codegen::ProgramTuning no_tuning;
    Expected<runtime::Target> target =
        runtime::compile_target(*graph, compile_options(common, args->arch, !args->no_fusion), &no_tuning);
    if (!target) return report(target.error());
    Expected<runtime::Planned> planned = runtime::run_pipeline(*graph, *target, runtime::Stage::plan);
    if (!planned) return report(planned.error());
    const ir::Plan& plan = planned->plan;
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
