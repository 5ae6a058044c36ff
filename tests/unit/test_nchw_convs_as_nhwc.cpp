// NCHW convolutions as NHWC ones (compiler/nchw_convs_as_nhwc.h): every NCHW
// conv2d becomes an NHWC one between transposes, the rewritten graph computes
// the values of the graph as written, and with layout sinking an NCHW network
// keeps its transposes at its input, its weights and its outputs.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "compiler/graph_internal.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "tests/unit/planned_graph_checks.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

Graph must_load(const std::string& path) {
  Expected<Graph> g = Graph::load(path);
  if (!g) ADD_FAILURE() << g.error().message;
  return std::move(g).value();
}

int nchw_convs(const ir::Graph& g) {
  int n = 0;
  for (const ir::Op& op : g.ops) n += op.kind == ir::OpKind::Conv2d && op.attrs.layout == ir::Layout::NCHW;
  return n;
}

// One NCHW conv of `x` and `w` with the given attributes (a JSON fragment), its result the graph's output.
Graph conv_graph(const std::string& x, const std::string& w, const std::string& dtype, const std::string& attrs) {
  return testing::must_parse(fmt::format(
      R"({{"kiln": 1, "inputs": {{"x": {{"shape": {0}, "dtype": "{2}"}}, "w": {{"shape": {1}, "dtype": "{2}"}}}},
          "ops": [{{"op": "conv2d", "in": ["x", "w"], "out": "y", "layout": "NCHW", {3}}}], "outputs": ["y"]}})",
      x, w, dtype, attrs));
}

// Whether a transpose keeps its operand's memory order: it moves only 1s
// (a bias [1, K, 1, 1] read as [1, 1, 1, K]).
bool moves_only_ones(const ir::Graph& g, const ir::Op& op) {
  const Shape& from = g.operand(op, 0).shape;
  int64_t last = -1;
  for (int64_t d : op.attrs.perm) {
    if (from[static_cast<size_t>(d)] == 1) continue;
    if (d < last) return false;
    last = d;
  }
  return true;
}

// Whether `t` is a graph input seen through views alone (a pointwise conv's
// filter columns: a transpose of a reshape of its weights' transpose).
bool input_through_views(const ir::Graph& g, ir::TensorId t) {
  const ir::Tensor& tensor = g.tensor(t);
  if (tensor.kind == ir::TensorKind::Input) return true;
  if (tensor.kind != ir::TensorKind::OpResult) return false;
  const ir::Op& op = g.ops[static_cast<size_t>(tensor.producer)];
  return ir::op_info(op.kind).family == ir::OpFamily::View && input_through_views(g, op.inputs[0]);
}

// The transposes left: each reads a graph input (the network's input, its
// weights, through views), is read only by ops that make graph outputs
// (layout sinking leaves an output's op as written), or moves only 1s; none
// sits between two convs.
void expect_transposes_only_at_the_edges(const ir::Graph& g) {
  for (const ir::Op& op : g.ops) {
    if (op.kind != ir::OpKind::Transpose || moves_only_ones(g, op)) continue;
    bool feeds_outputs = !g.users[static_cast<size_t>(op.output)].empty();
    for (int32_t user : g.users[static_cast<size_t>(op.output)]) feeds_outputs &= g.result(g.ops[static_cast<size_t>(user)]).is_output;
    const bool reads_input = input_through_views(g, op.inputs[0]);
    EXPECT_TRUE(reads_input || g.result(op).is_output || feeds_outputs)
        << "transpose '" << g.result(op).name << "' of '" << g.operand(op, 0).name << "' inside the graph";
  }
}

