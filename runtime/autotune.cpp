#include "runtime/autotune.h"

#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <optional>

#include "compiler/error.h"
#include "runtime/bench.h"
#include "runtime/cache_dir.h"
#include "runtime/cuda_driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/log.h"
#include "runtime/pipeline.h"
#include "runtime/program_cache.h"

namespace kiln::runtime {
namespace {

// A candidate must be this much faster than the heuristic's choice to replace it.
constexpr double kMargin = 0.99;
// Each candidate's time: the median of its medians over this many rounds of about kRoundMs each.
constexpr int kRounds = 5;
constexpr double kRoundMs = 60;

// The arch a GPU here can time, or why not.
Expected<std::string> timing_arch(const CompileOptions& options) {
  Expected<const Driver*> gpu = driver();
  if (!gpu) return Error{ErrorCode::CompileOrDevice, "autotuning times kernels on a GPU: " + gpu.error().message};
  const std::string here = device_arch().value_or("");
  const std::string arch = options.arch.empty() ? here : options.arch;
  if (arch != here)
    return Error{ErrorCode::CompileOrDevice,
                 fmt::format("autotuning for {} needs a GPU of that arch; this one is {}", arch, here)};
  return arch;
}

// Kernel `k`'s alternatives, each with the other kernels at `best`: compiled
// at once (NVRTC is the slow part), then timed alone in rounds, each round
// starting one candidate later, so that a GPU that clocks down as it heats
// up slows them all alike. Updates `best` and adds the trials.
Status tune_kernel(const Graph& graph, const CompileOptions& base, const codegen::GeneratedKernel& k,
                   std::optional<BenchBuffers>& buffers, codegen::ProgramTuning& best, std::vector<MeasuredTrial>& trials) {
  std::vector<std::future<Expected<Executable>>> compiled;
  for (const codegen::Tuning& t : k.tuning_space) {
    codegen::ProgramTuning candidate = best;
    candidate[k.plan_kernel] = t;
    compiled.push_back(std::async(std::launch::async, [&graph, &base, candidate] {
      return compile_executable(graph, base, &candidate);
    }));
  }
  std::vector<Executable> candidates;
  for (auto& job : compiled) {
    Expected<Executable> exe = job.get();
    if (!exe) return exe.error();
    candidates.push_back(std::move(*exe));
  }
  if (!buffers) {
    Expected<BenchBuffers> made = BenchBuffers::make(candidates.front(), 1);
    if (!made) return made.error();
    buffers.emplace(std::move(*made));
  }
  const size_t n = candidates.size();
  std::vector<std::vector<double>> samples(n);
  for (int round = 0; round < kRounds; ++round)
    for (size_t i = 0; i < n; ++i) {
      const size_t c = (i + static_cast<size_t>(round)) % n;
      Expected<Timing> t = time_runs(candidates[c], *buffers, kRoundMs);
      if (!t) return t.error();
      samples[c].push_back(t->median_ms);
    }
  double best_ms = 0, heuristic_ms = 0;
  for (size_t c = 0; c < n; ++c) {
    std::sort(samples[c].begin(), samples[c].end());
    const double ms = samples[c][samples[c].size() / 2];
    trials.push_back({k.plan_kernel, k.tuning_space[c], ms});
    if (c == 0) {
      heuristic_ms = best_ms = ms;
    } else if (ms < best_ms && ms < kMargin * heuristic_ms) {
      best_ms = ms;
      best[k.plan_kernel] = k.tuning_space[c];
    }
  }
  return {};
}

}  // namespace

Expected<TunedProgram> autotune(const Graph& graph, const CompileOptions& options) {
  Expected<std::string> arch = timing_arch(options);
  if (!arch) return arch.error();
  CompileOptions base = options;
  base.arch = *arch;
  base.autotune = false;
  // The kernels and the alternatives their generators offer; the heuristic's first.
  const codegen::ProgramTuning heuristic;
  Expected<Target> target = compile_target(graph, base, &heuristic);
  if (!target) return target.error();
  Expected<Planned> planned = run_pipeline(graph, *target);
  if (!planned) return planned.error();
  TunedProgram tuned{*arch, {}, {}};
  for (const codegen::GeneratedKernel& k : planned->program.kernels)
    if (k.tuning_space.size() > 1) tuned.choice[k.plan_kernel] = k.tuning_space.front();
  std::optional<BenchBuffers> buffers;
  for (const codegen::GeneratedKernel& k : planned->program.kernels)
    if (k.tuning_space.size() > 1)
      if (Status s = tune_kernel(graph, base, k, buffers, tuned.choice, tuned.trials); !s) return s.error();

  if (options.use_cache) {
    const std::string cache_dir = options.cache_dir.empty() ? default_cache_dir() : options.cache_dir;
    const ir::Hash128& key = target->program_key;
    TuningRecord record{graph.name(), device_name().value_or(""), tuned.choice, tuned.trials};
    if (secure_cache_dir(cache_dir) && store_tuning(cache_dir, key, record))
      remember_tuning(cache_dir, key, tuned.choice);
    else
      detail::warn("could not record the tuning in " + cache_dir);
  }
  return tuned;
}

}  // namespace kiln::runtime
