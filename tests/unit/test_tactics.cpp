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
#include "compiler/plan_printer.h"
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

codegen::GeneratedProgram generate(const Graph& g, int sm, const codegen::VendorLibraries& vendors = {},
                                   const codegen::ProgramTuning& tuning = {}) {
  return codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = sm}), sm, tuning, nullptr, vendors);
}

// The one kernel of `g` that has tactics.
codegen::GeneratedKernel kernel_with_tactics(const Graph& g, int sm, const codegen::VendorLibraries& vendors = {},
                                             const codegen::ProgramTuning& tuning = {}) {
  const codegen::GeneratedProgram p = generate(g, sm, vendors, tuning);
  for (const codegen::GeneratedKernel& k : p.kernels)
    if (!k.tactics.empty()) return k;
  ADD_FAILURE() << "no kernel with tactics";
  return {};
}

// Its tactics, the cuBLASLt tactic's refusal without vendor libraries left out.
TacticRecord tactics_of(const Graph& g, int sm) {
  TacticRecord r = kernel_with_tactics(g, sm).tactics;
  if (!r.rejected.empty() && r.rejected[0].tactic == "cublasLt") {
    EXPECT_EQ(r.rejected[0].reason, "no vendor library was offered to this compile");
    r.rejected.erase(r.rejected.begin());
  }
  return r;
}

Graph example(const std::string& path) { return Graph::load(std::string(KILN_SOURCE_DIR "/examples/") + path).value(); }

Graph matmul(const std::string& dtype, const std::string& precision) {
  return testing::must_parse(fmt::format(R"({{"kiln": 1, "inputs": {{"x": {{"shape": [512, 256], "dtype": "{0}"}},
    "w": {{"shape": [256, 1024], "dtype": "{0}"}}}},
    "ops": [{{"op": "matmul", "in": ["x", "w"], "out": "y", "precision": "{1}"}}], "outputs": ["y"]}})",
                                         dtype, precision));
}

TEST(Tactics, EachListInItsOrderTheLastResortLast) {
  EXPECT_THAT(names_of(codegen::GemmGenerator::tactics()), ::testing::ElementsAre("cublasLt", "mma.sync one slice", "wgmma", "mma.sync", "simt"));
  EXPECT_THAT(names_of(codegen::AttentionGenerator::tactics()),
              ::testing::ElementsAre("flash decoding", "flash wgmma", "flash mma.sync", "exact two-pass"));
}

TEST(Tactics, AGemmTheHopperKernelCannotTakeNamesWhy) {
  // B [64, 4001] bf16: its rows 8002 bytes apart, no tensor map loads it.
  // (One slice, before it, refuses for the few tiles.)
  const TacticRecord sm90 = tactics_of(example("matmul/hopper_n_major_odd_n.json"), 90);
  EXPECT_EQ(sm90.chosen, "mma.sync");
  ASSERT_THAT(rejected_names(sm90), ::testing::ElementsAre("mma.sync one slice", "wgmma"));
  EXPECT_EQ(sm90.rejected[0].reason, "64 tiles of 128 x 128, under 96");
  EXPECT_EQ(sm90.rejected[1].reason, "B ('w') has rows 4001 elements apart (8002 bytes), no 16-byte multiple");
  // A decode GEMM: one row of tiles keeps mma.sync and its K split.
  const TacticRecord decode = tactics_of(example("matmul/odd_k_decode.json"), 90);
  EXPECT_EQ(decode.chosen, "mma.sync");
  ASSERT_EQ(decode.rejected.size(), 2u);
  EXPECT_EQ(decode.rejected[1].reason, "one row of tiles (M = 7) in 32 tiles, under 132: mma.sync splits K");
  // Below sm_90 the Hopper kernel, and one slice (measured against it), are refused for the target alone.
  const TacticRecord sm80 = tactics_of(example("matmul/hopper_n_major_odd_n.json"), 80);
  EXPECT_EQ(sm80.chosen, "mma.sync");
  ASSERT_EQ(sm80.rejected.size(), 2u);
  EXPECT_EQ(sm80.rejected[0].reason, "measured against the Hopper kernel on sm_90 only, the target is sm_80");
  EXPECT_EQ(sm80.rejected[1].reason, "the Hopper kernel needs sm_90, the target is sm_80");
  // One that fits takes the Hopper kernel; one slice refuses its 32 tiles.
  const TacticRecord hopper = tactics_of(matmul("bf16", "f32"), 90);
  EXPECT_EQ(hopper.chosen, "wgmma");
  ASSERT_THAT(rejected_names(hopper), ::testing::ElementsAre("mma.sync one slice"));
  EXPECT_EQ(hopper.rejected[0].reason, "32 tiles of 128 x 128, under 96");
}

