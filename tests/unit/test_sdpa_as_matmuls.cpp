// An sdpa over f32 operands as two matmuls and a softmax
// (compiler/sdpa_as_matmuls.h): the rewritten graph computes the sdpa's
// values (masks of both kinds with rows that see no key, GQA, a 16-bit v,
// the default scale), it plans as SIMT matmuls around a softmax, and the
// sdpas that stay (causal, past the budget) say why; 16-bit ones are not
// touched.
#include <gtest/gtest.h>

#include <gmock/gmock.h>

#include <fmt/format.h>

#include "compiler/graph_internal.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "tests/unit/planned_graph_checks.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

// q [1, H, 16, 32], k and v [1, Hkv, 3, 32] in the given types; `mask` an
// op making the mask 'm' from the input 'r' ([1, H, 16, 3]), or none. Over
// 3 keys about one row in eight sees none of them.
std::string sdpa_graph(const char* q_type, const char* kv_type, const char* v_type, int heads, int kv_heads,
                       const std::string& mask, const std::string& attrs = "") {
  const std::string mask_ops = mask.empty() ? "" : mask + ", ";
  return fmt::format(R"({{"kiln": 1, "inputs": {{"q": {{"shape": [1, {3}, 16, 32], "dtype": "{0}"}},
      "k": {{"shape": [1, {4}, 3, 32], "dtype": "{1}"}}, "v": {{"shape": [1, {4}, 3, 32], "dtype": "{2}"}},
      "r": {{"shape": [1, {3}, 16, 3], "dtype": "f32"}}}},
    "ops": [{5}{{"op": "sdpa", "in": ["q", "k", "v"{6}], "out": "o"{7}}}], "outputs": ["o"]}})",
                     q_type, kv_type, v_type, heads, kv_heads, mask_ops, mask.empty() ? "" : R"(, "m")", attrs);
}

const char* kBoolMask = R"({"op": "gt", "in": ["r", 0.5], "out": "m"})";
// log(relu(r)): -inf where r <= 0, an additive mask with -inf rows.
const char* kInfMask = R"({"op": "relu", "in": ["r"], "out": "rr"}, {"op": "log", "in": ["rr"], "out": "m"})";

TEST(SdpaAsMatmuls, EverySdpaOfF32OperandsComputesItsValues) {
  const std::pair<const char*, std::string> cases[] = {
      {"no mask, the default scale", sdpa_graph("f32", "f32", "f32", 4, 4, "")},
      {"a bool mask, rows that see no key", sdpa_graph("f32", "f32", "f32", 4, 4, kBoolMask, R"(, "scale": 0.3)")},
      {"an additive mask of -inf, rows that see no key", sdpa_graph("f32", "f32", "f32", 4, 4, kInfMask)},
      {"GQA: 4 heads over 2", sdpa_graph("f32", "f32", "f32", 4, 2, kBoolMask)},
      {"bf16 q and k, f32 v", sdpa_graph("bf16", "bf16", "f32", 2, 2, kInfMask)},
      {"f32 q, bf16 k and v: the probabilities rounded to bf16", sdpa_graph("f32", "bf16", "bf16", 2, 1, "")},
  };
  uint64_t seed = 1;
  for (const auto& [what, json] : cases) {
    SCOPED_TRACE(what);
    const Graph g = testing::must_parse(json);
    const ir::Graph& planned = ir_of(g);
    EXPECT_TRUE(testing::rewritten_by(g, "sdpa_as_matmuls")) << ir::rewrite_notes_text(planned);
    EXPECT_EQ(testing::count_ops(planned, ir::OpKind::Sdpa), 0);
    EXPECT_EQ(testing::count_ops(planned, ir::OpKind::Matmul), 2);
    const ir::Plan p = ir::plan_fusion(planned, {.sm = 90});
    ASSERT_EQ(ir::verify_plan(planned, p), "");
    for (const ir::PlannedKernel& k : p.kernels) EXPECT_NE(k.kind, ir::KernelKind::Attention);
    for (uint64_t s : {seed, seed + 1}) {
      const std::vector<HostTensor> inputs = random_inputs(g, s);
      testing::expect_rewritten_close_to_written(g, inputs, s);
      // Rows that see no key give zeros, as the sdpa's do.
      if (std::string(what).find("no key") != std::string::npos) {
        const std::vector<HostTensor> out = testing::must_run(g, inputs);
        size_t zero_rows = 0;
        for (size_t row = 0; row < out[0].values.size() / 32; ++row)
          zero_rows += std::all_of(out[0].values.begin() + static_cast<std::ptrdiff_t>(row * 32),
                                   out[0].values.begin() + static_cast<std::ptrdiff_t>(row * 32 + 32),
                                   [](float v) { return v == 0.0f; });
        EXPECT_GT(zero_rows, 0u);
      }
    }
    seed += 2;
  }
}

TEST(SdpaAsMatmuls, CausalAndOverBudgetSdpasStayAndSayWhy) {
  const Graph causal = testing::must_parse(sdpa_graph("f32", "f32", "f32", 2, 2, "", R"(, "causal": true)"));
  EXPECT_EQ(testing::count_ops(ir_of(causal), ir::OpKind::Sdpa), 1);
  EXPECT_THAT(ir::rewrite_notes_text(ir_of(causal)),
              HasSubstr("not rewritten (sdpa_as_matmuls): 'o' (sdpa): causal: its mask needs the key positions"));
  const Graph long_rows = testing::must_parse(R"({"kiln": 1, "inputs": {"q": {"shape": [1, 32, 8192, 64], "dtype": "f32"},
    "k": {"shape": [1, 32, 8192, 64], "dtype": "f32"}, "v": {"shape": [1, 32, 8192, 64], "dtype": "f32"}},
    "ops": [{"op": "sdpa", "in": ["q", "k", "v"], "out": "o"}], "outputs": ["o"]})");
  EXPECT_EQ(testing::count_ops(ir_of(long_rows), ir::OpKind::Sdpa), 1);
  EXPECT_THAT(ir::rewrite_notes_text(ir_of(long_rows)), HasSubstr("its f32 scores would take 8192 MiB between the matmuls"));
  const Graph sixteen = testing::must_parse(sdpa_graph("bf16", "bf16", "bf16", 2, 2, kBoolMask));
  EXPECT_EQ(testing::count_ops(ir_of(sixteen), ir::OpKind::Sdpa), 1);
  EXPECT_THAT(ir::rewrite_notes_text(ir_of(sixteen)), ::testing::Not(HasSubstr("sdpa_as_matmuls")));
}

// Written-out f32 attention (DistilBERT's masked_fill) becomes the sdpa and
// then these matmuls: one plan for every way of writing it.
TEST(SdpaAsMatmuls, WrittenOutF32AttentionComesThroughTheSdpa) {
  Expected<Graph> g = Graph::load(KILN_SOURCE_DIR "/examples/attention/distilbert_masked_fill.json");
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(testing::rewritten_by(*g, "attention_as_sdpa"));
  EXPECT_TRUE(testing::rewritten_by(*g, "sdpa_as_matmuls"));
  EXPECT_EQ(testing::count_ops(ir_of(*g), ir::OpKind::Sdpa), 0);
}

}  // namespace
}  // namespace kiln