TEST(NchwConvsAsNhwc, EveryNchwConvComputesTheSameValues) {
  struct Case {
    const char *x, *w, *dtype, *attrs;
  };
  const Case cases[] = {
      {"[2, 16, 9, 11]", "[8, 16, 3, 3]", "bf16", R"("padding": [1, 1])"},
      {"[1, 5, 13, 7]", "[6, 5, 3, 2]", "f32", R"("padding": [1, 0], "stride": [2, 1])"},
      {"[2, 8, 10, 10]", "[4, 8, 3, 3]", "f16", R"("dilation": [2, 2], "padding": [2, 2])"},
      {"[2, 12, 7, 7]", "[6, 4, 3, 3]", "bf16", R"("groups": 3, "padding": [1, 1])"},                 // grouped
      {"[2, 24, 9, 9]", "[24, 1, 3, 3]", "bf16", R"("groups": 24, "padding": [1, 1], "stride": [2, 2])"},  // depthwise
      {"[1, 6, 8, 8]", "[12, 1, 5, 5]", "f32", R"("groups": 6, "padding": [2, 2])"},                  // multiplier 2
      {"[2, 32, 5, 5]", "[16, 32, 1, 1]", "bf16", R"("padding": [0, 0])"},                           // 1x1
      {"[2, 3, 16, 16]", "[8, 3, 4, 4]", "bf16", R"("stride": [4, 4])"},  // tiles, but 4-pixel rows: not a patch matmul
  };
  for (const Case& c : cases) {
    const Graph g = conv_graph(c.x, c.w, c.dtype, c.attrs);
    EXPECT_TRUE(testing::rewritten_by(g, "nchw_convs_as_nhwc")) << c.x << " " << c.attrs;
    EXPECT_EQ(nchw_convs(ir_of(g)), 0) << c.x << " " << c.attrs;
    EXPECT_EQ(ir_of(g).inputs, Graph::Internal::as_written(g).inputs);
    EXPECT_EQ(ir_of(g).outputs, Graph::Internal::as_written(g).outputs);
    const ir::Plan p = ir::plan_fusion(ir_of(g));
    ASSERT_EQ(ir::verify_plan(ir_of(g), p), "") << c.x << " " << c.attrs;
    // The reference sums each output's products in one order whatever the layout: bit for bit.
    for (uint64_t seed = 1; seed <= 2; ++seed) testing::expect_planned_equals_written(g, seed, testing::Equality::kBits);
  }
}

TEST(NchwConvsAsNhwc, PatchConvolutionsStayMatmuls) {
  const Graph g = must_load(KILN_SOURCE_DIR "/examples/conv/patch_embedding.json");
  EXPECT_TRUE(testing::rewritten_by(g, "patch_convolutions"));
  EXPECT_FALSE(testing::rewritten_by(g, "nchw_convs_as_nhwc"));
}

TEST(NchwConvsAsNhwc, ResNetBlocksStayNhwcBetweenTheirInputAndOutput) {
  const Graph g = must_load(KILN_SOURCE_DIR "/examples/layout/resnet_blocks_nchw.json");
  ASSERT_TRUE(testing::rewritten_by(g, "nchw_convs_as_nhwc"));
  ASSERT_TRUE(testing::rewritten_by(g, "layout_sinking"));
  const ir::Graph& planned = ir_of(g);
  EXPECT_EQ(nchw_convs(planned), 0);
  expect_transposes_only_at_the_edges(planned);
  for (const ir::Op& op : planned.ops) {
    if (op.kind == ir::OpKind::BatchNorm) { EXPECT_EQ(op.attrs.axis, 3); }
    if (op.kind == ir::OpKind::MaxPool2d) { EXPECT_EQ(op.attrs.layout, ir::Layout::NHWC); }
  }
  const ir::Plan p = ir::plan_fusion(planned);
  ASSERT_EQ(ir::verify_plan(planned, p), "");
  for (uint64_t seed = 1; seed <= 2; ++seed) testing::expect_planned_equals_written(g, seed, testing::Equality::kBits);
}

