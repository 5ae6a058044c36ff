// GPU tests of one compile for every size (runtime/pipeline.h): each
// symbolic graph (pointwise, norm, held-row, row-reduction, matmul, attention, decode and conv kernels) compiled ONCE, run at its smallest, largest, an odd and a
// prime size against the reference interpreter on random inputs with its
// outputs poisoned (Executable::run_host), and against the same graph
// written with integers and compiled at that size. The compile is counted:
// after every size has run, compiling the symbolic graph again with
// fail_if_compiling finds every kernel in the cache. Label `gpu`; without a
// GPU every test skips and says why.
#include <algorithm>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "compiler/graph_internal.h"
#include "kiln/executable.h"
#include "kiln/reference.h"
#include "runtime/bench.h"
#include "runtime/check.h"
#include "runtime/random_inputs.h"
#include "tests/gpu/require_gpu.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

struct SymbolicCase {
  std::string name, json;
  std::vector<Graph::DimValues> sizes;  // smallest, largest, odd, prime
};

// The text of tests/cli/<name>.json.
std::string graph_file(const std::string& name) {
  std::ifstream file(KILN_SOURCE_DIR "/tests/cli/" + name + ".json");
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

std::vector<SymbolicCase> cases() {
  const std::string rn = R"({"kiln": 1, "name": "residual_rms_norm_gelu",
 "dims": {"B": {"min": 1, "max": 16}, "S": {"min": 1, "max": 512}},
 "inputs": {"x": {"shape": ["B", "S", 768], "dtype": "bf16"}, "res": {"shape": ["B", "S", 768], "dtype": "bf16"},
            "w": {"shape": [768], "dtype": "bf16"}, "bias": {"shape": [768], "dtype": "bf16"}},
 "ops": [{"op": "add", "in": ["x", "res"], "out": "h", "dtype": "bf16"}, {"op": "rms_norm", "in": ["h", "w"], "out": "n"},
         {"op": "add", "in": ["n", "bias"], "out": "nb"}, {"op": "gelu", "in": ["nb"], "out": "y", "dtype": "bf16"}],
 "outputs": ["y", "h"]})";
  const std::string ln = R"({"kiln": 1, "name": "layer_norm_rows",
 "dims": {"R": {"min": 1, "max": 20000}},
 "inputs": {"x": {"shape": ["R", 1024], "dtype": "f32"}, "g": {"shape": [1024], "dtype": "f32"}, "b": {"shape": [1024], "dtype": "f32"}},
 "ops": [{"op": "layer_norm", "in": ["x", "g", "b"], "out": "y"}], "outputs": ["y"]})";
  const std::string sm = R"({"kiln": 1, "name": "rows_softmax",
 "dims": {"N": {"min": 1, "max": 4096}},
 "inputs": {"x": {"shape": ["N", 1000], "dtype": "f32"}, "scale": {"shape": [1000], "dtype": "f32"}},
 "ops": [{"op": "mul", "in": ["x", "scale"], "out": "xs"}, {"op": "softmax", "in": ["xs"], "out": "p"},
         {"op": "mul", "in": ["p", 2.0], "out": "y"}], "outputs": ["y"]})";
  const std::string pw = R"({"kiln": 1, "name": "bias_gelu_rows",
 "dims": {"B": {"min": 1, "max": 64, "multiple_of": 1}, "T": {"min": 8, "max": 2048, "multiple_of": 8}},
 "inputs": {"x": {"shape": ["B", "T", 96], "dtype": "f16"}, "b": {"shape": [96], "dtype": "f16"}, "s": {"shape": ["B", 1, 96], "dtype": "f32"}},
 "ops": [{"op": "add", "in": ["x", "b"], "out": "xb"}, {"op": "gelu", "in": ["xb"], "out": "g"},
         {"op": "mul", "in": ["g", "s"], "out": "y", "dtype": "f16"}], "outputs": ["y"]})";
  const std::string held = R"({"kiln": 1, "name": "layer_norm_written_out",
 "dims": {"R": {"min": 1, "max": 50000}},
 "inputs": {"x": {"shape": ["R", 512], "dtype": "f32"}},
 "ops": [{"op": "reduce_mean", "in": ["x"], "out": "m", "axes": [1], "keepdims": true},
         {"op": "sub", "in": ["x", "m"], "out": "d"}, {"op": "mul", "in": ["d", "d"], "out": "d2"},
         {"op": "reduce_mean", "in": ["d2"], "out": "v", "axes": [1], "keepdims": true},
         {"op": "add", "in": ["v", 1e-5], "out": "ve"}, {"op": "rsqrt", "in": ["ve"], "out": "r"},
         {"op": "mul", "in": ["d", "r"], "out": "y"}, {"op": "reduce_max", "in": ["x"], "out": "top", "axes": [1]}],
 "outputs": ["y", "top"]})";
  // Two matmuls over rows B*S on the Hopper kernel (M a parameter, tensor maps sized at launch),
  // with bias, GELU and a residual read through reshapes.
  const std::string mlp = R"({"kiln": 1, "name": "mlp",
 "dims": {"B": {"min": 1, "max": 16}, "S": {"min": 1, "max": 512}},
 "inputs": {"x": {"shape": ["B", "S", 256], "dtype": "bf16"}, "w": {"shape": [256, 1024], "dtype": "bf16"},
            "b": {"shape": [1024], "dtype": "bf16"}, "w2": {"shape": [1024, 256], "dtype": "bf16"}},
 "ops": [{"op": "reshape", "in": ["x"], "out": "x2", "shape": ["B*S", 256]}, {"op": "matmul", "in": ["x2", "w"], "out": "h"},
         {"op": "add", "in": ["h", "b"], "out": "hb"}, {"op": "gelu", "in": ["hb"], "out": "g", "dtype": "bf16"},
         {"op": "matmul", "in": ["g", "w2"], "out": "y2"}, {"op": "add", "in": ["y2", "x2"], "out": "r", "dtype": "bf16"},
         {"op": "reshape", "in": ["r"], "out": "y", "shape": ["B", "S", 256]}],
 "outputs": ["y"]})";
  // The same over f32 operands (full f32 precision): the SIMT kernel, its tile rows walked by a loop.
  const std::string f32_mlp = R"({"kiln": 1, "name": "f32_mlp",
 "dims": {"B": {"min": 1, "max": 16}, "S": {"min": 1, "max": 512}},
 "inputs": {"x": {"shape": ["B", "S", 96], "dtype": "f32"}, "w": {"shape": [96, 200], "dtype": "f32"},
            "b": {"shape": [200], "dtype": "f32"}, "w2": {"shape": [200, 96], "dtype": "f32"}},
 "ops": [{"op": "reshape", "in": ["x"], "out": "x2", "shape": ["B*S", 96]}, {"op": "matmul", "in": ["x2", "w"], "out": "h"},
         {"op": "add", "in": ["h", "b"], "out": "hb"}, {"op": "gelu", "in": ["hb"], "out": "g"},
         {"op": "matmul", "in": ["g", "w2"], "out": "y2"}, {"op": "add", "in": ["y2", "x2"], "out": "r"},
         {"op": "reshape", "in": ["r"], "out": "y", "shape": ["B", "S", 96]}],
 "outputs": ["y"]})";
  // A fused QKV projection, attention on the Hopper kernel (query tiles counted by the kernel) with a
  // padding mask [B, 1, 1, S] or causal (key tiles past the diagonal skipped, a block per query
  // tile), the output projection gathering its rows (b, s), a residual.
  auto attention_layer = [](const std::string& name, bool causal) {
    return fmt::format(R"({{"kiln": 1, "name": "{}",
 "dims": {{"B": {{"min": 1, "max": 16}}, "S": {{"min": 1, "max": 512}}}},
 "inputs": {{"x": {{"shape": ["B", "S", 256], "dtype": "bf16"}}, "wqkv": {{"shape": [256, 768], "dtype": "bf16"}},
            "wo": {{"shape": [256, 256], "dtype": "bf16"}}{}}},
 "ops": [{{"op": "reshape", "in": ["x"], "out": "x2", "shape": ["B*S", 256]}},
         {{"op": "matmul", "in": ["x2", "wqkv"], "out": "qkv", "dtype": "bf16"}},
         {{"op": "reshape", "in": ["qkv"], "out": "qkv5", "shape": ["B", "S", 3, 4, 64]}},
         {{"op": "transpose", "in": ["qkv5"], "out": "qkvt", "perm": [2, 0, 3, 1, 4]}},
         {{"op": "slice", "in": ["qkvt"], "out": "q1", "axis": 0, "start": 0, "end": 1}},
         {{"op": "slice", "in": ["qkvt"], "out": "k1", "axis": 0, "start": 1, "end": 2}},
         {{"op": "slice", "in": ["qkvt"], "out": "v1", "axis": 0, "start": 2, "end": 3}},
         {{"op": "reshape", "in": ["q1"], "out": "q", "shape": ["B", 4, "S", 64]}},
         {{"op": "reshape", "in": ["k1"], "out": "k", "shape": ["B", 4, "S", 64]}},
         {{"op": "reshape", "in": ["v1"], "out": "v", "shape": ["B", 4, "S", 64]}},
         {{"op": "sdpa", "in": ["q", "k", "v"{}], "out": "a", "dtype": "bf16"{}}},
         {{"op": "transpose", "in": ["a"], "out": "at", "perm": [0, 2, 1, 3]}},
         {{"op": "reshape", "in": ["at"], "out": "a2", "shape": ["B*S", 256]}},
         {{"op": "matmul", "in": ["a2", "wo"], "out": "o"}},
         {{"op": "add", "in": ["o", "x2"], "out": "r", "dtype": "bf16"}},
         {{"op": "reshape", "in": ["r"], "out": "y", "shape": ["B", "S", 256]}}],
 "outputs": ["y"]}})",
                       name, causal ? "" : R"(, "mask": {"shape": ["B", 1, 1, "S"], "dtype": "bf16"})",
                       causal ? "" : R"(, "mask")", causal ? R"(, "causal": true)" : "");
  };
  const std::string attention = attention_layer("attention_layer", false), causal = attention_layer("causal_layer", true);
  // A decode step over a static cache of any length: one query a head, grouped-query k and v
  // expanded from 8 heads, an additive mask over the keys; flash decoding counts its chunks of 1024
  // keys at launch (one chunk: no merge), the flash kernel below 512 keys.
  const std::string decode = graph_file("symbolic_decode_step");
  // A softmax written out over rows of symbolic length, and their mean: every pass re-reads the row.
  const std::string keys_softmax = graph_file("symbolic_keys_softmax");
  // Convolutions over a symbolic batch (tests/cli/symbolic_convnet.json): 1x1, 3x3, a shortcut and a
  // residual, a max pool, global average pooling, a depthwise conv with batch norm and ReLU6, a grouped
  // stride-2 conv.
  const std::string convnet = graph_file("symbolic_convnet");
  // BERT's pooler over a symbolic batch (its first tokens gathered: the mma.sync kernel, a variant of
  // 16, 32 or 64 rows below 65) and a padding mask [B, 1, S, S] (16-byte stores at any S).
  const std::string pooler = graph_file("symbolic_pooler");
  return {{"pooler_and_mask", pooler, {{{"B", 2}, {"S", 2}}, {{"B", 128}, {"S", 64}}, {{"B", 17}, {"S", 37}}, {{"B", 41}, {"S", 13}}}},
          {"decode_step", decode, {{{"B", 1}, {"L", 2}}, {{"B", 8}, {"L", 20000}}, {{"B", 3}, {"L", 1025}}, {{"B", 2}, {"L", 4099}}}},
          {"softmax_over_keys_written_out", keys_softmax, {{{"R", 1}, {"L", 1}}, {{"R", 64}, {"L", 40000}}, {{"R", 3}, {"L", 1025}}, {{"R", 7}, {"L", 4099}}}},
          {"symbolic_convnet", convnet, {{{"B", 1}}, {{"B", 64}}, {{"B", 7}}, {{"B", 13}}}},
          {"attention_layer", attention, {{{"B", 1}, {"S", 1}}, {{"B", 16}, {"S", 512}}, {{"B", 3}, {"S", 45}}, {{"B", 13}, {"S", 127}}}},
          {"causal_layer", causal, {{{"B", 1}, {"S", 1}}, {{"B", 16}, {"S", 512}}, {{"B", 3}, {"S", 200}}, {{"B", 2}, {"S", 257}}}},
          {"mlp", mlp, {{{"B", 1}, {"S", 1}}, {{"B", 16}, {"S", 512}}, {{"B", 3}, {"S", 45}}, {{"B", 13}, {"S", 127}}}},
          {"f32_mlp", f32_mlp, {{{"B", 1}, {"S", 1}}, {{"B", 16}, {"S", 512}}, {{"B", 3}, {"S", 45}}, {{"B", 13}, {"S", 127}}}},
          {"layer_norm_written_out", held, {{{"R", 1}}, {{"R", 50000}}, {{"R", 999}}, {{"R", 7919}}}},
          {"residual_rms_norm_gelu", rn, {{{"B", 1}, {"S", 1}}, {{"B", 16}, {"S", 512}}, {{"B", 3}, {"S", 45}}, {{"B", 13}, {"S", 127}}}},
          {"layer_norm_rows", ln, {{{"R", 1}}, {{"R", 20000}}, {{"R", 999}}, {{"R", 7919}}}},
          {"rows_softmax", sm, {{{"N", 1}}, {{"N", 4096}}, {{"N", 333}}, {{"N", 997}}}},
          {"bias_gelu_rows", pw, {{{"B", 1}, {"T", 8}}, {{"B", 64}, {"T", 2048}}, {{"B", 5}, {"T", 72}}, {{"B", 31}, {"T", 8}}}}};
}

