// Patch convolutions as matmuls (compiler/patch_convolutions.h): which convs
// become matmuls of their input's patches, and that the rewritten graph
// computes the values of the graph as written.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "compiler/graph_internal.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "tests/unit/planned_graph_checks.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

bool has_conv(const ir::Graph& g) {
  for (const ir::Op& op : g.ops)
    if (op.kind == ir::OpKind::Conv2d) return true;
  return false;
}

// One conv of `x` and `w` with the given attributes (a JSON fragment), its result the graph's output.
Graph conv_graph(const std::string& x, const std::string& w, const std::string& dtype, const std::string& attrs) {
  return testing::must_parse(fmt::format(
      R"({{"kiln": 1, "inputs": {{"x": {{"shape": {0}, "dtype": "{2}"}}, "w": {{"shape": {1}, "dtype": "{2}"}}}},
          "ops": [{{"op": "conv2d", "in": ["x", "w"], "out": "y", {3}}}], "outputs": ["y"]}})",
      x, w, dtype, attrs));
}

TEST(PatchConvolutions, ViTsPatchEmbeddingIsAMatmulOfPatchesReadInPlace) {
  Expected<Graph> loaded = Graph::load(KILN_SOURCE_DIR "/examples/conv/patch_embedding.json");
  ASSERT_TRUE(loaded) << loaded.error().message;
  const Graph& g = *loaded;
  const ir::Graph& planned = ir_of(g);
  const ir::Graph& as_written = Graph::Internal::as_written(g);
  EXPECT_FALSE(has_conv(planned));
  EXPECT_EQ(planned.inputs, as_written.inputs);
  EXPECT_EQ(planned.outputs, as_written.outputs);
  int matmuls = 0;
  for (const ir::Op& op : planned.ops) {
    if (op.kind != ir::OpKind::Matmul) continue;
    ++matmuls;
    EXPECT_EQ(planned.operand(op, 0).shape, (Shape{8 * 14 * 14, 3 * 16 * 16}));
    EXPECT_EQ(planned.operand(op, 1).shape, (Shape{3 * 16 * 16, 384}));
  }
  EXPECT_EQ(matmuls, 1);
  // One kernel: the views are the matmul's operand reads, the bias and the flattening its epilogue.
  const ir::Plan p = ir::plan_fusion(planned);
  ASSERT_EQ(ir::verify_plan(planned, p), "");
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_EQ(p.kernels[0].kind, ir::KernelKind::Matmul);
  testing::expect_planned_equals_written(g, 5, testing::Equality::kValues);
}

TEST(PatchConvolutions, WindowsThatTileTheInputComputeTheConvsValues) {
  struct Case {
    const char *x, *w, *dtype, *attrs;
  };
  const Case cases[] = {
      // NCHW, 8-pixel patch rows; a rectangular patch; f16.
      {"[2, 3, 32, 32]", "[16, 3, 8, 8]", "bf16", R"("layout": "NCHW", "stride": [8, 8])"},
      {"[1, 5, 12, 32]", "[24, 5, 3, 16]", "f16", R"("layout": "NCHW", "stride": [3, 16])"},
      // NHWC with 3 channels: rows of 8 pixels are 24 elements.
      {"[2, 32, 32, 3]", "[16, 8, 8, 3]", "bf16", R"("stride": [8, 8])"},
      // NHWC, 4 channels, 2 x 2 patches: rows of 8 elements.
      {"[3, 16, 16, 4]", "[8, 2, 2, 4]", "bf16", R"("stride": [2, 2])"},
      // Pointwise (1x1, stride 1) NHWC: its pixel rows as they lie; 24 channels, odd H and W.
      {"[2, 7, 9, 24]", "[40, 1, 1, 24]", "bf16", R"("stride": [1, 1])"},
      {"[1, 4, 4, 64]", "[8, 1, 1, 64]", "f16", R"("stride": [1, 1])"},
  };
  for (const Case& c : cases) {
    const Graph g = conv_graph(c.x, c.w, c.dtype, c.attrs);
    EXPECT_FALSE(has_conv(ir_of(g))) << c.x << " " << c.attrs;
    const ir::Plan p = ir::plan_fusion(ir_of(g));
    ASSERT_EQ(ir::verify_plan(ir_of(g), p), "");
    for (uint64_t seed = 1; seed <= 3; ++seed) testing::expect_planned_equals_written(g, seed, testing::Equality::kValues);
  }
}

TEST(PatchConvolutions, OtherConvsStayConvs) {
  struct Case {
    const char *x, *w, *dtype, *attrs, *why;
  };
  const Case cases[] = {
      {"[2, 3, 32, 32]", "[16, 3, 8, 8]", "bf16", R"("layout": "NCHW", "stride": [4, 4])", "windows overlap"},
      {"[2, 3, 32, 32]", "[16, 3, 8, 8]", "bf16", R"("layout": "NCHW", "stride": [8, 8], "padding": [1, 1])", "padding"},
      {"[2, 3, 36, 32]", "[16, 3, 8, 8]", "bf16", R"("layout": "NCHW", "stride": [8, 8])", "rows left over"},
      {"[2, 3, 32, 32]", "[16, 3, 4, 4]", "bf16", R"("layout": "NCHW", "stride": [4, 4])", "4-pixel patch rows"},
      {"[2, 32, 32, 3]", "[16, 8, 8, 3]", "f32", R"("stride": [8, 8])", "f32 operands"},
      {"[2, 32, 32, 16]", "[16, 2, 2, 16]", "bf16", R"("stride": [2, 2])", "channels gather already"},
      {"[2, 32, 32, 8]", "[16, 1, 1, 8]", "f32", R"("stride": [1, 1])", "an f32 pointwise conv"},
      {"[2, 32, 32, 8]", "[16, 1, 1, 8]", "bf16", R"("stride": [2, 2])", "a strided 1x1"},
      {"[2, 32, 32, 8]", "[8, 2, 2, 4]", "bf16", R"("stride": [2, 2], "groups": 2)", "groups"},
  };
  for (const Case& c : cases) EXPECT_TRUE(has_conv(ir_of(conv_graph(c.x, c.w, c.dtype, c.attrs)))) << c.why;
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A pointwise conv whose result reaches a pooling op through a batch norm and
// a ReLU stays a conv: the conv kernel pools 2 x 2 windows in its epilogue.
TEST(PatchConvolutions, APointwiseConvFeedingAPoolStaysAConv) {
  const Graph g = testing::must_parse(R"({"kiln": 1,
    "inputs": {"x": {"shape": [2, 8, 8, 16], "dtype": "bf16"}, "w": {"shape": [32, 1, 1, 16], "dtype": "bf16"},
               "m": {"shape": [32], "dtype": "f32"}, "v": {"shape": [32], "dtype": "f32"}},
    "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "c"},
            {"op": "batch_norm", "in": ["c", "m", "v"], "out": "bn", "axis": 3},
            {"op": "relu", "in": ["bn"], "out": "r"},
            {"op": "avg_pool2d", "in": ["r"], "out": "y", "kernel": [2, 2], "stride": [2, 2]}],
    "outputs": ["y"]})");
  EXPECT_TRUE(has_conv(ir_of(g)));
}

}  // namespace
}  // namespace kiln