// The network's input is also the first block's residual: the add reads the
// input as its conv does, from the copy written once channels-last, and the
// block's result stays NHWC for the next conv.
TEST(NchwConvsAsNhwc, AResidualOfTheNetworksInputReadsItsChannelsLastCopy) {
  const Graph g = testing::must_parse(R"({"kiln": 1, "name": "residual_input",
    "inputs": {"x": {"shape": [2, 16, 8, 8], "dtype": "bf16"}, "w1": {"shape": [16, 16, 3, 3], "dtype": "bf16"},
               "w2": {"shape": [8, 16, 1, 1], "dtype": "bf16"}},
    "ops": [{"op": "conv2d", "in": ["x", "w1"], "out": "c1", "layout": "NCHW", "padding": [1, 1]},
            {"op": "add", "in": ["c1", "x"], "out": "sum"},
            {"op": "relu", "in": ["sum"], "out": "r", "dtype": "bf16"},
            {"op": "conv2d", "in": ["r", "w2"], "out": "y", "layout": "NCHW", "dtype": "bf16"}],
    "outputs": ["y"]})");
  const ir::Graph& planned = ir_of(g);
  expect_transposes_only_at_the_edges(planned);
  int transposes_of_x = 0;
  for (const ir::Op& op : planned.ops) transposes_of_x += op.kind == ir::OpKind::Transpose && planned.operand(op, 0).name == "x";
  EXPECT_EQ(transposes_of_x, 1);
  const ir::Plan p = ir::plan_fusion(planned);
  ASSERT_EQ(ir::verify_plan(planned, p), "");
  // copy of x, copy of w1, the conv with the residual and relu; the second conv (1x1: weights in order)
  ASSERT_EQ(p.kernels.size(), 4u);
  EXPECT_EQ(p.kernels[0].kind, ir::KernelKind::Copy);
  std::vector<std::string> reads;
  for (ir::TensorId t : p.kernels[2].reads) reads.push_back(planned.tensor(t).name);
  EXPECT_THAT(reads, ::testing::Contains("c1.input_nhwc"));
  EXPECT_THAT(reads, ::testing::Not(::testing::Contains("x")));
  for (uint64_t seed = 1; seed <= 2; ++seed) testing::expect_planned_equals_written(g, seed, testing::Equality::kBits);
}

// EfficientNet's block: the squeeze-excite's 1x1 convs add their bias as
// PyTorch's NCHW export does, reshaped to [K, 1, 1]: layout sinking reads it
// as [1, 1, 1, K] and the gate stays NHWC too.
TEST(NchwConvsAsNhwc, DepthwiseSqueezeExciteBlockStaysNhwc) {
  const Graph g = must_load(KILN_SOURCE_DIR "/examples/layout/mbconv_se_nchw.json");
  ASSERT_TRUE(testing::rewritten_by(g, "nchw_convs_as_nhwc"));
  const ir::Graph& planned = ir_of(g);
  EXPECT_EQ(nchw_convs(planned), 0);
  expect_transposes_only_at_the_edges(planned);
  const ir::Plan p = ir::plan_fusion(planned);
  ASSERT_EQ(ir::verify_plan(planned, p), "");
  bool depthwise = false;
  for (const ir::PlannedKernel& k : p.kernels) depthwise |= k.kind == ir::KernelKind::DepthwiseConv;
  EXPECT_TRUE(depthwise);
  for (uint64_t seed = 1; seed <= 2; ++seed) testing::expect_planned_equals_written(g, seed, testing::Equality::kBits);
}

// The concat, its channel axis in the carriers' order (3 where it ran over NHWC).
std::vector<int64_t> concat_axes(const ir::Graph& g) {
  std::vector<int64_t> axes;
  for (const ir::Op& op : g.ops)
    if (op.kind == ir::OpKind::Concat) axes.push_back(op.attrs.axis);
  return axes;
}