// x [m, k] times w [k, n], + bias, SiLU (an expansion's epilogue), in bf16.
Graph tall_matmul(int64_t m, int64_t n, int64_t k, int64_t batch = 0) {
  const std::string lead = batch ? fmt::format("{}, ", batch) : "";
  return testing::must_parse(fmt::format(R"({{"kiln": 1, "inputs": {{"x": {{"shape": [{3}{0}, {2}], "dtype": "bf16"}},
    "w": {{"shape": [{3}{2}, {1}], "dtype": "bf16"}}, "b": {{"shape": [{1}], "dtype": "bf16"}}}},
    "ops": [{{"op": "matmul", "in": ["x", "w"], "out": "y", "dtype": "bf16"}}, {{"op": "add", "in": ["y", "b"], "out": "z"}},
            {{"op": "silu", "in": ["z"], "out": "s", "dtype": "bf16"}}], "outputs": ["s"]}})",
                                         m, n, k, lead));
}

TEST(Tactics, SmallDepthOverTallGemmsTakesOneSlice) {
  auto decided = [](const Graph& g) {
    const codegen::GeneratedKernel k = kernel_with_tactics(g, 90);
    return k.tactics.chosen + ": " + k.decisions.substr(0, k.decisions.find(';'));
  };
  // K <= 48: 128-row tiles over 8 warps, the depth padded to a 16-deep multiple, one stage.
  EXPECT_EQ(decided(tall_matmul(100000, 96, 16)), "mma.sync one slice: mma.sync 128x96x16, 8x1 warps, 1 stages");
  // Past 128 columns the widest tile of 48 to 128 that divides N (144 = 3 x 48; 480 = 5 x 96).
  EXPECT_EQ(decided(tall_matmul(50001, 144, 40)), "mma.sync one slice: mma.sync 128x48x48, 8x1 warps, 1 stages");
  // N <= 32 up to K = 128; N > 128 in under four rounds of tiles: 64-row tiles over 4 warps.
  EXPECT_EQ(decided(tall_matmul(100000, 24, 120)), "mma.sync one slice: mma.sync 128x32x128, 8x1 warps, 1 stages");
  EXPECT_EQ(decided(tall_matmul(6272, 480, 80)), "mma.sync one slice: mma.sync 64x96x80, 4x1 warps, 1 stages");
  // Refused, each for its reason (wgmma takes them).
  auto refusal = [](const Graph& g) {
    const TacticRecord r = tactics_of(g, 90);
    EXPECT_EQ(r.chosen, "wgmma");
    return r.rejected.empty() ? std::string() : r.rejected[0].tactic + ": " + r.rejected[0].reason;
  };
  EXPECT_EQ(refusal(tall_matmul(100352, 256, 64)),
            "mma.sync one slice: K = 64 over N = 256 in 1568 tiles: one slice takes K <= 48, or K <= 128 where N <= 32 or "
            "N > 128 in under 528 tiles");
  EXPECT_EQ(refusal(tall_matmul(100000, 24, 136)),
            "mma.sync one slice: K = 136 over N = 24 in 782 tiles: one slice takes K <= 48, or K <= 128 where N <= 32 or "
            "N > 128 in under 528 tiles");
  EXPECT_EQ(refusal(tall_matmul(4096, 4096, 16)),
            "mma.sync one slice: M = 4096 under 4 x N = 4096: one slice is measured on tall GEMMs (a conv's pixels) only");
  EXPECT_EQ(refusal(tall_matmul(20000, 96, 16, 4)),
            "mma.sync one slice: 4 batches (grouped convs and batched matmuls keep their tiles)");
}

