// GEMMs of the shapes models have, on sm_90: vocabulary sizes that are no
// multiple of 8 (50257, 32001, 151936), decode rows (M = 1..64), odd K. Which
// kernel each takes and why (GeneratedKernel::decisions, the plan's codegen
// lines), that the Hopper kernel's grid covers every column, and that NVRTC
// compiles the generated sm_90 kernels. Their values against the reference
// are the GPU suite's (tests/gpu/test_odd_gemm.cpp).
#include <gtest/gtest.h>

#include <future>

#include <fmt/format.h>

#include "codegen/kernel_codegen.h"
#include "compiler/graph_internal.h"
#include "compiler/planner/planner.h"
#include "kiln/executable.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

// h [m, k] times w [n, k] transposed (nn.Linear, an LM head with tied embeddings).
Graph lm_head(int64_t m, int64_t n, int64_t k) {
  return testing::must_parse(fmt::format(R"({{"kiln": 1, "inputs": {{"h": {{"shape": [{0}, {2}], "dtype": "bf16"}},
    "w": {{"shape": [{1}, {2}], "dtype": "bf16"}}}},
    "ops": [{{"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]}},
            {{"op": "matmul", "in": ["h", "wt"], "out": "logits"}}], "outputs": ["logits"]}})",
                                         m, n, k));
}

codegen::GeneratedProgram sm90(const Graph& g) {
  return codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = 90}), 90);
}

const codegen::GeneratedKernel& matmul_kernel(const codegen::GeneratedProgram& p) {
  for (const codegen::GeneratedKernel& k : p.kernels)
    if (k.decisions.find("wgmma") != std::string::npos || k.decisions.find("mma.sync") != std::string::npos) return k;
  ADD_FAILURE() << "no matmul kernel";
  return p.kernels.at(0);
}

TEST(OddGemm, VocabularySizesAndDecodeRowsTakeTheHopperKernel) {
  // The weights [N, K] are K-major with 16-byte rows: B by TMA. The logits' rows of 50257 or 32001
  // elements are no 16-byte multiple: staged and copied out by the threads (a block past N element by
  // element, each store predicated on n < N); Qwen2's 151936 (a multiple of 8) goes out by bulk tensor stores.
  for (const int64_t n : {50257, 32001, 151936})
    for (const int64_t m : {1, 7, 64, 4096}) {
      const int64_t k = n == 32001 ? 4096 : 768;
      const codegen::GeneratedProgram p = sm90(lm_head(m, n, k));
      ASSERT_EQ(p.kernels.size(), 1u);
      const codegen::GeneratedKernel& kernel = p.kernels[0];
      const std::string label = fmt::format("m {} n {} k {}: {}", m, n, k, kernel.decisions);
      EXPECT_EQ(kernel.decisions.rfind("wgmma ", 0), 0u) << label;
      EXPECT_NE(kernel.decisions.find("A by TMA"), std::string::npos) << label;
      const bool copied_out = n % 8 != 0;
      EXPECT_EQ(kernel.decisions.find("staged logits, copied out") != std::string::npos, copied_out) << label;
      const int bn = kernel.decisions.find("x256x") != std::string::npos ? 256 : 128;
      // One unit per tile: the grid covers ceil(N / bn) tile columns of every tile row.
      EXPECT_EQ(kernel.grid[0], static_cast<uint32_t>((m + 127) / 128 * ((n + bn - 1) / bn))) << label;
      EXPECT_EQ(kernel.source.find(fmt::format("if (n0 + blk * 64 + column < {}LL) kiln::copy_element<2>(", n)) != std::string::npos,
                copied_out)
          << label;
    }
}

TEST(OddGemm, AlignedVocabulariesStoreByTma) {
  // Llama's 32000: rows of 64000 bytes go out by bulk tensor stores, no copy-out.
  const codegen::GeneratedKernel k = sm90(lm_head(4096, 32000, 4096)).kernels.at(0);
  EXPECT_EQ(k.decisions,
            "wgmma 128x256x64, A by TMA, cluster 1, 4 stages, registers 56/224; epilogue: staged logits, column blocks "
            "unrolled");
}

TEST(OddGemm, OddKIsPaddedOntoTheHopperKernel) {
  const codegen::GeneratedProgram p = sm90(lm_head(4096, 4096, 4099));
  ASSERT_EQ(p.kernels.size(), 2u);  // the two padded copies (one kernel: fused horizontally), the matmul
  EXPECT_EQ(matmul_kernel(p).decisions.rfind("wgmma 128x256x64, A by TMA", 0), 0u) << matmul_kernel(p).decisions;
}