// A dense layer: conv -> concat with its input -> conv. Every concatenated
// value is an NCHW conv's result, NHWC in memory: layout sinking concatenates
// the NHWC results along their channel axis (3), and the next conv reads the
// concat as it is written, with no transpose between the convs.
TEST(NchwConvsAsNhwc, DenseLayerConcatRunsOverNhwc) {
  const Graph g = testing::must_parse(R"({"kiln": 1, "name": "dense_layer",
    "inputs": {"x": {"shape": [2, 8, 6, 6], "dtype": "bf16"}, "w0": {"shape": [16, 8, 3, 3], "dtype": "bf16"},
               "w1": {"shape": [8, 16, 3, 3], "dtype": "bf16"}, "w2": {"shape": [4, 24, 1, 1], "dtype": "bf16"}},
    "ops": [{"op": "conv2d", "in": ["x", "w0"], "out": "c0", "layout": "NCHW", "padding": [1, 1]},
            {"op": "conv2d", "in": ["c0", "w1"], "out": "c1", "layout": "NCHW", "padding": [1, 1]},
            {"op": "concat", "in": ["c0", "c1"], "out": "cat", "axis": 1},
            {"op": "conv2d", "in": ["cat", "w2"], "out": "y", "layout": "NCHW"}],
    "outputs": ["y"]})");
  ASSERT_TRUE(testing::rewritten_by(g, "layout_sinking"));
  const ir::Graph& planned = ir_of(g);
  EXPECT_EQ(nchw_convs(planned), 0);
  EXPECT_EQ(concat_axes(planned), std::vector<int64_t>{3});
  expect_transposes_only_at_the_edges(planned);
  // the last conv reads the concat's result itself
  for (const ir::Op& op : planned.ops)
    if (op.kind == ir::OpKind::Conv2d && planned.result(op).name == "y.nhwc") {
      EXPECT_EQ(planned.operand(op, 0).name, "cat.perm0312");
    }
  const ir::Plan p = ir::plan_fusion(planned);
  ASSERT_EQ(ir::verify_plan(planned, p), "");
  for (uint64_t seed = 1; seed <= 3; ++seed) testing::expect_planned_equals_written(g, seed, testing::Equality::kBits);
}

// An operand not carried as the others are (here the network's NCHW input
// itself) leaves the concat as written, over NCHW; values unchanged.
TEST(NchwConvsAsNhwc, ConcatOfAnUncarriedOperandStaysAsWritten) {
  const Graph g = testing::must_parse(R"({"kiln": 1, "name": "concat_input",
    "inputs": {"x": {"shape": [2, 8, 6, 6], "dtype": "bf16"}, "w0": {"shape": [8, 8, 3, 3], "dtype": "bf16"},
               "w1": {"shape": [4, 16, 1, 1], "dtype": "bf16"}},
    "ops": [{"op": "conv2d", "in": ["x", "w0"], "out": "c0", "layout": "NCHW", "padding": [1, 1]},
            {"op": "concat", "in": ["x", "c0"], "out": "cat", "axis": 1},
            {"op": "conv2d", "in": ["cat", "w1"], "out": "y", "layout": "NCHW"}],
    "outputs": ["y"]})");
  EXPECT_EQ(concat_axes(ir_of(g)), std::vector<int64_t>{1});
  for (uint64_t seed = 1; seed <= 2; ++seed) testing::expect_planned_equals_written(g, seed, testing::Equality::kBits);
}

// DenseNet's block written NCHW (examples/layout/dense_block_nchw.json): the
// first layer's concat runs over NHWC and feeds the second layer's bn-relu-
// conv without a transpose; the last, the graph's output, stays NCHW.
TEST(NchwConvsAsNhwc, DenseBlockConcatsStayNhwcBetweenLayers) {
  const Graph g = must_load(KILN_SOURCE_DIR "/examples/layout/dense_block_nchw.json");
  ASSERT_TRUE(testing::rewritten_by(g, "layout_sinking"));
  const ir::Graph& planned = ir_of(g);
  EXPECT_EQ(nchw_convs(planned), 0);
  EXPECT_EQ(concat_axes(planned), (std::vector<int64_t>{3, 1}));
  expect_transposes_only_at_the_edges(planned);
  const ir::Plan p = ir::plan_fusion(planned);
  ASSERT_EQ(ir::verify_plan(planned, p), "");
  for (const ir::PlannedKernel& k : p.kernels)
    for (ir::TensorId t : k.reads) EXPECT_NE(planned.tensor(t).name, "l2_r1") << "the second layer's conv reads an NCHW copy";
  for (uint64_t seed = 1; seed <= 2; ++seed) testing::expect_planned_equals_written(g, seed, testing::Equality::kBits);
}

}  // namespace
}  // namespace kiln