TEST(SymbolicGpu, OneCompileRunsEverySizeLikeTheIntegerGraph) {
  REQUIRE_GPU();
  for (const SymbolicCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const Graph g = testing::must_parse(c.json);
    const std::string dir = testing::fresh_cache("symbolic-gpu-" + c.name).string();
    Expected<Executable> exe = Executable::compile(g, {.cache_dir = dir});
    ASSERT_TRUE(exe.ok()) << exe.error().message;
    int run = 0;
    for (const Graph::DimValues& sizes : c.sizes) {
      std::string at;
      for (const auto& [k, v] : sizes) at += fmt::format("{}={} ", k, v);
      SCOPED_TRACE(at);
      Expected<Graph> sized = g.specialize(sizes);
      ASSERT_TRUE(sized.ok()) << sized.error().message;
      const std::vector<HostTensor> inputs = random_inputs(*sized, 7 + static_cast<uint64_t>(run++));
      Expected<std::vector<HostTensor>> got = exe->run_host(inputs);  // outputs poisoned first
      ASSERT_TRUE(got.ok()) << got.error().message;
      Expected<std::vector<HostTensor>> want = run_reference(*sized, inputs);
      ASSERT_TRUE(want.ok()) << want.error().message;
      Expected<Executable> integer = Executable::compile(*sized, {.cache_dir = dir});
      ASSERT_TRUE(integer.ok()) << integer.error().message;
      Expected<std::vector<HostTensor>> integer_got = integer->run_host(inputs);
      ASSERT_TRUE(integer_got.ok()) << integer_got.error().message;
      for (size_t k = 0; k < want->size(); ++k) {
        const ir::TensorId id = ir_of(*sized).outputs[k];
        const double tolerance = runtime::default_tolerance(ir_of(*sized), id);
        ASSERT_EQ((*got)[k].shape, (*want)[k].shape);
        const runtime::Comparison c1 = runtime::compare((*got)[k], (*want)[k]);
        EXPECT_TRUE(c1.passes(tolerance)) << "output " << k << ": rel err " << c1.relative_error << " against the reference";
        const runtime::Comparison c2 = runtime::compare((*got)[k], (*integer_got)[k]);
        EXPECT_TRUE(c2.passes(tolerance)) << "output " << k << ": rel err " << c2.relative_error
                                          << " against the integer graph's kernels";
      }
    }
    // ONE compile: the symbolic kernels are all in the cache, whatever the sizes run.
    Expected<Executable> again = Executable::compile(g, {.cache_dir = dir, .fail_if_compiling = true});
    ASSERT_TRUE(again.ok()) << again.error().message;
    for (const KernelReport& r : again->report()) EXPECT_TRUE(r.cache_hit);
    std::filesystem::remove_all(dir);
  }
}

