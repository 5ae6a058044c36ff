// GPU tests: generated kernels against the reference interpreter, with fresh
// random inputs and outputs poisoned before each run. Label `gpu`; without a
// GPU every test skips and says why.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <future>
#include <random>

#include "compiler/graph_internal.h"
#include "kiln/executable.h"
#include "runtime/autotune.h"
#include "runtime/pipeline.h"
#include "kiln/reference.h"
#include "runtime/check.h"
#include "runtime/cuda_driver.h"
#include "runtime/random_inputs.h"
#include "runtime/storage.h"
#include "codegen/kernel_codegen.h"
#include "compiler/planner/planner.h"
#include "tests/unit/random_graph.h"
#include "tests/gpu/check_graphs.h"
#include "tests/gpu/require_gpu.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::check_graphs;
using testing::Outcome;

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
  // KILN_RANDOM_GRAPHS raises the count for a long differential run.
  const uint64_t count = std::getenv("KILN_RANDOM_GRAPHS") ? std::strtoull(std::getenv("KILN_RANDOM_GRAPHS"), nullptr, 10) : 200;
  for (uint64_t seed = 1; seed <= count; ++seed) {
    graphs.push_back(testing::random_graph(seed));
    names.push_back("random graph " + std::to_string(seed));
  }
  // Regressions from a 2000-graph run: a pool kernel wrote its pre-pool
  // outputs only as far as the pool's output reaches (220, 375, 421, 449,
  // 1124, 1664); a normalisation's input held in registers was reused for a
  // transposed view of it (380, 1904).
  for (uint64_t seed : {220, 375, 380, 421, 449, 1124, 1664, 1904})
    if (seed > count) {
      graphs.push_back(testing::random_graph(seed));
      names.push_back("random graph " + std::to_string(seed));
    }
  const Outcome o = check_graphs(graphs, names, 1000);
  RecordProperty("passed", o.passed);
  std::printf("FIGURE random graphs on the GPU: %d run, %d failed\n", o.passed + o.failed, o.failed);
  EXPECT_EQ(o.failed, 0);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Anchors, norms, pools and attention at sizes that are not multiples of
