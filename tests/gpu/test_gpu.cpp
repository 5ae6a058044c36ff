// GPU tests: generated kernels against the reference interpreter, with fresh
// random inputs and outputs poisoned before each run. Label `gpu`; without a
// GPU every test skips and says why.
#include <filesystem>
#include <future>
#include <random>

#include "kiln/executable.h"
#include "kiln/reference.h"
#include "runtime/check.h"
#include "runtime/cuda_driver.h"
#include "runtime/random_inputs.h"
#include "tests/unit/random_graph.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

#define REQUIRE_GPU()                                                    \
  do {                                                                   \
    Expected<const runtime::Driver*> d = runtime::driver();              \
    if (!d) GTEST_SKIP() << "skipped: " << d.error().message;            \
  } while (0)

// Compiles in parallel (NVRTC is the slow part), runs serially on the GPU.
struct Outcome {
  int passed = 0, failed = 0;
};

Outcome check_graphs(const std::vector<Graph>& graphs, const std::vector<std::string>& names, uint64_t seed) {
  std::vector<std::future<Expected<Executable>>> compiled;
  for (const Graph& g : graphs)
    compiled.push_back(std::async(std::launch::async, [&g] { return Executable::compile(g); }));
  Outcome o;
  for (size_t i = 0; i < graphs.size(); ++i) {
    Expected<Executable> exe = compiled[i].get();
    if (!exe) {
      ADD_FAILURE() << names[i] << ": " << exe.error().message;
      ++o.failed;
      continue;
    }
    const std::vector<HostTensor> inputs = random_inputs(graphs[i], seed + i);
    Expected<std::vector<HostTensor>> got = exe->run_host(inputs);
    Expected<std::vector<HostTensor>> want = run_reference(graphs[i], inputs);
    if (!got || !want) {
      ADD_FAILURE() << names[i] << ": " << (!got ? got.error().message : want.error().message);
      ++o.failed;
      continue;
    }
    bool ok = true;
    for (size_t k = 0; k < want->size(); ++k) {
      const ir::TensorId id = graphs[i].ir().outputs[k];
      const double tolerance = runtime::default_tolerance(graphs[i].ir(), id);
      const runtime::Comparison c = runtime::compare((*got)[k], (*want)[k]);
      if (!c.passes(tolerance)) {
        ok = false;
        ADD_FAILURE() << names[i] << " output '" << graphs[i].ir().tensor(id).name << "': rel err " << c.relative_error
                      << " (tolerance " << tolerance << ")"
                      << (c.nonfinite_match ? "" : ", NaN/inf differ at element " + std::to_string(c.first_mismatch))
                      << "\n" << graphs[i].to_json();
      }
    }
    ok ? ++o.passed : ++o.failed;
  }
  return o;
}

TEST(Gpu, EveryExampleMatchesTheReference) {
  REQUIRE_GPU();
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(KILN_SOURCE_DIR "/examples"))
    if (e.path().extension() == ".json") {
      graphs.push_back(Graph::load(e.path().string()).value());
      names.push_back(e.path().filename().string());
    }
  for (uint64_t seed : {11u, 12u}) {
    const Outcome o = check_graphs(graphs, names, seed);
    RecordProperty("passed_seed_" + std::to_string(seed), o.passed);
    EXPECT_EQ(o.failed, 0);
  }
}

TEST(Gpu, EveryPointwiseOpInEveryDtypeWithOddShapesAndBroadcasting) {
  REQUIRE_GPU();
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  const char* unary[] = {"identity", "neg", "abs", "relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh",
                         "exp", "log", "sqrt", "rsqrt", "reciprocal", "square", "erf", "sin", "cos", "softplus", "clamp"};
  const char* binary[] = {"add", "sub", "mul", "div", "maximum", "minimum", "pow", "eq", "ne", "lt", "le", "gt", "ge"};
  for (const char* dtype : {"f32", "f16", "bf16"}) {
    for (const char* op : unary) {
      const std::string attrs = std::string(op) == "clamp" ? R"(, "min": -0.5, "max": 0.7)" : "";
      const bool positive = std::string(op) == "log" || std::string(op) == "sqrt" || std::string(op) == "rsqrt";
      const std::string pre = positive ? R"({"op": "abs", "in": ["x"], "out": "a"},)" : R"({"op": "identity", "in": ["x"], "out": "a"},)";
      graphs.push_back(testing::must_parse(fmt::format(
          R"({{"kiln": 1, "inputs": {{"x": {{"shape": [3, 5, 37], "dtype": "{0}"}}}},
             "ops": [{1} {{"op": "{2}", "in": ["a"], "out": "y"{3}}}], "outputs": ["y"]}})", dtype, pre, op, attrs)));
      names.push_back(fmt::format("{} {}", op, dtype));
    }
    for (const char* op : binary) {
      graphs.push_back(testing::must_parse(fmt::format(
          R"({{"kiln": 1, "inputs": {{"x": {{"shape": [3, 5, 37], "dtype": "{0}"}}, "b": {{"shape": [5, 1], "dtype": "{0}"}}}},
             "ops": [{{"op": "{1}", "in": ["x", "b"], "out": "y"}}], "outputs": ["y"]}})", dtype, op)));
      names.push_back(fmt::format("{} {}", op, dtype));
    }
  }
  const Outcome o = check_graphs(graphs, names, 100);
  RecordProperty("passed", o.passed);
  EXPECT_EQ(o.failed, 0);
}

TEST(Gpu, RandomGraphsMatchTheReference) {
  REQUIRE_GPU();
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    graphs.push_back(testing::random_graph(seed));
    names.push_back("random graph " + std::to_string(seed));
  }
  const Outcome o = check_graphs(graphs, names, 1000);
  RecordProperty("passed", o.passed);
  EXPECT_EQ(o.failed, 0);
}

}  // namespace
}  // namespace kiln