TEST(SymbolicGpu, ALaunchOutsideTheRangeIsRefusedBeforeItRuns) {
  REQUIRE_GPU();
  const std::vector<SymbolicCase> all = cases();
  const auto softmax = std::find_if(all.begin(), all.end(), [](const SymbolicCase& c) { return c.name == "rows_softmax"; });
  ASSERT_NE(softmax, all.end());
  const Graph g = testing::must_parse(softmax->json);  // N in [1, 4096]; inputs x [N, 1000], scale [1000]
  Expected<Executable> exe = Executable::compile(g);
  ASSERT_TRUE(exe.ok()) << exe.error().message;
  const std::vector<HostTensor> inputs{HostTensor{{4097, 1000}, DType::f32, std::vector<float>(4097 * 1000)},
                                       HostTensor{{1000}, DType::f32, std::vector<float>(1000)}};
  Expected<std::vector<HostTensor>> got = exe->run_host(inputs);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.error().message, ::testing::HasSubstr("N = 4097 is outside its range (N in [1, 4096])"));
}

// A graph whose range at its largest sizes needs more memory than any GPU has (N up to 2^24 rows
// of 8192: 256 GiB the input, as much the intermediate between the kernels) runs and is timed at
// small sizes: inputs and workspace are sized at the bound sizes, not the range's largest (`kiln
// run --dim` and `kiln bench --dim` of the backend's Llama graph, whose range reaches 2 TiB,
// failed allocating them).
TEST(SymbolicGpu, ASmallSizeOfAHugeRangeRunsAndIsTimed) {
  REQUIRE_GPU();
  const Graph g = testing::must_parse(R"({"kiln": 1, "name": "huge_range_softmax_matmul",
 "dims": {"N": {"min": 1, "max": 16777216}},
 "inputs": {"x": {"shape": ["N", 8192], "dtype": "bf16"}, "w": {"shape": [8192, 64], "dtype": "bf16"}},
 "ops": [{"op": "softmax", "in": ["x"], "out": "p", "dtype": "bf16"}, {"op": "matmul", "in": ["p", "w"], "out": "y"}],
 "outputs": ["y"]})");
  Expected<Executable> exe = Executable::compile(g);
  ASSERT_TRUE(exe.ok()) << exe.error().message;
  Expected<Graph> sized = g.specialize({{"N", 3}});
  ASSERT_TRUE(sized.ok()) << sized.error().message;
  const std::vector<HostTensor> inputs = random_inputs(*sized, 11);
  Expected<std::vector<HostTensor>> got = exe->run_host(inputs);
  ASSERT_TRUE(got.ok()) << got.error().message;
  Expected<std::vector<HostTensor>> want = run_reference(*sized, inputs);
  ASSERT_TRUE(want.ok()) << want.error().message;
  const double tolerance = runtime::default_tolerance(ir_of(*sized), ir_of(*sized).outputs[0]);
  EXPECT_TRUE(runtime::compare((*got)[0], (*want)[0]).passes(tolerance));
  // timed at N = 3 on buffers of the integer graph at that size (what `kiln bench --dim` does)
  Expected<Executable> integer = Executable::compile(*sized);
  ASSERT_TRUE(integer.ok()) << integer.error().message;
  Expected<runtime::BenchBuffers> buffers = runtime::BenchBuffers::make(*integer, 1);
  ASSERT_TRUE(buffers.ok()) << buffers.error().message;
  Expected<runtime::Timing> t = runtime::time_runs(*exe, *buffers, 20, {Shape{3, 8192}, Shape{8192, 64}});
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_GT(t->median_ms, 0.0);
}

}  // namespace
}  // namespace kiln