// the tiles, in every dtype and layout.
TEST(Gpu, FamiliesWithOddShapes) {
  REQUIRE_GPU();
  std::vector<std::string> texts;
  for (const char* dt : {"f32", "f16", "bf16"}) {
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"a":{{"shape":[3,129,70],"dtype":"{0}"}},"b":{{"shape":[70,66],"dtype":"{0}"}},"c":{{"shape":[66],"dtype":"{0}"}}}},
      "ops":[{{"op":"matmul","in":["a","b"],"out":"m"}},{{"op":"add","in":["m","c"],"out":"y","dtype":"{0}"}}],"outputs":["y"]}})", dt));
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[2,17,19,24],"dtype":"{0}"}},"w":{{"shape":[40,3,3,6],"dtype":"{0}"}}}},
      "ops":[{{"op":"conv2d","in":["x","w"],"out":"c","stride":[2,2],"padding":[1,1],"dilation":[2,2],"groups":4}},{{"op":"relu","in":["c"],"out":"y"}}],"outputs":["y"]}})", dt));
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[2,24,13,11],"dtype":"{0}"}},"w":{{"shape":[36,24,5,3],"dtype":"{0}"}}}},
      "ops":[{{"op":"conv2d","in":["x","w"],"out":"c","layout":"NCHW","padding":[2,1]}},{{"op":"reduce_sum","in":["c"],"out":"s","axes":[0,2,3]}}],"outputs":["c","s"]}})", dt));
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"q":{{"shape":[2,6,77,80],"dtype":"{0}"}},"k":{{"shape":[2,2,130,80],"dtype":"{0}"}},"v":{{"shape":[2,2,130,80],"dtype":"{0}"}}}},
      "ops":[{{"op":"sdpa","in":["q","k","v"],"out":"o","causal":true}}],"outputs":["o"]}})", dt));
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[7,5003],"dtype":"{0}"}},"w":{{"shape":[5003],"dtype":"{0}"}}}},
      "ops":[{{"op":"layer_norm","in":["x","w"],"out":"n"}},{{"op":"softmax","in":["x"],"out":"s","axis":0}},{{"op":"log_softmax","in":["x"],"out":"l"}}],"outputs":["n","s","l"]}})", dt));
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[3,9,11,30],"dtype":"{0}"}}}},
      "ops":[{{"op":"group_norm","in":["x"],"out":"g","groups":5}},{{"op":"max_pool2d","in":["g"],"out":"p","kernel":[3,3],"stride":[2,2],"padding":[1,1]}},
             {{"op":"avg_pool2d","in":["x"],"out":"a","kernel":[2,3],"count_include_pad":false,"padding":[1,1]}}],"outputs":["p","a"]}})", dt));
    // Rows in the shared memory of a cluster (sm_90) or one block: chunked
    // (a multiple of 8), element by element (odd), not along the last axis.
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[3,100000],"dtype":"{0}"}},"w":{{"shape":[100000],"dtype":"{0}"}}}},
      "ops":[{{"op":"softmax","in":["x"],"out":"s"}},{{"op":"rms_norm","in":["x","w"],"out":"r"}}],"outputs":["s","r"]}})", dt));
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[5,20001],"dtype":"{0}"}}}},
      "ops":[{{"op":"layer_norm","in":["x"],"out":"n"}},{{"op":"exp","in":["n"],"out":"y"}}],"outputs":["y"]}})", dt));
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[2,30000,3],"dtype":"{0}"}}}},
      "ops":[{{"op":"log_softmax","in":["x"],"out":"l","axis":1}}],"outputs":["l"]}})", dt));
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[2,40,40,96],"dtype":"{0}"}},"b":{{"shape":[96],"dtype":"{0}"}}}},
      "ops":[{{"op":"add","in":["x","b"],"out":"h"}},{{"op":"group_norm","in":["h"],"out":"g","groups":3}}],"outputs":["h","g"]}})", dt));
    // A pool of 2x2 windows in a conv's epilogue (rows window by window):
    // grouped, bias + relu + max; the result also written, average.
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[2,10,12,24],"dtype":"{0}"}},"w":{{"shape":[20,3,3,12],"dtype":"{0}"}},"b":{{"shape":[20],"dtype":"{0}"}}}},
      "ops":[{{"op":"conv2d","in":["x","w"],"out":"c","padding":[1,1],"groups":2}},{{"op":"add","in":["c","b"],"out":"h"}},{{"op":"relu","in":["h"],"out":"y"}},
             {{"op":"max_pool2d","in":["y"],"out":"p","kernel":[2,2]}}],"outputs":["p"]}})", dt));
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[3,6,18,16],"dtype":"{0}"}},"w":{{"shape":[13,1,3,16],"dtype":"{0}"}}}},
      "ops":[{{"op":"conv2d","in":["x","w"],"out":"c","padding":[0,1]}},{{"op":"tanh","in":["c"],"out":"y"}},
             {{"op":"avg_pool2d","in":["y"],"out":"p","kernel":[2,2]}}],"outputs":["y","p"]}})", dt));
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[33,65,7],"dtype":"{0}"}}}},
      "ops":[{{"op":"reduce_max","in":["x"],"out":"a","axes":[0,2]}},{{"op":"reduce_mean","in":["x"],"out":"b","axes":[1],"keepdims":true}},
             {{"op":"sub","in":["x","b"],"out":"d"}},{{"op":"reduce_min","in":["d"],"out":"c"}}],"outputs":["a","c"]}})", dt));
  }
  // Tensor-core paths: tf32 and bf16 precision on f32 operands, a weight
  // read transposed in place, bf16 x f16 (tf32 MMA), 16-byte implicit
  // im2col, 128x128 tiles, batch broadcasting in f16.
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[2,100,72],"dtype":"f32"},"b":{"shape":[72,136],"dtype":"f32"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m","precision":"tf32"},{"op":"relu","in":["m"],"out":"y"}],"outputs":["y"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[50,40],"dtype":"f32"},"b":{"shape":[40,30],"dtype":"f32"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m","precision":"bf16"}],"outputs":["m"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[130,72],"dtype":"bf16"},"w":{"shape":[96,72],"dtype":"bf16"},"bias":{"shape":[96],"dtype":"f32"}},
    "ops":[{"op":"transpose","in":["w"],"out":"wt","perm":[1,0]},{"op":"matmul","in":["x","wt"],"out":"m"},
           {"op":"add","in":["m","bias"],"out":"y","dtype":"bf16"}],"outputs":["y"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[33,48],"dtype":"bf16"},"b":{"shape":[48,20],"dtype":"f16"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m"}],"outputs":["m"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[2,15,15,32],"dtype":"bf16"},"w":{"shape":[48,3,3,32],"dtype":"bf16"},"b":{"shape":[48],"dtype":"bf16"}},
    "ops":[{"op":"conv2d","in":["x","w"],"out":"c","padding":[1,1]},{"op":"add","in":["c","b"],"out":"y"},
           {"op":"reduce_sum","in":["y"],"out":"s","axes":[0,1,2]}],"outputs":["y","s"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[1024,512],"dtype":"bf16"},"b":{"shape":[512,1536],"dtype":"bf16"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m"},{"op":"gelu","in":["m"],"out":"y"}],"outputs":["y"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[4,1,40,64],"dtype":"f16"},"b":{"shape":[3,64,24],"dtype":"f16"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m"}],"outputs":["m"]})");
  // Few rows (decode): K split across blocks, the partials summed by the
  // last block of each tile, K not a multiple of the slice, batches, tf32;
  // and with an epilogue reduction (no split).
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[5,3000],"dtype":"bf16"},"b":{"shape":[3000,1000],"dtype":"bf16"},"c":{"shape":[1000],"dtype":"f32"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m"},{"op":"add","in":["m","c"],"out":"s"},{"op":"gelu","in":["s"],"out":"y","dtype":"bf16"}],"outputs":["y"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[3,20,1111],"dtype":"f16"},"b":{"shape":[1111,200],"dtype":"f16"},"r":{"shape":[3,20,200],"dtype":"f16"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m"},{"op":"add","in":["m","r"],"out":"y"}],"outputs":["y","m"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[16,2048],"dtype":"f32"},"b":{"shape":[2048,72],"dtype":"f32"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"y","precision":"tf32"}],"outputs":["y"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[16,2048],"dtype":"bf16"},"b":{"shape":[2048,300],"dtype":"bf16"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m"},{"op":"reduce_sum","in":["m"],"out":"s","axes":[0]}],"outputs":["m","s"]})");
  // Hopper's TMA + wgmma kernel (sm_90; >= 132 tiles of 128 x 128): B
  // n-contiguous and k-contiguous (a transpose read in place), K not a
  // multiple of the 64-wide slice, M and N not multiples of the tile, 3-d
  // tensor maps (batched operands), a broadcast 2-d B, an epilogue
  // reduction finished by the last of the persistent blocks.
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[1100,200],"dtype":"bf16"},"b":{"shape":[200,2104],"dtype":"bf16"},"c":{"shape":[2104],"dtype":"bf16"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m"},{"op":"add","in":["m","c"],"out":"s"},{"op":"gelu","in":["s"],"out":"y","dtype":"bf16"}],"outputs":["y"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[1500,136],"dtype":"f16"},"w":{"shape":[1800,136],"dtype":"f16"},"r":{"shape":[1500,1800],"dtype":"f16"}},
    "ops":[{"op":"transpose","in":["w"],"out":"wt","perm":[1,0]},{"op":"matmul","in":["x","wt"],"out":"m"},
           {"op":"add","in":["m","r"],"out":"s"},{"op":"relu","in":["s"],"out":"y","dtype":"f16"}],"outputs":["y"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[12,300,96],"dtype":"bf16"},"b":{"shape":[12,96,520],"dtype":"bf16"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m"},{"op":"mul","in":["m",0.125],"out":"y"}],"outputs":["y"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[12,300,96],"dtype":"bf16"},"b":{"shape":[96,520],"dtype":"bf16"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m"},{"op":"reduce_sum","in":["m"],"out":"s","axes":[0,1]}],"outputs":["m","s"]})");
  // An NCHW conv: its last coordinate is not the GEMM column, so neither
  // column-pair stores nor column reductions in registers apply (a sum
  // keeping only W was once combined across channels).
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[2,16,10,12],"dtype":"bf16"},"w":{"shape":[24,16,3,3],"dtype":"bf16"}},
    "ops":[{"op":"conv2d","in":["x","w"],"out":"c","layout":"NCHW","padding":[1,1]},{"op":"reduce_sum","in":["c"],"out":"s","axes":[0,1,2]}],"outputs":["c","s"]})");
  // Hopper conv (implicit GEMM on the wgmma kernel, A gathered with
  // cp.async): slices that cross filter taps (C = 40, K = 360), N under the
  // tile (BN 128, then 64 without clusters), stride 2 with dilation and
  // uneven padding, a 1x1 conv, M not a multiple of 128, bias/relu and a
  // per-channel epilogue reduction.
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[2,75,117,40],"dtype":"bf16"},"w":{"shape":[72,3,3,40],"dtype":"bf16"},"b":{"shape":[72],"dtype":"f32"}},
    "ops":[{"op":"conv2d","in":["x","w"],"out":"c","padding":[1,1]},{"op":"add","in":["c","b"],"out":"s"},{"op":"relu","in":["s"],"out":"y","dtype":"bf16"}],"outputs":["y"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[6,130,97,16],"dtype":"f16"},"w":{"shape":[40,3,3,16],"dtype":"f16"}},
    "ops":[{"op":"conv2d","in":["x","w"],"out":"c","stride":[2,2],"padding":[2,1],"dilation":[2,1]},
           {"op":"reduce_sum","in":["c"],"out":"s","axes":[0,1,2]}],"outputs":["c","s"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[1,130,130,32],"dtype":"bf16"},"w":{"shape":[64,1,1,32],"dtype":"bf16"}},
    "ops":[{"op":"conv2d","in":["x","w"],"out":"y"}],"outputs":["y"]})");
  // ... batch_norm's column values computed once per tile column (two columns of tiles, N not a
  // multiple of the tile).
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[8,40,41,64],"dtype":"bf16"},"w":{"shape":[200,3,3,64],"dtype":"bf16"},
    "mean":{"shape":[200],"dtype":"f32"},"var":{"shape":[200],"dtype":"f32"},"g":{"shape":[200],"dtype":"f32"},"b":{"shape":[200],"dtype":"f32"}},
    "ops":[{"op":"conv2d","in":["x","w"],"out":"c","padding":[1,1]},{"op":"abs","in":["var"],"out":"v"},
           {"op":"batch_norm","in":["c","mean","v","g","b"],"out":"n"},{"op":"relu","in":["n"],"out":"y","dtype":"bf16"}],"outputs":["y"]})");
  // ... pooling 2x2 windows in its epilogue: M not a multiple of the tile, the result also written.
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[8,54,54,64],"dtype":"bf16"},"w":{"shape":[128,3,3,64],"dtype":"bf16"},"b":{"shape":[128],"dtype":"bf16"}},
    "ops":[{"op":"conv2d","in":["x","w"],"out":"c","padding":[1,1]},{"op":"add","in":["c","b"],"out":"h"},{"op":"relu","in":["h"],"out":"y","dtype":"bf16"},
           {"op":"max_pool2d","in":["y"],"out":"p","kernel":[2,2]}],"outputs":["p","y"]})");
  // Residuals through the staging buffers (the first by bulk tensor loads,
  // the second from memory): a Hopper conv, and batched (3-d maps) with M
  // and N not multiples of the tile.
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[4,70,70,64],"dtype":"bf16"},"w":{"shape":[128,3,3,64],"dtype":"bf16"},
    "r":{"shape":[4,70,70,128],"dtype":"bf16"},"q":{"shape":[4,70,70,128],"dtype":"bf16"}},
    "ops":[{"op":"conv2d","in":["x","w"],"out":"c","padding":[1,1]},{"op":"add","in":["c","r"],"out":"s"},{"op":"sub","in":["s","q"],"out":"t"},
           {"op":"relu","in":["t"],"out":"y","dtype":"bf16"}],"outputs":["y"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"a":{"shape":[4,600,128],"dtype":"f16"},"b":{"shape":[4,128,1000],"dtype":"f16"},"r":{"shape":[4,600,1000],"dtype":"f16"}},
    "ops":[{"op":"matmul","in":["a","b"],"out":"m"},{"op":"mul","in":["r",0.5],"out":"h"},{"op":"add","in":["m","h"],"out":"y","dtype":"f16"}],"outputs":["y"]})");
  // Flash attention: head dims 64/128/256, additive and bool masks, more
  // queries than keys under a causal mask (rows that see no key give
  // zeros), q read through a transpose.
  texts.push_back(R"({"kiln":1,"inputs":{"q":{"shape":[2,3,150,128],"dtype":"bf16"},"k":{"shape":[2,3,97,128],"dtype":"bf16"},"v":{"shape":[2,3,97,128],"dtype":"bf16"},"m":{"shape":[1,1,150,97],"dtype":"f32"}},
    "ops":[{"op":"sdpa","in":["q","k","v","m"],"out":"o","scale":0.1}],"outputs":["o"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"q":{"shape":[1,4,33,256],"dtype":"f16"},"k":{"shape":[1,2,70,256],"dtype":"f16"},"v":{"shape":[1,2,70,256],"dtype":"f16"},"m":{"shape":[1,4,1,70],"dtype":"bool"}},
    "ops":[{"op":"sdpa","in":["q","k","v","m"],"out":"o"}],"outputs":["o"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"q":{"shape":[2,2,100,64],"dtype":"bf16"},"k":{"shape":[2,2,50,64],"dtype":"bf16"},"v":{"shape":[2,2,50,64],"dtype":"bf16"}},
    "ops":[{"op":"sdpa","in":["q","k","v"],"out":"o","causal":true}],"outputs":["o"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[2,90,4,64],"dtype":"bf16"},"k":{"shape":[2,4,200,64],"dtype":"bf16"},"v":{"shape":[2,4,200,64],"dtype":"bf16"}},
    "ops":[{"op":"transpose","in":["x"],"out":"q","perm":[0,2,1,3]},{"op":"sdpa","in":["q","k","v"],"out":"o","causal":true},
           {"op":"relu","in":["o"],"out":"y"}],"outputs":["y"]})");
  // Split reductions: few kept elements over long axes, with a
  // post-reduction op and an elementwise sibling output.
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[3,70001],"dtype":"bf16"},"y":{"shape":[200000],"dtype":"f32"}},
    "ops":[{"op":"reduce_sum","in":["x"],"out":"s","axes":[1]},{"op":"reduce_max","in":["x"],"out":"m","axes":[1]},
           {"op":"sub","in":["s","m"],"out":"d","dtype":"bf16"},{"op":"reduce_mean","in":["y"],"out":"ym","axes":[0]},
           {"op":"exp","in":["y"],"out":"ye"}],"outputs":["d","ym","ye"]})");
  // Column reductions (outer axes): vectorised and not, split and not,
  // with post-reduction ops and elementwise siblings.
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[5,300,72],"dtype":"bf16"}},
    "ops":[{"op":"reduce_mean","in":["x"],"out":"m","axes":[1],"keepdims":true},{"op":"sub","in":["m",1.5],"out":"d"},
           {"op":"reduce_max","in":["x"],"out":"mx","axes":[1]}],"outputs":["d","mx"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[4,1000,40],"dtype":"f32"}},
    "ops":[{"op":"reduce_min","in":["x"],"out":"m","axes":[1]},{"op":"exp","in":["x"],"out":"e"}],"outputs":["m","e"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[3000,33],"dtype":"f16"}},
    "ops":[{"op":"reduce_sum","in":["x"],"out":"s","axes":[0]}],"outputs":["s"]})");
  texts.push_back(R"({"kiln":1,"inputs":{"x":{"shape":[64,64,48],"dtype":"f16"},"y":{"shape":[48],"dtype":"f32"}},
    "ops":[{"op":"mul","in":["x","y"],"out":"p"},{"op":"reduce_sum","in":["p"],"out":"s","axes":[0,1]},
           {"op":"square","in":["p"],"out":"q"},{"op":"reduce_sum","in":["q"],"out":"ss","axes":[0,1]}],"outputs":["s","ss","p"]})");
  // Rank 8, reduced over single, alternate and all axes; a 1000-op chain the
  // planner cuts into kernels of at most 256 ops.
  for (const char* axes : {"[0]", "[3]", "[5]", "[7]", "[0,2,4,6]", "[0,1,2,3,4,5,6,7]"})
    texts.push_back(fmt::format(R"({{"kiln":1,"inputs":{{"x":{{"shape":[2,1,3,1,2,5,2,3],"dtype":"bf16"}}}},
      "ops":[{{"op":"reduce_max","in":["x"],"out":"m","axes":{0},"keepdims":true}},{{"op":"sub","in":["x","m"],"out":"d"}},
             {{"op":"reduce_sum","in":["d"],"out":"s","axes":{0}}}],"outputs":["s","d"]}})", axes));
  {
    std::string chain = R"({"kiln":1,"inputs":{"x":{"shape":[1000],"dtype":"f32"}},"ops":[)";
    for (int i = 0; i < 1000; ++i)
      chain += fmt::format(R"({}{{"op":"{}","in":["{}",{}],"out":"t{}"}})", i ? "," : "", i % 2 ? "mul" : "add",
                           i ? fmt::format("t{}", i - 1) : "x", i % 2 ? "0.999" : "0.001", i);
    texts.push_back(chain + R"(],"outputs":["t999"]})");
  }
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  for (size_t i = 0; i < texts.size(); ++i) {
    graphs.push_back(testing::must_parse(texts[i]));
    names.push_back("odd shapes " + std::to_string(i));
  }
  const Outcome o = check_graphs(graphs, names, 500);
  EXPECT_EQ(o.failed, 0);
}

