// The rewrite table's driver (compiler/rewrite_table.h): rows to a fixed
// point, the check after each rewrite, the notes; and the table's rows on
// the examples, the graph as written untouched.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "compiler/error.h"
#include "compiler/graph_internal.h"
#include "compiler/graph_rewrite.h"
#include "compiler/plan_printer.h"
#include "compiler/rewrite_check.h"
#include "compiler/planner/planner.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

// Toy rows over unary ops: neg(x) -> mul(x, -1); mul(mul(x, a), b) ->
// mul(x, a*b) (which the first enables); and one that breaks the graph.
ir::RowMatches find_ops(const ir::Graph& g, ir::OpKind kind, bool (*also)(const ir::Graph&, const ir::Op&)) {
  ir::RowMatches m;
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].kind == kind && also(g, g.ops[i])) m.sites.push_back({static_cast<int32_t>(i), ir::op_named(g, static_cast<int32_t>(i)), {}});
  return m;
}
bool always(const ir::Graph&, const ir::Op&) { return true; }
bool mul_of_mul(const ir::Graph& g, const ir::Op& op) {
  const ir::Tensor& x = g.operand(op, 0);
  return g.operand(op, 1).kind == ir::TensorKind::Constant && x.kind == ir::TensorKind::OpResult &&
         g.ops[static_cast<size_t>(x.producer)].kind == ir::OpKind::Mul &&
         g.operand(g.ops[static_cast<size_t>(x.producer)], 1).kind == ir::TensorKind::Constant;
}

ir::Graph rebuild(const ir::Graph& g, const ir::RowMatches& m, void (*change)(ir::GraphRewrite&, const ir::Graph&, ir::Op)) {
  ir::GraphRewrite out(g);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    bool site = false;
    for (const ir::RewriteSite& s : m.sites) site = site || s.op == static_cast<int32_t>(i);
    if (site) change(out, g, g.ops[i]);
    else out.emit(g.ops[i]);
  }
  return out.take();
}
ir::TensorId constant(ir::GraphRewrite& out, float value) {
  ir::Tensor c;
  c.kind = ir::TensorKind::Constant;
  c.constant = value;
  return out.add(c);
}

const ir::RewriteRow kNegAsMul{
    "neg_as_mul", [](const ir::Graph& g) { return find_ops(g, ir::OpKind::Neg, always); },
    [](const ir::Graph& g, const ir::RowMatches& m) {
      return rebuild(g, m, [](ir::GraphRewrite& out, const ir::Graph&, ir::Op op) {
        op.kind = ir::OpKind::Mul;
        op.inputs.push_back(constant(out, -1.0f));
        out.emit(op);
      });
    }};
const ir::RewriteRow kFoldMuls{
    "fold_muls", [](const ir::Graph& g) { return find_ops(g, ir::OpKind::Mul, mul_of_mul); },
    [](const ir::Graph& g, const ir::RowMatches& m) {
      return rebuild(g, m, [](ir::GraphRewrite& out, const ir::Graph& g, ir::Op op) {
        const ir::Op& inner = g.ops[static_cast<size_t>(g.operand(op, 0).producer)];
        op.inputs = {inner.inputs[0], constant(out, g.operand(inner, 1).constant * g.operand(op, 1).constant)};
        out.emit(op);
      });
    }};
const ir::RewriteRow kBreaksShapes{
    "breaks_shapes", [](const ir::Graph& g) { return find_ops(g, ir::OpKind::Neg, always); },
    [](const ir::Graph& g, const ir::RowMatches& m) {
      ir::Graph bad = g;
      bad.tensors[static_cast<size_t>(bad.ops[static_cast<size_t>(m.sites[0].op)].output)].shape = {7};
      return bad;
    }};
const ir::RewriteRow kNeverSettles{
    "never_settles", [](const ir::Graph& g) { return find_ops(g, ir::OpKind::Neg, always); },
    [](const ir::Graph& g, const ir::RowMatches&) { return g; }};

std::shared_ptr<const ir::Graph> as_written(const std::string& ops, const std::string& outputs = R"(["y"])") {
  const Graph g = testing::must_parse(
      fmt::format(R"({{"kiln": 1, "inputs": {{"x": {{"shape": [4, 8], "dtype": "f32"}}}}, "ops": [{}], "outputs": {}}})", ops,
                  outputs));
  return std::make_shared<const ir::Graph>(Graph::Internal::as_written(g));
}

