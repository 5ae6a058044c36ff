// Written-out attention as sdpa (compiler/attention_rewrite.h): which
// chains become one sdpa, the views that feed it, the near misses and why,
// and that the reference interpreter gives the rewritten graph the values of
// the graph as written.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>

#include "compiler/graph_internal.h"
#include "compiler/plan_printer.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "runtime/random_inputs.h"
#include "tests/unit/planned_graph_checks.h"
#include "tests/unit/random_graph.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

Graph example(const std::string& name) {
  Expected<Graph> g = Graph::load(std::string(KILN_SOURCE_DIR "/examples/attention/") + name + ".json");
  if (!g) ADD_FAILURE() << name << ": " << g.error().message;
  return std::move(g).value();
}

// Random inputs, a padding mask of 0/1 with its first key kept (so that no
// row has every key masked: there the chain and sdpa differ, as
// attention_rewrite.h says) and bool masks whose first key is kept.
std::vector<HostTensor> inputs_for(const Graph& g, uint64_t seed) {
  std::vector<HostTensor> in = random_inputs(g, seed);
  const std::vector<TensorDesc> descs = g.inputs();
  for (size_t i = 0; i < in.size(); ++i) {
    HostTensor& t = in[i];
    const int64_t last = t.shape.empty() ? 1 : t.shape.back();
    if (descs[i].name == "attention_mask")
      for (size_t e = 0; e < t.values.size(); ++e) t.values[e] = e % last == 0 || t.values[e] > -0.5f ? 1.0f : 0.0f;
    if (t.dtype == DType::boolean)
      for (size_t e = 0; e < t.values.size(); e += static_cast<size_t>(last)) t.values[e] = 1.0f;
  }
  return in;
}

void expect_rewritten_equals_written(const Graph& g, uint64_t seed) {
  testing::expect_rewritten_close_to_written(g, inputs_for(g, seed), seed);
}

// The planned graph's sdpa, checked: the one attention op, its operands
// views of what the matmuls read (no op computes them).
const ir::Op* the_sdpa(const ir::Graph& g) {
  const ir::Op* found = nullptr;
  for (const ir::Op& op : g.ops)
    if (op.kind == ir::OpKind::Sdpa) {
      EXPECT_EQ(found, nullptr) << "a second sdpa";
      found = &op;
    }
  if (!found) {
    ADD_FAILURE() << "no sdpa\n" << ir::rewrite_notes_text(g);
    return nullptr;
  }
  for (size_t slot = 0; slot < 3; ++slot)
    for (ir::TensorId t = found->inputs[slot]; g.tensor(t).kind == ir::TensorKind::OpResult;) {
      const ir::Op& p = g.ops[static_cast<size_t>(g.tensor(t).producer)];
      if (ir::op_info(p.kind).family != ir::OpFamily::View) {
        ADD_FAILURE() << "sdpa operand " << slot << " is computed by " << ir::op_name(p.kind);
        break;
      }
      t = p.inputs[0];
    }
  return found;
}

// g as the rewrite table makes it without its sdpa_as_matmuls row: the sdpa
// of written-out f32 attention, which that row then takes apart again
// (compiler/sdpa_as_matmuls.h; tests/unit/test_sdpa_as_matmuls.cpp).
Graph as_sdpa(const Graph& g) {
  std::vector<ir::RewriteRow> rows;
  for (const ir::RewriteRow& r : ir::rewrite_table())
    if (r.name != "sdpa_as_matmuls") rows.push_back(r);
  auto written = std::make_shared<const ir::Graph>(Graph::Internal::as_written(g));
  return Graph::Internal::with_planned(g, ir::run_rewrites(written, rows));
}

ir::Plan plan(const Graph& g, int sm = 90) {
  ir::Plan p = ir::plan_fusion(ir_of(g), {.sm = sm});
  EXPECT_EQ(ir::verify_plan(ir_of(g), p), "");
  return p;
}

bool has_kernel(const ir::Plan& p, ir::KernelKind kind) {
  for (const ir::PlannedKernel& k : p.kernels)
    if (k.kind == kind) return true;
  return false;
}