// The figures issue 4 asks for: cold compile time per kernel kind, time to
// load a kernel from the disk cache, host time of a cache-hit run.
TEST(Gpu, CompileAndLaunchFigures) {
  REQUIRE_GPU();
  const fs::path dir = kiln::testing::fresh_cache("figures");
  std::map<std::string, std::vector<double>> cold;
  for (const auto& e : fs::recursive_directory_iterator(KILN_SOURCE_DIR "/examples"))
    if (e.path().extension() == ".json") {
      Graph g = Graph::load(e.path().string()).value();
      Expected<Executable> exe = Executable::compile(g, {.cache_dir = dir.string()});
      ASSERT_TRUE(exe.ok());
      for (const KernelReport& k : exe->report())
        if (!k.cache_hit) cold[k.kind].push_back(k.milliseconds);
    }
  for (auto& [kind, ms] : cold) {
    std::sort(ms.begin(), ms.end());
    std::printf("FIGURE cold compile %-10s median %.1f ms over %zu kernels (min %.1f, max %.1f)\n", kind.c_str(),
                ms[ms.size() / 2], ms.size(), ms.front(), ms.back());
  }
  // Disk load: a fresh process (fork) loading one kernel from the cache.
  Graph g = Graph::load(KILN_SOURCE_DIR "/examples/pointwise/scale_shift_gelu.json").value();
  std::fflush(stdout);  // or the child prints the parent's buffered lines again
  const pid_t pid = fork();
  if (pid == 0) {
    Expected<Executable> exe = Executable::compile(g, {.cache_dir = dir.string(), .fail_if_compiling = true});
    if (exe) std::printf("FIGURE load from disk cache (recipe + 1 cubin, fresh process): %.3f ms\n", exe->report()[0].milliseconds);
    std::fflush(stdout);
    _exit(exe ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // Host time of a cache-hit run: compile (memory hit) + launch, until launch returns.
  Expected<Executable> warm = Executable::compile(g, {.cache_dir = dir.string()});
  ASSERT_TRUE(warm.ok());
  std::vector<DeviceBinding> bindings;
  std::vector<CUdeviceptr> buffers;
  const runtime::Driver& cu = *runtime::driver().value();
  std::vector<TensorDesc> bound = g.inputs();
  for (const TensorDesc& d : g.outputs()) bound.push_back(d);
  for (const TensorDesc& d : bound) {
    CUdeviceptr p;
    const size_t bytes = warm->binding_bytes(d.name).value();
    cu.cuMemAlloc(&p, bytes);
    buffers.push_back(p);
    bindings.push_back({d.name, reinterpret_cast<void*>(p), bytes});
  }
  ASSERT_TRUE(warm->launch(bindings).ok());  // first launch loads the module
  cu.cuCtxSynchronize();
  std::vector<double> us;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Expected<Executable> exe = Executable::compile(g, {.cache_dir = dir.string()});
    Status s = warm->launch(bindings);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    ASSERT_TRUE(exe.ok() && s.ok());
  }
  cu.cuCtxSynchronize();
  std::sort(us.begin(), us.end());
  std::printf("FIGURE cache-hit compile (memory) + launch of a one-kernel graph: median %.1f us, p90 %.1f us\n",
              us[us.size() / 2], us[us.size() * 9 / 10]);
  std::vector<double> launch_only;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(warm->launch(bindings).ok());
    launch_only.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  cu.cuCtxSynchronize();
  std::sort(launch_only.begin(), launch_only.end());
  std::printf("FIGURE launch only (bound executable): median %.1f us\n", launch_only[launch_only.size() / 2]);
  for (CUdeviceptr p : buffers) cu.cuMemFree(p);
  fs::remove_all(dir);
}

// Misuse through the C++ API is an Error naming the binding, and nothing runs.
TEST(Gpu, LaunchMisuseIsAnErrorAndNoLaunch) {
  REQUIRE_GPU();
  const Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [1000], "dtype": "f32"}},
    "ops": [{"op": "cos", "in": ["x"], "out": "y"}], "outputs": ["y"]})");
  Expected<Executable> exe = Executable::compile(g, {.use_cache = false});
  ASSERT_TRUE(exe.ok());
  const runtime::Driver& cu = *runtime::driver().value();
  CUdeviceptr x, y;
  ASSERT_EQ(cu.cuMemAlloc(&x, 4000), CUDA_SUCCESS);
  ASSERT_EQ(cu.cuMemAlloc(&y, 4000), CUDA_SUCCESS);
  ASSERT_EQ(cu.cuMemsetD32Async(y, 0x7fc00001u, 1000, nullptr), CUDA_SUCCESS);  // a NaN pattern: a launch would overwrite it
  auto expect_error = [&](const std::vector<DeviceBinding>& b, void* stream, const std::string& says) {
    const Status s = exe->launch(b, stream);
    ASSERT_FALSE(s.ok()) << says;
    EXPECT_NE(s.error().message.find(says), std::string::npos) << s.error().message;
  };
  void* px = reinterpret_cast<void*>(x);
  void* py = reinterpret_cast<void*>(y);
  expect_error({{"x", px, 4000}}, nullptr, "output 'y' is not bound");
  expect_error({{"y", py, 4000}}, nullptr, "input 'x' is not bound");
  expect_error({{"x", px, 3996}, {"y", py, 4000}}, nullptr, "binding 'x': 3996 bytes given, 4000 needed");
  expect_error({{"x", nullptr, 4000}, {"y", py, 4000}}, nullptr, "binding 'x': null pointer");
  expect_error({{"x", static_cast<char*>(px) + 2, 4000}, {"y", py, 4000}}, nullptr,
               "binding 'x': address 0x");  // (f32 two bytes past an aligned address)
  expect_error({{"x", px, 4000}, {"y", static_cast<char*>(py) + 1, 4000}}, nullptr, "is not a multiple of 4 bytes");
  expect_error({{"x", px, 4000}, {"y", py, 4000}, {"z", px, 4}}, nullptr, "'z' is not an input or output");
  cu.cuCtxSynchronize();
  uint32_t first = 0;
  cu.cuMemcpyDtoH(&first, y, 4);
  EXPECT_EQ(first, 0x7fc00001u);  // nothing ran
  EXPECT_TRUE(exe->launch({{"x", px, 4000}, {"y", py, 4000}}).ok());
  cu.cuMemFree(x);
  cu.cuMemFree(y);
}

