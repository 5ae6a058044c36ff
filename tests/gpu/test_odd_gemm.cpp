// GPU tests of GEMMs of the shapes models have: vocabulary sizes that are no
// multiple of 8 (50257, 32001, 151936) at decode and prefill rows (M = 1, 7,
// 64, 4096), odd K padded onto the Hopper kernel (compiler/matmul_k_padding.h)
// and odd K at decode left on mma.sync, against the reference interpreter
// with fresh random inputs and outputs poisoned before each run
// (testing::check_graphs). Which kernel each takes on sm_90 is checked first
// (on the CPU: tests/unit/test_odd_gemm.cpp says why). K is cut where the
// reference would take minutes (M = 4096 runs K = 72 and 24). Label `gpu`;
// without a GPU every test skips and says why.
#include <cstdio>

#include <fmt/format.h>

#include "codegen/kernel_codegen.h"
#include "compiler/graph_internal.h"
#include "compiler/planner/planner.h"
#include "tests/gpu/check_graphs.h"
#include "tests/gpu/require_gpu.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

struct Shape3 {
  int64_t m, n, k;
  const char* kernel;  // what sm_90's matmul kernel's decisions start with
};

// h [m, k] times w [n, k] transposed (nn.Linear; an LM head with tied embeddings), then a bias;
// the logits stored as `dtype`.
Graph lm_head(const Shape3& s, const char* dtype = "bf16") {
  return testing::must_parse(fmt::format(R"({{"kiln": 1, "name": "lm_head_m{0}_n{1}_k{2}_{3}",
    "inputs": {{"h": {{"shape": [{0}, {2}], "dtype": "bf16"}}, "w": {{"shape": [{1}, {2}], "dtype": "bf16"}},
                "b": {{"shape": [{1}], "dtype": "bf16"}}}},
    "ops": [{{"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]}},
            {{"op": "matmul", "in": ["h", "wt"], "out": "m", "dtype": "{3}"}},
            {{"op": "add", "in": ["m", "b"], "out": "logits"}}], "outputs": ["logits"]}})",
                                         s.m, s.n, s.k, dtype));
}

std::string sm90_matmul_decisions(const Graph& g) {
  const codegen::GeneratedProgram p = codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = 90}), 90);
  return p.kernels.back().decisions;  // (the matmul comes after any padded copies)
}

TEST(GpuOddGemm, VocabularySizesDecodeRowsAndOddKMatchTheReference) {
  REQUIRE_GPU();
  const std::vector<Shape3> shapes = {
      // GPT-2's vocabulary: decode rows and a prefill of 4096 rows
      {1, 50257, 768, "wgmma"}, {7, 50257, 768, "wgmma"}, {64, 50257, 768, "wgmma"}, {4096, 50257, 72, "wgmma"},
      // 32001 (a vocabulary with one added token), Qwen2's 151936
      {7, 32001, 4096, "wgmma"}, {4096, 32001, 24, "wgmma"}, {1, 151936, 896, "wgmma"}, {64, 151936, 896, "wgmma"},
      // odd K: padded to a multiple of 8 and on the Hopper kernel, odd N too; at decode left on mma.sync
      {1536, 1536, 99, "wgmma"}, {2048, 4096, 1027, "wgmma"}, {2048, 50257, 99, "wgmma"}, {7, 50257, 771, "mma.sync"},
      // a decode projection: mma.sync with its K split
      {1, 4096, 4096, "mma.sync"},
  };
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  for (const Shape3& s : shapes) {
    graphs.push_back(lm_head(s));
    names.push_back(fmt::format("m {} n {} k {}", s.m, s.n, s.k));
    const std::string decisions = sm90_matmul_decisions(graphs.back());
    EXPECT_EQ(decisions.rfind(s.kernel, 0), 0u) << names.back() << ": " << decisions;
  }
  const testing::Outcome o = testing::check_graphs(graphs, names, 41);
  std::printf("FIGURE odd GEMM shapes on the GPU: %zu graphs, %d failed\n", graphs.size(), o.failed);
  EXPECT_EQ(o.failed, 0);
}

