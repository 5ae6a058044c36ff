// Symbolic dimensions (graph-format.md, "Symbolic dimensions"): shape
// inference over products of symbols, the load errors, the hash over
// `dims`, the JSON round trip, binding sizes (specialize, reading them from
// the inputs' shapes), and reference runs of a symbolic graph at several
// sizes against the same graph written with integers.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "compiler/graph_internal.h"
#include "compiler/symbolic_dims.h"
#include "kiln/executable.h"
#include "runtime/random_inputs.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using testing::must_parse;
using testing::parse_error;

const char* kDims = R"("dims": {"B": {"min": 1, "max": 64}, "S": {"min": 1, "max": 4096, "multiple_of": 8}})";

// A graph with the dims above, these inputs ("name": shape JSON) and ops.
std::string graph(const std::vector<std::pair<std::string, std::string>>& inputs, const std::string& ops,
                  const std::string& outputs = R"(["y"])", const std::string& dims = kDims) {
  std::string in;
  for (size_t i = 0; i < inputs.size(); ++i)
    in += fmt::format(R"({}"{}": {{"shape": {}, "dtype": "f32"}})", i ? ", " : "", inputs[i].first, inputs[i].second);
  return fmt::format(R"({{"kiln": 1, "name": "g", {}, "inputs": {{{}}}, "ops": [{}], "outputs": {}}})", dims, in, ops,
                     outputs);
}

// The type of tensor `name` as the IR prints it.
std::string type_of(const Graph& g, const std::string& name) {
  const ir::Graph& ir = Graph::Internal::as_written(g);
  for (const ir::Tensor& t : ir.tensors)
    if (t.name == name) return fmt::format("{}{}", to_string(t.dtype), ir::shape_text(t));
  return "(no tensor " + name + ")";
}

// (Input `both` gives each symbol an input where it stands alone.)
std::string result_of(std::vector<std::pair<std::string, std::string>> inputs, const std::string& op) {
  inputs.emplace_back("both", R"(["B", "S"])");
  return type_of(must_parse(graph(inputs, op)), "y");
}

TEST(Symbolic, ShapeInferenceOverProducts) {
  const std::pair<std::string, std::string> x{"x", R"(["B", "S", 64])"};
  EXPECT_EQ(result_of({x, {"b", "[64]"}}, R"({"op": "add", "in": ["x", "b"], "out": "y"})"), "f32[B,S,64]");
  EXPECT_EQ(result_of({x, {"m", R"([1, "S", 1])"}}, R"({"op": "mul", "in": ["x", "m"], "out": "y"})"), "f32[B,S,64]");
  EXPECT_EQ(result_of({x, {"w", "[64, 256]"}}, R"({"op": "matmul", "in": ["x", "w"], "out": "y"})"), "f32[B,S,256]");
  EXPECT_EQ(result_of({x}, R"({"op": "reshape", "in": ["x"], "out": "y", "shape": ["B", -1, 16]})"), "f32[B,S*4,16]");
  EXPECT_EQ(result_of({x}, R"({"op": "reshape", "in": ["x"], "out": "y", "shape": [-1, 64]})"), "f32[B*S,64]");
  EXPECT_EQ(result_of({x}, R"({"op": "reshape", "in": ["x"], "out": "y", "shape": ["S*B", 2, 32]})"), "f32[B*S,2,32]");
  EXPECT_EQ(result_of({x}, R"({"op": "transpose", "in": ["x"], "out": "y", "perm": [1, 0, 2]})"), "f32[S,B,64]");
  EXPECT_EQ(result_of({x}, R"({"op": "reduce_sum", "in": ["x"], "out": "y", "axes": [1], "keepdims": true})"),
            "f32[B,1,64]");
  EXPECT_EQ(result_of({x}, R"({"op": "softmax", "in": ["x"], "out": "y", "axis": 1})"), "f32[B,S,64]");
  EXPECT_EQ(result_of({x}, R"({"op": "slice", "in": ["x"], "out": "y", "axis": 1, "start": -1})"), "f32[B,1,64]");
  EXPECT_EQ(result_of({{"x", R"(["B", "2*S"])"}}, R"({"op": "slice", "in": ["x"], "out": "y", "axis": 1, "start": "S"})"),
            "f32[B,S]");
  EXPECT_EQ(result_of({{"x", R"(["B", "S"])"}, {"kv", "[4096, 8]"}},
                      R"({"op": "slice", "in": ["kv"], "out": "y", "axis": 0, "end": "S"})"),
            "f32[S,8]");
  EXPECT_EQ(result_of({x}, R"({"op": "concat", "in": ["x", "x"], "out": "y", "axis": 1})"), "f32[B,S*2,64]");
  EXPECT_EQ(result_of({{"x", R"(["B", 1, 64])"}}, R"({"op": "expand", "in": ["x"], "out": "y", "shape": [-1, "B", 64]})"),
            "f32[B,B,64]");
  EXPECT_EQ(result_of({{"x", R"(["B", 8, 8, 16])"}, {"w", "[32, 3, 3, 16]"}},
                      R"({"op": "conv2d", "in": ["x", "w"], "out": "y", "padding": [1, 1]})"),
            "f32[B,8,8,32]");
  EXPECT_EQ(result_of({{"x", R"(["B", 8, 8, 16])"}}, R"({"op": "max_pool2d", "in": ["x"], "out": "y", "kernel": [2, 2]})"),
            "f32[B,4,4,16]");
  EXPECT_EQ(result_of({{"q", R"(["B", 8, "S", 64])"}, {"k", R"(["B", 2, "S", 64])"}},
                      R"({"op": "sdpa", "in": ["q", "k", "k"], "out": "y", "causal": true})"),
            "f32[B,8,S,64]");
}

