// Tile choices (codegen/tuning.h) and their records in the cache
// (runtime/tuning_record.h): what the autotuner may change, and that
// nothing it records can make kiln build a kernel its generator would not.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>

#include "compiler/graph_internal.h"
#include "codegen/kernel_codegen.h"
#include "compiler/planner/planner.h"
#include "kiln/executable.h"
#include "runtime/autotune.h"
#include "runtime/pipeline.h"
#include "runtime/cuda_driver.h"
#include "runtime/program_cache.h"
#include "runtime/tuning_record.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using codegen::Tuning;

}  // namespace
namespace codegen {
void PrintTo(const Tuning& t, std::ostream* os) { *os << "{" << t.to_string() << "}"; }
}  // namespace codegen
namespace {

// bf16 matmul + bias + GELU, 4096 x 2048 x 512: enough 128 x 256 tiles for the Hopper kernel.
constexpr const char* kHopperMatmul = R"({"kiln": 1, "inputs": {"a": {"shape": [4096, 512], "dtype": "bf16"},
  "b": {"shape": [512, 2048], "dtype": "bf16"}, "bias": {"shape": [2048], "dtype": "bf16"}},
  "ops": [{"op": "matmul", "in": ["a", "b"], "out": "m"}, {"op": "add", "in": ["m", "bias"], "out": "h"},
          {"op": "gelu", "in": ["h"], "out": "y", "dtype": "bf16"}], "outputs": ["y"]})";
// A linear layer's weight, stored [n][k] (B K-major), 192-column tiles.
constexpr const char* kHopperLinear = R"({"kiln": 1, "inputs": {"x": {"shape": [4096, 768], "dtype": "bf16"},
  "w": {"shape": [3072, 768], "dtype": "bf16"}, "r": {"shape": [4096, 3072], "dtype": "bf16"}},
  "ops": [{"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]}, {"op": "matmul", "in": ["x", "wt"], "out": "m"},
          {"op": "add", "in": ["m", "r"], "out": "y", "dtype": "bf16"}], "outputs": ["y"]})";
// Decode: 16 rows, K split across blocks.
constexpr const char* kFewRows = R"({"kiln": 1, "inputs": {"a": {"shape": [16, 4096], "dtype": "bf16"},
  "b": {"shape": [4096, 4096], "dtype": "bf16"}}, "ops": [{"op": "matmul", "in": ["a", "b"], "out": "y"}], "outputs": ["y"]})";
// A conv on the Hopper kernel (gathered A).
constexpr const char* kHopperConv = R"({"kiln": 1, "inputs": {"x": {"shape": [16, 40, 40, 64], "dtype": "bf16"},
  "w": {"shape": [128, 3, 3, 64], "dtype": "bf16"}}, "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "c", "padding": [1, 1]},
  {"op": "relu", "in": ["c"], "out": "y"}], "outputs": ["y"]})";

codegen::GeneratedProgram generate(const Graph& g, int sm, const codegen::ProgramTuning& tuning = {}) {
  return codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = sm}), sm, tuning);
}

TEST(Tuning, TextRoundTripsAndRejectsAnythingElse) {
  const Tuning t{256, 2, 8, 0};
  EXPECT_EQ(t.to_string(), "tile_n=256 cluster=2 raster=8");
  EXPECT_EQ(Tuning::parse(t.to_string()), t);
  EXPECT_EQ(Tuning::parse("raster=4 splits=3"), (Tuning{0, 0, 4, 3}));
  const Tuning rolled{128, 1, 16, 0, Tuning::kRolled};
  EXPECT_EQ(rolled.to_string(), "tile_n=128 cluster=1 raster=16 epilogue=rolled");
  EXPECT_EQ(Tuning::parse(rolled.to_string()), rolled);
  EXPECT_EQ(Tuning::parse("epilogue=unrolled"), (Tuning{0, 0, 0, 0, Tuning::kUnrolled}));
  const Tuning pingpong{256, 2, 8, 0, Tuning::kRolled, 1};
  EXPECT_EQ(pingpong.to_string(), "tile_n=256 cluster=2 raster=8 epilogue=rolled pingpong=1");
  EXPECT_EQ(Tuning::parse(pingpong.to_string()), pingpong);
  EXPECT_EQ(Tuning::parse(""), Tuning{});
  for (const char* bad : {"tile_n", "tile_n=", "tile_n=abc", "tile_n=0", "tile_n=-8", "tile_n=128x", "depth=3",
                          "raster=4 raster=8", "tile_n=99999", "epilogue=1", "epilogue=rolled epilogue=rolled",
                          "pingpong=0", "pingpong=2", "pingpong=1 pingpong=1"})
    EXPECT_FALSE(Tuning::parse(bad).has_value()) << bad;
  EXPECT_EQ(codegen::to_string({{0, t}, {3, Tuning{0, 0, 4, 2}}}), "k0{tile_n=256 cluster=2 raster=8} k3{raster=4 splits=2}");
}