struct ExampleCase {
  const char* name;
  float scale;
  bool bool_mask;  // the mask operand is bool
  int mask_rank;   // 0: no mask
};

TEST(AttentionRewrite, ModelsAttentionWrittenOutIsOneSdpaComputingTheSameValues) {
  const ExampleCase cases[] = {
      {"bert_padding_mask", 0.125f, false, 4},        // div by 8, additive extended mask [B,1,1,S]
      {"distilbert_masked_fill", 0.17677669f, true, 4},  // q / sqrt(d) folded, masked_fill with a bool mask
      {"t5_position_bias", 1.0f, false, 4},           // no scale, position bias [1,H,S,S]
      {"gpt2_causal_where", 0.125f, true, 4},         // where with a sliced bool tril buffer
      {"swin_window_mask", 0.1767767f, false, 4},     // bias + window mask added in a 5-d view
      {"softmax_written_out", 0.125f, false, 0},      // exp(x - max) / sum
      {"attention_decomposed", 0.17677669f, false, 4},
  };
  for (const ExampleCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Graph g = as_sdpa(example(c.name));
    const ir::Graph& planned = ir_of(g);
    EXPECT_EQ(testing::count_ops(planned, ir::OpKind::Matmul), 0);
    EXPECT_EQ(testing::count_ops(planned, ir::OpKind::Softmax), 0);
    const ir::Op* found = the_sdpa(planned);
    ASSERT_NE(found, nullptr);
    const ir::Op& sdpa = *found;
    EXPECT_FLOAT_EQ(sdpa.attrs.scale, c.scale);
    EXPECT_FALSE(sdpa.attrs.causal);
    if (c.mask_rank == 0) {
      EXPECT_EQ(sdpa.inputs.size(), 3u);
    } else {
      ASSERT_EQ(sdpa.inputs.size(), 4u);
      EXPECT_EQ(planned.operand(sdpa, 3).dtype == DType::boolean, c.bool_mask);
      EXPECT_EQ(planned.operand(sdpa, 3).rank(), c.mask_rank);
    }
    // The graph as written is untouched: its hash and IR.
    EXPECT_EQ(testing::count_ops(Graph::Internal::as_written(g), ir::OpKind::Sdpa), 0);
    EXPECT_THAT(g.to_ir_text(), ::testing::Not(HasSubstr("sdpa")));
    ASSERT_FALSE(planned.rewrites.empty());
    EXPECT_EQ(planned.rewrites[0].row, "attention_as_sdpa");
    EXPECT_TRUE(planned.rewrites[0].applied);
    for (int sm : {80, 90}) {
      const ir::Plan p = plan(g, sm);
      EXPECT_TRUE(has_kernel(p, ir::KernelKind::Attention));
      EXPECT_FALSE(has_kernel(p, ir::KernelKind::Matmul));
    }
    for (uint64_t seed : {1, 2}) expect_rewritten_equals_written(g, seed);
  }
}

// The views sdpa reads: BERT's q and k are transposes of the projections'
// reshapes, with kᵀ's transpose cancelled; Swin's masks regrouped from the
// 5-d view they were added in.
TEST(AttentionRewrite, OperandsAreViewsOfWhatTheMatmulsRead) {
  const Graph bert = example("bert_padding_mask");
  const ir::Graph& g = ir_of(bert);
  ASSERT_NE(the_sdpa(g), nullptr);
  const ir::Op& sdpa = *the_sdpa(g);
  for (size_t slot = 0; slot < 3; ++slot) {
    const ir::Tensor& t = g.operand(sdpa, slot);
    EXPECT_EQ(t.shape, (Shape{2, 4, 128, 64}));
    const ir::Op& view = g.ops[static_cast<size_t>(t.producer)];
    EXPECT_EQ(view.kind, ir::OpKind::Transpose) << slot;
    EXPECT_EQ(view.attrs.perm, (std::vector<int64_t>{0, 2, 1, 3})) << slot;
    EXPECT_EQ(g.tensor(view.inputs[0]).name, std::string("qkv").substr(slot, 1) + "4");
  }
  EXPECT_EQ(g.operand(sdpa, 3).shape, (Shape{2, 1, 1, 128}));  // the extended mask as written
  const Graph swin = example("swin_window_mask");
  ASSERT_NE(the_sdpa(ir_of(swin)), nullptr);
  const ir::Op& s = *the_sdpa(ir_of(swin));
  EXPECT_EQ(ir_of(swin).operand(s, 3).shape, (Shape{8, 3, 49, 49}));  // bias [1,3,49,49] + mask [8,1,49,49]
  // Regrouped, not copied: the window mask is a view of the input.
  int copies = 0;
  for (const ir::Op& op : ir_of(swin).ops) copies += op.kind == ir::OpKind::Add;
  EXPECT_EQ(copies, 1);  // the two masks summed (in the attention kernel's prologue)
}

