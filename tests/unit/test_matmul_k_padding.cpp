// K padding of matmuls (compiler/matmul_k_padding.h): where it applies, the
// padded graph computes the same values, keeps inputs and outputs, keeps B
// K-major, and its matmul reads operands written once with K a multiple of
// 8; where it does not, the plan's near miss says why.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "compiler/graph_internal.h"
#include "compiler/matmul_k_padding.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "compiler/rewrite_check.h"
#include "tests/unit/planned_graph_checks.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

const ir::Op& only_matmul(const ir::Graph& g) {
  const ir::Op* found = nullptr;
  for (const ir::Op& op : g.ops)
    if (op.kind == ir::OpKind::Matmul) {
      EXPECT_EQ(found, nullptr) << "more than one matmul";
      found = &op;
    }
  EXPECT_NE(found, nullptr);
  return *found;
}

// x [m, k] times w [n, k] transposed: nn.Linear.
Graph linear(int64_t m, int64_t n, int64_t k, const char* dtype = "bf16") {
  return testing::must_parse(fmt::format(R"({{"kiln": 1, "inputs": {{"x": {{"shape": [{0}, {2}], "dtype": "{3}"}},
    "w": {{"shape": [{1}, {2}], "dtype": "{3}"}}}},
    "ops": [{{"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]}},
            {{"op": "matmul", "in": ["x", "wt"], "out": "y"}}], "outputs": ["y"]}})",
                                         m, n, k, dtype));
}

std::string notes(const Graph& g) { return ir::rewrite_notes_text(ir_of(g)); }

TEST(MatmulKPadding, TheExamplePadsBothOperandsAndKeepsTheWeightsKMajor) {
  Expected<Graph> loaded = Graph::load(KILN_SOURCE_DIR "/examples/matmul/hopper_odd_k_linear_gelu.json");
  ASSERT_TRUE(loaded) << loaded.error().message;
  const Graph& g = *loaded;
  ASSERT_TRUE(testing::rewritten_by(g, "matmul_k_padding")) << notes(g);
  const ir::Graph& planned = ir_of(g);
  const ir::Graph& as_written = Graph::Internal::as_written(g);
  EXPECT_EQ(planned.inputs, as_written.inputs);
  EXPECT_EQ(planned.outputs, as_written.outputs);
  const ir::Op& mm = only_matmul(planned);
  EXPECT_EQ(planned.operand(mm, 0).shape, (Shape{1536, 104}));
  EXPECT_EQ(planned.operand(mm, 0).name, "x.k104");
  // B is a transpose of the padded weights [1536, 104]: still K-major.
  const ir::Tensor& b = planned.operand(mm, 1);
  EXPECT_EQ(b.shape, (Shape{104, 1536}));
  ASSERT_GE(b.producer, 0);
  const ir::Op& transpose = planned.ops[static_cast<size_t>(b.producer)];
  ASSERT_EQ(transpose.kind, ir::OpKind::Transpose);
  EXPECT_EQ(planned.operand(transpose, 0).name, "w.k104");
  EXPECT_EQ(planned.operand(transpose, 0).shape, (Shape{1536, 104}));
  // The transpose as written had no other reader: it is gone.
  int transposes = 0;
  for (const ir::Op& op : planned.ops) transposes += op.kind == ir::OpKind::Transpose;
  EXPECT_EQ(transposes, 1);
  // One kernel writes both padded operands (fused horizontally); the matmul reads them from memory
  // (on sm_90 and sm_80 alike).
  for (int sm : {90, 80}) {
    const ir::Plan p = ir::plan_fusion(planned, {.sm = sm});
    ASSERT_EQ(ir::verify_plan(planned, p), "");
    ASSERT_EQ(p.kernels.size(), 2u) << sm;
    EXPECT_EQ(p.kernels[0].kind, ir::KernelKind::Pointwise);
    EXPECT_EQ(p.kernels[1].kind, ir::KernelKind::Matmul);
  }
  testing::expect_planned_equals_written(g, 3, testing::Equality::kValues);
}

TEST(MatmulKPadding, NearMissesSayWhy) {
  // Decode: 7 rows. The weights would be copied for a GEMM of a few MFLOP.
  const Graph decode = linear(7, 4096, 99);
  EXPECT_FALSE(testing::rewritten_by(decode, "matmul_k_padding"));
  EXPECT_EQ(notes(decode),
            "not rewritten (matmul_k_padding): 'y' (matmul): K = 99: copying its operands padded to K = 104 (1.6 MiB) costs "
            "more than it saves on 0.01 GFLOP (padded where the GEMM does at least 256 flops per byte copied)\n");
  // B stored [K, N] with N odd: no layout of it loads by TMA.
  const Graph n_major = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [4096, 99], "dtype": "bf16"},
    "w": {"shape": [99, 4001], "dtype": "bf16"}}, "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})");
  EXPECT_FALSE(testing::rewritten_by(n_major, "matmul_k_padding"));
  EXPECT_EQ(notes(n_major),
            "not rewritten (matmul_k_padding): 'y' (matmul): K = 99: B ('w') has rows of 4001 elements, no 16-byte "
            "multiple with K padded or not: no tensor map loads it\n");
  // Not this row's: f32 operands, K a multiple of 8.
  EXPECT_EQ(notes(linear(4096, 4096, 99, "f32")), "");
  EXPECT_EQ(notes(linear(4096, 4096, 104)), "");
}

