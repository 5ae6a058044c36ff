// A kernel kind's tactics (codegen/tactic.h): the order of each list, the
// reasons a tactic gives for not fitting, and the last tactic of each list
// as the last resort that always fits.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

#include "codegen/attention_generator.h"
#include "codegen/gemm_generator.h"
#include "codegen/kernel_codegen.h"
#include "compiler/error.h"
#include "compiler/graph_internal.h"
#include "compiler/planner/planner.h"
#include "tests/unit/random_graph.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

using codegen::TacticRecord;

template <class List>
std::vector<std::string> names_of(const List& tactics) {
  std::vector<std::string> names;
  for (const auto& t : tactics) names.emplace_back(t.name);
  return names;
}

std::vector<std::string> rejected_names(const TacticRecord& r) {
  std::vector<std::string> names;
  for (const TacticRecord::Rejected& x : r.rejected) names.push_back(x.tactic);
  return names;
}

codegen::GeneratedProgram generate(const Graph& g, int sm) {
  return codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = sm}), sm);
}

// The one kernel of `g` that has tactics.
TacticRecord tactics_of(const Graph& g, int sm) {
  const codegen::GeneratedProgram p = generate(g, sm);
  for (const codegen::GeneratedKernel& k : p.kernels)
    if (!k.tactics.empty()) return k.tactics;
  ADD_FAILURE() << "no kernel with tactics";
  return {};
}

Graph example(const std::string& path) { return Graph::load(std::string(KILN_SOURCE_DIR "/examples/") + path).value(); }

Graph matmul(const std::string& dtype, const std::string& precision) {
  return testing::must_parse(fmt::format(R"({{"kiln": 1, "inputs": {{"x": {{"shape": [512, 256], "dtype": "{0}"}},
    "w": {{"shape": [256, 1024], "dtype": "{0}"}}}},
    "ops": [{{"op": "matmul", "in": ["x", "w"], "out": "y", "precision": "{1}"}}], "outputs": ["y"]}})",
                                         dtype, precision));
}

TEST(Tactics, EachListInItsOrderTheLastResortLast) {
  EXPECT_THAT(names_of(codegen::GemmGenerator::tactics()), ::testing::ElementsAre("wgmma", "mma.sync", "simt"));
  EXPECT_THAT(names_of(codegen::AttentionGenerator::tactics()),
              ::testing::ElementsAre("flash decoding", "flash wgmma", "flash mma.sync", "exact two-pass"));
}

TEST(Tactics, AGemmTheHopperKernelCannotTakeNamesWhy) {
  // B [64, 4001] bf16: its rows 8002 bytes apart, no tensor map loads it.
  const TacticRecord sm90 = tactics_of(example("matmul/hopper_n_major_odd_n.json"), 90);
  EXPECT_EQ(sm90.chosen, "mma.sync");
  ASSERT_EQ(sm90.rejected.size(), 1u);
  EXPECT_EQ(sm90.rejected[0].tactic, "wgmma");
  EXPECT_EQ(sm90.rejected[0].reason, "B ('w') has rows 4001 elements apart (8002 bytes), no 16-byte multiple");
  // A decode GEMM: one row of tiles keeps mma.sync and its K split.
  const TacticRecord decode = tactics_of(example("matmul/odd_k_decode.json"), 90);
  EXPECT_EQ(decode.chosen, "mma.sync");
  ASSERT_EQ(decode.rejected.size(), 1u);
  EXPECT_EQ(decode.rejected[0].reason, "one row of tiles (M = 7) in 32 tiles, under 132: mma.sync splits K");
  // Below sm_90 the Hopper kernel is refused for the target alone.
  const TacticRecord sm80 = tactics_of(example("matmul/hopper_n_major_odd_n.json"), 80);
  EXPECT_EQ(sm80.chosen, "mma.sync");
  ASSERT_EQ(sm80.rejected.size(), 1u);
  EXPECT_EQ(sm80.rejected[0].reason, "the Hopper kernel needs sm_90, the target is sm_80");
  // One that fits takes the Hopper kernel, nothing rejected.
  const TacticRecord hopper = tactics_of(matmul("bf16", "f32"), 90);
  EXPECT_EQ(hopper.chosen, "wgmma");
  EXPECT_TRUE(hopper.rejected.empty());
}

TEST(Tactics, F32OperandsAtF32PrecisionTakeSimtAndSayWhy) {
  const TacticRecord r = tactics_of(matmul("f32", "f32"), 90);
  EXPECT_EQ(r.chosen, "simt");
  ASSERT_THAT(rejected_names(r), ::testing::ElementsAre("wgmma", "mma.sync"));
  EXPECT_EQ(r.rejected[1].reason, "A ('x') is f32 at precision \"f32\": no tensor-core MMA computes it exactly");
  EXPECT_EQ(r.rejected[0].reason, r.rejected[1].reason);
  // At precision tf32 the same operands take mma.sync; wgmma refuses tf32.
  const TacticRecord tf32 = tactics_of(matmul("f32", "tf32"), 90);
  EXPECT_EQ(tf32.chosen, "mma.sync");
  ASSERT_EQ(tf32.rejected.size(), 1u);
  EXPECT_EQ(tf32.rejected[0].reason, "f32 operands (tf32 MMA)");
  // Before sm_80 no tensor cores: SIMT, both others refused for the target.
  const TacticRecord sm75 = tactics_of(matmul("bf16", "f32"), 75);
  EXPECT_EQ(sm75.chosen, "simt");
  ASSERT_EQ(sm75.rejected.size(), 2u);
  EXPECT_EQ(sm75.rejected[1].reason, "tensor cores need sm_80, the target is sm_75");
}

