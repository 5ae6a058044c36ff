// kiln dump GRAPH --stage STAGE: print one stage of the pipeline
// (runtime::run_pipeline), as a compile for the target makes it.
#include <fmt/format.h>

#include "compiler/graph_internal.h"
#include "compiler/size_probe.h"
#include "codegen/kernel_codegen.h"
#include "compiler/ir_printer.h"
#include "compiler/plan_printer.h"
#include "compiler/rewrite_table.h"
#include "runtime/nvrtc.h"
#include "runtime/pipeline.h"
#include "tools/helpers.h"
#include "kiln/graph.h"
#include "tools/commands.h"

namespace kiln::cli {

Runner add_dump(CLI::App& app, const CommonOptions& common) {
  CLI::App* cmd = app.add_subcommand("dump", "print one stage of the pipeline: ir, rewrites, plan, cuda, ptx, sass");
  struct Args {
    std::string path, stage = "ir", arch;
    int kernel = -1;
    std::vector<std::string> dims;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("GRAPH", args->path, "graph file")->required();
  cmd->add_option("--stage", args->stage,
                  "ir | rewrites (the graph the planner takes: each rewrite applied and declined, then its IR) | plan | "
                  "cuda | ptx | sass (default: ir)")
      ->check(CLI::IsMember({"ir", "rewrites", "plan", "cuda", "ptx", "sass"}));
  cmd->add_option("--kernel", args->kernel, "only this kernel (plan, cuda, ptx, sass)")->check(CLI::Validator(
      [](std::string& text) {
        return !text.empty() && text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos
                   ? std::string()
                   : "a kernel number (0, 1, ...), not '" + text + "'";
      },
      "KERNEL"));
  cmd->add_option("--arch", args->arch, "target architecture, e.g. sm_90");
  add_dim_option(cmd, args->dims);
  return [args, &common] {
    // The IR of a symbolic graph prints as written; later stages show its one
    // compile for every size where that covers it, else need its sizes.
    std::optional<Graph> once_graph;
    if (args->stage != "ir" && args->stage != "rewrites" && args->dims.empty()) {
      Expected<std::optional<Graph>> once = load_symbolic_once(args->path, compile_options(common, args->arch));
      if (!once) return report(once.error());
      once_graph = std::move(*once);
    }
    Expected<Graph> graph = once_graph ? Expected<Graph>(*once_graph) : load_sized(args->path, args->dims, args->stage == "ir");
    if (!graph) return report(graph.error());
    if (args->stage == "ir") {
      if (args->kernel >= 0)
        return report({ErrorCode::InvalidInput, "--kernel: the ir stage is the whole graph, before kernels exist; "
                                                "--kernel applies to plan, cuda, ptx and sass"});
      fmt::print("{}", graph->to_ir_text());
      return 0;
    }
    if (args->stage == "rewrites") {
      if (args->kernel >= 0)
        return report({ErrorCode::InvalidInput, "--kernel: the rewrites stage is the whole graph, before kernels exist; "
                                                "--kernel applies to plan, cuda, ptx and sass"});
      const ir::Graph& planned = ir_of(*graph);
      fmt::print("{}{}\n{}", ir::rewrite_notes_text(planned), planned.rewrites.empty() ? "no rewrite applies\n" : "",
                 ir::print_ir(planned));
      return 0;
    }
    // The plan alone without --arch (no tile choices read: the plan does not
    // depend on them); with it, what each kernel's generator decided too.
    const bool plan_only = args->stage == "plan" && args->arch.empty();
    const codegen::ProgramTuning no_tuning;
    Expected<runtime::Target> target =
        runtime::compile_target(*graph, compile_options(common, args->arch), plan_only ? &no_tuning : nullptr);
    if (!target) return report(target.error());
    const std::string& arch = target->arch;
    Expected<runtime::Planned> planned =
        runtime::run_pipeline(*graph, *target, plan_only ? runtime::Stage::plan : runtime::Stage::cuda);
    if (!planned) return report(planned.error());
    const ir::Plan& plan = planned->plan;
    // A symbolic graph's plan is of its probe graph: sizes printed as their expressions.
    auto plan_text = [&] {
      if (!planned->probe) return ir::plan_to_text(ir_of(*graph), plan, codegen::plan_tactics(planned->program, arch));
      return ir::symbolic_plan_text(ir_of(*planned->probe_graph), plan, *planned->probe);
    };
    if (plan_only) {
      fmt::print("{}", plan_text());
      return 0;
    }
    if (args->kernel >= static_cast<int>(plan.kernels.size()))
      return report({ErrorCode::InvalidInput, fmt::format("--kernel {}: the plan has {} kernels (0 to {})", args->kernel,
                                                          plan.kernels.size(), plan.kernels.size() - 1)});
    const codegen::GeneratedProgram& program = planned->program;
    if (args->stage == "plan") {  // with --arch: and what each kernel's generator decided for it
      fmt::print("{}", plan_text());
      for (const codegen::GeneratedKernel& k : program.kernels)
        if (!k.tuning.empty() || !k.decisions.empty())
          fmt::print("codegen {} kernel {}: {}{}{}\n", arch, k.plan_kernel, k.tuning.to_string(),
                     !k.tuning.empty() && !k.decisions.empty() ? "; " : "", k.decisions);
      return 0;
    }
    for (const codegen::GeneratedKernel& k : program.kernels) {
      if (args->kernel >= 0 && k.plan_kernel != args->kernel) continue;
      if (args->stage == "cuda" || k.library) {  // (a vendor library's call has no PTX or SASS: its description)
        fmt::print("{}\n", k.source);
        continue;
      }
      Expected<runtime::NvrtcOutput> out = runtime::nvrtc_compile(k.source, arch, args->stage == "ptx");
      if (!out) return report(out.error());
      if (args->stage == "ptx") {
        Expected<std::string> usage = runtime::nvrtc_resource_usage(k.source, arch);
        std::string resources = usage ? *usage : usage.error().message + "\n";
        std::string commented;
        for (size_t at = 0; at < resources.size();) {
          const size_t end = resources.find('\n', at);
          commented += "// " + resources.substr(at, end - at) + "\n";
          at = end == std::string::npos ? resources.size() : end + 1;
        }
        fmt::print("// kernel {} ({})\n{}{}\n", k.plan_kernel, arch, commented, out->binary);
        continue;
      }
      Expected<std::string> sass = disassemble(out->binary);
      if (!sass) return report(sass.error());
      fmt::print("// kernel {} ({})\n{}\n", k.plan_kernel, arch, *sass);
    }
    return 0;
  };
}

}  // namespace kiln::cli