TEST(Tactics, F32OperandsAtF32PrecisionTakeSimtAndSayWhy) {
  const TacticRecord r = tactics_of(matmul("f32", "f32"), 90);
  EXPECT_EQ(r.chosen, "simt");
  ASSERT_THAT(rejected_names(r), ::testing::ElementsAre("mma.sync one slice", "wgmma", "mma.sync"));
  EXPECT_EQ(r.rejected[2].reason, "A ('x') is f32 at precision \"f32\": no tensor-core MMA computes it exactly");
  EXPECT_EQ(r.rejected[0].reason, r.rejected[2].reason);
  EXPECT_EQ(r.rejected[1].reason, r.rejected[2].reason);
  // At precision tf32 the same operands take mma.sync; wgmma refuses tf32.
  const TacticRecord tf32 = tactics_of(matmul("f32", "tf32"), 90);
  EXPECT_EQ(tf32.chosen, "mma.sync");
  ASSERT_EQ(tf32.rejected.size(), 2u);
  EXPECT_EQ(tf32.rejected[0].reason, "f32 operands (tf32 MMA): the pipelined kernels take them");
  EXPECT_EQ(tf32.rejected[1].reason, "f32 operands (tf32 MMA)");
  // Before sm_80 no tensor cores: SIMT, the three tensor-core tactics refused for the target.
  const TacticRecord sm75 = tactics_of(matmul("bf16", "f32"), 75);
  EXPECT_EQ(sm75.chosen, "simt");
  ASSERT_EQ(sm75.rejected.size(), 3u);
  EXPECT_EQ(sm75.rejected[2].reason, "tensor cores need sm_80, the target is sm_75");
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

// ---- the cuBLASLt tactic (codegen/vendor_codegen.cpp) ------------------------------

const codegen::VendorLibraries kCublasLt{.cublaslt = true};

Graph graph(const std::string& json) { return testing::must_parse(json); }

TEST(VendorTactic, F32OperandsTakeCublasLtByTheRule) {
  // f32 operands at precision f32: cuBLAS's SGEMM, not the SIMT kernel.
  const codegen::GeneratedKernel f32 = kernel_with_tactics(matmul("f32", "f32"), 90, kCublasLt);
  EXPECT_EQ(f32.tactics.chosen, "cublasLt");
  EXPECT_TRUE(f32.tactics.rejected.empty());
  ASSERT_TRUE(f32.library.has_value());
  EXPECT_EQ(f32.decisions, "cublasLt 512x1024x256 x1: a f32 [m][k] (row 256), b f32 [k][n] (row 1024), d f32 [m][n] (row 1024)");
  EXPECT_EQ(f32.library->problem(f32.args.size()), "");
  EXPECT_FALSE(f32.library->tf32);
  EXPECT_EQ(f32.source.find("__global__"), std::string::npos) << "no NVRTC source";
  // Both choices offered to --autotune, the rule's first.
  ASSERT_EQ(f32.tuning_space.size(), 2u);
  EXPECT_EQ(f32.tuning_space[0].to_string(), "vendor=cublasLt");
  EXPECT_EQ(f32.tuning_space[1].to_string(), "vendor=own");
  // At precision tf32: cuBLASLt in TF32 (kiln's tf32 mma.sync kernel took 4.5x its time).
  const codegen::GeneratedKernel tf32 = kernel_with_tactics(matmul("f32", "tf32"), 90, kCublasLt);
  ASSERT_TRUE(tf32.library.has_value());
  EXPECT_TRUE(tf32.library->tf32);
  const codegen::GeneratedKernel tf32_own =
      kernel_with_tactics(matmul("f32", "tf32"), 90, kCublasLt, {{0, codegen::Tuning{.vendor = codegen::Tuning::kOwn}}});
  EXPECT_EQ(tf32_own.tactics.chosen, "mma.sync");
  // An LM head of 50257 bf16 columns: rows no 16-byte multiple apart, so the rule keeps kiln's
  // kernel (cuBLASLt's 2-byte-aligned kernels took 3.8x its time); KILN_VENDOR=always reads the
  // tied embedding [n][k] in place as B transposed.
  const Graph head = graph(R"({"kiln": 1, "inputs": {"h": {"shape": [64, 768], "dtype": "bf16"},
    "w": {"shape": [50257, 768], "dtype": "bf16"}},
    "ops": [{"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]}, {"op": "matmul", "in": ["h", "wt"], "out": "logits"}],
    "outputs": ["logits"]})");
  EXPECT_EQ(kernel_with_tactics(head, 90, kCublasLt).tactics.chosen, "wgmma");
  const codegen::GeneratedKernel lm = kernel_with_tactics(head, 90, {.cublaslt = true, .always = true});
  EXPECT_EQ(lm.tactics.chosen, "cublasLt");
  EXPECT_EQ(lm.decisions,
            "cublasLt 64x50257x768 x1: a bf16 [m][k] (row 768), b bf16 [n][k] (column 768), d bf16 [m][n] (row 50257)");
}

TEST(VendorTactic, TheRuleKeepsKilnsTensorCoreKernelsAndSaysWhy) {
  const codegen::GeneratedKernel k = kernel_with_tactics(matmul("bf16", "f32"), 90, kCublasLt);
  EXPECT_EQ(k.tactics.chosen, "wgmma");
  ASSERT_THAT(rejected_names(k.tactics), ::testing::ElementsAre("cublasLt", "mma.sync one slice"));
  EXPECT_EQ(k.tactics.rejected[0].reason,
            "the rule keeps kiln's tensor-core kernels for 16-bit operands other than a vocabulary's projection "
            "(--autotune times cuBLASLt beside them)");
  EXPECT_FALSE(k.library.has_value());
  ASSERT_GE(k.tuning_space.size(), 2u);
  EXPECT_EQ(k.tuning_space.front(), k.tuning);  // the heuristic's first
  EXPECT_EQ(k.tuning_space.back().to_string(), "vendor=cublasLt");
  // The tuning's choice of cuBLASLt takes it; of kiln's own, the f32 matmul keeps SIMT.
  const codegen::GeneratedKernel tuned =
      kernel_with_tactics(matmul("bf16", "f32"), 90, kCublasLt, {{0, codegen::Tuning{.vendor = codegen::Tuning::kCublasLt}}});
  EXPECT_EQ(tuned.tactics.chosen, "cublasLt");
  EXPECT_EQ(tuned.tuning.to_string(), "vendor=cublasLt");
  const codegen::GeneratedKernel own =
      kernel_with_tactics(matmul("f32", "f32"), 90, kCublasLt, {{0, codegen::Tuning{.vendor = codegen::Tuning::kOwn}}});
  EXPECT_EQ(own.tactics.chosen, "simt");
  EXPECT_EQ(own.tactics.rejected.at(0).reason, "the tuning chose kiln's own kernel");
  EXPECT_EQ(own.tuning.to_string(), "vendor=own");
  // KILN_VENDOR=always: every matmul it can take.
  EXPECT_EQ(kernel_with_tactics(matmul("bf16", "f32"), 90, {.cublaslt = true, .always = true}).tactics.chosen, "cublasLt");
}

TEST(VendorTactic, AVocabularysProjectionTakesCublasLtByTheRule) {
  // 16-bit operands: cuBLASLt for N >= 16384 columns over K <= 1024 (LM heads), kiln's kernel
  // past either edge or on rows no 16-byte multiple apart (N = 32001); an LM head with a cast beside it stays kiln's (the product alone only).
  auto head = [](int64_t n, int64_t k, const std::string& extra_op = "") {
    const std::string out = extra_op.empty() ? "logits" : "f";
    return graph(fmt::format(R"({{"kiln": 1, "inputs": {{"h": {{"shape": [128, {1}], "dtype": "bf16"}},
      "w": {{"shape": [{0}, {1}], "dtype": "bf16"}}}},
      "ops": [{{"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]}},
              {{"op": "matmul", "in": ["h", "wt"], "out": "logits"}}{2}],
      "outputs": ["{3}"]}})", n, k, extra_op, out));
  };
  EXPECT_EQ(kernel_with_tactics(head(32000, 1024), 90, kCublasLt).tactics.chosen, "cublasLt");
  EXPECT_EQ(kernel_with_tactics(head(151936, 896), 90, kCublasLt).tactics.chosen, "cublasLt");
  EXPECT_EQ(kernel_with_tactics(head(16384, 64), 90, kCublasLt).tactics.chosen, "cublasLt");
  EXPECT_NE(kernel_with_tactics(head(16376, 1024), 90, kCublasLt).tactics.chosen, "cublasLt");
  EXPECT_NE(kernel_with_tactics(head(32000, 1032), 90, kCublasLt).tactics.chosen, "cublasLt");
  EXPECT_NE(kernel_with_tactics(head(32001, 1024), 90, kCublasLt).tactics.chosen, "cublasLt");
  EXPECT_NE(kernel_with_tactics(head(32000, 1020), 90, kCublasLt).tactics.chosen, "cublasLt");
  const codegen::GeneratedKernel cast =
      kernel_with_tactics(head(32000, 1024, R"(, {"op": "cast", "in": ["logits"], "out": "f", "dtype": "f32"})"), 90, kCublasLt);
  EXPECT_NE(cast.tactics.chosen, "cublasLt");
  ASSERT_FALSE(cast.tactics.rejected.empty());
  EXPECT_EQ(cast.tactics.rejected[0].reason, "the kernel computes cast ('f') beside the matmul: kiln's own kernels fuse it");
}