TEST(Symbolic, LoadErrorsNameTheOpAndTheDimension) {
  const std::pair<std::string, std::string> x{"x", R"(["B", "S", 64])"};
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {graph({x, {"b", "[3, 1, 64]"}}, R"({"op": "add", "in": ["x", "b"], "out": "y"})"),
       "op 0 'y' (add): shapes [B,S,64] and [3,1,64] do not broadcast: B against 3"},
      {graph({x, {"t", R"(["S", "B", 64])"}}, R"({"op": "add", "in": ["x", "t"], "out": "y"})"),
       "op 0 'y' (add): shapes [B,S,64] and [S,B,64] do not broadcast: B against S"},
      {graph({x}, R"({"op": "reshape", "in": ["x"], "out": "y", "shape": ["B+S", 64]})"),
       "op 0 'y' (reshape): attribute 'shape': dimension 'B+S' is a sum or difference"},
      {graph({x}, R"({"op": "reshape", "in": ["x"], "out": "y", "shape": ["S/2", -1]})"), "is a quotient"},
      {graph({x}, R"({"op": "reshape", "in": ["x"], "out": "y", "shape": [3, -1]})"),
       "cannot reshape 'x' f32[B,S,64] (B*S*64 elements) to [3,-1]: the -1 would be (B*S*64) / (3), a quotient"},
      {graph({x}, R"({"op": "reshape", "in": ["x"], "out": "y", "shape": ["B", "S", 32]})"),
       "cannot reshape 'x' f32[B,S,64] (B*S*64 elements) to [B,S,32] (B*S*32 elements)"},
      {graph({x}, R"({"op": "reshape", "in": ["x"], "out": "y", "shape": ["T", -1]})"),
       "dimension 'T' uses unknown symbol 'T' (declared: B, S)"},
      {graph({x, {"w", R"(["B", 8])"}}, R"({"op": "matmul", "in": ["x", "w"], "out": "y"})"),
       "op 0 'y' (matmul): inner dimensions differ: 'x' f32[B,S,64] is [..., M, 64] but 'w' f32[B,8] is [..., B, N]"},
      {graph({x}, R"({"op": "concat", "in": ["x", "x"], "out": "y", "axis": 0}, {"op": "concat", "in": ["x", "y"], "out": "z", "axis": 1})",
             R"(["z"])"),
       "op 1 'z' (concat): input 1 'y' f32[B*2,S,64] differs from input 0 'x' f32[B,S,64] at axis 0"},
      {graph({x, {"c", "[1, 8, 64]"}}, R"({"op": "concat", "in": ["x", "c"], "out": "y", "axis": 1})"),
       "differs from input 0"},
      {graph({x, {"c", R"(["B", 8, 64])"}}, R"({"op": "concat", "in": ["x", "c"], "out": "y", "axis": 1})"),
       "op 0 'y' (concat): along axis 1, S and 8 add up to a sum"},
      {graph({{"x", R"([1, "S", 8, 16])"}, {"w", "[32, 3, 3, 16]"}}, R"({"op": "conv2d", "in": ["x", "w"], "out": "y"})"),
       "op 0 'y' (conv2d): the spatial dimension H of input 'x' f32[1,S,8,16] is the symbol expression S"},
      {graph({{"x", R"(["B", 8, "S", 16])"}}, R"({"op": "avg_pool2d", "in": ["x"], "out": "y", "kernel": [2, 2]})"),
       "op 0 'y' (avg_pool2d): the spatial dimension W of input 'x' f32[B,8,S,16] is the symbol expression S"},
      {graph({{"x", R"(["B", 8, 8, "S"])"}, {"w", R"([4, 3, 3, "S"])"}},
             R"({"op": "conv2d", "in": ["x", "w"], "out": "y", "groups": 2})"),
       "op 0 'y' (conv2d): groups 2 must divide both the S input channels"},
      {graph({{"x", R"(["B", 8, "S"])"}}, R"({"op": "group_norm", "in": ["x"], "out": "y", "groups": 4})"),
       "op 0 'y' (group_norm): groups 4 must divide the S channels"},
      {graph({x}, R"({"op": "slice", "in": ["x"], "out": "y", "axis": 1, "start": 10})"),
       "op 0 'y' (slice): start 10 lies within axis size S for some sizes and past it for others (8 to 4096)"},
      {graph({x}, R"({"op": "slice", "in": ["x"], "out": "y", "axis": 1, "start": 2})"),
       "op 0 'y' (slice): slice [2:S:1] of axis 1 (size S) of 'x' f32[B,S,64] has a length that is a sum"},
      {graph({x}, R"({"op": "slice", "in": ["x"], "out": "y", "axis": 1, "start": 0, "end": -1})"),
       "has a length that is a sum or difference of dimensions"},
      {graph({x, {"kv", "[1024, 8]"}}, R"({"op": "slice", "in": ["kv"], "out": "y", "axis": 0, "end": "S"})"),
       "op 0 'y' (slice): end S may pass the end of axis size 1024"},
      {graph({{"q", R"([1, 8, 4, "S"])"}}, R"({"op": "sdpa", "in": ["q", "q", "q"], "out": "y"})"),
       "give 'scale' explicitly"},
      {graph({{"x", "[4]"}}, R"({"op": "relu", "in": ["x"], "out": "y"})"),
       "dims 'B': the symbol never stands alone as a dimension of an input"},
      {graph({{"x", R"(["2*B", "S"])"}}, R"({"op": "relu", "in": ["x"], "out": "y"})"),
       "dims 'B': the symbol never stands alone"},
      {graph({{"x", R"(["B", "S"])"}}, R"({"op": "relu", "in": ["x"], "out": "y"})", R"(["y"])",
             R"("dims": {"B": {"min": 0, "max": 4}, "S": {"min": 1, "max": 4}})"),
       "dims 'B': min 0 must be at least 1"},
      {graph({{"x", R"(["B"])"}}, R"({"op": "relu", "in": ["x"], "out": "y"})", R"(["y"])",
             R"("dims": {"B": {"min": 8, "max": 4}})"),
       "dims 'B': max 4 is less than min 8"},
      {graph({{"x", R"(["B"])"}}, R"({"op": "relu", "in": ["x"], "out": "y"})", R"(["y"])",
             R"("dims": {"B": {"min": 9, "max": 15, "multiple_of": 8}})"),
       "dims 'B': no multiple of 8 lies in [9, 15]"},
      {graph({{"x", R"(["B"])"}}, R"({"op": "relu", "in": ["x"], "out": "y"})", R"(["y"])",
             R"("dims": {"B": {"min": 1}})"),
       "dims 'B': missing \"max\""},
      {graph({{"x", R"(["B"])"}}, R"({"op": "relu", "in": ["x"], "out": "y"})", R"(["y"])",
             R"("dims": {"B": {"min": 1, "max": 4, "step": 2}})"),
       "dims 'B': unknown key 'step'"},
      {graph({{"x", R"(["B", "S"])"}}, R"({"op": "relu", "in": ["x"], "out": "y"})", R"(["y"])",
             R"("dims": {"B": {"min": 1, "max": 4611686018427387904}, "S": {"min": 1, "max": 4611686018427387904}})"),
       "input 'x': shape [B,S] has more than 2^62 elements at the largest sizes"},
      {R"({"kiln": 1, "inputs": {"x": {"shape": ["B"], "dtype": "f32"}}, "ops": [], "outputs": ["x"]})",
       "input 'x': dimension 'B' uses unknown symbol 'B' (the graph declares no \"dims\")"},
  };
  for (const Case& c : cases) EXPECT_THAT(parse_error(c.text), HasSubstr(c.message)) << c.text;
}