TEST(MatmulKPadding, LargeGemmsArePaddedWhereTheyPay) {
  // The copies: rows x (K + K') x 2 bytes for each operand; padded from 256 flops per byte copied.
  EXPECT_TRUE(testing::rewritten_by(linear(4096, 4096, 4099), "matmul_k_padding"));
  EXPECT_TRUE(testing::rewritten_by(linear(4096, 50257, 771), "matmul_k_padding"));
  EXPECT_FALSE(testing::rewritten_by(linear(64, 50257, 771), "matmul_k_padding"));
  EXPECT_EQ(notes(linear(4096, 4096, 4099)),
            "rewrite matmul_k_padding: 'y' (matmul): K = 4099 padded to 4104 in both operands (128.2 MiB copied for "
            "137.54 GFLOP)\n");
}

// The replacement at every odd-K matmul, whatever its size (the sites
// chosen here, not by the cost rule): the same values on the reference, a
// graph the rewrite check accepts, a plan the verifier accepts.
void expect_padding_keeps_values(const std::string& json, uint64_t seed) {
  const Graph g = testing::must_parse(json);
  const ir::Graph& as_written = Graph::Internal::as_written(g);
  ir::RowMatches every;
  for (size_t i = 0; i < as_written.ops.size(); ++i)
    if (as_written.ops[i].kind == ir::OpKind::Matmul) every.sites.push_back({static_cast<int32_t>(i), "", {}});
  auto padded = std::make_shared<const ir::Graph>(ir::pad_matmul_k(as_written, every));
  ASSERT_EQ(ir::rewritten_graph_problem(as_written, *padded), "") << json;
  for (const ir::Op& op : padded->ops)
    if (op.kind == ir::OpKind::Matmul) EXPECT_EQ(padded->operand(op, 0).shape.back() % 8, 0) << json;
  const Graph h = Graph::Internal::with_planned(g, padded);
  const ir::Plan p = ir::plan_fusion(*padded);
  ASSERT_EQ(ir::verify_plan(*padded, p), "") << json;
  testing::expect_planned_equals_written(h, seed, testing::Equality::kValues);
}

TEST(MatmulKPadding, EveryLayoutOfTheOperandsKeepsItsValues) {
  const char* cases[] = {
      // batched, B a transpose of [B, N, K] (attention scores with an odd head size)
      R"({"kiln": 1, "inputs": {"q": {"shape": [2, 3, 17, 13], "dtype": "bf16"}, "k": {"shape": [2, 3, 11, 13], "dtype": "bf16"}},
          "ops": [{"op": "transpose", "in": ["k"], "out": "kt", "perm": [0, 1, 3, 2]}, {"op": "matmul", "in": ["q", "kt"], "out": "s"}],
          "outputs": ["s"]})",
      // B [K, N] as stored (padded along K, its axis -2), broadcast over A's batch
      R"({"kiln": 1, "inputs": {"a": {"shape": [4, 9, 21], "dtype": "f16"}, "b": {"shape": [21, 16], "dtype": "f16"}},
          "ops": [{"op": "matmul", "in": ["a", "b"], "out": "y"}], "outputs": ["y"]})",
      // A a transpose ([K, M] stored), B through a transpose read elsewhere too (kept for that reader)
      R"({"kiln": 1, "inputs": {"xt": {"shape": [5, 12], "dtype": "bf16"}, "w": {"shape": [10, 5], "dtype": "bf16"}},
          "ops": [{"op": "transpose", "in": ["xt"], "out": "x", "perm": [1, 0]},
                  {"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]},
                  {"op": "matmul", "in": ["x", "wt"], "out": "y"}, {"op": "relu", "in": ["wt"], "out": "r"}],
          "outputs": ["y", "r"]})",
      // x times its own transpose: one padded copy for both operands
      R"({"kiln": 1, "inputs": {"x": {"shape": [6, 11], "dtype": "bf16"}},
          "ops": [{"op": "transpose", "in": ["x"], "out": "xt", "perm": [1, 0]}, {"op": "matmul", "in": ["x", "xt"], "out": "g"}],
          "outputs": ["g"]})",
      // A computed (a gelu), the result an output and read by an epilogue; two matmuls share the weights
      R"({"kiln": 1, "inputs": {"x": {"shape": [8, 3], "dtype": "bf16"}, "w": {"shape": [4, 3], "dtype": "bf16"}},
          "ops": [{"op": "gelu", "in": ["x"], "out": "gx", "dtype": "bf16"}, {"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]},
                  {"op": "matmul", "in": ["gx", "wt"], "out": "y1"}, {"op": "matmul", "in": ["x", "wt"], "out": "y2"},
                  {"op": "add", "in": ["y1", "y2"], "out": "s"}],
          "outputs": ["y1", "s"]})",
  };
  uint64_t seed = 1;
  for (const char* json : cases) expect_padding_keeps_values(json, seed++);
}

}  // namespace
}  // namespace kiln
