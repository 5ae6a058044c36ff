// kiln dump GRAPH --stage STAGE: print one stage of the pipeline.
#include <fmt/format.h>

#include "compiler/plan_printer.h"
#include "compiler/planner/planner.h"
#include "kiln/graph.h"
#include "tools/commands.h"

namespace kiln::cli {

Runner add_dump(CLI::App& app, const CommonOptions& common) {
  CLI::App* cmd = app.add_subcommand("dump", "print one stage of the pipeline: ir, plan, cuda, ptx, sass");
  struct Args {
    std::string path, stage = "ir", arch;
    int kernel = -1;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("GRAPH", args->path, "graph file")->required();
  cmd->add_option("--stage", args->stage, "ir | plan | cuda | ptx | sass (default: ir)")
      ->check(CLI::IsMember({"ir", "plan", "cuda", "ptx", "sass"}));
  cmd->add_option("--kernel", args->kernel, "only this kernel (plan, cuda, ptx, sass)");
  cmd->add_option("--arch", args->arch, "target architecture, e.g. sm_90");
  return [args] {
    Expected<Graph> graph = Graph::load(args->path);
    if (!graph) return report(graph.error());
    if (args->stage == "ir") {
      fmt::print("{}", graph->to_ir_text());
      return 0;
    }
    if (args->stage == "plan") {
      fmt::print("{}", ir::plan_to_text(graph->ir(), ir::plan_fusion(graph->ir())));
      return 0;
    }
    return report({ErrorCode::InvalidInput,
                   fmt::format("--stage {}: this build of kiln does not have that stage yet (available: ir, plan)",
                               args->stage)});
  };
}

}  // namespace kiln::cli