TEST(Tactics, AttentionSaysWhyEachFlashKernelDoesNot) {
  // 4 heads a key head x 64 queries: too many rows for flash decoding.
  const TacticRecord sm80 = tactics_of(example("attention/sdpa_causal_gqa.json"), 80);
  EXPECT_EQ(sm80.chosen, "flash mma.sync");
  ASSERT_THAT(rejected_names(sm80), ::testing::ElementsAre("flash decoding", "flash wgmma"));
  EXPECT_EQ(sm80.rejected[0].reason, "256 query rows a key head (4 heads x 64 queries), over 16");
  EXPECT_EQ(sm80.rejected[1].reason, "the Hopper kernel needs sm_90, the target is sm_80");
  EXPECT_EQ(tactics_of(example("attention/sdpa_causal_gqa.json"), 90).chosen, "flash wgmma");
  EXPECT_EQ(tactics_of(example("attention/sdpa_decode_gqa.json"), 90).chosen, "flash decoding");
  // f32 operands: every flash kernel refuses them, the exact kernel takes them (causal: not as matmuls).
  const Graph f32 = testing::must_parse(R"({"kiln": 1, "inputs": {"q": {"shape": [1, 2, 32, 64], "dtype": "f32"},
    "k": {"shape": [1, 2, 32, 64], "dtype": "f32"}, "v": {"shape": [1, 2, 32, 64], "dtype": "f32"}},
    "ops": [{"op": "sdpa", "in": ["q", "k", "v"], "out": "o", "causal": true}], "outputs": ["o"]})");
  const TacticRecord exact = tactics_of(f32, 90);
  EXPECT_EQ(exact.chosen, "exact two-pass");
  ASSERT_EQ(exact.rejected.size(), 3u);
  for (const TacticRecord::Rejected& r : exact.rejected) EXPECT_EQ(r.reason, "q ('q') is stored as f32, not bf16 or f16");
}

// Over random graphs and three targets: every matmul, conv and attention
// kernel names the tactic that built it, the tactics before it in the
// list are exactly the rejected ones, each with a reason; the other kinds
// have none. Before sm_80 every GEMM is SIMT.
TEST(Tactics, TheLastResortAlwaysFits) {
  const std::vector<std::string> gemm = names_of(codegen::GemmGenerator::tactics());
  const std::vector<std::string> attention = names_of(codegen::AttentionGenerator::tactics());
  int gemms = 0, attentions = 0;
  std::map<std::string, int> chosen;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const Graph g = testing::random_graph(seed);
    for (int sm : {75, 80, 90}) {
      const ir::Plan plan = ir::plan_fusion(ir_of(g), {.sm = sm});
      Expected<codegen::GeneratedProgram> p =
          detail::catch_errors([&] { return codegen::generate_program(ir_of(g), plan, sm); });
      ASSERT_TRUE(p.ok()) << "seed " << seed << " sm_" << sm << ": " << p.error().message;
      for (const codegen::GeneratedKernel& k : p->kernels) {
        const ir::KernelKind kind = plan.kernels[static_cast<size_t>(k.plan_kernel)].kind;
        const bool is_gemm = kind == ir::KernelKind::Matmul || kind == ir::KernelKind::Conv;
        const std::string label = fmt::format("seed {} sm_{} kernel {}", seed, sm, k.plan_kernel);
        if (!is_gemm && kind != ir::KernelKind::Attention) {
          EXPECT_TRUE(k.tactics.empty()) << label;
          continue;
        }
        (is_gemm ? gemms : attentions)++;
        const std::vector<std::string>& order = is_gemm ? gemm : attention;
        const std::vector<std::string> rejected = rejected_names(k.tactics);
        ASSERT_LT(rejected.size(), order.size()) << label;
        EXPECT_EQ(rejected, std::vector<std::string>(order.begin(), order.begin() + static_cast<long>(rejected.size())))
            << label;
        EXPECT_EQ(k.tactics.chosen, order[rejected.size()]) << label;
        ++chosen[k.tactics.chosen];
        for (const TacticRecord::Rejected& r : k.tactics.rejected) EXPECT_FALSE(r.reason.empty()) << label;
        if (is_gemm && sm < 80) EXPECT_EQ(k.tactics.chosen, "simt") << label;
      }
    }
  }
  EXPECT_GT(gemms, 500);
  EXPECT_GT(attentions, 100);
  // (The random graphs' small f32 and 16-bit GEMMs and f32 attention: the last resorts are reached.)
  EXPECT_GT(chosen["simt"], 0);
  EXPECT_GT(chosen["mma.sync"], 0);
  EXPECT_GT(chosen["exact two-pass"], 0);
}

}  // namespace
}  // namespace kiln
