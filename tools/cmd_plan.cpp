// kiln plan GRAPH [--json] [--dot] [--svg] [--no-fusion] [--arch sm_XX]: print the
// fusion plan for the target, as a compile plans it (runtime::run_pipeline);
// with --arch (text and JSON), which tactic builds each kernel on that target
// and why those before it in its list do not (codegen/tactic.h).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "compiler/error.h"
#include "compiler/graph_hash.h"
#include "compiler/graph_internal.h"
#include "codegen/launch_geometry.h"
#include "compiler/plan_printer.h"
#include "compiler/size_probe.h"
#include "compiler/specialize.h"
#include "kiln/graph.h"
#include "runtime/pipeline.h"
#include "runtime/temp_files.h"
#include "tools/helpers.h"
#include "tools/external_tool.h"
#include "tools/commands.h"

namespace kiln::cli {

namespace {

struct PlanArgs {
  std::string path;
  bool json = false, dot = false, svg = false, no_fusion = false;
  std::string arch;
  std::vector<std::string> dims;
};

int print_symbolic_plan(const Graph& graph, const PlanArgs& args, const CommonOptions& common) {
  Expected<Graph::DimValues> values = parse_dims(args.dims);
  if (!values) return report(values.error());
  ir::DimValues sizes(values->begin(), values->end());
  if (!sizes.empty())
    if (Expected<ir::DimValues> checked = detail::catch_errors([&] { return ir::check_dim_values(ir_of(graph), sizes); });
        !checked)
      return report({checked.error().code, fmt::format("{}: {}", args.path, checked.error().message)});
  const codegen::ProgramTuning no_tuning;
  Expected<runtime::Target> target =
      runtime::compile_target(graph, compile_options(common, args.arch, !args.no_fusion), &no_tuning);
  if (!target) return report(target.error());
  Expected<runtime::Planned> planned = runtime::run_pipeline(graph, *target);
  if (!planned) return report(planned.error());
  const ir::Graph& g = ir_of(*planned->probe_graph);
  const ir::SizeProbe& probe = *planned->probe;
  if (args.json) {  // (the probe graph's hash replaced by the graph's own)
    std::string doc = ir::plan_to_json(g, planned->plan);
    const std::string probe_hash = ir::graph_hash(g).hex();
    if (size_t at = doc.find(probe_hash); at != std::string::npos) doc.replace(at, probe_hash.size(), graph.hash());
    fmt::print("{}", doc);
    return 0;
  }
  // With --arch: each kernel's tactic, as for a graph of integer sizes.
  const ir::PlanTactics tactics =
      args.arch.empty() ? ir::PlanTactics{} : codegen::plan_tactics(planned->program, target->arch);
  fmt::print("{}", symbolic_plan_text(g, planned->plan, probe, tactics));
  std::vector<std::string> ranges;
  for (const ir::DimSymbol& s : probe.table().symbols) ranges.push_back(s.range_text());
  fmt::print("one compile for every size: {}\n", fmt::join(ranges, "; "));
  if (sizes.empty()) return 0;
  std::vector<std::string> at;
  for (const auto& [name, value] : sizes) at.push_back(fmt::format("{}={}", name, value));
  const std::vector<uint8_t> runs = codegen::kernels_run_at(planned->program.kernels, sizes);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!runs[i]) continue;  // (another variant of its plan kernel runs at these sizes)
    const codegen::GeneratedKernel& k = planned->program.kernels[i];
    fmt::print("kernel {} at {}: {}{}\n", k.plan_kernel, fmt::join(at, ", "), codegen::to_string(codegen::launch_geometry(k, sizes)),
               k.when ? fmt::format("; the size bucket's variant ({}, where {})", k.tuning.to_string(), k.when->to_string()) : "");
  }
  return 0;
}

}  // namespace

Runner add_plan(CLI::App& app, const CommonOptions& common) {
  CLI::App* cmd = app.add_subcommand("plan", "print the fusion plan: kernels, their ops, reads, writes, and why groups were split");
  auto args = std::make_shared<PlanArgs>();
  cmd->add_option("GRAPH", args->path, "graph file")->required();
  auto* json = cmd->add_flag("--json", args->json, "the plan as JSON (cli.md)");
  auto* dot = cmd->add_flag("--dot", args->dot, "the plan as Graphviz, one cluster per kernel")->excludes(json);
  cmd->add_flag("--svg", args->svg, "the plan as an SVG picture (needs Graphviz's dot)")->excludes(json)->excludes(dot);
  cmd->add_flag("--no-fusion", args->no_fusion, "one kernel per op");
  cmd->add_option("--arch", args->arch, "plan for this target, sm_XX (default: the GPU present, else sm_90)");
  add_dim_option(cmd, args->dims);
  return [args, &common] {
    // A symbolic graph compiled once for every size: its one plan (sizes as
    // their expressions), and with --dim each kernel's launch at those sizes.
    std::string per_size;
    Expected<std::optional<Graph>> once =
        load_symbolic_once(args->path, compile_options(common, args->arch, !args->no_fusion), &per_size);
    if (!once) return report(once.error());
    if (*once && !args->svg && !args->dot) return print_symbolic_plan(**once, *args, common);
    Expected<Graph> graph = load_sized(args->path, args->dims);
    if (!graph && !per_size.empty())
      return report({graph.error().code, graph.error().message + fmt::format(" (it is compiled per size: {})", per_size)});
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
    if (args->dot) {
      fmt::print("{}", ir::plan_to_dot(g, plan));
      return 0;
    }
    // With --arch: the kernels generated (not compiled) for the target, for
    // their tactics. A graph whose plan codegen refuses still prints its
    // plan, then the error.
    ir::PlanTactics tactics;
    std::optional<Error> refused;
    if (!args->arch.empty()) {
      Expected<runtime::Planned> generated = runtime::run_pipeline(*graph, *target, runtime::Stage::cuda);
      if (generated) tactics = codegen::plan_tactics(generated->program, target->arch);
      else refused = generated.error();
    }
    fmt::print("{}", args->json ? ir::plan_to_json(g, plan, tactics) : ir::plan_to_text(g, plan, tactics));
    return refused ? report(*refused) : 0;
  };
}

}  // namespace kiln::cli