// f32 logits of odd widths: rows of 4 * N bytes, no 16-byte multiple, copied out of the staging
// rows in 16-byte chunks of four columns, with partial tiles along M.
TEST(GpuOddGemm, F32LogitsOfOddWidthMatchTheReference) {
  REQUIRE_GPU();
  const std::vector<Shape3> shapes = {{300, 32001, 64, "wgmma"}, {129, 50257, 72, "wgmma"}, {256, 4093, 128, "wgmma"}};
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  for (const Shape3& s : shapes) {
    graphs.push_back(lm_head(s, "f32"));
    names.push_back(fmt::format("f32 m {} n {} k {}", s.m, s.n, s.k));
    const std::string decisions = sm90_matmul_decisions(graphs.back());
    EXPECT_EQ(decisions.rfind(s.kernel, 0), 0u) << names.back() << ": " << decisions;
    EXPECT_NE(decisions.find("copied out"), std::string::npos) << names.back() << ": " << decisions;
  }
  const testing::Outcome o = testing::check_graphs(graphs, names, 43);
  EXPECT_EQ(o.failed, 0);
}

// f32 operands at precision f32 take the SIMT kernel: each of its tiles
// (128 x 128, 128 x 64, 64 x 64) over partial tiles along M, N and K, with A
// and B walked along either dimension (stored transposed or not), and an
// epilogue that adds a bias and finishes a row reduction (T5's scores and
// their softmax max, as PyTorch's math attention writes them).
TEST(GpuOddGemm, F32TilesOverPartialTilesMatchTheReference) {
  REQUIRE_GPU();
  struct Case {
    int64_t batch, m, n, k;
    bool a_transposed, b_transposed;
    const char* tile;
  };
  const std::vector<Case> cases = {
      {20, 300, 260, 70, false, false, "SIMT f32 128x128x8"}, {20, 300, 260, 70, true, true, "SIMT f32 128x128x8"},
      {40, 200, 100, 33, false, true, "SIMT f32 128x64x8"},   {40, 200, 100, 33, true, false, "SIMT f32 128x64x8"},
      {3, 129, 66, 70, true, true, "SIMT f32 64x64x16"},      {1, 1, 20000, 257, false, true, "SIMT f32 128x128x8"},
  };
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  for (const Case& c : cases) {
    const std::string a_shape = c.a_transposed ? fmt::format("[{}, {}, {}]", c.batch, c.k, c.m) : fmt::format("[{}, {}, {}]", c.batch, c.m, c.k);
    const std::string b_shape = c.b_transposed ? fmt::format("[{}, {}]", c.n, c.k) : fmt::format("[{}, {}]", c.k, c.n);
    graphs.push_back(testing::must_parse(fmt::format(R"({{"kiln": 1, "name": "f32_b{0}_m{1}_n{2}_k{3}",
      "inputs": {{"a": {{"shape": {4}, "dtype": "f32"}}, "b": {{"shape": {5}, "dtype": "f32"}}, "c": {{"shape": [{2}], "dtype": "f32"}}}},
      "ops": [{{"op": "transpose", "in": ["a"], "out": "at", "perm": {6}}}, {{"op": "transpose", "in": ["b"], "out": "bt", "perm": {7}}},
              {{"op": "matmul", "in": ["at", "bt"], "out": "s"}}, {{"op": "add", "in": ["s", "c"], "out": "y"}},
              {{"op": "reduce_max", "in": ["y"], "out": "r", "axes": [2], "keepdims": true}}], "outputs": ["y", "r"]}})",
                                                     c.batch, c.m, c.n, c.k, a_shape, b_shape,
                                                     c.a_transposed ? "[0, 2, 1]" : "[0, 1, 2]", c.b_transposed ? "[1, 0]" : "[0, 1]")));
    names.push_back(fmt::format("batch {} m {} n {} k {}{}{}", c.batch, c.m, c.n, c.k, c.a_transposed ? " A^T" : "",
                                c.b_transposed ? " B^T" : ""));
    const std::string decisions = sm90_matmul_decisions(graphs.back());
    EXPECT_EQ(decisions.rfind(c.tile, 0), 0u) << names.back() << ": " << decisions;
  }
  const testing::Outcome o = testing::check_graphs(graphs, names, 43);
  std::printf("FIGURE f32 SIMT tiles on the GPU: %zu graphs, %d failed\n", graphs.size(), o.failed);
  EXPECT_EQ(o.failed, 0);
}

