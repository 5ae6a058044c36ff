#include "runtime/autotune.h"

#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <map>
#include <mutex>

#include "compiler/error.h"
#include "runtime/bench.h"
#include "runtime/cache_dir.h"
#include "runtime/cuda_driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/log.h"
#include "runtime/program_cache.h"
#include "runtime/tuning_record.h"

namespace kiln::runtime {
namespace {

std::mutex tuning_mutex;
// Recorded choices by (cache directory, program key), as this process last read or wrote them.
std::map<std::pair<std::string, ir::Hash128>, codegen::ProgramTuning>& tuning_memory() {
  static std::map<std::pair<std::string, ir::Hash128>, codegen::ProgramTuning> memory;
  return memory;
}

// A candidate must be this much faster than the heuristic's choice to replace it.
constexpr double kMargin = 0.99;
// Each candidate's time: the median of its medians over this many rounds of about kRoundMs each.
constexpr int kRounds = 5;
constexpr double kRoundMs = 60;

}  // namespace

codegen::ProgramTuning recorded_tuning(const std::string& cache_dir, const ir::Hash128& program_key) {
  {
    std::lock_guard<std::mutex> lock(tuning_mutex);
    if (auto it = tuning_memory().find({cache_dir, program_key}); it != tuning_memory().end()) return it->second;
  }
  codegen::ProgramTuning tuning;
  if (secure_cache_dir(cache_dir))  // (an unsafe directory is reported by the compile that uses it)
    if (std::optional<TuningRecord> r = load_tuning(cache_dir, program_key)) tuning = r->choice;
  std::lock_guard<std::mutex> lock(tuning_mutex);
  tuning_memory()[{cache_dir, program_key}] = tuning;
  return tuning;
}

void remember_tuning(const std::string& cache_dir, const ir::Hash128& program_key, const codegen::ProgramTuning& tuning) {
  std::lock_guard<std::mutex> lock(tuning_mutex);
  tuning_memory()[{cache_dir, program_key}] = tuning;
}

void forget_recorded_tunings() {
  std::lock_guard<std::mutex> lock(tuning_mutex);
  tuning_memory().clear();
}

Expected<Executable> autotune(const Graph& graph, const CompileOptions& options) {
  Expected<const Driver*> gpu = driver();
  if (!gpu) return Error{ErrorCode::CompileOrDevice, "autotuning times kernels on a GPU: " + gpu.error().message};
  const std::string here = device_arch().value_or("");
  const std::string arch = options.arch.empty() ? here : options.arch;
  if (arch != here)
    return Error{ErrorCode::CompileOrDevice,
                 fmt::format("autotuning for {} needs a GPU of that arch; this one is {}", arch, here)};
  CompileOptions base = options;
  base.arch = arch;
  base.autotune = false;

  // The kernels and the alternatives their generators offer.
  Expected<Planned> planned = plan_and_generate(graph, options.fuse, arch, {});
  if (!planned) return planned.error();
  const codegen::GeneratedProgram& program = planned->program;

  codegen::ProgramTuning best;
  for (const codegen::GeneratedKernel& k : program.kernels)
    if (k.tuning_space.size() > 1) best[k.plan_kernel] = k.tuning_space.front();

  std::optional<BenchBuffers> buffers;
  std::vector<MeasuredTrial> trials;
  for (const codegen::GeneratedKernel& k : program.kernels) {
    if (k.tuning_space.size() < 2) continue;
    // NVRTC is the slow part: every candidate compiles at once, then each is timed alone.
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
    // Rounds over every candidate, each round starting one candidate later:
    // a GPU that clocks down as it heats up slows them all alike.
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
  }

  if (options.use_cache) {
    const std::string cache_dir = options.cache_dir.empty() ? default_cache_dir() : options.cache_dir;
    const ir::Hash128 key = program_key(graph.to_json(), arch, options.fuse);
    TuningRecord record{graph.name(), device_name().value_or(""), best, trials};
    if (secure_cache_dir(cache_dir) && store_tuning(cache_dir, key, record))
      remember_tuning(cache_dir, key, best);
    else
      detail::warn("could not record the tuning in " + cache_dir);
  }
  Expected<std::unique_ptr<Executable::Impl>> tuned = compile_program(graph, base, &best);
  if (!tuned) return tuned.error();
  for (KernelReport& r : (*tuned)->reports) {
    for (const MeasuredTrial& t : trials)
      if (t.kernel == r.kernel) r.trials.push_back({t.tuning.to_string(), t.milliseconds});
  }
  return Executable(std::move(*tuned));
}

}  // namespace kiln::runtime