TEST(VendorTactic, RefusesWhatItCannotComputeAsKilnWould) {
  auto refusal = [](const Graph& g, int sm = 90) {
    const codegen::GeneratedKernel k = kernel_with_tactics(g, sm, {.cublaslt = true, .always = true});
    EXPECT_NE(k.tactics.chosen, "cublasLt");
    return k.tactics.rejected.empty() ? std::string() : k.tactics.rejected[0].reason;
  };
  // An epilogue: kiln's own kernels fuse it.
  EXPECT_EQ(refusal(graph(R"({"kiln": 1, "inputs": {"x": {"shape": [64, 32], "dtype": "f32"}, "w": {"shape": [32, 48], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}, {"op": "relu", "in": ["y"], "out": "r"}], "outputs": ["r"]})")),
            "the kernel computes relu ('r') beside the matmul: kiln's own kernels fuse it");
  // f32 operands rounded to bf16 by the precision.
  EXPECT_EQ(refusal(matmul("f32", "bf16")), "the precision rounds f32 operands to 16 bits, which cuBLASLt does not");
  // Operands of two types.
  EXPECT_EQ(refusal(graph(R"({"kiln": 1, "inputs": {"x": {"shape": [64, 32], "dtype": "bf16"}, "w": {"shape": [32, 48], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})")),
            "operands of bf16 and f32: cuBLASLt takes two of bf16, f16 or f32");
  // Before sm_80.
  EXPECT_EQ(refusal(matmul("f32", "f32"), 75), "kiln calls cuBLASLt on sm_80 and newer, the target is sm_75");
  // A conv.
  EXPECT_EQ(refusal(example("conv/conv_bias_relu.json")), "a conv is not a matmul cuBLASLt takes");
  // Batches of A broadcast along one batch dim and not the other: no one batch stride.
  EXPECT_EQ(refusal(graph(R"({"kiln": 1, "inputs": {"x": {"shape": [3, 1, 16, 8], "dtype": "f32"}, "w": {"shape": [3, 4, 8, 16], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})")),
            "A ('x')'s batches are not evenly spaced in memory");
  // B with fewer batch dims than the result, not all broadcast: the same.
  EXPECT_EQ(refusal(graph(R"({"kiln": 1, "inputs": {"x": {"shape": [2, 3, 16, 8], "dtype": "f32"}, "w": {"shape": [3, 8, 16], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})")),
            "B ('w')'s batches are not evenly spaced in memory");
}