// Pointers a user binds need not be 16-byte aligned: every tensor bound one
// element past an aligned address takes the kernels' element-by-element
// path (vector loads and stores only where every pointer is aligned) and
// still matches the reference; so do the inputs alone (an aligned result:
// the Hopper kernel stores it by the copy engine and its threads fill the
// staging buffers with the residual).
TEST(Gpu, UnalignedBindingsMatchTheReference) {
  REQUIRE_GPU();
  const runtime::Driver& cu = *runtime::driver().value();
  const char* graphs[] = {
      R"({"kiln": 1, "inputs": {"x": {"shape": [64, 1024], "dtype": "bf16"}, "w": {"shape": [1024], "dtype": "bf16"},
          "b": {"shape": [1024], "dtype": "bf16"}}, "ops": [{"op": "layer_norm", "in": ["x", "w", "b"], "out": "y"}],
          "outputs": ["y"]})",
      R"({"kiln": 1, "inputs": {"x": {"shape": [4, 2, 64, 256], "dtype": "f16"}, "m": {"shape": [1, 1, 64, 256], "dtype": "f16"}},
          "ops": [{"op": "add", "in": ["x", "m"], "out": "s"}, {"op": "softmax", "in": ["s"], "out": "y", "axis": -1}],
          "outputs": ["y"]})",
      R"({"kiln": 1, "inputs": {"x": {"shape": [96, 2048], "dtype": "f32"}},
          "ops": [{"op": "reduce_sum", "in": ["x"], "out": "y", "axes": [1]}], "outputs": ["y"]})",
      R"({"kiln": 1, "inputs": {"x": {"shape": [8, 7, 7, 64], "dtype": "bf16"}},
          "ops": [{"op": "group_norm", "in": ["x"], "out": "g", "groups": 8, "axis": 3}, {"op": "silu", "in": ["g"], "out": "y"}],
          "outputs": ["y"]})",
      R"({"kiln": 1, "inputs": {"x": {"shape": [1000, 64], "dtype": "bf16"}, "s": {"shape": [64], "dtype": "bf16"}},
          "ops": [{"op": "mul", "in": ["x", "s"], "out": "t"}, {"op": "gelu", "in": ["t"], "out": "y"}], "outputs": ["y"]})",
      // Hopper conv: the input gathered element by element, no tensor map for the weights.
      R"({"kiln": 1, "inputs": {"x": {"shape": [2, 75, 117, 40], "dtype": "bf16"}, "w": {"shape": [72, 3, 3, 40], "dtype": "bf16"}},
          "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "y", "padding": [1, 1]}], "outputs": ["y"]})",
      // ... pooling its 2x2 windows in the epilogue.
      R"({"kiln": 1, "inputs": {"x": {"shape": [2, 76, 118, 40], "dtype": "bf16"}, "w": {"shape": [72, 3, 3, 40], "dtype": "bf16"}},
          "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "c", "padding": [1, 1]},
                  {"op": "max_pool2d", "in": ["c"], "out": "y", "kernel": [2, 2]}], "outputs": ["y"]})",
      // Hopper: no tensor map for either operand; the producer loads elements.
      R"({"kiln": 1, "inputs": {"a": {"shape": [1100, 200], "dtype": "bf16"}, "b": {"shape": [200, 2104], "dtype": "bf16"}},
          "ops": [{"op": "matmul", "in": ["a", "b"], "out": "y"}], "outputs": ["y"]})",
      // Hopper: a residual read from memory instead of through the staging buffers.
      R"({"kiln": 1, "inputs": {"a": {"shape": [1100, 200], "dtype": "bf16"}, "b": {"shape": [200, 2104], "dtype": "bf16"},
          "r": {"shape": [1100, 2104], "dtype": "bf16"}},
          "ops": [{"op": "matmul", "in": ["a", "b"], "out": "m"}, {"op": "add", "in": ["m", "r"], "out": "y", "dtype": "bf16"}],
          "outputs": ["y"]})",
  };
  for (const char* text : graphs)
    for (const bool skew_output : {true, false}) {
      const Graph g = testing::must_parse(text);
      const ir::Graph& ir = ir_of(g);
      Expected<Executable> exe = Executable::compile(g, {.use_cache = false});
      ASSERT_TRUE(exe.ok()) << exe.error().message;
      const std::vector<HostTensor> inputs = random_inputs(g, 7);
      std::vector<CUdeviceptr> allocations;
      std::vector<DeviceBinding> bindings;
      auto bind = [&](const ir::Tensor& t, const std::string& bytes) {
        const bool output = &t == &ir.tensor(ir.outputs[0]);
        const size_t element = static_cast<size_t>(byte_size(codegen::storage_dtype(t)));
        const size_t skew = output && !skew_output ? 0 : element;
        CUdeviceptr p;
        ASSERT_EQ(cu.cuMemAlloc(&p, bytes.size() + 16), CUDA_SUCCESS);
        allocations.push_back(p);
        ASSERT_EQ(cu.cuMemcpyHtoD(p + skew, bytes.data(), bytes.size()), CUDA_SUCCESS);
        bindings.push_back({t.name, reinterpret_cast<void*>(p + skew), bytes.size()});
      };
      for (size_t i = 0; i < inputs.size(); ++i)
        bind(ir.tensor(ir.inputs[i]), runtime::to_storage(inputs[i], ir.tensor(ir.inputs[i]).strides));
      const ir::Tensor& y = ir.tensor(ir.outputs[0]);
      const DType storage = codegen::storage_dtype(y);
      const std::string poison(static_cast<size_t>(element_count(y.shape) * byte_size(storage)), '\xff');
      bind(y, poison);
      ASSERT_TRUE(exe->launch(bindings).ok());
      ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
      std::string bytes(poison.size(), '\0');
      ASSERT_EQ(cu.cuMemcpyDtoH(bytes.data(), reinterpret_cast<CUdeviceptr>(bindings.back().pointer), bytes.size()),
                CUDA_SUCCESS);
      const HostTensor got{y.shape, y.dtype, runtime::from_storage(bytes, storage, element_count(y.shape))};
      Expected<std::vector<HostTensor>> want = run_reference(g, inputs);
      ASSERT_TRUE(want.ok());
      const runtime::Comparison c = runtime::compare(got, want->front());
      EXPECT_TRUE(c.passes(runtime::default_tolerance(ir, ir.outputs[0])))
          << text << (skew_output ? "" : "\n(the output aligned)") << "\nrel err " << c.relative_error;
      for (CUdeviceptr p : allocations) cu.cuMemFree(p);
    }
}