const std::string kLayer = graph({{"x", R"(["B", "S", 64])"}, {"w", "[64, 256]"}, {"b", "[256]"}},
                                 R"({"op": "matmul", "in": ["x", "w"], "out": "h"},
                                    {"op": "add", "in": ["h", "b"], "out": "hb"},
                                    {"op": "reshape", "in": ["hb"], "out": "r", "shape": ["B", -1, 64]},
                                    {"op": "softmax", "in": ["r"], "out": "y"},
                                    {"op": "slice", "in": ["y"], "out": "last", "axis": 1, "start": -1},
                                    {"op": "reduce_sum", "in": ["r"], "out": "s", "axes": [1]})",
                                 R"(["y", "last", "s"])");

// The same graph with every size written as an integer.
std::string layer_at(int64_t b, int64_t s) {
  return fmt::format(R"({{"kiln": 1, "name": "g", "inputs": {{"x": {{"shape": [{}, {}, 64], "dtype": "f32"}},
    "w": {{"shape": [64, 256], "dtype": "f32"}}, "b": {{"shape": [256], "dtype": "f32"}}}},
    "ops": [{{"op": "matmul", "in": ["x", "w"], "out": "h"}}, {{"op": "add", "in": ["h", "b"], "out": "hb"}},
            {{"op": "reshape", "in": ["hb"], "out": "r", "shape": [{}, {}, 64]}}, {{"op": "softmax", "in": ["r"], "out": "y"}},
            {{"op": "slice", "in": ["y"], "out": "last", "axis": 1, "start": {}}},
            {{"op": "reduce_sum", "in": ["r"], "out": "s", "axes": [1]}}],
    "outputs": ["y", "last", "s"]}})",
                     b, s, b, s * 4, s * 4 - 1);
}

