// Shape and dtype inference for every op family, and the checks that reject
// invalid ops with a message that names the op and the tensors.
#include <limits>

#include "compiler/graph_internal.h"
#include "compiler/ir.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using testing::must_parse;
using testing::one_op;
using testing::parse_error;

// The result type of the single op of one_op(...).
std::string result_of(const std::string& fields, const std::vector<std::string>& shapes,
                      const std::string& dtype = "f32") {
  Graph g = must_parse(one_op(fields, shapes, dtype));
  const auto& t = ir_of(g).tensor(ir_of(g).ops.back().output);
  return std::string(to_string(t.dtype)) + to_string(t.shape);
}

std::string error_of(const std::string& fields, const std::vector<std::string>& shapes,
                     const std::string& dtype = "f32") {
  return parse_error(one_op(fields, shapes, dtype));
}

TEST(ShapeInference, PointwiseBroadcasting) {
  EXPECT_EQ(result_of(R"("op": "add", "in": ["a", "b"])", {"[32,1,8]", "[4,1]"}), "f32[32,4,8]");
  EXPECT_EQ(result_of(R"("op": "mul", "in": ["a", 2.5])", {"[3,4]"}), "f32[3,4]");
  EXPECT_EQ(result_of(R"("op": "relu", "in": ["a"])", {"[]"}), "f32[]");
  EXPECT_EQ(result_of(R"("op": "gelu", "in": ["a"])", {"[5]"}, "bf16"), "bf16[5]");
  EXPECT_EQ(result_of(R"("op": "lt", "in": ["a", 0])", {"[2,3]"}), "bool[2,3]");
  EXPECT_EQ(result_of(R"("op": "add", "in": [1, 2])", {}), "f32[]");
  EXPECT_EQ(result_of(R"("op": "clamp", "in": ["a"], "min": 0, "max": 6)", {"[7]"}), "f32[7]");
  EXPECT_THAT(error_of(R"("op": "add", "in": ["a", "b"])", {"[32,56,56,128]", "[64]"}),
              HasSubstr("op 0 'y' (add): shapes [32,56,56,128] and [64] do not broadcast"));
}

TEST(ShapeInference, DtypeRuleThree) {
  const std::string mixed = R"({"kiln": 1, "inputs": {"h": {"shape": [4], "dtype": "f16"},
    "b": {"shape": [4], "dtype": "bf16"}, "f": {"shape": [4], "dtype": "f32"},
    "c": {"shape": [4], "dtype": "bool"}},
    "ops": [{"op": "add", "in": ["h", "b"], "out": "hb"},
            {"op": "mul", "in": ["h", 3], "out": "h3"},
            {"op": "add", "in": ["b", "f"], "out": "bf"},
            {"op": "where", "in": ["c", "b", 1], "out": "w"},
            {"op": "cast", "in": ["c"], "out": "cf", "dtype": "f16"},
            {"op": "relu", "in": ["h"], "out": "r", "dtype": "bf16"}],
    "outputs": ["hb", "h3", "bf", "w", "cf", "r"]})";
  Graph g = must_parse(mixed);
  auto dtype_of = [&](int op) { return to_string(ir_of(g).tensor(ir_of(g).ops[op].output).dtype); };
  EXPECT_EQ(dtype_of(0), "f32");   // f16 with bf16 gives f32
  EXPECT_EQ(dtype_of(1), "f16");   // scalars are ignored
  EXPECT_EQ(dtype_of(2), "f32");   // f32 wins
  EXPECT_EQ(dtype_of(3), "bf16");  // where's condition is ignored
  EXPECT_EQ(dtype_of(4), "f16");
  EXPECT_EQ(dtype_of(5), "bf16");  // explicit dtype
}

TEST(ShapeInference, RoundingFlagsFollowRuleTwo) {
  Graph g = must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [4], "dtype": "bf16"}},
    "ops": [{"op": "exp", "in": ["x"], "out": "e"},
            {"op": "exp", "in": ["x"], "out": "r", "dtype": "bf16"},
            {"op": "transpose", "in": ["x"], "out": "t"},
            {"op": "add", "in": ["e", "r"], "out": "o"},
            {"op": "neg", "in": ["o"], "out": "n"}],
    "outputs": ["o", "n"]})");
  const auto& ir = ir_of(g);
  auto tensor = [&](int op) { return ir.tensor(ir.ops[op].output); };
  EXPECT_FALSE(tensor(0).rounded);  // bf16 in name, f32 values
  EXPECT_EQ(tensor(0).value_dtype(), DType::f32);
  EXPECT_TRUE(tensor(1).rounded);   // explicit dtype
  EXPECT_TRUE(tensor(2).rounded);   // a view of a rounded input moves no data
  EXPECT_TRUE(tensor(3).rounded);   // a graph output, read by `n` as stored
  EXPECT_TRUE(tensor(4).rounded);
}