TEST(Tuning, EachKernelReportsItsChoiceAndAlternativesHeuristicFirst) {
  const Graph mm = testing::must_parse(kHopperMatmul);
  const codegen::GeneratedProgram p = generate(mm, 90);
  ASSERT_EQ(p.kernels.size(), 1u);
  const codegen::GeneratedKernel& k = p.kernels[0];
  ASSERT_GE(k.tuning_space.size(), 6u);
  EXPECT_EQ(k.tuning, k.tuning_space.front());
  EXPECT_EQ(k.tuning, (Tuning{256, 1, 8, 0, Tuning::kRolled}));  // GELU's erf: the epilogue's blocks in a loop
  for (const Tuning& t : {Tuning{128, 2, 8, 0, Tuning::kRolled}, Tuning{128, 1, 16, 0, Tuning::kUnrolled},
                          Tuning{256, 1, 4, 0, Tuning::kUnrolled}, Tuning{256, 2, 8, 0, Tuning::kUnrolled},
                          Tuning{256, 2, 8, 0, Tuning::kRolled, 1}, Tuning{128, 1, 8, 0, Tuning::kUnrolled, 1}})
    EXPECT_NE(std::find(k.tuning_space.begin(), k.tuning_space.end(), t), k.tuning_space.end()) << t.to_string();
  for (size_t i = 0; i < k.tuning_space.size(); ++i)
    for (size_t j = 0; j < i; ++j) EXPECT_NE(k.tuning_space[i], k.tuning_space[j]);

  const codegen::GeneratedProgram few = generate(testing::must_parse(kFewRows), 90);
  EXPECT_GT(few.kernels[0].tuning.splits, 1);
  EXPECT_GE(few.kernels[0].tuning_space.size(), 9u);  // splits: the heuristic's, none, half, double; 3 orders each

  const codegen::GeneratedProgram conv = generate(testing::must_parse(kHopperConv), 90);
  EXPECT_EQ(conv.kernels[0].tuning, (Tuning{128, 2, 8, 0, Tuning::kUnrolled}));  // ReLU: cheap, unrolled
  EXPECT_NE(std::find(conv.kernels[0].tuning_space.begin(), conv.kernels[0].tuning_space.end(),
                      Tuning{64, 1, 8, 0, Tuning::kRolled}),
            conv.kernels[0].tuning_space.end());

  // Kernels with nothing to choose report nothing.
  const Graph pointwise = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [64], "dtype": "f32"}},
    "ops": [{"op": "relu", "in": ["x"], "out": "y"}], "outputs": ["y"]})");
  EXPECT_TRUE(generate(pointwise, 90).kernels[0].tuning_space.empty());
  EXPECT_TRUE(generate(pointwise, 90).kernels[0].tuning.empty());
}