TEST(AttentionRewrite, ThePlanIsTheSdpaKernelsPlan) {
  // BERT's attention and its mask's arithmetic in one kernel: the sdpa's.
  const ir::Plan p = plan(example("bert_padding_mask"));
  ASSERT_EQ(p.kernels.size(), 1u) << ir::plan_to_text(ir_of(example("bert_padding_mask")), p);
  EXPECT_EQ(p.kernels[0].kind, ir::KernelKind::Attention);
}

std::string graph(const std::string& inputs, const std::string& ops, const std::string& outputs = R"(["o"])") {
  return fmt::format(R"({{"kiln": 1, "inputs": {{{}}}, "ops": [{}], "outputs": {}}})", inputs, ops, outputs);
}

const char* kQkv = R"("q": {"shape": [2, 3, 32, 16], "dtype": "f32"}, "k": {"shape": [2, 3, 32, 16], "dtype": "f32"},
                      "v": {"shape": [2, 3, 32, 16], "dtype": "f32"})";

// kQkv held as bf16: written-out attention whose scores a bf16 graph rounds.
const char* kQkv16 = R"("q": {"shape": [2, 3, 32, 16], "dtype": "bf16"}, "k": {"shape": [2, 3, 32, 16], "dtype": "bf16"},
                        "v": {"shape": [2, 3, 32, 16], "dtype": "bf16"})";

struct VariantCase {
  const char* what;
  std::string json;
  float scale;
};