TEST(VendorTactic, BatchesBroadcastAndSlicedOperandsAreReadWhereTheyLie) {
  // x [4, 128, 64] times w [64, 32]: w one matrix for every batch (batch stride 0).
  const codegen::GeneratedKernel k = kernel_with_tactics(
      graph(R"({"kiln": 1, "inputs": {"x": {"shape": [4, 128, 64], "dtype": "f32"}, "w": {"shape": [64, 32], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})"),
      90, kCublasLt);
  ASSERT_TRUE(k.library.has_value());
  EXPECT_EQ(k.library->batches, 4);
  EXPECT_EQ(k.library->a.batch_stride, 128 * 64);
  EXPECT_EQ(k.library->b.batch_stride, 0);
  EXPECT_EQ(k.library->d.batch_stride, 128 * 32);
  // A's columns sliced out of a wider tensor (q of a fused projection): offset and row stride.
  const codegen::GeneratedKernel s = kernel_with_tactics(
      graph(R"({"kiln": 1, "inputs": {"qkv": {"shape": [128, 96], "dtype": "f32"}, "w": {"shape": [32, 16], "dtype": "f32"}},
    "ops": [{"op": "slice", "in": ["qkv"], "out": "k", "axis": 1, "start": 32, "end": 64},
            {"op": "matmul", "in": ["k", "w"], "out": "y"}], "outputs": ["y"]})"),
      90, kCublasLt);
  ASSERT_TRUE(s.library.has_value()) << s.tactics.rejected.at(0).reason;
  EXPECT_EQ(s.library->a.offset, 32);
  EXPECT_EQ(s.library->a.row_stride, 96);
  EXPECT_EQ(s.library->a.column_stride, 1);
}