TEST(RewriteTable, RowsRunToAFixedPointAndEachRewriteIsNoted) {
  // neg(mul(x, 2)) -> mul(mul(x, 2), -1) in round 1, which fold_muls
  // (before it in the table) only sees in round 2: mul(x, -2).
  const auto g = as_written(R"({"op": "mul", "in": ["x", 2.0], "out": "a"}, {"op": "neg", "in": ["a"], "out": "y"})");
  const auto out = ir::run_rewrites(g, {kFoldMuls, kNegAsMul});
  const ir::Op& y = out->ops[static_cast<size_t>(out->tensor(out->outputs[0]).producer)];  // ('a' stays, unread)
  EXPECT_EQ(y.kind, ir::OpKind::Mul);
  EXPECT_EQ(out->operand(y, 0).name, "x");
  EXPECT_EQ(out->operand(y, 1).constant, -2.0f);
  ASSERT_EQ(out->rewrites.size(), 2u);
  EXPECT_EQ(out->rewrites[0].row, "neg_as_mul");
  EXPECT_EQ(out->rewrites[0].where, "'y' (neg)");
  EXPECT_EQ(out->rewrites[1].row, "fold_muls");
  EXPECT_TRUE(out->rewrites[1].applied);
  EXPECT_EQ(ir::rewrite_notes_text(*out), "rewrite neg_as_mul: 'y' (neg)\nrewrite fold_muls: 'y' (mul)\n");
}

TEST(RewriteTable, NothingToRewriteIsTheGraphItself) {
  const auto g = as_written(R"({"op": "exp", "in": ["x"], "out": "y"})");
  EXPECT_EQ(ir::run_rewrites(g, {kFoldMuls, kNegAsMul}), g);
  EXPECT_EQ(ir::run_rewrites(g), g);
}

TEST(RewriteTable, ARewriteThatBreaksTheGraphIsAnInternalErrorNamingIt) {
  const auto g = as_written(R"({"op": "neg", "in": ["x"], "out": "y"})");
  try {
    ir::run_rewrites(g, {kBreaksShapes});
    FAIL() << "no error";
  } catch (const detail::InternalError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rewrite breaks_shapes at 'y' (neg): output 'y' changed: f32[4,8]"));
  }
  try {
    ir::run_rewrites(g, {kNeverSettles});
    FAIL() << "no error";
  } catch (const detail::InternalError& e) {
    EXPECT_THAT(e.what(), HasSubstr("no fixed point"));
  }
}

// The check itself: what it refuses.
TEST(RewriteTable, TheCheckRefusesGraphsThatAreNotTheSameComputation) {
  const auto g = as_written(R"({"op": "exp", "in": ["x"], "out": "a"}, {"op": "neg", "in": ["a"], "out": "y"})");
  ir::Graph reordered = *g;
  std::swap(reordered.ops[0], reordered.ops[1]);
  EXPECT_THAT(ir::rewritten_graph_problem(*g, reordered), HasSubstr("reads a tensor no earlier op makes"));
  ir::Graph reshaped = *g;
  reshaped.ops[0].kind = ir::OpKind::Reshape;
  reshaped.ops[0].attrs.shape = {8, 4};
  EXPECT_THAT(ir::rewritten_graph_problem(*g, reshaped), HasSubstr("makes [4,8] where shape inference gives [8,4]"));
  ir::Graph bool_read = *g;
  bool_read.tensors[static_cast<size_t>(bool_read.ops[0].output)].dtype = DType::boolean;
  EXPECT_THAT(ir::rewritten_graph_problem(*g, bool_read), HasSubstr("reads bool 'a'"));
  ir::Graph stale = *g;
  stale.users.clear();
  EXPECT_THAT(ir::rewritten_graph_problem(*g, stale), HasSubstr("users index"));
  EXPECT_EQ(ir::rewritten_graph_problem(*g, *g), "");
}

// The table's rows on the examples: each applied where it was before it
// was a table, its note in the plan, the graph as written (hash, IR)
// unchanged.
TEST(RewriteTable, TheTablesRowsOnTheExamples) {
  const std::pair<const char*, const char*> cases[] = {
      {"conv/patch_embedding", "rewrite patch_convolutions: 'patches' (conv2d) -> matmul of its 16x16 patches"},
      {"layout/bottleneck_channels_last", "rewrite layout_sinking: "},
      {"conv/thin_channels_stem", "rewrite conv_channel_padding: 'c' (conv2d): input and weights read with 3 channels padded to 8"},
      {"attention/bert_padding_mask", "rewrite attention_as_sdpa: 'context' (matmul) and the 4 ops before it"},
  };
  for (const auto& [name, line] : cases) {
    Expected<Graph> g = Graph::load(std::string(KILN_SOURCE_DIR "/examples/") + name + ".json");
    ASSERT_TRUE(g) << name << ": " << g.error().message;
    const ir::Graph& planned = ir_of(*g);
    EXPECT_THAT(ir::rewrite_notes_text(planned), HasSubstr(line)) << name;
    EXPECT_THAT(ir::plan_to_text(planned, ir::plan_fusion(planned)), HasSubstr(line)) << name;
    EXPECT_TRUE(Graph::Internal::as_written(*g).rewrites.empty());
    const Graph reloaded = testing::must_parse(g->to_json());
    EXPECT_EQ(reloaded.hash(), g->hash());
    EXPECT_EQ(reloaded.to_ir_text(), g->to_ir_text());
    EXPECT_NE(&planned, &Graph::Internal::as_written(*g));
  }
}

}  // namespace
}  // namespace kiln