// Forms the models' converters write: bmm over [B*H, S, D] with reshapes
// around it (PyTorch's matmul), a shared k broadcast over heads, masks
// subtracted, several fills, a fill and an added mask, keepdims=false
// reductions reshaped back, rank 2 and 3 attention.
TEST(AttentionRewrite, VariantsOfTheChainMapAndComputeTheSameValues) {
  const std::string kt = R"({"op": "transpose", "in": ["k"], "out": "kt", "perm": [0, 1, 3, 2]})";
  const VariantCase cases[] = {
      {"bmm with reshapes (PyTorch's matmul)",
       graph(kQkv, R"({"op": "transpose", "in": ["k"], "out": "kt", "perm": [0, 1, 3, 2]},
             {"op": "expand", "in": ["q"], "out": "qe", "shape": [2, 3, 32, 16]},
             {"op": "reshape", "in": ["qe"], "out": "q3", "shape": [6, 32, 16]},
             {"op": "reshape", "in": ["kt"], "out": "kt3", "shape": [6, 16, 32]},
             {"op": "matmul", "in": ["q3", "kt3"], "out": "s3"},
             {"op": "reshape", "in": ["s3"], "out": "s", "shape": [2, 3, 32, 32]},
             {"op": "mul", "in": ["s", 0.25], "out": "ss"},
             {"op": "softmax", "in": ["ss"], "out": "p"},
             {"op": "expand", "in": ["p"], "out": "pe", "shape": [2, 3, 32, 32]},
             {"op": "reshape", "in": ["pe"], "out": "p3", "shape": [6, 32, 32]},
             {"op": "reshape", "in": ["v"], "out": "v3", "shape": [6, 32, 16]},
             {"op": "matmul", "in": ["p3", "v3"], "out": "o3"},
             {"op": "reshape", "in": ["o3"], "out": "o", "shape": [2, 3, 32, 16]})"),
       0.25f},
      {"a bmm's result as the graph's output",
       graph(R"("q": {"shape": [6, 32, 16], "dtype": "f32"}, "k": {"shape": [6, 16, 32], "dtype": "f32"},
                "v": {"shape": [6, 32, 16], "dtype": "f32"})",
             R"({"op": "matmul", "in": ["q", "k"], "out": "s"}, {"op": "softmax", "in": ["s"], "out": "p"},
                {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       1.0f},
      {"one query row of rank 2",
       graph(R"("q": {"shape": [1, 16], "dtype": "f32"}, "k": {"shape": [40, 16], "dtype": "f32"},
                "v": {"shape": [40, 16], "dtype": "f32"})",
             R"({"op": "transpose", "in": ["k"], "out": "kt", "perm": [1, 0]},
                {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "div", "in": ["s", 4.0], "out": "ss"},
                {"op": "softmax", "in": ["ss"], "out": "p"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       0.25f},
      {"k and v shared by every head (broadcast)",
       graph(R"("q": {"shape": [2, 4, 32, 16], "dtype": "f32"}, "k": {"shape": [2, 1, 32, 16], "dtype": "f32"},
                "v": {"shape": [1, 1, 32, 16], "dtype": "f32"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "softmax", "in": ["s"], "out": "p"},
                {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       1.0f},
      {"a mask subtracted and a bias added after the scale",
       graph(std::string(kQkv) + R"(, "m": {"shape": [32, 32], "dtype": "f32"}, "b": {"shape": [3, 1, 32], "dtype": "f32"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "sub", "in": ["s", "m"], "out": "sm"},
                {"op": "mul", "in": ["sm", 0.5], "out": "ss"}, {"op": "add", "in": ["b", "ss"], "out": "sb"},
                {"op": "softmax", "in": ["sb"], "out": "p"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       0.5f},
      {"two fills and an added mask",
       graph(std::string(kQkv) + R"(, "keep": {"shape": [2, 1, 1, 32], "dtype": "bool"},
                "causal": {"shape": [32, 32], "dtype": "bool"}, "m": {"shape": [2, 1, 1, 32], "dtype": "f32"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"},
                {"op": "where", "in": ["causal", "s", -1e9], "out": "s1"},
                {"op": "div", "in": ["s1", 2.0], "out": "s2"}, {"op": "add", "in": ["s2", "m"], "out": "s3"},
                {"op": "where", "in": ["keep", -3e38, "s3"], "out": "s4"},
                {"op": "softmax", "in": ["s4"], "out": "p"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       0.5f},
      {"q and k each scaled by d^-1/4 before q·kᵀ (Whisper)",
       graph(kQkv, R"({"op": "mul", "in": ["q", 0.5], "out": "qs"}, {"op": "mul", "in": [0.5, "k"], "out": "ks"},
                {"op": "transpose", "in": ["ks"], "out": "kt", "perm": [0, 1, 3, 2]},
                {"op": "matmul", "in": ["qs", "kt"], "out": "s"}, {"op": "softmax", "in": ["s"], "out": "p"},
                {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       0.25f},
      {"written-out softmax with keepdims=false reductions",
       graph(kQkv, kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"},
                {"op": "reduce_max", "in": ["s"], "out": "mx", "axes": [3]},
                {"op": "reshape", "in": ["mx"], "out": "mx4", "shape": [2, 3, 32, 1]},
                {"op": "sub", "in": ["s", "mx4"], "out": "sh"}, {"op": "exp", "in": ["sh"], "out": "e"},
                {"op": "reduce_sum", "in": ["e"], "out": "sum", "axes": [-1], "keepdims": true},
                {"op": "div", "in": ["e", "sum"], "out": "p"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       1.0f},
      {"16-bit probabilities by p·v's precision",
       graph(R"("q": {"shape": [1, 2, 32, 16], "dtype": "bf16"}, "k": {"shape": [1, 2, 32, 16], "dtype": "bf16"},
                "v": {"shape": [1, 2, 32, 16], "dtype": "bf16"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "softmax", "in": ["s"], "out": "p"},
                {"op": "matmul", "in": ["p", "v"], "out": "o", "precision": "bf16", "dtype": "bf16"})"),
       1.0f},
      {"scores cast to f32 and probabilities cast back (T5 in a bf16 model)",
       graph(R"("q": {"shape": [1, 2, 32, 16], "dtype": "bf16"}, "k": {"shape": [1, 2, 32, 16], "dtype": "bf16"},
                "v": {"shape": [1, 2, 32, 16], "dtype": "bf16"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "cast", "in": ["s"], "out": "sf", "dtype": "f32"},
                {"op": "softmax", "in": ["sf"], "out": "p"}, {"op": "cast", "in": ["p"], "out": "pb", "dtype": "bf16"},
                {"op": "matmul", "in": ["pb", "v"], "out": "o", "dtype": "bf16"})"),
       1.0f},
  };
  for (const VariantCase& c : cases) {
    SCOPED_TRACE(c.what);
    const Graph g = as_sdpa(testing::must_parse(c.json));
    const ir::Graph& planned = ir_of(g);
    EXPECT_EQ(testing::count_ops(planned, ir::OpKind::Matmul), 0) << ir::rewrite_notes_text(planned);
    EXPECT_EQ(testing::count_ops(planned, ir::OpKind::Softmax) + testing::count_ops(planned, ir::OpKind::Exp), 0);
    const ir::Op* sdpa = the_sdpa(planned);
    ASSERT_NE(sdpa, nullptr);
    EXPECT_FLOAT_EQ(sdpa->attrs.scale, c.scale);
    EXPECT_TRUE(has_kernel(plan(g), ir::KernelKind::Attention));
    for (uint64_t seed : {3, 4}) expect_rewritten_equals_written(g, seed);
  }
}

// The near misses stay as written, each with why; in the plan's text too.
TEST(AttentionRewrite, NearMissesStayAsWrittenAndSayWhy) {
  const Graph g = example("attention_near_misses");
  const ir::Graph& planned = ir_of(g);
  EXPECT_EQ(testing::count_ops(planned, ir::OpKind::Sdpa), 0);
  const std::pair<const char*, const char*> expected[] = {
      {"probabilities_read_elsewhere", "the probabilities 'p_read' are a graph output"},
      {"softmax_over_queries", "normalises over axis 2"},
      {"mask_from_scores", "is computed from the scores"},
      {"scale_not_constant", "multiplies the scores by 'scale' f32[], not a constant"},
      {"scores_rounded", "the scores are rounded to bf16 at 's_bf16' (matmul) and to f16 at 's_f16' (cast)"},
      {"probabilities_unrounded", "the probabilities 'p_f32' are f32 values and v 'vb' bf16[1,2,16,16] holds bf16"},
  };
  ASSERT_EQ(planned.rewrites.size(), std::size(expected)) << ir::rewrite_notes_text(planned);
  for (size_t i = 0; i < std::size(expected); ++i) {
    const ir::RewriteNote& n = planned.rewrites[i];
    EXPECT_FALSE(n.applied);
    EXPECT_EQ(n.row, "attention_as_sdpa");
    EXPECT_THAT(n.where, HasSubstr(fmt::format("'{}' (matmul)", expected[i].first)));
    EXPECT_THAT(n.why, HasSubstr(expected[i].second));
  }
  EXPECT_THAT(ir::plan_to_text(planned, plan(g)),
              HasSubstr("not rewritten (attention_as_sdpa): 'scale_not_constant' (matmul): "));
}

// Of the bf16 outputs of g as written and as planned (reference interpreter,
// same inputs): the share of elements equal to the bit, and the largest
// difference in units of the written value's last bf16 place.
struct Agreement {
  double identical = 0, worst_ulps = 0;
};
Agreement agreement(const Graph& written, const Graph& planned, size_t output, uint64_t seed) {
  const std::vector<HostTensor> inputs = inputs_for(written, seed);
  const HostTensor want = testing::must_run(written, inputs)[output], got = testing::must_run(planned, inputs)[output];
  Agreement a;
  for (size_t e = 0; e < want.values.size(); ++e) {
    const float w = want.values[e], r = got.values[e];
    a.identical += w == r;
    const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(w), 1e-30f)) - 7);
    a.worst_ulps = std::max(a.worst_ulps, std::fabs(double{w} - double{r}) / ulp);
  }
  a.identical /= static_cast<double>(want.values.size());
  return a;
}

// Swin's window attention in a bf16 graph rounds its scores: the sdpa keeps
// each of those roundings (after q·kᵀ, after the scale, after the bias,
// after a shifted window's mask) and forms the probabilities whole, so its
// values are the graph's but for the order of f32 sums: nearly every
// element equal to the bit. The same sdpa without the roundings (what a
// rewrite that dropped them would compute) differs in many.
TEST(AttentionRewrite, RoundedScoresKeepTheGraphsRoundings) {
  const Graph g = example("swin_rounded_scores");
  const ir::Graph& planned = ir_of(g);
  std::vector<const ir::Op*> sdpas;
  for (const ir::Op& op : planned.ops)
    if (op.kind == ir::OpKind::Sdpa) sdpas.push_back(&op);
  ASSERT_EQ(sdpas.size(), 4u) << ir::rewrite_notes_text(planned);
  EXPECT_EQ(sdpas[0]->attrs.scores_rounded_to, DType::bf16);
  EXPECT_EQ(sdpas[0]->attrs.score_roundings, ir::kRoundProduct | ir::kRoundMasked);
  EXPECT_FLOAT_EQ(sdpas[0]->attrs.scale, 1.0f);
  EXPECT_EQ(sdpas[1]->attrs.score_roundings, ir::kRoundProduct | ir::kRoundScaled | ir::kRoundMasked);
  EXPECT_FLOAT_EQ(sdpas[1]->attrs.scale, 0.17677669f);
  // The shifted window: the bias, then the window mask (a fifth input), each rounded.
  EXPECT_EQ(sdpas[2]->attrs.score_roundings, ir::kRoundProduct | ir::kRoundMasked | ir::kRoundMasked2);
  ASSERT_EQ(sdpas[2]->inputs.size(), 5u);
  EXPECT_EQ(planned.operand(*sdpas[2], 4).shape, (Shape{8, 1, 49, 49}));
  // Rows of 100 keys (a whole-row tile of 112), rounded after the product alone.
  EXPECT_EQ(sdpas[3]->attrs.score_roundings, ir::kRoundProduct);
  // The near miss: rows longer than one tile.
  std::vector<std::string> why;
  for (const ir::RewriteNote& n : planned.rewrites)
    if (!n.applied && n.row == "attention_as_sdpa") why.push_back(n.why);
  ASSERT_EQ(why.size(), 1u);
  EXPECT_THAT(why[0], HasSubstr("a row has 256 keys"));
  // Each rounded sdpa is planned as an attention kernel on sm_80 and sm_90.
  for (int sm : {80, 90}) {
    const ir::Plan p = plan(g, sm);
    int attention = 0;
    for (const ir::PlannedKernel& k : p.kernels) attention += k.kind == ir::KernelKind::Attention;
    EXPECT_EQ(attention, 4);
  }

  ir::Graph unrounded = planned;
  for (ir::Op& op : unrounded.ops) op.attrs.score_roundings = 0;
  const Graph dropped = Graph::Internal::with_planned(g, std::make_shared<const ir::Graph>(std::move(unrounded)));
  const Graph written = Graph::Internal::unsunk(g);
  for (size_t output : {0, 1, 2, 3})
    for (uint64_t seed : {1, 2}) {
      SCOPED_TRACE(fmt::format("output {} seed {}", output, seed));
      const Agreement kept = agreement(written, g, output, seed), lost = agreement(written, dropped, output, seed);
      EXPECT_GE(kept.identical, 0.995);
      EXPECT_LE(kept.worst_ulps, 1.0);
      EXPECT_LT(lost.identical, kept.identical - 0.05) << "without the roundings the test would not see them";
    }
}

TEST(AttentionRewrite, ChainsThatCannotBeSdpaStayAsWritten) {
  const std::string kt = R"({"op": "transpose", "in": ["k"], "out": "kt", "perm": [0, 1, 3, 2]})";
  const std::pair<std::string, const char*> cases[] = {
      {graph(kQkv, kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "tanh", "in": ["s"], "out": "c"},
                {"op": "softmax", "in": ["c"], "out": "p"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       "pass through 'c' (tanh), which sdpa does not compute"},
      {graph(std::string(kQkv) + R"(, "keep": {"shape": [32, 32], "dtype": "bool"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "where", "in": ["keep", "s", -1.0], "out": "c"},
                {"op": "softmax", "in": ["c"], "out": "p"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       "only a fill of at most -10000 masks a key out"},
      {graph(std::string(kQkv) + R"(, "fill": {"shape": [], "dtype": "f32"}, "keep": {"shape": [32, 32], "dtype": "bool"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "where", "in": ["keep", "s", "fill"], "out": "c"},
                {"op": "softmax", "in": ["c"], "out": "p"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       "fills masked scores with 'fill' f32[], a tensor, not a constant"},
      {graph(R"("q": {"shape": [2, 3, 32, 16], "dtype": "f32"}, "k": {"shape": [2, 3, 32, 16], "dtype": "f32"},
                "v": {"shape": [2, 3, 32, 8], "dtype": "f32"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "softmax", "in": ["s"], "out": "p"},
                {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       "has head dimension 8 and q 'q' f32[2,3,32,16] has 16"},
      {graph(kQkv, kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "softmax", "in": ["s"], "out": "p"},
                {"op": "exp", "in": ["s"], "out": "e"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})",
             R"(["o", "e"])"),
       "the scores 's' are read elsewhere too ('e' (exp))"},
      {graph(kQkv, kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s", "precision": "tf32"},
                {"op": "softmax", "in": ["s"], "out": "p"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       "rounds its f32 operands to tf32 (its precision)"},
      {graph(R"("q": {"shape": [1, 2, 32, 16], "dtype": "bf16"}, "k": {"shape": [1, 2, 32, 16], "dtype": "bf16"},
                "v": {"shape": [1, 2, 32, 16], "dtype": "f32"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "softmax", "in": ["s"], "out": "p", "dtype": "bf16"},
                {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       "the probabilities are rounded to bf16 and v 'v' f32[1,2,32,16] holds f32 values"},
      // Rounded scores: a fill, a third added tensor, a scale after the mask.
      {graph(std::string(kQkv16) + R"(, "keep": {"shape": [32, 32], "dtype": "bool"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s", "dtype": "bf16"},
                {"op": "where", "in": ["keep", "s", -1e9], "out": "c", "dtype": "bf16"},
                {"op": "softmax", "in": ["c"], "out": "p", "dtype": "bf16"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       "the scores are rounded to bf16 and 'c' (where) fills masked scores"},
      {graph(std::string(kQkv16) + R"(, "a": {"shape": [32, 32], "dtype": "bf16"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s", "dtype": "bf16"},
                {"op": "add", "in": ["s", "a"], "out": "s1", "dtype": "bf16"}, {"op": "add", "in": ["s1", "a"], "out": "s2", "dtype": "bf16"},
                {"op": "add", "in": ["s2", "a"], "out": "s3", "dtype": "bf16"},
                {"op": "softmax", "in": ["s3"], "out": "p", "dtype": "bf16"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       "'s3' (add) adds a third tensor to them"},
      {graph(std::string(kQkv16) + R"(, "a": {"shape": [32, 32], "dtype": "bf16"})",
             kt + R"(, {"op": "matmul", "in": ["q", "kt"], "out": "s", "dtype": "bf16"},
                {"op": "add", "in": ["s", "a"], "out": "s1", "dtype": "bf16"}, {"op": "mul", "in": ["s1", 0.25], "out": "s2", "dtype": "bf16"},
                {"op": "softmax", "in": ["s2"], "out": "p", "dtype": "bf16"}, {"op": "matmul", "in": ["p", "v"], "out": "o"})"),
       "'s2' (mul) scales them after the mask is added"},
  };
  for (const auto& [json, why] : cases) {
    const Graph g = testing::must_parse(json);
    const ir::Graph& planned = ir_of(g);
    EXPECT_EQ(testing::count_ops(planned, ir::OpKind::Sdpa), 0) << why;
    ASSERT_EQ(planned.rewrites.size(), 1u) << why;
    EXPECT_THAT(planned.rewrites[0].why, HasSubstr(why));
    expect_rewritten_equals_written(g, 5);  // nothing changed: the same values
  }
}

// Two attentions in a row, the second reading the first's output: both
// rewritten, in one rebuild, and the ops that fed only the replaced ones
// gone while an op nobody reads (as written) stays.
TEST(AttentionRewrite, ChainedAttentionsAndTheOpsThatOnlyFedThem) {
  const std::string kt = R"({"op": "transpose", "in": ["k"], "out": "kt", "perm": [0, 1, 3, 2]})";
  const Graph g = as_sdpa(testing::must_parse(graph(
      kQkv, kt + R"(, {"op": "mul", "in": ["q", 1.0], "out": "unread"},
         {"op": "matmul", "in": ["q", "kt"], "out": "s"}, {"op": "softmax", "in": ["s"], "out": "p"},
         {"op": "matmul", "in": ["p", "v"], "out": "o1"},
         {"op": "matmul", "in": ["o1", "kt"], "out": "s2"}, {"op": "softmax", "in": ["s2"], "out": "p2"},
         {"op": "matmul", "in": ["p2", "v"], "out": "o"})")));
  const ir::Graph& planned = ir_of(g);
  EXPECT_EQ(testing::count_ops(planned, ir::OpKind::Sdpa), 2);
  EXPECT_EQ(testing::count_ops(planned, ir::OpKind::Mul), 1);  // 'unread' stays
  EXPECT_EQ(planned.rewrites.size(), 2u);
  // kᵀ (read by both q·kᵀ, nothing else) goes: each sdpa reads k itself.
  for (const ir::Op& op : planned.ops) EXPECT_NE(op.kind, ir::OpKind::Transpose);
  expect_rewritten_equals_written(g, 6);
}

// Random graphs with attention written out (random_graph.cpp's matmul ->
// mul -> softmax -> matmul in every dtype): where it became an sdpa, a
// valid plan and the values of the graph as written; where it did not, a
// near miss says why (16-bit v and f32 probabilities).
TEST(AttentionRewrite, RandomGraphsWithWrittenOutAttention) {
  int rewritten = 0, declined = 0;
  for (uint64_t seed = 1; seed <= 3000; ++seed) {
    const Graph g = testing::random_graph(seed);
    const ir::Graph& planned = ir_of(g);
    bool applied = false, near_miss = false;
    for (const ir::RewriteNote& n : planned.rewrites)
      if (n.row == "attention_as_sdpa") (n.applied ? applied : near_miss) = true;
    declined += near_miss;
    if (!applied) continue;
    ++rewritten;
    ASSERT_EQ(ir::verify_plan(planned, ir::plan_fusion(planned)), "") << "seed " << seed;
    expect_rewritten_equals_written(g, seed);
    if (HasFailure()) FAIL() << "seed " << seed << "\n" << g.to_json();
  }
  EXPECT_GT(rewritten, 20);
  EXPECT_GT(declined, 20);
  RecordProperty("graphs_rewritten", rewritten);
}

}  // namespace
}  // namespace kiln