// Where cuBLASLt computes f32 matmuls, the planner leaves them alone in
// their kernels (their bias and activation a kernel of their own, saying
// why) and the tactic takes them; 16-bit matmuls keep their epilogues.
TEST(VendorTactic, ThePlannerLeavesF32MatmulsAloneForCublasLt) {
  const std::string json = R"({"kiln": 1, "inputs": {"x": {"shape": [256, 64], "dtype": "DT"}, "w": {"shape": [64, 128], "dtype": "DT"},
    "b": {"shape": [128], "dtype": "DT"}}, "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}, {"op": "add", "in": ["y", "b"], "out": "z"},
    {"op": "relu", "in": ["z"], "out": "r"}], "outputs": ["r"]})";
  auto with = [&](const char* dtype) {
    std::string text = json;
    for (size_t at; (at = text.find("DT")) != std::string::npos;) text.replace(at, 2, dtype);
    return graph(text);
  };
  const Graph f32 = with("f32");
  const ir::Plan plan = ir::plan_fusion(ir_of(f32), {.sm = 90, .cublaslt_f32_matmuls = true});
  ASSERT_EQ(plan.kernels.size(), 2u);
  EXPECT_EQ(plan.kernels[0].ops.size(), 1u);
  ASSERT_FALSE(plan.boundaries.empty());
  EXPECT_EQ(plan.boundaries[0].reason.rfind("cuBLASLt computes 'y' (f32 operands): its kernel is the product alone", 0), 0u)
      << plan.boundaries[0].reason;
  const codegen::GeneratedProgram p = codegen::generate_program(ir_of(f32), plan, 90, {}, nullptr, kCublasLt);
  ASSERT_TRUE(p.kernels.at(0).library.has_value());
  EXPECT_FALSE(p.kernels.at(1).library.has_value());
  // Without the flag, or with 16-bit operands: one kernel.
  EXPECT_EQ(ir::plan_fusion(ir_of(f32), {.sm = 90}).kernels.size(), 1u);
  EXPECT_EQ(ir::plan_fusion(ir_of(with("bf16")), {.sm = 90, .cublaslt_f32_matmuls = true}).kernels.size(), 1u);
}

