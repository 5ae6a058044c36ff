// Eight threads compiling and running one set of graphs at once, as an
// inference server's request threads would: one kernel cache folder shared
// by all, the CPU path (the reference interpreter) for the runs. Under the
// sanitizer job (tools/fuzz.sh, ASan + UBSan) and tools/tsan.sh (TSan) this
// is where a data race or a use-after-free in the compile path shows.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "kiln/executable.h"
#include "kiln/graph.h"
#include "kiln/reference.h"
#include "runtime/random_inputs.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr int kThreads = 8;

TEST(Threads, EightThreadsCompileAndRunOneGraphSetAtOnce) {
  // Four kernel kinds: a pointwise chain, a held-row norm, a matmul with an
  // epilogue, attention.
  const std::vector<std::string> paths = {
      KILN_SOURCE_DIR "/examples/pointwise/scale_shift_gelu.json",
      KILN_SOURCE_DIR "/examples/held_rows/rms_norm_as_llama_writes_it.json",
      KILN_SOURCE_DIR "/examples/matmul/matmul_bias_gelu.json",
      KILN_SOURCE_DIR "/examples/attention/sdpa_causal_gqa.json",
  };
  // What one thread alone computes: the reference's outputs for seed 7.
  std::vector<std::vector<HostTensor>> want;
  for (const std::string& path : paths) {
    Graph g = Graph::load(path).value();
    want.push_back(testing::must_run(g, random_inputs(g, 7)));
  }

  const fs::path cache = testing::fresh_cache("threads");
  std::vector<std::string> failures(kThreads);
  std::atomic<int> started{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      ++started;
      while (started.load() < kThreads) std::this_thread::yield();  // all begin together
      for (size_t n = 0; n < paths.size(); ++n) {
        const size_t i = (n + static_cast<size_t>(t)) % paths.size();  // each thread its own order
        Expected<Graph> g = Graph::load(paths[i]);
        if (!g) { failures[t] += g.error().message + "\n"; continue; }
        Expected<Executable> exe = Executable::compile(*g, {.arch = "sm_90", .use_cache = true, .cache_dir = cache.string()});
        if (!exe) { failures[t] += fmt::format("{}: {}\n", paths[i], exe.error().message); continue; }
        Expected<std::vector<HostTensor>> got = run_reference(exe->graph(), random_inputs(exe->graph(), 7));
        if (!got) { failures[t] += fmt::format("{}: {}\n", paths[i], got.error().message); continue; }
        for (size_t o = 0; o < got->size(); ++o)
          if ((*got)[o].values != want[i][o].values) failures[t] += fmt::format("{}: output {} differs\n", paths[i], o);
      }
    });
  for (std::thread& t : pool) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;

  // What the threads left in the cache is whole: compiled again, every kernel loads from it.
  for (const std::string& path : paths) {
    Expected<Executable> exe =
        Executable::compile(Graph::load(path).value(), {.arch = "sm_90", .use_cache = true, .cache_dir = cache.string()});
    ASSERT_TRUE(exe.ok()) << exe.error().message;
    for (const KernelReport& k : exe->report()) EXPECT_TRUE(k.cache_hit) << path << " kernel " << k.kernel;
  }
  fs::remove_all(cache);
}

}  // namespace
}  // namespace kiln