TEST(Symbolic, IrPrintsExpressions) {
  const std::string ir = must_parse(kLayer).to_ir_text();
  EXPECT_THAT(ir, HasSubstr("dims B in [1, 64]; S in [1, 4096], a multiple of 8\n"));
  EXPECT_THAT(ir, HasSubstr("input %x : f32[B,S,64]\n"));
  EXPECT_THAT(ir, HasSubstr("op 2 %r = reshape(%hb) {shape=[B,S*4,64]} : f32[B,S*4,64]\n"));
  EXPECT_THAT(ir, HasSubstr("op 4 %last = slice(%y) {axis=1, start=-1, end=S*4, step=1} : f32[B,1,64]\n"));
}

TEST(Symbolic, JsonRoundTripKeepsExpressions) {
  const Graph g = must_parse(kLayer);
  const std::string json = g.to_json();
  EXPECT_THAT(json, HasSubstr(R"("dims": {"B":{"min":1,"max":64,"multiple_of":1},"S":{"min":1,"max":4096,"multiple_of":8}})"));
  EXPECT_THAT(json, HasSubstr(R"("shape":["B","S",64])"));
  EXPECT_THAT(json, HasSubstr(R"("shape":["B","S*4",64])"));
  const Graph back = must_parse(json);
  EXPECT_EQ(back.hash(), g.hash());
  EXPECT_EQ(back.to_json(), json);
  EXPECT_EQ(back.to_ir_text(), g.to_ir_text());
  EXPECT_TRUE(back.is_symbolic());
}