TEST(ShapeInference, Reductions) {
  EXPECT_EQ(result_of(R"("op": "reduce_sum", "in": ["a"], "axes": [-1])", {"[2,3,4]"}), "f32[2,3]");
  EXPECT_EQ(result_of(R"("op": "reduce_max", "in": ["a"], "axes": [0, 2], "keepdims": true)", {"[2,3,4]"}),
            "f32[1,3,1]");
  EXPECT_EQ(result_of(R"("op": "reduce_mean", "in": ["a"])", {"[2,3,4]"}), "f32[]");
  EXPECT_THAT(error_of(R"("op": "reduce_sum", "in": ["a"], "axes": [1, -2])", {"[2,3,4]"}),
              HasSubstr("name the same axis twice"));
  EXPECT_THAT(error_of(R"("op": "reduce_sum", "in": ["a"], "axes": [3])", {"[2,3,4]"}),
              HasSubstr("axis 3 is out of range for a rank-3 input"));
  EXPECT_THAT(error_of(R"("op": "reduce_sum", "in": ["a"], "axes": [])", {"[2]"}), HasSubstr("must not be empty"));
}

TEST(ShapeInference, Normalisations) {
  EXPECT_EQ(result_of(R"("op": "softmax", "in": ["a"], "axis": 0)", {"[5,6]"}), "f32[5,6]");
  EXPECT_EQ(result_of(R"("op": "layer_norm", "in": ["a", "b", "c"], "axis": 1)", {"[2,3,4]", "[3,4]", "[3,4]"}),
            "f32[2,3,4]");
  EXPECT_EQ(result_of(R"("op": "batch_norm", "in": ["a", "b", "c"], "axis": 1)", {"[2,3,4]", "[3]", "[3]"}),
            "f32[2,3,4]");
  EXPECT_EQ(result_of(R"("op": "group_norm", "in": ["a"], "groups": 2)", {"[2,5,4]"}), "f32[2,5,4]");
  EXPECT_THAT(error_of(R"("op": "layer_norm", "in": ["a", "b"])", {"[2,3,4]", "[3,4]"}),
              HasSubstr("weight 'b' f32[3,4] must have shape [4]"));
  EXPECT_THAT(error_of(R"("op": "group_norm", "in": ["a"], "groups": 3)", {"[2,5,4]"}),
              HasSubstr("groups 3 must be at least 1 and divide the 4 channels"));
  EXPECT_THAT(error_of(R"("op": "group_norm", "in": ["a"])", {"[2,4]"}), HasSubstr("'groups' is required"));
  EXPECT_THAT(error_of(R"("op": "rms_norm", "in": ["a"], "eps": -1)", {"[2,4]"}), HasSubstr("must not be negative"));
  // Default eps differs per op and is resolved, so it prints and hashes alike.
  Graph g = must_parse(one_op(R"("op": "rms_norm", "in": ["a"])", {"[2,4]"}));
  EXPECT_FLOAT_EQ(ir_of(g).ops[0].attrs.eps, 1e-6f);
}

TEST(ShapeInference, Matmul) {
  EXPECT_EQ(result_of(R"("op": "matmul", "in": ["a", "b"])", {"[8,16]", "[16,4]"}), "f32[8,4]");
  EXPECT_EQ(result_of(R"("op": "matmul", "in": ["a", "b"])", {"[3,1,8,16]", "[5,16,4]"}), "f32[3,5,8,4]");
  EXPECT_THAT(error_of(R"("op": "matmul", "in": ["a", "b"])", {"[8,16]", "[15,4]"}),
              HasSubstr("inner dimensions differ"));
  EXPECT_THAT(error_of(R"("op": "matmul", "in": ["a", "b"])", {"[16]", "[16,4]"}),
              HasSubstr("must have rank at least 2"));
  EXPECT_THAT(error_of(R"("op": "matmul", "in": ["a", "b"])", {"[2,8,16]", "[3,16,4]"}),
              HasSubstr("batch dimensions [2] of 'a' f32[2,8,16] and [3] of 'b' f32[3,16,4] do not broadcast"));
}

