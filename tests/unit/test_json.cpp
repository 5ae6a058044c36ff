// JSON loading: round trips of every example graph, and document-level errors.
#include <filesystem>
#include <fstream>

#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using testing::parse_error;

std::vector<std::filesystem::path> example_graphs() {
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(KILN_SOURCE_DIR "/examples"))
    if (entry.path().extension() == ".json") paths.push_back(entry.path());
  std::sort(paths.begin(), paths.end());
  return paths;
}

TEST(Json, EveryExampleRoundTrips) {
  const auto paths = example_graphs();
  ASSERT_GE(paths.size(), 8u);
  for (const auto& path : paths) {
    Expected<Graph> g = Graph::load(path.string());
    ASSERT_TRUE(g.ok()) << g.error().message;
    Expected<Graph> again = Graph::from_json(g->to_json(), "round trip");
    ASSERT_TRUE(again.ok()) << path << ": " << again.error().message << "\n" << g->to_json();
    EXPECT_EQ(again->hash(), g->hash()) << path;
    EXPECT_EQ(again->to_ir_text(), g->to_ir_text()) << path;
    EXPECT_EQ(again->to_json(), g->to_json()) << path;
  }
}

TEST(Json, KeepsInputBindingOrder) {
  Expected<Graph> g = Graph::from_json(R"({"kiln": 1, "inputs": {"z": {"shape": [1], "dtype": "f32"},
    "a": {"shape": [1], "dtype": "f32"}}, "ops": [], "outputs": ["a"]})");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->inputs()[0].name, "z");
  EXPECT_EQ(g->inputs()[1].name, "a");
}

TEST(Json, DocumentErrorsNameWhatAndWhere) {
  EXPECT_THAT(parse_error(R"({"kiln": 1, "inputs": {)"), HasSubstr("invalid JSON"));
  EXPECT_THAT(parse_error("[1, 2]"), HasSubstr("a graph must be a JSON object"));
  EXPECT_THAT(parse_error(R"({"kiln": 1.0, "inputs": {}, "ops": [], "outputs": []})"),
              HasSubstr("\"kiln\" must be the integer 1"));
  EXPECT_THAT(parse_error(R"({"kiln": 1, "inputs": {"x": {"shape": [1], "dtype": "f32"}, "x": {"shape": [2], "dtype": "f32"}},
    "ops": [], "outputs": ["x"]})"), HasSubstr("key 'x' appears twice"));
  EXPECT_THAT(parse_error(R"({"kiln": 1, "inputs": {}, "ops": [], "outputs": [], "extra": 0})"),
              HasSubstr("unknown top-level key 'extra'"));
  EXPECT_THAT(parse_error(R"({"kiln": 1, "inputs": {"x": {"shape": [1], "dtype": "f32", "layout": "NHWC"}},
    "ops": [], "outputs": ["x"]})"), HasSubstr("input 'x': unknown key 'layout'"));
  EXPECT_THAT(parse_error(std::string(100, '[') + std::string(100, ']')), HasSubstr("nesting is deeper than 64"));
  EXPECT_THAT(parse_error(R"({"kiln": 1, "inputs": {"x": {"shape": [1], "dtype": "f32"}},
    "ops": [{"op": "relu", "in": ["x"], "out": "y\"); system(\"rm"}], "outputs": ["x"]})"),
              HasSubstr("op 0: output name 'y\"); system(\"rm' is not a valid name"));
}

TEST(Json, SurvivesPathologicalNesting) {
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  EXPECT_THAT(parse_error(deep), HasSubstr("nesting"));
}

TEST(Json, LoadReportsAMissingFile) {
  Expected<Graph> g = Graph::load("/nonexistent/graph.json");
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.error().message, HasSubstr("/nonexistent/graph.json: cannot open the file"));
}

}  // namespace
}  // namespace kiln
