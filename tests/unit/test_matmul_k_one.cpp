// Matmuls over K = 1 as products (compiler/matmul_k_one.h): the rotary
// table's outer product becomes a mul the planner fuses (one pointwise
// kernel, one compile for every size), the rewritten graph computes the
// written one's values, and a precision that rounds f32 operands is a near
// miss that says why.
#include <gtest/gtest.h>

#include <gmock/gmock.h>

#include "compiler/graph_internal.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "runtime/pipeline.h"
#include "tests/unit/planned_graph_checks.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

// cos and sin of inv_freq[:, None] @ positions[None, :], transposed and
// doubled, as a rotary embedding's table is computed (f32), over a symbolic
// sequence (examples/matmul/rotary_table_k_one.json has it at S = 128).
const char* kRotaryTable = R"({"kiln": 1, "name": "rotary_table", "dims": {"S": {"min": 1, "max": 4096}},
 "inputs": {"inv_freq": {"shape": [32, 1], "dtype": "f32"}, "pos": {"shape": [1, "S"], "dtype": "f32"}},
 "ops": [{"op": "matmul", "in": ["inv_freq", "pos"], "out": "freqs"},
         {"op": "transpose", "in": ["freqs"], "out": "ft", "perm": [1, 0]},
         {"op": "concat", "in": ["ft", "ft"], "out": "emb", "axis": 1},
         {"op": "cos", "in": ["emb"], "out": "c", "dtype": "bf16"},
         {"op": "sin", "in": ["emb"], "out": "s", "dtype": "bf16"}],
 "outputs": ["c", "s"]})";

TEST(MatmulKOne, TheRotaryTableIsOnePointwiseKernelForEverySize) {
  const Graph g = testing::must_parse(kRotaryTable);
  Expected<std::string> why = runtime::per_size_reason(g, runtime::Target{.arch = "sm_90"});
  ASSERT_TRUE(why.ok()) << why.error().message;
  EXPECT_EQ(*why, "");
  Expected<Graph> sized = g.specialize({{"S", 77}});
  ASSERT_TRUE(sized.ok()) << sized.error().message;
  EXPECT_THAT(ir::rewrite_notes_text(ir_of(*sized)), ::testing::HasSubstr("rewrite matmul_k_one: 'freqs' (matmul) -> mul"));
  for (const ir::Op& op : ir_of(*sized).ops) EXPECT_NE(op.kind, ir::OpKind::Matmul);
  const ir::Plan p = ir::plan_fusion(ir_of(*sized));
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_EQ(p.kernels[0].kind, ir::KernelKind::Pointwise);
  testing::expect_planned_equals_written(*sized, 3, testing::Equality::kValues);
}

TEST(MatmulKOne, EveryBroadcastKeepsItsValues) {
  const char* cases[] = {
      // batched 16-bit operands, B broadcast over A's batch, an explicit dtype
      R"({"kiln": 1, "inputs": {"a": {"shape": [3, 7, 1], "dtype": "bf16"}, "b": {"shape": [1, 9], "dtype": "bf16"}},
          "ops": [{"op": "matmul", "in": ["a", "b"], "out": "y", "dtype": "bf16"}], "outputs": ["y"]})",
      // A a reshape ([2, 5] stored), f32, read by an epilogue
      R"({"kiln": 1, "inputs": {"a2": {"shape": [2, 5], "dtype": "f32"}, "b": {"shape": [2, 1, 6], "dtype": "f32"}},
          "ops": [{"op": "reshape", "in": ["a2"], "out": "a", "shape": [2, 5, 1]}, {"op": "matmul", "in": ["a", "b"], "out": "y"},
                  {"op": "relu", "in": ["y"], "out": "r"}], "outputs": ["y", "r"]})",
  };
  uint64_t seed = 1;
  for (const char* json : cases) {
    const Graph g = testing::must_parse(json);
    EXPECT_THAT(ir::rewrite_notes_text(ir_of(g)), ::testing::HasSubstr("rewrite matmul_k_one"));
    ASSERT_EQ(ir::verify_plan(ir_of(g), ir::plan_fusion(ir_of(g))), "") << json;
    testing::expect_planned_equals_written(g, seed++, testing::Equality::kValues);
  }
}

TEST(MatmulKOne, AnOperandMadeByATransposeStaysAMatmul) {
  const Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"at": {"shape": [1, 5], "dtype": "f32"}, "b": {"shape": [1, 6], "dtype": "f32"}},
    "ops": [{"op": "transpose", "in": ["at"], "out": "a", "perm": [1, 0]}, {"op": "matmul", "in": ["a", "b"], "out": "y"}],
    "outputs": ["y"]})");
  EXPECT_THAT(ir::rewrite_notes_text(ir_of(g)),
              ::testing::HasSubstr("not rewritten (matmul_k_one): 'y' (matmul): an operand is a transpose"));
}

TEST(MatmulKOne, APrecisionThatRoundsF32OperandsStaysAMatmul) {
  const Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"a": {"shape": [8, 1], "dtype": "f32"}, "b": {"shape": [1, 8], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["a", "b"], "out": "y", "precision": "tf32"}], "outputs": ["y"]})");
  EXPECT_THAT(ir::rewrite_notes_text(ir_of(g)),
              ::testing::HasSubstr("not rewritten (matmul_k_one): 'y' (matmul): its precision rounds f32 operands before the product"));
  EXPECT_EQ(ir_of(g).ops[0].kind, ir::OpKind::Matmul);
}

}  // namespace
}  // namespace kiln