// The mma.sync tactic's kernel, and why the wgmma tactic before it did not fit.
// (Without vendor libraries, the cuBLASLt tactic comes first and refuses; one slice, the next, refuses
// these few tiles, wide GEMMs or any target but sm_90.)
std::string mma_sync_after_wgmma(const codegen::GeneratedKernel& k) {
  EXPECT_EQ(k.tactics.chosen, "mma.sync");
  if (k.tactics.rejected.size() != 3 || k.tactics.rejected[0].tactic != "cublasLt" ||
      k.tactics.rejected[1].tactic != "mma.sync one slice" || k.tactics.rejected[2].tactic != "wgmma") {
    ADD_FAILURE() << "not the rejected cuBLASLt, one slice and wgmma tactics";
    return k.decisions;
  }
  return k.decisions + " | not wgmma: " + k.tactics.rejected[2].reason;
}

TEST(OddGemm, TheRejectedWgmmaTacticSaysWhy) {
  // Decode rows of an odd K: not padded (the copies would cost more than the GEMM), so no tensor map.
  // The mma.sync tile is as tall as the rows (16), however wide the problem.
  EXPECT_EQ(mma_sync_after_wgmma(matmul_kernel(sm90(lm_head(7, 50257, 771)))),
            "mma.sync 16x64x64, 1x4 warps, 4 stages; epilogue: stores direct | not wgmma: B ('wt') has rows 771 "
            "elements apart (1542 bytes), no 16-byte multiple");
  // A decode projection: one row of tiles that does not fill the GPU keeps mma.sync and its K split.
  EXPECT_EQ(mma_sync_after_wgmma(matmul_kernel(sm90(lm_head(1, 4096, 4096)))),
            "mma.sync 16x64x64, 1x4 warps, 4 stages; epilogue: stores direct | not wgmma: one row of tiles (M = 1) in "
            "32 tiles, under 132: mma.sync splits K");
  // Few tiles of operands copied from memory: 64-deep slices, and 32-row tiles in 6 stages where
  // 64-row ones fill under half the SMs (32 blocks here), 32 columns wide where 64 still do (64).
  EXPECT_EQ(mma_sync_after_wgmma(matmul_kernel(sm90(lm_head(256, 512, 768)))),
            "mma.sync 32x32x64, 2x2 warps, 6 stages; epilogue: stores direct | not wgmma: 8 tiles of 128 x 128, under 32");
  EXPECT_EQ(mma_sync_after_wgmma(matmul_kernel(sm90(lm_head(512, 512, 768)))),
            "mma.sync 32x64x64, 2x2 warps, 6 stages; epilogue: stores direct | not wgmma: 16 tiles of 128 x 128, under 32");
  EXPECT_EQ(mma_sync_after_wgmma(matmul_kernel(sm90(lm_head(640, 768, 768)))),
            "mma.sync 64x64x64, 2x2 warps, 4 stages; epilogue: stores direct | not wgmma: 30 tiles of 128 x 128, under 32");
  // B stored [K, N] with N odd.
  const Graph n_major = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [256, 64], "dtype": "bf16"},
    "w": {"shape": [64, 4001], "dtype": "bf16"}}, "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})");
  EXPECT_EQ(mma_sync_after_wgmma(matmul_kernel(sm90(n_major))),
            "mma.sync 64x64x32, 2x2 warps, 4 stages; epilogue: stores direct | not wgmma: B ('w') has rows 4001 elements "
            "apart (8002 bytes), no 16-byte multiple");
  // On sm_80 the Hopper kernel is refused for the target alone.
  const Graph g = lm_head(7, 50257, 771);
  EXPECT_EQ(mma_sync_after_wgmma(
                codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = 80}), 80).kernels.at(0)),
            "mma.sync 16x64x64, 1x4 warps, 4 stages; epilogue: stores direct | not wgmma: the Hopper kernel needs "
            "sm_90, the target is sm_80");
}

TEST(OddGemm, NvrtcCompilesTheGeneratedSm90Kernels) {
  // GPT-2's LM head at decode and prefill, Qwen2's vocabulary at 64 rows, 32001 at 4096 rows, odd K padded and not.
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 50257, 768}, {4096, 50257, 768}, {64, 151936, 896}, {4096, 32001, 4096}, {4096, 4096, 4099}, {7, 4096, 4099}};
  std::vector<std::future<std::string>> jobs;
  for (const auto& [m, n, k] : shapes)
    jobs.push_back(std::async(std::launch::async, [m = m, n = n, k = k] {
      Expected<Executable> exe = Executable::compile(lm_head(m, n, k), {.arch = "sm_90", .use_cache = false});
      return exe ? std::string() : fmt::format("m {} n {} k {}: {}", m, n, k, exe.error().message);
    }));
  for (auto& job : jobs) EXPECT_EQ(job.get(), "");
}

}  // namespace
}  // namespace kiln