// Tall GEMMs of a small depth take the whole K in one slice on sm_90
// ("mma.sync one slice": codegen/gemm_codegen.cpp one_slice_tile): K not a
// multiple of 16 (zeros pad the slice), N not a multiple of 16 (a ragged
// column tile), M ragged, the 64-row tiles of a wide N in few rounds, and a
// 1x1 conv whose input is scaled per channel first (squeeze-excitation's
// scale: on sm_90 the planner writes the scaled input once, by a kernel of
// its own, and the conv gathers it), with bias or batch norm and SiLU after
// each.
TEST(GpuOddGemm, OneSliceTallGemmsMatchTheReference) {
  REQUIRE_GPU();
  struct Case {
    int64_t m, n, k;
    const char* tile;
  };
  const std::vector<Case> cases = {{100003, 96, 16, "mma.sync 128x96x16, 8x1 warps, 1 stages"},
                                   {50001, 72, 40, "mma.sync 128x80x48, 8x1 warps, 1 stages"},
                                   {6273, 488, 80, "mma.sync 64x128x80, 4x1 warps, 1 stages"},
                                   {50001, 144, 24, "mma.sync 128x48x32, 8x1 warps, 1 stages"},
                                   {40007, 24, 120, "mma.sync 128x32x128, 8x1 warps, 1 stages"}};
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  for (const Case& c : cases) {
    graphs.push_back(testing::must_parse(fmt::format(R"({{"kiln": 1, "name": "one_slice_m{0}_n{1}_k{2}",
      "inputs": {{"x": {{"shape": [{0}, {2}], "dtype": "bf16"}}, "w": {{"shape": [{2}, {1}], "dtype": "bf16"}},
                  "b": {{"shape": [{1}], "dtype": "bf16"}}}},
      "ops": [{{"op": "matmul", "in": ["x", "w"], "out": "y", "dtype": "bf16"}}, {{"op": "add", "in": ["y", "b"], "out": "z"}},
              {{"op": "silu", "in": ["z"], "out": "s", "dtype": "bf16"}}], "outputs": ["s"]}})",
                                                     c.m, c.n, c.k)));
    names.push_back(fmt::format("m {} n {} k {}", c.m, c.n, c.k));
    const std::string decisions = sm90_matmul_decisions(graphs.back());
    EXPECT_EQ(decisions.rfind(c.tile, 0), 0u) << names.back() << ": " << decisions;
  }
  // EfficientNet's projection: x scaled per (image, channel), a 1x1 conv 96 -> 24, batch norm.
  graphs.push_back(testing::must_parse(R"({"kiln": 1, "name": "one_slice_se_projection",
    "inputs": {"x": {"shape": [8, 57, 55, 96], "dtype": "bf16"}, "se": {"shape": [8, 1, 1, 96], "dtype": "bf16"},
               "w": {"shape": [24, 1, 1, 96], "dtype": "bf16"}, "mean": {"shape": [24], "dtype": "bf16"},
               "var": {"shape": [24], "dtype": "bf16"}, "gamma": {"shape": [24], "dtype": "bf16"},
               "beta": {"shape": [24], "dtype": "bf16"}},
    "ops": [{"op": "mul", "in": ["x", "se"], "out": "xs", "dtype": "bf16"},
            {"op": "conv2d", "in": ["xs", "w"], "out": "c", "dtype": "bf16"},
            {"op": "batch_norm", "in": ["c", "mean", "var", "gamma", "beta"], "out": "y", "dtype": "bf16"}],
    "outputs": ["y"]})"));
  names.push_back("1x1 conv 96 -> 24 of a scaled input, 25080 pixels");
  const std::string decisions = sm90_matmul_decisions(graphs.back());
  EXPECT_EQ(decisions.rfind("mma.sync 128x32x96, 8x1 warps, 1 stages", 0), 0u) << decisions;
  const testing::Outcome o = testing::check_graphs(graphs, names, 47);
  std::printf("FIGURE one-slice GEMMs on the GPU: %zu graphs, %d failed\n", graphs.size(), o.failed);
  EXPECT_EQ(o.failed, 0);
}