TEST(ShapeInference, Conv2d) {
  EXPECT_EQ(result_of(R"("op": "conv2d", "in": ["a", "b"], "padding": [1, 1])", {"[2,8,8,16]", "[32,3,3,16]"}),
            "f32[2,8,8,32]");
  EXPECT_EQ(result_of(R"("op": "conv2d", "in": ["a", "b"], "stride": [2, 2], "layout": "NCHW")",
                      {"[2,16,9,9]", "[32,16,3,3]"}),
            "f32[2,32,4,4]");
  EXPECT_EQ(result_of(R"("op": "conv2d", "in": ["a", "b"], "dilation": [2, 2], "groups": 4)",
                      {"[1,9,9,8]", "[4,3,3,2]"}),
            "f32[1,5,5,4]");
  EXPECT_THAT(error_of(R"("op": "conv2d", "in": ["a", "b"])", {"[2,8,8,16]", "[32,3,3,8]"}),
              HasSubstr("has 8 channels per group but input 'a' f32[2,8,8,16] has 16 channels"));
  EXPECT_THAT(error_of(R"("op": "conv2d", "in": ["a", "b"])", {"[1,2,2,4]", "[4,3,3,4]"}),
              HasSubstr("the output would be empty"));
  EXPECT_THAT(error_of(R"("op": "conv2d", "in": ["a", "b"], "stride": [0, 1])", {"[1,4,4,4]", "[4,1,1,4]"}),
              HasSubstr("stride value 0"));
}

TEST(ShapeInference, Pooling) {
  EXPECT_EQ(result_of(R"("op": "max_pool2d", "in": ["a"], "kernel": [2, 2])", {"[1,8,8,3]"}), "f32[1,4,4,3]");
  EXPECT_EQ(result_of(R"("op": "avg_pool2d", "in": ["a"], "kernel": [3, 3], "stride": [1, 1], "padding": [1, 1],
                         "layout": "NCHW")", {"[1,3,5,5]"}),
            "f32[1,3,5,5]");
  EXPECT_THAT(error_of(R"("op": "max_pool2d", "in": ["a"])", {"[1,8,8,3]"}), HasSubstr("'kernel' [kh, kw] is required"));
  EXPECT_THAT(error_of(R"("op": "max_pool2d", "in": ["a"], "kernel": [2, 2], "padding": [2, 0])", {"[1,8,8,3]"}),
              HasSubstr("padding 2 exceeds half the kernel size 2"));
  EXPECT_THAT(error_of(R"("op": "max_pool2d", "in": ["a"], "kernel": [2, 2], "count_include_pad": false)",
                       {"[1,8,8,3]"}),
              HasSubstr("unknown attribute 'count_include_pad'"));
}

TEST(ShapeInference, Views) {
  EXPECT_EQ(result_of(R"("op": "transpose", "in": ["a"], "perm": [0, 2, 1])", {"[2,3,4]"}), "f32[2,4,3]");
  EXPECT_EQ(result_of(R"("op": "transpose", "in": ["a"])", {"[2,3,4]"}), "f32[4,3,2]");
  EXPECT_EQ(result_of(R"("op": "reshape", "in": ["a"], "shape": [6, -1])", {"[2,3,4]"}), "f32[6,4]");
  EXPECT_THAT(error_of(R"("op": "reshape", "in": ["a"], "shape": [5, -1])", {"[2,3,4]"}), HasSubstr("cannot reshape"));
  EXPECT_THAT(error_of(R"("op": "reshape", "in": ["a"], "shape": [-1, -1])", {"[2,3,4]"}), HasSubstr("more than one -1"));
  EXPECT_THAT(error_of(R"("op": "transpose", "in": ["a"], "perm": [0, 0, 1])", {"[2,3,4]"}), HasSubstr("twice"));
}

TEST(ShapeInference, Sdpa) {
  EXPECT_EQ(result_of(R"("op": "sdpa", "in": ["a", "b", "c"], "causal": true)",
                      {"[2,8,16,32]", "[2,2,24,32]", "[2,2,24,32]"}),
            "f32[2,8,16,32]");
  EXPECT_EQ(result_of(R"("op": "sdpa", "in": ["a", "b", "c", "d"])",
                      {"[2,8,16,32]", "[2,8,24,32]", "[2,8,24,32]", "[1,1,16,24]"}),
            "f32[2,8,16,32]");
  EXPECT_THAT(error_of(R"("op": "sdpa", "in": ["a", "b", "c"])", {"[2,8,16,32]", "[2,3,24,32]", "[2,3,24,32]"}),
              HasSubstr("q's 8 heads are not a multiple of k/v's 3 heads"));
  EXPECT_THAT(error_of(R"("op": "sdpa", "in": ["a", "b", "c", "d"])",
                       {"[2,8,16,32]", "[2,8,24,32]", "[2,8,24,32]", "[16,16]"}),
              HasSubstr("does not broadcast to the scores' shape [2,8,16,24]"));
  Graph g = must_parse(one_op(R"("op": "sdpa", "in": ["a", "b", "c"])", {"[1,1,2,64]", "[1,1,2,64]", "[1,1,2,64]"}));
  EXPECT_FLOAT_EQ(ir_of(Graph::Internal::unsunk(g)).ops[0].attrs.scale, 0.125f);  // (as written: f32 runs as matmuls)
}