// Integers written as strings are integers: the graph is not symbolic.
TEST(Symbolic, IntegersWrittenAsStrings) {
  const std::string as_strings = R"({"kiln": 1, "inputs": {"x": {"shape": ["4", 8], "dtype": "f32"}},
    "ops": [{"op": "reshape", "in": ["x"], "out": "r", "shape": ["2*2", "8"]},
            {"op": "slice", "in": ["r"], "out": "y", "axis": 1, "start": "3", "end": "6"}], "outputs": ["y"]})";
  const std::string as_integers = R"({"kiln": 1, "inputs": {"x": {"shape": [4, 8], "dtype": "f32"}},
    "ops": [{"op": "reshape", "in": ["x"], "out": "r", "shape": [4, 8]},
            {"op": "slice", "in": ["r"], "out": "y", "axis": 1, "start": 3, "end": 6}], "outputs": ["y"]})";
  const Graph g = must_parse(as_strings);
  EXPECT_FALSE(g.is_symbolic());
  EXPECT_EQ(g.hash(), must_parse(as_integers).hash());
  EXPECT_EQ(type_of(g, "y"), "f32[4,3]");
}

TEST(Symbolic, HashCoversDims) {
  const Graph g = must_parse(kLayer);
  // Never the hash of an integer graph, not even the one at the smallest sizes.
  EXPECT_NE(g.hash(), must_parse(layer_at(1, 8)).hash());
  // The table's order and the spelling of a product do not matter; ranges do.
  std::string reordered = kLayer;
  reordered.replace(reordered.find(kDims), std::string(kDims).size(),
                    R"("dims": {"S": {"min": 1, "max": 4096, "multiple_of": 8}, "B": {"max": 64, "min": 1}})");
  EXPECT_EQ(must_parse(reordered).hash(), g.hash());
  std::string other_range = kLayer;
  other_range.replace(other_range.find(R"("max": 64)"), 9, R"("max": 32)");
  EXPECT_NE(must_parse(other_range).hash(), g.hash());
  std::string other_multiple = kLayer;
  other_multiple.replace(other_multiple.find(R"("multiple_of": 8)"), 16, R"("multiple_of": 16)");
  EXPECT_NE(must_parse(other_multiple).hash(), g.hash());
  const std::string product = graph({{"x", R"(["B", "S"])"}}, R"({"op": "reshape", "in": ["x"], "out": "y", "shape": ["B*S"]})");
  std::string swapped = product;
  swapped.replace(swapped.find("B*S"), 3, "S*B");
  EXPECT_EQ(must_parse(product).hash(), must_parse(swapped).hash());
}

TEST(Symbolic, SpecializeGivesTheIntegerGraph) {
  const Graph g = must_parse(kLayer);
  for (auto [b, s] : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {3, 24}, {64, 4096}}) {
    Expected<Graph> sized = g.specialize({{"B", b}, {"S", s}});
    ASSERT_TRUE(sized) << sized.error().message;
    EXPECT_FALSE(sized->is_symbolic());
    const Graph written = must_parse(layer_at(b, s));
    EXPECT_EQ(sized->hash(), written.hash()) << b << "," << s;
    EXPECT_EQ(sized->to_json(), written.to_json());
  }
}

TEST(Symbolic, SpecializeChecksTheSizes) {
  const Graph g = must_parse(kLayer);
  auto error = [&](const Graph::DimValues& sizes) {
    Expected<Graph> sized = g.specialize(sizes);
    EXPECT_FALSE(sized);
    return sized ? std::string() : sized.error().message;
  };
  EXPECT_THAT(error({{"B", 65}, {"S", 8}}), HasSubstr("graph 'g': B = 65 is outside its range (B in [1, 64])"));
  EXPECT_THAT(error({{"B", 2}, {"S", 12}}),
              HasSubstr("graph 'g': S = 12 is outside its range (S in [1, 4096], a multiple of 8)"));
  EXPECT_THAT(error({{"B", 2}}), HasSubstr("graph 'g': symbol 'S' has no size"));
  EXPECT_THAT(error({{"B", 2}, {"S", 8}, {"T", 1}}), HasSubstr("a size was given for 'T', which is not one of its dims"));
  Expected<Graph> integer = must_parse(layer_at(2, 8)).specialize({{"B", 2}});
  ASSERT_FALSE(integer);
  EXPECT_THAT(integer.error().message, HasSubstr("has no symbolic dimensions"));
}