TEST(Tuning, AChoiceInTheSpaceChangesTheKernelAndOneOutsideIsIgnored) {
  const Graph mm = testing::must_parse(kHopperMatmul);
  const codegen::GeneratedProgram heuristic = generate(mm, 90);
  const codegen::GeneratedKernel& h = heuristic.kernels[0];
  for (const Tuning& t : h.tuning_space) {
    const codegen::GeneratedProgram p = generate(mm, 90, {{0, t}});
    EXPECT_EQ(p.kernels[0].tuning, t);
    EXPECT_EQ(p.kernels[0].tuning_space, h.tuning_space);
    if (t == h.tuning)
      EXPECT_EQ(p.kernels[0].canonical, h.canonical);
    else
      EXPECT_NE(p.kernels[0].canonical, h.canonical) << t.to_string();
  }
  // Not offered: a width the kernel does not have, a split of a kernel that does not split,
  // a tile order not tried, another kernel's id.
  for (const codegen::ProgramTuning& foreign :
       {codegen::ProgramTuning{{0, Tuning{96, 2, 8, 0, 1}}}, codegen::ProgramTuning{{0, Tuning{256, 2, 8, 4, 1}}},
        codegen::ProgramTuning{{0, Tuning{256, 2, 7, 0, 1}}}, codegen::ProgramTuning{{5, Tuning{128, 1, 8, 0, 1}}}}) {
    const codegen::GeneratedProgram p = generate(mm, 90, foreign);
    EXPECT_EQ(p.kernels[0].tuning, h.tuning) << codegen::to_string(foreign);
    EXPECT_EQ(p.kernels[0].canonical, h.canonical) << codegen::to_string(foreign);
  }
  // The split changes the grid and the workspace.
  const Graph few_rows = testing::must_parse(kFewRows);
  const codegen::GeneratedProgram few = generate(few_rows, 90);
  const codegen::GeneratedProgram unsplit = generate(few_rows, 90, {{0, Tuning{0, 0, 8, 1}}});
  EXPECT_EQ(unsplit.kernels[0].grid[1], 1u);
  EXPECT_EQ(few.kernels[0].grid[1], static_cast<uint32_t>(few.kernels[0].tuning.splits));
}

// Every entry of every kernel's space, requested, is what the kernel is built with.
TEST(Tuning, EveryChoiceInTheSpaceIsHonoured) {
  const char* channel_stats = R"({"kiln": 1, "inputs": {"x": {"shape": [16, 40, 40, 64], "dtype": "bf16"},
    "w": {"shape": [128, 3, 3, 64], "dtype": "bf16"}}, "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "c", "padding": [1, 1]},
    {"op": "reduce_sum", "in": ["c"], "out": "s", "axes": [0, 1, 2]}], "outputs": ["c", "s"]})";
  for (const char* text : {kHopperMatmul, kFewRows, kHopperConv, channel_stats}) {
    const Graph g = testing::must_parse(text);
    const codegen::GeneratedProgram heuristic = generate(g, 90);
    ASSERT_GE(heuristic.kernels[0].tuning_space.size(), 6u) << text;
    for (const Tuning& t : heuristic.kernels[0].tuning_space)
      EXPECT_EQ(generate(g, 90, {{0, t}}).kernels[0].tuning, t) << t.to_string() << "\n" << text;
  }
}

TEST(Tuning, AlternativesCompileForSm90) {
  // Every alternative of the Hopper matmul and conv is compiled on the GPU
  // machine (Gpu.EveryTuningChoiceMatchesTheReference); here a few, through NVRTC.
  struct Case {
    const char* graph;
    Tuning tuning;
  };
  const std::vector<Case> cases{{kHopperMatmul, {128, 1, 4, 0, Tuning::kUnrolled}}, {kHopperMatmul, {128, 2, 16, 0, Tuning::kRolled}},
                                {kHopperConv, {64, 1, 8, 0, Tuning::kRolled}}, {kFewRows, {0, 0, 16, 8}},
                                {kHopperMatmul, {256, 2, 8, 0, Tuning::kRolled, 1}}, {kHopperMatmul, {128, 1, 8, 0, Tuning::kUnrolled, 1}},
                                {kHopperLinear, {192, 1, 4, 0, Tuning::kRolled}}};
  std::vector<std::future<std::string>> jobs;
  for (const Case& c : cases)
    jobs.push_back(std::async(std::launch::async, [c] {
      const Graph g = testing::must_parse(c.graph);
      const codegen::ProgramTuning tuning{{0, c.tuning}};
      Expected<Executable> exe = runtime::compile_executable(g, {.arch = "sm_90", .use_cache = false}, &tuning);
      if (!exe) return exe.error().message;
      const KernelReport& r = exe->report().at(0);
      return r.tuning == c.tuning.to_string() && r.tuned ? std::string() : "built with " + r.tuning;
    }));
  for (auto& job : jobs) EXPECT_EQ(job.get(), "");
}