TEST(ShapeInference, BoolValuesAreReadOnlyWhereAllowed) {
  const std::string head = R"({"kiln": 1, "inputs": {"x": {"shape": [4], "dtype": "f32"},
    "m": {"shape": [4], "dtype": "bool"}}, "ops": [)";
  EXPECT_THAT(parse_error(head + R"({"op": "add", "in": ["m", "x"], "out": "y"}], "outputs": ["y"]})"),
              HasSubstr("op 0 'y' (add): input 0 'm' bool[4] is bool"));
  EXPECT_THAT(parse_error(head + R"({"op": "where", "in": ["x", "x", "x"], "out": "y"}], "outputs": ["y"]})"),
              HasSubstr("the condition 'x' f32[4] must be bool"));
  EXPECT_THAT(parse_error(head + R"({"op": "gt", "in": ["x", 0], "out": "y", "dtype": "f32"}], "outputs": ["y"]})"),
              HasSubstr("a comparison's dtype must be bool"));
  EXPECT_THAT(parse_error(head + R"({"op": "relu", "in": ["x"], "out": "y", "dtype": "bool"}], "outputs": ["y"]})"),
              HasSubstr("dtype bool is only for comparisons and cast"));
  must_parse(head + R"({"op": "cast", "in": ["m"], "out": "y", "dtype": "f32"}], "outputs": ["y", "m"]})");
}

TEST(ShapeInference, ScalarsAndNumbers) {
  EXPECT_THAT(error_of(R"("op": "add", "in": ["a", 1e39])", {"[2]"}), HasSubstr("scalar constant 1e+39 is not finite in f32"));
  // The shortest decimal of FLT_MAX (as a graph's JSON writes it) reads back as FLT_MAX; half a
  // unit in the last place further is infinity.
  EXPECT_THAT(error_of(R"("op": "add", "in": ["a", -3.4028236e38])", {"[2]"}), HasSubstr("is not finite in f32"));
  const Graph lowest = testing::must_parse(R"({"kiln": 1, "inputs": {"a": {"shape": [2], "dtype": "f32"}},
    "ops": [{"op": "lt", "in": ["a", -3.4028235e+38], "out": "y"}], "outputs": ["y"]})");
  EXPECT_EQ(testing::must_parse(lowest.to_json()).to_json(), lowest.to_json());
  EXPECT_THAT(error_of(R"("op": "matmul", "in": ["a", 2])", {"[2,2]"}), HasSubstr("scalars may only be operands of pointwise ops"));
  EXPECT_THAT(error_of(R"("op": "leaky_relu", "in": ["a"], "alpha": "big")", {"[2]"}),
              HasSubstr("attribute 'alpha' must be a number, got 'big'"));
}

TEST(ShapeInference, ElementCountOverflow) {
  EXPECT_THAT(parse_error(R"({"kiln": 1, "inputs": {"x": {"shape": [2147483648, 2147483648, 2], "dtype": "f32"}},
    "ops": [], "outputs": ["x"]})"), HasSubstr("more than 2^62 elements"));
  // Each input fits, but the broadcast result does not.
  EXPECT_THAT(error_of(R"("op": "add", "in": ["a", "b"])", {"[4294967296, 1]", "[1, 4294967296]"}),
              HasSubstr("more than 2^62 elements"));
}