TEST(Symbolic, SizesFromTheInputsShapes) {
  const Graph g = must_parse(kLayer);
  Expected<Graph::DimValues> sizes = g.dims_from_shapes({{3, 16, 64}, {64, 256}, {256}});
  ASSERT_TRUE(sizes) << sizes.error().message;
  EXPECT_EQ(*sizes, (Graph::DimValues{{"B", 3}, {"S", 16}}));
  auto error = [&](const std::vector<Shape>& shapes) {
    Expected<Graph::DimValues> s = g.dims_from_shapes(shapes);
    EXPECT_FALSE(s);
    return s ? std::string() : s.error().message;
  };
  EXPECT_THAT(error({{3, 12, 64}, {64, 256}, {256}}),
              HasSubstr("input 'x' [3,12,64] (dimension 1 of [B,S,64]): S = 12 is outside its range (S in [1, 4096], a multiple of 8)"));
  EXPECT_THAT(error({{3, 16, 32}, {64, 256}, {256}}), HasSubstr("input 'x': has shape [3,16,32] but [B,S,64] with B=3, S=16 is [3,16,64]"));
  EXPECT_THAT(error({{3, 16}, {64, 256}, {256}}), HasSubstr("input 'x': has rank 2 but the graph's [B,S,64] has rank 3"));
  // Two inputs that disagree on a symbol.
  const Graph two = must_parse(graph({{"a", R"(["B", 8])"}, {"c", R"(["B", "S"])"}},
                                     R"({"op": "relu", "in": ["a"], "out": "y"}, {"op": "relu", "in": ["c"], "out": "z"})",
                                     R"(["y", "z"])"));
  Expected<Graph::DimValues> s = two.dims_from_shapes({{2, 8}, {3, 8}});
  ASSERT_FALSE(s);
  EXPECT_THAT(s.error().message, HasSubstr("input 'c' [3,8] (dimension 0 of [B,S]): gives B = 3, but input 'a' [2,8] "
                                           "(dimension 0 of [B,8]) gives B = 2"));
}

// The symbolic graph g and the graph written with integers, run on the
// reference interpreter with the same random inputs: the same bits.
void expect_same_bits(const Graph& g, const Graph& written, uint64_t seed, const std::string& sizes) {
  const std::vector<HostTensor> inputs = random_inputs(written, seed);
  const std::vector<HostTensor> expected = testing::must_run(written, inputs);
  const std::vector<HostTensor> got = testing::must_run(g, inputs);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].shape, expected[i].shape);
    EXPECT_EQ(got[i].values, expected[i].values) << "output " << i << " at " << sizes;
  }
}

// The reference interpreter runs a symbolic graph at the sizes of its
// inputs; the results are those of the graph written with integers.
TEST(Symbolic, ReferenceRunsEqualTheIntegerGraph) {
  const Graph g = must_parse(kLayer);
  for (auto [b, s] : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {2, 16}, {5, 40}}) {
    const Graph written = must_parse(layer_at(b, s));
    expect_same_bits(g, written, 7, fmt::format("B={}, S={}", b, s));
  }
  // Inputs whose sizes break the ranges are refused before anything runs.
  const std::vector<HostTensor> bad = random_inputs(must_parse(layer_at(2, 12)), 7);
  Expected<std::vector<HostTensor>> out = run_reference(g, bad);
  ASSERT_FALSE(out);
  EXPECT_THAT(out.error().message, HasSubstr("S = 12 is outside its range"));
}

// The C++ builder makes the same graph as the JSON (the same hash).
TEST(Symbolic, BuilderMatchesJson) {
  GraphBuilder b("g");
  b.dim("B", 1, 64);
  b.dim("S", 1, 4096, 8);
  const Tensor x = b.symbolic_input("x", {"B", "S", 64}, DType::f32);
  const Tensor w = b.input("w", {64, 256}, DType::f32);
  const Tensor bias = b.input("b", {256}, DType::f32);
  const Tensor hb = b.add(b.matmul(x, w), bias);
  const Tensor r = b.op("reshape", {hb}, {{"shape", std::vector<DimSize>{"B", int64_t{-1}, int64_t{64}}}});
  const Tensor y = b.softmax(r);
  const Tensor last = b.op("slice", {y}, {{"axis", int64_t{1}}, {"start", int64_t{-1}}, {"end", std::string("S*4")}});
  const Tensor sum = b.reduce_sum(r, {1});
  b.output(y);
  b.output(last);
  b.output(sum);
  Expected<Graph> g = b.build();
  ASSERT_TRUE(g) << g.error().message;
  EXPECT_TRUE(g->is_symbolic());
  EXPECT_EQ(g->hash(), must_parse(kLayer).hash());

  GraphBuilder late("late");
  late.input("x", {4}, DType::f32);
  late.dim("B", 1, 8);
  ASSERT_FALSE(late.status());
  EXPECT_THAT(late.status().error().message, HasSubstr("dims 'B': symbols are declared before the inputs"));
  GraphBuilder sum_dim("sum");
  sum_dim.dim("B", 1, 8);
  sum_dim.symbolic_input("x", {"B+1"}, DType::f32);
  ASSERT_FALSE(sum_dim.status());
  EXPECT_THAT(sum_dim.status().error().message, HasSubstr("input 'x': dimension 'B+1' is a sum or difference"));
}