// Every tile choice the generators offer the autotuner gives the right
// answer: the Hopper matmul (M and N not tile multiples, bias and a residual
// through the staging buffers), the Hopper conv (gathered A, a residual),
// and the few-row matmul's K splits.
TEST(Gpu, EveryTuningChoiceMatchesTheReference) {
  REQUIRE_GPU();
  const char* graphs[] = {
      R"({"kiln": 1, "inputs": {"a": {"shape": [1100, 264], "dtype": "bf16"}, "b": {"shape": [264, 2056], "dtype": "bf16"},
          "bias": {"shape": [2056], "dtype": "bf16"}, "r": {"shape": [1100, 2056], "dtype": "bf16"}},
          "ops": [{"op": "matmul", "in": ["a", "b"], "out": "m"}, {"op": "add", "in": ["m", "bias"], "out": "h"},
                  {"op": "add", "in": ["h", "r"], "out": "s"}, {"op": "relu", "in": ["s"], "out": "y", "dtype": "bf16"}],
          "outputs": ["y"]})",
      R"({"kiln": 1, "inputs": {"x": {"shape": [16, 38, 41, 64], "dtype": "f16"}, "w": {"shape": [128, 3, 3, 64], "dtype": "f16"},
          "r": {"shape": [16, 38, 41, 128], "dtype": "f16"}},
          "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "c", "padding": [1, 1]}, {"op": "add", "in": ["c", "r"], "out": "y", "dtype": "f16"}],
          "outputs": ["y"]})",
      R"({"kiln": 1, "inputs": {"x": {"shape": [16, 38, 40, 64], "dtype": "bf16"}, "w": {"shape": [128, 3, 3, 64], "dtype": "bf16"}},
          "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "c", "padding": [1, 1]}, {"op": "relu", "in": ["c"], "out": "r"},
                  {"op": "avg_pool2d", "in": ["r"], "out": "y", "kernel": [2, 2]}], "outputs": ["y"]})",
      // B stored [n][k] (a linear layer's weight), N not a multiple of 8 or of any tile width.
      R"({"kiln": 1, "inputs": {"a": {"shape": [1100, 264], "dtype": "bf16"}, "w": {"shape": [776, 264], "dtype": "bf16"},
          "r": {"shape": [1100, 776], "dtype": "bf16"}},
          "ops": [{"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]}, {"op": "matmul", "in": ["a", "wt"], "out": "m"},
                  {"op": "add", "in": ["m", "r"], "out": "y", "dtype": "bf16"}], "outputs": ["y"]})",
      R"({"kiln": 1, "inputs": {"a": {"shape": [9, 4100], "dtype": "bf16"}, "b": {"shape": [4100, 1000], "dtype": "bf16"},
          "bias": {"shape": [1000], "dtype": "f32"}},
          "ops": [{"op": "matmul", "in": ["a", "b"], "out": "m"}, {"op": "add", "in": ["m", "bias"], "out": "y"}], "outputs": ["y"]})",
  };
  int checked = 0;
  for (const char* text : graphs) {
    const Graph g = testing::must_parse(text);
    const ir::Plan plan = ir::plan_fusion(ir_of(g));
    const codegen::GeneratedProgram heuristic = codegen::generate_program(ir_of(g), plan, 90);
    ASSERT_EQ(heuristic.kernels.size(), 1u);
    const std::vector<codegen::Tuning>& space = heuristic.kernels[0].tuning_space;
    EXPECT_GE(space.size(), 6u) << text;
    const std::vector<HostTensor> inputs = random_inputs(g, 21);
    Expected<std::vector<HostTensor>> want = run_reference(g, inputs);
    ASSERT_TRUE(want.ok()) << want.error().message;
    std::vector<std::future<Expected<Executable>>> compiled;
    for (const codegen::Tuning& t : space)
      compiled.push_back(std::async(std::launch::async, [&g, t] {
        const codegen::ProgramTuning tuning{{0, t}};
        return runtime::compile_executable(g, {.use_cache = false}, &tuning);
      }));
    for (size_t i = 0; i < space.size(); ++i) {
      Expected<Executable> exe = compiled[i].get();
      ASSERT_TRUE(exe.ok()) << exe.error().message;
      EXPECT_EQ(exe->report()[0].tuning, space[i].to_string());
      Expected<std::vector<HostTensor>> got = exe->run_host(inputs);
      ASSERT_TRUE(got.ok()) << got.error().message;
      const ir::TensorId y = ir_of(g).outputs[0];
      const runtime::Comparison c = runtime::compare(got->front(), want->front());
      EXPECT_TRUE(c.passes(runtime::default_tolerance(ir_of(g), y)))
          << space[i].to_string() << ": rel err " << c.relative_error << "\n" << text;
      ++checked;
    }
  }
  RecordProperty("choices_checked", checked);
  std::printf("checked %d tile choices against the reference\n", checked);
}