// Attention's q and k read as [B, H, S, D] from [B, S, H, D]: no one batch
// stride, so where cuBLASLt computes the f32 scores a copy writes each once
// (planner/strided_operands.h) and the call reads the copies.
TEST(VendorTactic, UnevenlyBatchedOperandsAreCopiedForCublasLt) {
  const Graph g = graph(R"({"kiln": 1, "inputs": {"q": {"shape": [2, 16, 4, 8], "dtype": "f32"}, "k": {"shape": [2, 16, 4, 8], "dtype": "f32"}},
    "ops": [{"op": "transpose", "in": ["q"], "out": "qt", "perm": [0, 2, 1, 3]}, {"op": "transpose", "in": ["k"], "out": "kt", "perm": [0, 2, 3, 1]},
            {"op": "matmul", "in": ["qt", "kt"], "out": "s"}], "outputs": ["s"]})");
  const ir::Plan plan = ir::plan_fusion(ir_of(g), {.sm = 90, .cublaslt_f32_matmuls = true});
  std::vector<std::string> kinds;
  for (const ir::PlannedKernel& k : plan.kernels) kinds.emplace_back(ir::to_string(k.kind));
  EXPECT_THAT(kinds, ::testing::UnorderedElementsAre("copy", "copy", "matmul"));
  bool said_why = false;
  for (const ir::Boundary& b : plan.boundaries)
    said_why = said_why || b.reason.find("cuBLASLt computes matmul 's', which reads a matrix of one batch stride") != std::string::npos;
  EXPECT_TRUE(said_why);
  const codegen::GeneratedProgram p = codegen::generate_program(ir_of(g), plan, 90, {}, nullptr, kCublasLt);
  EXPECT_TRUE(p.kernels.back().library.has_value()) << p.kernels.back().tactics.rejected.at(0).reason;
  // Without cuBLASLt the SIMT kernel reads them in place: one kernel.
  EXPECT_EQ(ir::plan_fusion(ir_of(g), {.sm = 90}).kernels.size(), 1u);
  // As a model writes them: heads split from the projection's columns by a reshape, and the
  // attention's output read back as rows of H*D (reshapes that need the copy).
  const Graph heads = graph(R"({"kiln": 1, "inputs": {"x": {"shape": [2, 16, 32], "dtype": "f32"}, "p": {"shape": [2, 4, 16, 16], "dtype": "f32"},
    "w": {"shape": [32, 32], "dtype": "f32"}},
    "ops": [{"op": "reshape", "in": ["x"], "out": "x4", "shape": [2, 16, 4, 8]}, {"op": "transpose", "in": ["x4"], "out": "v", "perm": [0, 2, 1, 3]},
            {"op": "matmul", "in": ["p", "v"], "out": "o"}, {"op": "transpose", "in": ["o"], "out": "ot", "perm": [0, 2, 1, 3]},
            {"op": "reshape", "in": ["ot"], "out": "rows", "shape": [32, 32]}, {"op": "matmul", "in": ["rows", "w"], "out": "y"}],
    "outputs": ["y"]})");
  const ir::Plan hplan = ir::plan_fusion(ir_of(heads), {.sm = 90, .cublaslt_f32_matmuls = true});
  const codegen::GeneratedProgram hp = codegen::generate_program(ir_of(heads), hplan, 90, {}, nullptr, kCublasLt);
  int calls = 0;
  for (const codegen::GeneratedKernel& k : hp.kernels) calls += k.library.has_value();
  EXPECT_EQ(calls, 2) << ir::plan_to_text(ir_of(heads), hplan);
}

