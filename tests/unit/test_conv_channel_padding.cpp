// Channel padding of thin convolutions (compiler/conv_channel_padding.h):
// the padded graph computes the same values, keeps inputs and outputs, and
// its conv reads 8 channels from a tensor written once.
#include <gtest/gtest.h>

#include "compiler/graph_internal.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "runtime/random_inputs.h"
#include "tests/unit/random_graph.h"
#include "tests/unit/planned_graph_checks.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

int count_ops(const ir::Graph& g, ir::OpKind kind) {
  int n = 0;
  for (const ir::Op& op : g.ops) n += op.kind == kind;
  return n;
}

bool padded(const Graph& g) { return count_ops(ir_of(g), ir::OpKind::Concat) > count_ops(Graph::Internal::as_written(g), ir::OpKind::Concat); }

// The padded graph computes what the graph as written computes (the added
// products are 0 * 0; a zero sum may change sign).
void expect_same_values(const Graph& g, uint64_t seed) {
  testing::expect_planned_equals_written(g, seed, testing::Equality::kValues);
}

TEST(ConvChannelPadding, TheStemReadsEightChannelsWrittenOnce) {
  Expected<Graph> loaded = Graph::load(KILN_SOURCE_DIR "/examples/conv/thin_channels_stem.json");
  ASSERT_TRUE(loaded) << loaded.error().message;
  const Graph& g = *loaded;
  ASSERT_TRUE(padded(g));
  const ir::Graph& planned = ir_of(g);
  const ir::Graph& as_written = Graph::Internal::as_written(g);
  EXPECT_EQ(planned.inputs, as_written.inputs);
  EXPECT_EQ(planned.outputs, as_written.outputs);
  for (const ir::Op& op : planned.ops) {
    if (op.kind != ir::OpKind::Conv2d) continue;
    EXPECT_EQ(planned.operand(op, 0).shape, (Shape{2, 32, 32, 8}));
    EXPECT_EQ(planned.operand(op, 1).shape, (Shape{16, 7, 7, 8}));
    EXPECT_TRUE(planned.operand(op, 0).rounded);
  }
  // Two small kernels write the padded input and weights; the conv reads them from memory.
  const ir::Plan p = ir::plan_fusion(planned);
  ASSERT_EQ(ir::verify_plan(planned, p), "");
  ASSERT_EQ(p.kernels.size(), 3u);
  EXPECT_EQ(p.kernels[2].kind, ir::KernelKind::Conv);
  expect_same_values(g, 3);
}

TEST(ConvChannelPadding, ConvsThatGatherAlreadyAreUntouched) {
  for (const char* conv : {R"("x": {"shape": [2, 8, 8, 16], "dtype": "bf16"}, "w": {"shape": [8, 3, 3, 16], "dtype": "bf16"}}, "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "y"}])",
                           R"("x": {"shape": [2, 8, 8, 3], "dtype": "f32"}, "w": {"shape": [8, 3, 3, 3], "dtype": "f32"}}, "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "y"}])"}) {
    const Graph g = testing::must_parse(std::string(R"({"kiln": 1, "inputs": {)") + conv + R"(, "outputs": ["y"]})");
    EXPECT_FALSE(padded(g)) << conv;
  }
}

// An NCHW stem is an NHWC conv by then (nchw_convs_as_nhwc.h): padded like a channels-last one.
TEST(ConvChannelPadding, AnNchwStemIsPaddedToo) {
  const Graph g = testing::must_parse(
      R"({"kiln": 1, "inputs": {"x": {"shape": [2, 3, 8, 8], "dtype": "bf16"}, "w": {"shape": [8, 3, 3, 3], "dtype": "bf16"}},
          "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "y", "layout": "NCHW", "padding": [1, 1]}], "outputs": ["y"]})");
  EXPECT_TRUE(padded(g));
  expect_same_values(g, 5);
}

TEST(ConvChannelPadding, RandomGraphsComputeTheSameValues) {
  int changed = 0;
  for (uint64_t seed = 1; seed <= 3000; ++seed) {
    const Graph g = testing::random_graph(seed);
    // (Written-out attention as sdpa, and an f32 sdpa as matmuls, change values within f32 rounding, not to a zero's sign.)
    if (!padded(g) || testing::rewritten_by(g, "attention_as_sdpa") ||
        testing::rewritten_by(g, "sdpa_as_matmuls"))
      continue;
    ++changed;
    const ir::Plan p = ir::plan_fusion(ir_of(g));
    ASSERT_EQ(ir::verify_plan(ir_of(g), p), "") << "seed " << seed << "\n" << g.to_json();
    expect_same_values(g, seed);
    if (HasFailure()) return;
  }
  EXPECT_GT(changed, 50);  // the property covers graphs that changed (205 of 3000)
  RecordProperty("graphs_padded", changed);

}

}  // namespace
}  // namespace kiln