TEST(GraphBuilder, BuildsTheSameGraphAsJson) {
  GraphBuilder b("mlp");
  Tensor x = b.input("x", {64, 512}, DType::bf16);
  Tensor w = b.input("w", {512, 256}, DType::bf16);
  Tensor bias = b.input("bias", {256}, DType::bf16);
  Tensor y = b.op("gelu", {b.add(b.matmul(x, w), bias)}, {}, DType::bf16, "y");
  b.output(y);
  Expected<Graph> built = b.build();
  ASSERT_TRUE(built.ok()) << built.error().message;
  Graph parsed = must_parse(R"({"kiln": 1, "name": "mlp", "inputs": {
      "x": {"shape": [64, 512], "dtype": "bf16"}, "w": {"shape": [512, 256], "dtype": "bf16"},
      "bias": {"shape": [256], "dtype": "bf16"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "mm"}, {"op": "add", "in": ["mm", "bias"], "out": "pre"},
            {"op": "gelu", "in": ["pre"], "out": "y", "dtype": "bf16"}],
    "outputs": ["y"]})");
  EXPECT_EQ(built->hash(), parsed.hash());
}

// What shape inference gave a tensor, asked while building (the PyTorch
// backend checks each converted node against PyTorch's shape this way).
TEST(GraphBuilder, GivesEachTensorsInferredShape) {
  GraphBuilder b("g");
  Tensor x = b.input("x", {4, 8}, DType::f32);
  Tensor s = b.op("slice", {x}, {{"axis", int64_t{1}}, {"start", int64_t{2}}, {"end", int64_t{100}}});
  EXPECT_EQ(*b.shape(s), (Shape{4, 6}));  // (clamped to the axis's 8)
  EXPECT_EQ(*b.shape(b.matmul(x, b.transpose(x, {1, 0}))), (Shape{4, 4}));
  EXPECT_THAT(b.shape(Tensor{}).error().message, HasSubstr("shape: not a tensor of this builder"));
  Tensor bad = b.matmul(x, x);
  EXPECT_FALSE(bad.valid());
  EXPECT_THAT(b.shape(x).error().message, HasSubstr("inner dimensions differ"));  // (the first error)
}

TEST(GraphBuilder, KeepsTheFirstError) {
  GraphBuilder b;
  Tensor x = b.input("x", {4, 8}, DType::f32);
  Tensor bad = b.matmul(x, x);  // [4,8] x [4,8]: inner dimensions differ
  EXPECT_FALSE(bad.valid());
  b.output(b.relu(bad));
  Expected<Graph> g = b.build();
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.error().message, HasSubstr("inner dimensions differ"));
}

// A handle the builder did not return is an error of the builder, never a
// read of its tensor table (a made-up id crashed or read garbage as a name).
TEST(GraphBuilder, RefusesAHandleItDidNotReturn) {
  auto error_of = [](auto&& make_bad) {
    GraphBuilder b("g");
    Tensor x = b.input("x", {3}, DType::f32);
    b.output(b.add(x, 1.0));  // tensor 1 is the scalar's constant, never handed out
    make_bad(b, x);
    Expected<Graph> g = b.build();
    return g.ok() ? std::string("built") : g.error().message;
  };
  for (int id : {1, 3, 1000, 1048576, std::numeric_limits<int>::max()})  // (0 is x, 2 the sum)
    EXPECT_THAT(error_of([&](GraphBuilder& b, Tensor x) { b.exp(Tensor{id, x.builder}); }),
                HasSubstr("exp: operand 0: not a tensor of this builder (id " + std::to_string(id) + ": an id it never returned)"));
  EXPECT_THAT(error_of([](GraphBuilder& b, Tensor) { b.exp(Tensor{}); }),
              HasSubstr("exp: operand 0: not a tensor of this builder (id -1: a handle no builder returned)"));
  EXPECT_THAT(error_of([](GraphBuilder& b, Tensor) { b.exp(Tensor{0}); }), HasSubstr("a handle no builder returned"));
  EXPECT_THAT(error_of([](GraphBuilder& b, Tensor x) { b.add(x, Tensor{0, x.builder + 1000}); }),
              HasSubstr("add: operand 1: not a tensor of this builder (id 0: a handle of another builder)"));
  EXPECT_THAT(error_of([](GraphBuilder& b, Tensor) { b.output(Tensor{7, 0}); }),
              HasSubstr("output: not a tensor of this builder"));
  // Another builder's real handle, with an id this builder also has.
  GraphBuilder other("other");
  Tensor theirs = other.input("y", {3}, DType::f32);
  EXPECT_THAT(error_of([&](GraphBuilder& b, Tensor) { b.relu(theirs); }), HasSubstr("a handle of another builder"));
  // On an empty builder too.
  GraphBuilder empty("empty");
  EXPECT_FALSE(empty.exp(Tensor{0, 1}).valid());
  ASSERT_FALSE(empty.status());
  EXPECT_THAT(empty.status().error().message, HasSubstr("not a tensor of this builder"));
}

}  // namespace
}  // namespace kiln
