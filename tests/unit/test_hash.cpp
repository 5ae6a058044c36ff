// Properties of the graph hash (graph-format.md "Identity of a graph").
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

using testing::must_parse;

const char* kBase = R"({"kiln": 1, "name": "block",
  "inputs": {"x": {"shape": [8, 16], "dtype": "bf16"}, "w": {"shape": [16, 32], "dtype": "bf16"},
             "b": {"shape": [32], "dtype": "f32"}},
  "ops": [{"op": "matmul", "in": ["x", "w"], "out": "m"},
          {"op": "add", "in": ["m", "b"], "out": "a"},
          {"op": "gelu", "in": ["a"], "out": "g"},
          {"op": "reduce_sum", "in": ["x"], "out": "s", "axes": [1]},
          {"op": "mul", "in": ["g", 0.5], "out": "y", "dtype": "bf16"}],
  "outputs": ["y", "s"]})";

std::string hash_of(const std::string& text) { return must_parse(text).hash(); }

std::string edit(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(GraphHash, Is128BitLowercaseHex) {
  const std::string h = hash_of(kBase);
  EXPECT_EQ(h.size(), 32u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(GraphHash, IgnoresNamesOrderAndSpelledDefaults) {
  const std::string base = hash_of(kBase);
  // Renaming every tensor, and the graph.
  std::string renamed = kBase;
  for (auto [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"x\"", "\"input0\""}, {"\"w\"", "\"weight\""}, {"\"b\"", "\"bias\""}, {"\"m\"", "\"mm\""},
           {"\"a\"", "\"pre\""}, {"\"g\"", "\"act\""}, {"\"s\"", "\"rowsum\""}, {"\"y\"", "\"out\""},
           {"\"block\"", "\"other name\""}}) {
    while (renamed.find(from) != std::string::npos) renamed = edit(renamed, from, to);
  }
  EXPECT_EQ(hash_of(renamed), base);
  // Reordering inputs, outputs and independent ops.
  EXPECT_EQ(hash_of(edit(kBase, R"("x": {"shape": [8, 16], "dtype": "bf16"}, "w": {"shape": [16, 32], "dtype": "bf16"},)",
                         R"("w": {"shape": [16, 32], "dtype": "bf16"}, "x": {"shape": [8, 16], "dtype": "bf16"},)")),
            base);
  EXPECT_EQ(hash_of(edit(kBase, R"("outputs": ["y", "s"])", R"("outputs": ["s", "y"])")), base);
  std::string reordered = edit(kBase, R"({"op": "reduce_sum", "in": ["x"], "out": "s", "axes": [1]},)", "");
  reordered = edit(reordered, R"("ops": [)", R"("ops": [{"op": "reduce_sum", "in": ["x"], "out": "s", "axes": [-1]},)");
  EXPECT_EQ(hash_of(reordered), base);  // also axis -1 spelt as 1
  // Spelling out defaults, and contiguous strides.
  EXPECT_EQ(hash_of(edit(kBase, R"("out": "m"})", R"("out": "m", "precision": "f32"})")), base);
  EXPECT_EQ(hash_of(edit(kBase, R"("axes": [1]})", R"("axes": [1], "keepdims": false})")), base);
  EXPECT_EQ(hash_of(edit(kBase, R"("shape": [8, 16], "dtype": "bf16"})", R"("shape": [8, 16], "dtype": "bf16", "strides": [16, 1]})")),
            base);
}

TEST(GraphHash, ChangesWithEveryKindOfChange) {
  const std::string base = hash_of(kBase);
  const std::vector<std::pair<std::string, std::string>> changes = {
      {R"("shape": [8, 16], "dtype": "bf16"})", R"("shape": [8, 16], "dtype": "f16"})"},          // input dtype
      {R"("shape": [32], "dtype": "f32")", R"("shape": [1], "dtype": "f32")"},                    // input shape
      {R"("shape": [8, 16], "dtype": "bf16"})", R"("shape": [8, 16], "dtype": "bf16", "strides": [1, 8]})"},  // strides
      {R"("op": "gelu")", R"("op": "gelu_tanh")"},                                                 // op
      {R"("axes": [1])", R"("axes": [0])"},                                                        // attribute
      {R"("out": "m"})", R"("out": "m", "precision": "tf32"})"},                                  // attribute
      {R"(["g", 0.5])", R"(["g", 0.25])"},                                                         // constant
      {R"("dtype": "bf16"}],)", R"("dtype": "f32"}],)"},                                           // explicit dtype
      {R"("out": "y", "dtype": "bf16"})", R"("out": "y"})"},                                       // explicit vs inferred
      {R"(["m", "b"])", R"(["b", "m"])"},                                                          // operand order
      {R"("outputs": ["y", "s"])", R"("outputs": ["y", "s", "g"])"},                               // which outputs
  };
  for (const auto& [from, to] : changes) EXPECT_NE(hash_of(edit(kBase, from, to)), base) << from << " -> " << to;
}

TEST(GraphHash, TellsApartInputsOfTheSameType) {
  const auto graph = [](const std::string& ops, const std::string& outputs) {
    return hash_of(R"({"kiln": 1, "inputs": {"x": {"shape": [4], "dtype": "f32"}, "y": {"shape": [4], "dtype": "f32"}},
      "ops": [)" + ops + R"(], "outputs": )" + outputs + "}");
  };
  // sub(x, y) and sub(y, x) are the same graph up to renaming ...
  EXPECT_EQ(graph(R"({"op": "sub", "in": ["x", "y"], "out": "d"})", R"(["d"])"),
            graph(R"({"op": "sub", "in": ["y", "x"], "out": "d"})", R"(["d"])"));
  // ... but reading one input twice is not reading two.
  EXPECT_NE(graph(R"({"op": "sub", "in": ["x", "y"], "out": "d"})", R"(["d"])"),
            graph(R"({"op": "sub", "in": ["x", "x"], "out": "d"})", R"(["d"])"));
  EXPECT_NE(graph(R"({"op": "exp", "in": ["x"], "out": "e"}, {"op": "log", "in": ["y"], "out": "l"})", R"(["e", "l"])"),
            graph(R"({"op": "exp", "in": ["x"], "out": "e"}, {"op": "log", "in": ["x"], "out": "l"})", R"(["e", "l"])"));
  EXPECT_NE(graph(R"({"op": "add", "in": ["x", "y"], "out": "s"}, {"op": "mul", "in": ["s", "x"], "out": "p"})", R"(["p"])"),
            graph(R"({"op": "add", "in": ["x", "y"], "out": "s"}, {"op": "mul", "in": ["s", "s"], "out": "p"})", R"(["p"])"));
}

}  // namespace
}  // namespace kiln