// `kiln compile --autotune`: every candidate timed, the winner recorded and
// found by a later compile in a new process, which runs correctly with it.
TEST(Gpu, AutotuneRecordsTheWinnerForLaterCompiles) {
  REQUIRE_GPU();
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-autotune-{}", ::getpid());
  fs::remove_all(dir);
  const Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"a": {"shape": [4096, 512], "dtype": "bf16"},
    "b": {"shape": [512, 2048], "dtype": "bf16"}, "bias": {"shape": [2048], "dtype": "bf16"}},
    "ops": [{"op": "matmul", "in": ["a", "b"], "out": "m"}, {"op": "add", "in": ["m", "bias"], "out": "h"},
            {"op": "gelu", "in": ["h"], "out": "y", "dtype": "bf16"}], "outputs": ["y"]})");
  Expected<Executable> tuned = Executable::compile(g, {.cache_dir = dir.string(), .autotune = true});
  ASSERT_TRUE(tuned.ok()) << tuned.error().message;
  const KernelReport& r = tuned->report().at(0);
  EXPECT_TRUE(r.tuned);
  EXPECT_GE(r.trials.size(), 6u);
  int chosen = 0;
  for (const TuningTrial& t : r.trials) {
    EXPECT_GT(t.milliseconds, 0.0);
    chosen += t.tuning == r.tuning;
    std::printf("autotune trial %-36s %.4f ms%s\n", t.tuning.c_str(), t.milliseconds, t.tuning == r.tuning ? "  <- chosen" : "");
  }
  EXPECT_EQ(chosen, 1);
  EXPECT_TRUE(fs::exists(dir / "tuning"));

  // As a new process would: the record read from disk, every kernel cached.
  runtime::forget_recorded_tunings();
  Expected<Executable> again = Executable::compile(g, {.cache_dir = dir.string(), .fail_if_compiling = true});
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->report()[0].tuning, r.tuning);
  EXPECT_TRUE(again->report()[0].tuned);
  EXPECT_TRUE(again->report()[0].trials.empty());
  const std::vector<HostTensor> inputs = random_inputs(g, 5);
  Expected<std::vector<HostTensor>> got = again->run_host(inputs);
  Expected<std::vector<HostTensor>> want = run_reference(g, inputs);
  ASSERT_TRUE(got.ok() && want.ok());
  const runtime::Comparison c = runtime::compare(got->front(), want->front());
  EXPECT_TRUE(c.passes(runtime::default_tolerance(ir_of(g), ir_of(g).outputs[0]))) << "rel err " << c.relative_error;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