TEST(TuningRecord, RoundTripsAndDamageIsDetected) {
  runtime::TuningRecord r{"g", "NVIDIA H100 80GB HBM3", {{0, Tuning{128, 2, 8, 0}}, {2, Tuning{0, 0, 4, 3}}},
                          {{0, Tuning{256, 2, 8, 0}, 0.85}, {0, Tuning{128, 2, 8, 0}, 0.8}}};
  const std::string text = runtime::tuning_to_text(r);
  std::optional<runtime::TuningRecord> back = runtime::tuning_from_text(text);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->choice, r.choice);
  EXPECT_EQ(back->device, r.device);
  ASSERT_EQ(back->trials.size(), 2u);
  EXPECT_EQ(back->trials[1].tuning, (Tuning{128, 2, 8, 0}));
  EXPECT_DOUBLE_EQ(back->trials[1].milliseconds, 0.8);
  std::string damaged = text;
  damaged[damaged.size() / 2] ^= 1;
  EXPECT_FALSE(runtime::tuning_from_text(damaged).has_value());
  EXPECT_FALSE(runtime::tuning_from_text("").has_value());
  EXPECT_FALSE(runtime::tuning_from_text(text.substr(0, text.size() - 1)).has_value());
}

// A record written by an autotuning run (here by hand: no GPU) is what
// later compiles build with; a damaged one is deleted and the heuristic used.
TEST(TuningRecord, CompilesUseTheRecordedChoice) {
  const fs::path dir = testing::fresh_cache("tuning");
  const Graph mm = testing::must_parse(kHopperMatmul);
  const ir::Hash128 key = runtime::program_key(mm.to_json(), "sm_90", true);
  Expected<Executable> plain = Executable::compile(mm, {.arch = "sm_90", .cache_dir = dir});
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ(plain->report()[0].tuning, "tile_n=256 cluster=1 raster=8 epilogue=rolled");
  EXPECT_FALSE(plain->report()[0].tuned);

  const Tuning chosen{256, 1, 16, 0, Tuning::kUnrolled};
  ASSERT_TRUE(runtime::store_tuning(dir, key, {"g", "test", {{0, chosen}}, {}}));
  runtime::remember_tuning(dir, key, {{0, chosen}});  // (this process read "no record" above)
  Expected<Executable> tuned = Executable::compile(mm, {.arch = "sm_90", .cache_dir = dir});
  ASSERT_TRUE(tuned.ok()) << tuned.error().message;
  EXPECT_EQ(tuned->report()[0].tuning, chosen.to_string());
  EXPECT_TRUE(tuned->report()[0].tuned);
  EXPECT_FALSE(tuned->report()[0].cache_hit);
  EXPECT_NE(tuned->report()[0].key, plain->report()[0].key);

  // What a new process (forgetting what this one read) builds with everything cached: its tiles and whether they were autotuned.
  auto fresh_process_builds = [&](const std::string& tuning, bool tuned) {
    const pid_t pid = fork();
    if (pid == 0) {
      runtime::forget_recorded_tunings();
      Expected<Executable> again = Executable::compile(mm, {.arch = "sm_90", .cache_dir = dir, .fail_if_compiling = true});
      _exit(again && again->report()[0].tuning == tuning && again->report()[0].tuned == tuned ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  };
  // A new process reads the record from disk and finds everything cached.
  EXPECT_TRUE(fresh_process_builds(chosen.to_string(), true));

  // A damaged record: deleted, the heuristic's kernel (cached) used.
  const fs::path record = dir / "tuning" / (key.hex() + ".json");
  ASSERT_TRUE(fs::exists(record));
  { std::ofstream(record, std::ios::app) << "x"; }
  EXPECT_TRUE(fresh_process_builds("tile_n=256 cluster=1 raster=8 epilogue=rolled", false));
  EXPECT_FALSE(fs::exists(record));

  // A forged record naming a choice the generator does not offer builds the heuristic's kernel.
  ASSERT_TRUE(runtime::store_tuning(dir, key, {"g", "test", {{0, Tuning{96, 4, 8, 0}}}, {}}));
  EXPECT_TRUE(fresh_process_builds("tile_n=256 cluster=1 raster=8 epilogue=rolled", false));
  fs::remove_all(dir);
}

TEST(Autotune, NeedsAGpuOfTheArch) {
  const Graph mm = testing::must_parse(kHopperMatmul);
  const std::optional<std::string> here = runtime::device_arch();
  Expected<Executable> exe = Executable::compile(mm, {.arch = here ? (*here == "sm_80" ? "sm_90" : "sm_80") : "sm_90",
                                                      .use_cache = false, .autotune = true});
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.error().code, ErrorCode::CompileOrDevice);
  EXPECT_NE(exe.error().message.find(here ? "needs a GPU of that arch" : "autotuning times kernels on a GPU"), std::string::npos)
      << exe.error().message;
}

}  // namespace
}  // namespace kiln
