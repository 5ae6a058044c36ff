// Layout sinking (compiler/layout_sinking.h): the sunk graph computes the
// same values bit for bit, keeps inputs and outputs, and lets channels-last
// convolutions read each other's results without a transpose.
#include <gtest/gtest.h>

#include "compiler/graph_internal.h"
#include "compiler/planner/planner.h"
#include "compiler/plan_verifier.h"
#include "runtime/random_inputs.h"
#include "tests/unit/random_graph.h"
#include "tests/unit/planned_graph_checks.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

Graph must_load(const std::string& path) {
  Expected<Graph> g = Graph::load(path);
  if (!g) ADD_FAILURE() << g.error().message;
  return std::move(g).value();
}

bool sunk(const Graph& g) { return testing::rewritten_by(g, "layout_sinking"); }

int count_ops(const ir::Graph& g, ir::OpKind kind) {
  int n = 0;
  for (const ir::Op& op : g.ops) n += op.kind == kind;
  return n;
}

// The graph as sunk computes what it computes as written, to the bit.
void expect_same_values(const Graph& g, uint64_t seed) {
  testing::expect_planned_equals_written(g, seed, testing::Equality::kBits);
}

TEST(LayoutSinking, GraphsWithoutATransposeToMoveAreUntouched) {
  const Graph g = testing::must_parse(R"({"kiln": 1, "name": "plain",
    "inputs": {"x": {"shape": [4, 8], "dtype": "f32"}},
    "ops": [{"op": "relu", "in": ["x"], "out": "r"}, {"op": "transpose", "in": ["r"], "out": "y", "perm": [1, 0]}],
    "outputs": ["y"]})");
  EXPECT_FALSE(sunk(g));
}

TEST(LayoutSinking, ChannelsLastBlockKeepsItsTensorsNhwc) {
  const Graph g = must_load(KILN_SOURCE_DIR "/examples/layout/bottleneck_channels_last.json");
  ASSERT_TRUE(sunk(g));
  const ir::Graph& as_written = Graph::Internal::as_written(g);
  const ir::Graph& planned = ir_of(g);
  // as written: each conv's input, weight and result transposed (9), the
  // residual's; sunk: the inputs' and weights' views alone (the residual
  // reads x through the first conv's view of it), the first conv's filter
  // columns (a pointwise conv as a matmul: patch_convolutions.h), and one in
  // front of the reshape of the pooled mean
  EXPECT_EQ(count_ops(as_written, ir::OpKind::Transpose), 9);
  EXPECT_EQ(count_ops(planned, ir::OpKind::Transpose), 6);
  // inputs and outputs keep their ids, names and shapes
  ASSERT_EQ(planned.inputs, as_written.inputs);
  ASSERT_EQ(planned.outputs, as_written.outputs);
  for (ir::TensorId id : planned.outputs) EXPECT_EQ(planned.tensor(id).shape, as_written.tensor(id).shape);
  // batch_norm and pooling run over NHWC
  for (const ir::Op& op : planned.ops) {
    if (op.kind == ir::OpKind::BatchNorm) { EXPECT_EQ(op.attrs.axis, 3); }
    if (op.kind == ir::OpKind::MaxPool2d) { EXPECT_EQ(op.attrs.layout, ir::Layout::NHWC); }
  }
  expect_same_values(g, 7);
}

TEST(LayoutSinking, RandomGraphsComputeTheSameBitForBit) {
  int moved = 0;
  for (uint64_t seed = 1; seed <= 3000; ++seed) {
    const Graph g = testing::random_graph(seed);
    // (Written-out attention as sdpa, and an f32 sdpa as matmuls, change values within f32 rounding: not bit for bit.)
    if (!sunk(g) || testing::rewritten_by(g, "attention_as_sdpa") ||
        testing::rewritten_by(g, "sdpa_as_matmuls"))
      continue;
    ++moved;
    const ir::Plan p = ir::plan_fusion(ir_of(g));
    ASSERT_EQ(ir::verify_plan(ir_of(g), p), "") << "seed " << seed << "\n" << g.to_json();
    expect_same_values(g, seed);
    if (HasFailure()) return;
  }
  EXPECT_GT(moved, 50);  // the property covers graphs that moved (91 of 3000)
  RecordProperty("graphs_sunk", moved);
}

}  // namespace
}  // namespace kiln