// As T5 writes them: q scaled by 1.0 (layout sinking writes the scaled q
// once in the projection's order) and expanded to its own shape, then its
// batch dims merged by a reshape; the product reshaped back as the output.
// The copy follows the expand; the scale is not recomputed in the
// vendor's kernel; the reshaped product is written by the call.
TEST(VendorTactic, ExpandsScalesAndReshapedProductsStayCublasLts) {
  const Graph g = graph(R"({"kiln": 1, "inputs": {"x": {"shape": [2, 16, 32], "dtype": "f32"}, "k": {"shape": [8, 8, 16], "dtype": "f32"}},
    "ops": [{"op": "reshape", "in": ["x"], "out": "x4", "shape": [2, 16, 4, 8]}, {"op": "transpose", "in": ["x4"], "out": "q", "perm": [0, 2, 1, 3]},
            {"op": "mul", "in": ["q", 1.0], "out": "qs"}, {"op": "expand", "in": ["qs"], "out": "qe", "shape": [2, 4, 16, 8]},
            {"op": "reshape", "in": ["qe"], "out": "q3", "shape": [8, 16, 8]}, {"op": "matmul", "in": ["q3", "k"], "out": "s"},
            {"op": "reshape", "in": ["s"], "out": "s4", "shape": [2, 4, 16, 16]}], "outputs": ["s4"]})");
  const ir::Plan plan = ir::plan_fusion(ir_of(g), {.sm = 90, .cublaslt_f32_matmuls = true});
  const codegen::GeneratedProgram p = codegen::generate_program(ir_of(g), plan, 90, {}, nullptr, kCublasLt);
  int calls = 0;
  for (const codegen::GeneratedKernel& k : p.kernels) {
    calls += k.library.has_value();
    if (!k.tactics.empty() && !k.library) ADD_FAILURE() << k.tactics.rejected.at(0).reason << "\n" << ir::plan_to_text(ir_of(g), plan);
  }
  EXPECT_EQ(calls, 1);
}

// Over random graphs: every kernel the cuBLASLt tactic takes describes a
// call its own checks accept (the ones a recipe read back must pass), with
// its pointers the kernel's arguments in their roles.
TEST(VendorTactic, RandomGraphsCallsAreWellFormed) {
  int calls = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const Graph g = testing::random_graph(seed);
    const ir::Plan plan = ir::plan_fusion(ir_of(g), {.sm = 90});
    Expected<codegen::GeneratedProgram> p = detail::catch_errors(
        [&] { return codegen::generate_program(ir_of(g), plan, 90, {}, nullptr, {.cublaslt = true, .always = true}); });
    ASSERT_TRUE(p.ok()) << "seed " << seed << ": " << p.error().message;
    for (const codegen::GeneratedKernel& k : p->kernels) {
      if (!k.library) continue;
      ++calls;
      EXPECT_EQ(k.library->problem(k.args.size()), "") << "seed " << seed;
      using Role = codegen::KernelArg::Role;
      EXPECT_NE(k.args[static_cast<size_t>(k.library->a.arg)].role, Role::Output) << "seed " << seed;
      EXPECT_NE(k.args[static_cast<size_t>(k.library->d.arg)].role, Role::Input) << "seed " << seed;
      EXPECT_EQ(k.args[static_cast<size_t>(k.library->workspace_arg)].role, Role::Workspace) << "seed " << seed;
    }
  }
  EXPECT_GT(calls, 10);
}

}  // namespace
}  // namespace kiln
