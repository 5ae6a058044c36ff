// kiln compile GRAPH... [--arch sm_XX]... [--json] [--autotune]: generate and
// NVRTC-compile every kernel into the cache; report compile time, cache hits
// and tile choices. --autotune times each tunable kernel's alternatives on
// the GPU and records the winners in the cache (runtime/autotune.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/executable.h"
#include "compiler/error.h"
#include "runtime/cache_dir.h"
#include "runtime/kernel_cache.h"
#include "tools/commands.h"
#include "tools/helpers.h"

namespace kiln::cli {

Runner add_compile(CLI::App& app, const CommonOptions& common) {
  CLI::App* cmd = app.add_subcommand("compile", "generate and JIT-compile every kernel into the cache (no GPU needed)");
  struct Args {
    std::vector<std::string> paths, archs;
    bool json = false;
    bool autotune = false;
    std::vector<std::string> dims;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("GRAPH", args->paths, "graph files")->required();
  cmd->add_option("--arch", args->archs, "target architecture (repeatable); default: the GPU present, else sm_90");
  cmd->add_flag("--json", args->json, "the report as JSON");
  add_dim_option(cmd, args->dims);
  cmd->add_flag("--autotune", args->autotune,
                "time the tile choices of every matmul and conv kernel on the GPU and record the fastest in the cache "
                "(needs a GPU of the --arch)");
  return [args, &common] {
    std::vector<std::string> archs = args->archs;
    if (archs.empty()) archs.push_back("");  // the GPU present, else sm_90 (runtime::compile_target)
    // compile's work is the cache: a folder kiln may not use is an error
    // here, where a library compile only warns and compiles in memory.
    if (!common.no_cache)
      if (Status safe = runtime::secure_cache_dir(common.cache_dir.empty() ? runtime::default_cache_dir() : common.cache_dir);
          !safe)
        return report(safe.error());
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const std::string& path : args->paths) {
      // A symbolic graph compiles once for every size where that covers it; else at --dim's sizes.
      Expected<std::optional<Graph>> once = load_symbolic_once(path, compile_options(common, ""));
      if (!once) return report(once.error());
      Expected<Graph> graph = *once ? Expected<Graph>(**once) : load_sized(path, args->dims);
      if (!graph) return report(graph.error());
      for (const std::string& wanted_arch : archs) {
        CompileOptions options = compile_options(common, wanted_arch);
        options.autotune = args->autotune;
        Expected<Executable> exe = Executable::compile(*graph, options);
        if (!exe) return report(exe.error());
        const std::string& arch = exe->arch();
        int hits = 0;
        for (const KernelReport& k : exe->report()) hits += k.cache_hit;
        nlohmann::ordered_json entry{{"graph", graph->name()}, {"path", path}, {"arch", arch}, {"kernels", nlohmann::ordered_json::array()}};
        if (*once) entry["every_size"] = true;
        if (!args->json)
          fmt::print("{} ({}): {} kernel{}, {} compiled, {} cached\n", graph->name().empty() ? path : detail::escaped(graph->name()), arch,
                     exe->report().size(), exe->report().size() == 1 ? "" : "s", exe->report().size() - hits, hits);
        if (!args->json && *once) fmt::print("  one compile for every size in range\n");
        for (const KernelReport& k : exe->report()) {
          nlohmann::ordered_json trials = nlohmann::ordered_json::array();
          for (const TuningTrial& t : k.trials) trials.push_back({{"tuning", t.tuning}, {"milliseconds", t.milliseconds}});
          entry["kernels"].push_back({{"id", k.kernel}, {"kind", k.kind}, {"key", k.key}, {"cache_hit", k.cache_hit},
                                      {"milliseconds", k.milliseconds}, {"tuning", k.tuning}, {"tuned", k.tuned},
                                      {"trials", trials}});
          if (args->json) continue;
          fmt::print("  kernel {} {}: {} in {:.1f} ms, key {}{}\n", k.kernel, k.kind, k.cache_hit ? "cache hit" : "compiled",
                     k.milliseconds, k.key,
                     k.tuning.empty() ? "" : fmt::format(", tiles {}{}", k.tuning, k.tuned ? " (autotuned)" : ""));
          for (const TuningTrial& t : k.trials)
            fmt::print("    tried {:<36} {:8.3f} ms{}\n", t.tuning, t.milliseconds, t.tuning == k.tuning ? "  <- chosen" : "");
        }
        results.push_back(std::move(entry));
      }
    }
    if (args->json) fmt::print("{}\n", results.dump(2));
    return 0;
  };
}

}  // namespace kiln::cli
