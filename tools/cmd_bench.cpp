// kiln bench GRAPH... [--json] [--no-fusion]: time the fused plan (and the
// unfused one for comparison) on the GPU; bytes, flops and achieved rates.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "compiler/graph_internal.h"
#include "kiln/executable.h"
#include "runtime/bench.h"
#include "compiler/error.h"
#include "tools/commands.h"
#include "tools/helpers.h"

namespace kiln::cli {

Runner add_bench(CLI::App& app, const CommonOptions& common) {
  CLI::App* cmd = app.add_subcommand("bench", "time the fused (and unfused) plan on the GPU");
  struct Args {
    std::vector<std::string> paths;
    bool json = false, no_fusion = false;
    std::vector<std::string> dims;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("GRAPH", args->paths, "graph files")->required();
  cmd->add_flag("--json", args->json, "results as JSON");
  cmd->add_flag("--no-fusion", args->no_fusion, "time only the one-kernel-per-op plan");
  add_dim_option(cmd, args->dims);
  return [args, &common] {
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    if (!args->json)
      fmt::print("{:<34} {:>7} {:>10} {:>10} {:>7} {:>9} {:>9}\n", "graph", "kernels", "fused ms", "unfused ms", "speedup",
                 "GB/s", "TFLOP/s");
    for (const std::string& path : args->paths) {
      Expected<Graph> graph = load_sized(path, args->dims);
      if (!graph) return report(graph.error());
      const int64_t bytes = runtime::min_bytes(ir_of(*graph)), flops = runtime::anchor_flops(ir_of(*graph));
      nlohmann::ordered_json r{{"graph", graph->name()}, {"path", path}, {"bytes", bytes}, {"flops", flops}};
      double fused = 0, unfused = 0;
      size_t kernels = 0;
      for (bool fuse : {true, false}) {
        if (fuse && args->no_fusion) continue;
        Expected<Executable> exe = Executable::compile(*graph, compile_options(common, "", fuse));
        if (!exe) return report(exe.error());
        Expected<runtime::Timing> t = runtime::time_executable(*exe, 1);
        if (!t) return report(t.error());
        (fuse ? fused : unfused) = t->median_ms;
        r[fuse ? "fused_ms" : "unfused_ms"] = t->median_ms;
        r[fuse ? "fused_kernels" : "unfused_kernels"] = exe->kernel_count();
        if (fuse || args->no_fusion) kernels = exe->kernel_count();
      }
      std::string symbolic_row;
      // A symbolic graph compiled once for every size: its kernels timed at these sizes on the
      // same inputs, beside the kernels of the graph written at them.
      if (Expected<std::optional<Graph>> once = load_symbolic_once(path, compile_options(common, ""));
          !once) {
        return report(once.error());
      } else if (*once && !args->no_fusion) {
        Expected<Executable> symbolic = Executable::compile(**once, compile_options(common, ""));
        Expected<Executable> integer = symbolic ? Executable::compile(*graph, compile_options(common, ""))
                                                : Expected<Executable>(symbolic.error());
        Expected<runtime::BenchBuffers> buffers =
            integer ? runtime::BenchBuffers::make(*integer, 1) : Expected<runtime::BenchBuffers>(integer.error());
        if (!buffers) return report(buffers.error());
        std::vector<Shape> shapes;
        for (const TensorDesc& t : graph->inputs()) shapes.push_back(t.shape);
        Expected<runtime::Timing> t = runtime::time_runs(*symbolic, *buffers, 300, shapes);
        if (!t) return report(t.error());
        r["one_compile_ms"] = t->median_ms;
        symbolic_row = fmt::format("{:<34} {:>7} {:>10.4f}  one compile for every size: {:.2f}x the time of the graph "
                                   "written at these sizes\n",
                                   detail::escaped(graph->name()).substr(0, 23) + " (symbolic)", symbolic->kernel_count(),
                                   t->median_ms, t->median_ms / fused);
      }
      const double ms = args->no_fusion ? unfused : fused;
      const double gbps = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
      const double tflops = static_cast<double>(flops) / (ms * 1e-3) / 1e12;
      r["gbps"] = gbps;
      r["tflops"] = tflops;
      results.push_back(r);
      if (!args->json)
        fmt::print("{:<34} {:>7} {:>10.4f} {:>10.4f} {:>7.2f} {:>9.1f} {:>9.2f}\n", detail::escaped(graph->name()).substr(0, 34), kernels,
                   args->no_fusion ? 0.0 : fused, unfused, args->no_fusion ? 1.0 : unfused / fused, gbps, tflops);
      if (!args->json) fmt::print("{}", symbolic_row);
    }
    if (args->json) fmt::print("{}\n", results.dump(2));
    return 0;
  };
}

}  // namespace kiln::cli