// A convolution over a symbolic batch and causal attention over a symbolic
// sequence, through concat, expand and reshape: the reference's results at
// several sizes are those of the graph written with integers. `@B`, `@S` and
// `@2S` stand for the sizes (expressions or integers).
const char* kConvAttention = R"({"kiln": 1, "name": "g", DIMS
  "inputs": {"img": {"shape": [@B, 6, 6, 8], "dtype": "f32"}, "w": {"shape": [16, 3, 3, 8], "dtype": "f32"},
             "q": {"shape": [@B, 4, @S, 16], "dtype": "bf16"}, "k": {"shape": [@B, 2, @S, 16], "dtype": "bf16"},
             "bias": {"shape": [1, 1, 1, @S], "dtype": "f32"}},
  "ops": [{"op": "conv2d", "in": ["img", "w"], "out": "c", "padding": [1, 1]},
          {"op": "relu", "in": ["c"], "out": "cr"},
          {"op": "max_pool2d", "in": ["cr"], "out": "p", "kernel": [2, 2]},
          {"op": "concat", "in": ["k", "k"], "out": "kk", "axis": 2},
          {"op": "slice", "in": ["kk"], "out": "k2", "axis": 2, "start": @S},
          {"op": "expand", "in": ["bias"], "out": "mask", "shape": [@B, 4, @S, -1]},
          {"op": "sdpa", "in": ["q", "k2", "k2", "mask"], "out": "a", "causal": true},
          {"op": "reshape", "in": ["a"], "out": "flat", "shape": [@B, -1]},
          {"op": "reduce_mean", "in": ["p"], "out": "pooled", "axes": [1, 2]}],
  "outputs": ["flat", "pooled"]})";

std::string conv_attention(const std::string& b, const std::string& s) {
  std::string text = kConvAttention;
  auto replace_all = [&](const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) text.replace(at, from.size(), to);
  };
  replace_all("DIMS", b == "\"B\"" ? R"("dims": {"B": {"min": 1, "max": 16}, "S": {"min": 1, "max": 512}},)" : "");
  replace_all("@B", b);
  replace_all("@S", s);
  return text;
}

TEST(Symbolic, ReferenceRunsEqualTheIntegerGraphWithConvAndAttention) {
  const Graph g = must_parse(conv_attention("\"B\"", "\"S\""));
  EXPECT_EQ(type_of(g, "flat"), "f32[B,S*64]");
  for (auto [b, s] : std::vector<std::pair<int, int>>{{1, 1}, {2, 5}, {3, 17}}) {
    const Graph written = must_parse(conv_attention(std::to_string(b), std::to_string(s)));
    Expected<Graph> sized = g.specialize({{"B", b}, {"S", s}});
    ASSERT_TRUE(sized) << sized.error().message;
    EXPECT_EQ(sized->hash(), written.hash());
    expect_same_bits(g, written, 11, fmt::format("B={}, S={}", b, s));
  }
}

// A symbolic graph that one compile does not cover (here a slice at a
// symbolic position, and an f32 matmul: test_symbolic_compile.cpp) is
// refused with a message saying how to bind its sizes.
TEST(Symbolic, CompilingASymbolicGraphOneCompileDoesNotCoverNeedsSizes) {
  Expected<Executable> exe = Executable::compile(must_parse(kLayer), {.use_cache = false});
  ASSERT_FALSE(exe);
  EXPECT_THAT(exe.error().message, HasSubstr("one compile for every size does not cover it yet: "));
  EXPECT_THAT(exe.error().message, HasSubstr("; bind its sizes first (--dim NAME=VALUE for each symbol, or Graph::specialize)"));
}

}  // namespace
}  // namespace kiln