// Few tiles of operands copied from memory (1x1 and 3x3 convs over 7 x 7 and 14 x 14 maps):
// 64-deep slices, unsplit up to K = 1152, N up to 32 in a tile as narrow as N, 32-row tiles in 6
// stages (32 columns wide where 64 leave most SMs idle); M ragged, a residual, batch norm.
// DenseNet's 3x3 128 -> 32 as a conv (its patches gathered).
TEST(GpuOddGemm, FewTilesInNarrowTilesAndDeepSlicesMatchTheReference) {
  REQUIRE_GPU();
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  auto conv = [&](int n, int hw, int c, int k, int r, bool residual, const char* tile) {
    const std::string pad = std::to_string(r / 2);
    graphs.push_back(testing::must_parse(fmt::format(R"({{"kiln": 1, "name": "few_tiles_{0}x{1}_{2}_{3}_{4}",
      "inputs": {{"x": {{"shape": [{0}, {1}, {1}, {2}], "dtype": "bf16"}}, "w": {{"shape": [{3}, {4}, {4}, {2}], "dtype": "bf16"}},
                  "mean": {{"shape": [{3}], "dtype": "bf16"}}, "var": {{"shape": [{3}], "dtype": "bf16"}},
                  "gamma": {{"shape": [{3}], "dtype": "bf16"}}, "beta": {{"shape": [{3}], "dtype": "bf16"}},
                  "r": {{"shape": [{0}, {1}, {1}, {3}], "dtype": "bf16"}}}},
      "ops": [{{"op": "conv2d", "in": ["x", "w"], "out": "c", "padding": [{5}, {5}], "dtype": "bf16"}},
              {{"op": "batch_norm", "in": ["c", "mean", "var", "gamma", "beta"], "out": "b", "dtype": "bf16"}},
              {{"op": "{6}", "in": ["b"{7}], "out": "y", "dtype": "bf16"}}], "outputs": ["y"]}})",
                                                     n, hw, c, k, r, pad, residual ? "add" : "relu", residual ? ", \"r\"" : "")));
    names.push_back(fmt::format("{}x{} conv {} -> {} over {} x {} x {}", r, r, c, k, n, hw, hw));
    const std::string decisions = sm90_matmul_decisions(graphs.back());
    EXPECT_EQ(decisions.rfind(tile, 0), 0u) << names.back() << ": " << decisions;
  };
  conv(32, 7, 1152, 192, 1, true, "mma.sync 64x64x64, 2x2 warps, 4 stages");  // EfficientNet: 1568 x 192 x 1152
  conv(16, 7, 992, 128, 1, false, "mma.sync 32x32x64, 2x2 warps, 6 stages");   // DenseNet: 784 rows, ragged, 26 blocks of 64
  conv(16, 14, 992, 128, 1, false, "mma.sync 64x64x64, 2x2 warps, 4 stages");  // 98 blocks of 64 rows
  conv(16, 7, 128, 32, 3, false, "mma.sync 32x32x64, 2x2 warps, 6 stages");    // DenseNet's growth
  conv(2, 11, 64, 48, 3, true, "mma.sync 32x32x64, 2x2 warps, 6 stages");      // 242 rows, 48 columns in two tiles of 32
  conv(3, 9, 96, 64, 1, true, "mma.sync 32x32x64, 2x2 warps, 6 stages");       // 243 rows
  conv(4, 7, 64, 16, 3, true, "mma.sync 64x16x64, 4x1 warps, 4 stages");       // 196 rows, N = 16
  const testing::Outcome o = testing::check_graphs(graphs, names, 53);
  std::printf("FIGURE few-tile GEMMs on the GPU: %zu graphs, %d failed\n", graphs.size(), o.failed);
  EXPECT_EQ(o.failed, 0);
}

}  // namespace
}  // namespace kiln
