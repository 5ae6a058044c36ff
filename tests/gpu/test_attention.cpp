// sdpa on the GPU against the reference interpreter: every query and key
// length of the attention issue's set, head dimensions 64 to 256 (96 and
// 80 padded), both 16-bit types, causal or not, masks of every broadcast
// (bool and additive), grouped-query ratios 1, 4 and 8, logits of +-50,
// rows that see no key (exactly 0), B x H past 65535, operands whose
// pointers are not 16-byte aligned (the Hopper kernel's element loads),
// and bitwise-identical reruns. Label `gpu`; skips without a GPU.
#include <cstring>
#include <future>

#include <fmt/format.h>

#include "compiler/graph_internal.h"
#include "compiler/planner/planner.h"
#include "kiln/kiln.h"
#include "runtime/check.h"
#include "runtime/cuda_driver.h"
#include "runtime/pipeline.h"
#include "runtime/random_inputs.h"
#include "runtime/storage.h"
#include "codegen/kernel_codegen.h"
#include "tests/gpu/require_gpu.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

struct Case {
  std::string name, text;
};

// One sdpa: q [b, h, sq, d], k and v [b, hkv, skv, d], an optional mask of
// `mask_shape` ("" for none) and type, causal or not, a scale.
Case sdpa_case(int64_t b, int64_t h, int64_t hkv, int64_t sq, int64_t skv, int64_t d, const char* dtype, bool causal,
               const std::string& mask_shape = "", const char* mask_dtype = "bool", double scale = 0.0) {
  std::string inputs = fmt::format(R"("q":{{"shape":[{},{},{},{}],"dtype":"{}"}},"k":{{"shape":[{},{},{},{}],"dtype":"{}"}},)"
                                   R"("v":{{"shape":[{},{},{},{}],"dtype":"{}"}})",
                                   b, h, sq, d, dtype, b, hkv, skv, d, dtype, b, hkv, skv, d, dtype);
  std::string in = R"("q","k","v")";
  if (!mask_shape.empty()) {
    inputs += fmt::format(R"(,"m":{{"shape":{},"dtype":"{}"}})", mask_shape, mask_dtype);
    in += R"(,"m")";
  }
  const std::string attrs = fmt::format(R"("causal":{}{})", causal ? "true" : "false",
                                        scale > 0 ? fmt::format(R"(,"scale":{})", scale) : "");
  Case c;
  c.name = fmt::format("b{} h{}/{} sq{} skv{} d{} {}{}{}", b, h, hkv, sq, skv, d, dtype, causal ? " causal" : "",
                       mask_shape.empty() ? "" : fmt::format(" mask {} {}", mask_dtype, mask_shape));
  c.text = fmt::format(R"({{"kiln":1,"inputs":{{{}}},"ops":[{{"op":"sdpa","in":[{}],"out":"o",{}}}],"outputs":["o"]}})", inputs, in,
                       attrs);
  return c;
}

// Compiles every case (in parallel), runs it twice on random inputs and
// compares with the reference; the two runs must agree bit for bit.
void check_cases(const std::vector<Case>& cases, uint64_t seed) {
  std::vector<Graph> graphs;
  for (const Case& c : cases) graphs.push_back(testing::must_parse(c.text));
  std::vector<std::future<Expected<Executable>>> compiled;
  for (const Graph& g : graphs) compiled.push_back(std::async(std::launch::async, [&g] { return Executable::compile(g); }));
  int failed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    Expected<Executable> exe = compiled[i].get();
    ASSERT_TRUE(exe.ok()) << cases[i].name << ": " << exe.error().message;
    const std::vector<HostTensor> inputs = random_inputs(graphs[i], seed + i);
    Expected<std::vector<HostTensor>> got = exe->run_host(inputs), again = exe->run_host(inputs);
    Expected<std::vector<HostTensor>> want = run_reference(graphs[i], inputs);
    ASSERT_TRUE(got && again && want) << cases[i].name;
    const ir::Graph& g = ir_of(graphs[i]);
    const runtime::Comparison c = runtime::compare((*got)[0], (*want)[0]);
    const double tolerance = runtime::default_tolerance(g, g.outputs[0]);
    const bool same = (*got)[0].values == (*again)[0].values;
    if (!c.passes(tolerance) || !same) {
      ++failed;
      ADD_FAILURE() << cases[i].name << ": rel err " << c.relative_error << " (tolerance " << tolerance << ")"
                    << (c.nonfinite_match ? "" : ", NaN/inf differ at element " + std::to_string(c.first_mismatch))
                    << (same ? "" : ", reruns differ");
    }
  }
  std::printf("FIGURE attention cases: %zu run, %d failed\n", cases.size(), failed);
}

// Every pair of lengths from the issue's set, causal (rows that see no key
// where sq > skv) and not, grouped-query heads 4 : 2.
TEST(GpuAttention, EveryLengthPair) {
  REQUIRE_GPU();
  const int64_t lengths[] = {1, 63, 64, 65, 127, 128, 129, 177, 1000, 4097};
  std::vector<Case> cases;
  for (int64_t sq : lengths)
    for (int64_t skv : lengths)
      if (sq * skv <= 1000 * 4097) cases.push_back(sdpa_case(1, 4, 2, sq, skv, 64, "bf16", (sq + skv) % 2 == 0));
  check_cases(cases, 1000);
}

// Head dimensions, types, masks of every broadcast, GQA ratios, logits of +-50.
TEST(GpuAttention, HeadDimsMasksAndGroups) {
  REQUIRE_GPU();
  std::vector<Case> cases;
  for (int64_t d : {64, 80, 96, 128, 256})
    for (const char* dt : {"bf16", "f16"})
      for (bool causal : {false, true}) cases.push_back(sdpa_case(2, 4, 4, 200, 333, d, dt, causal));
  // Masks: full, per (query, key), per key per batch, per query row per head; bool and additive.
  for (const char* type : {"bool", "f32", "bf16"})
    for (const char* shape : {"[2,4,150,257]", "[150,257]", "[2,1,1,257]", "[1,4,150,1]", "[1,1,1,1]"})
      cases.push_back(sdpa_case(2, 4, 2, 150, 257, 128, "bf16", false, shape, type));
  cases.push_back(sdpa_case(2, 4, 2, 150, 257, 128, "f16", true, "[2,1,150,257]", "bool"));
  for (int64_t ratio : {1, 4, 8}) cases.push_back(sdpa_case(2, 8, 8 / ratio, 130, 300, 128, "bf16", true));
  // Scores of +-50 (the softmax's exponentials span e^100).
  cases.push_back(sdpa_case(1, 2, 2, 257, 300, 64, "bf16", false, "", "bool", 6.0));
  cases.push_back(sdpa_case(1, 2, 1, 257, 300, 128, "f16", true, "", "bool", 4.0));
  check_cases(cases, 2000);
}

// Flash decoding (at most 16 query rows per kv head, at least 512 keys):
// one query and a few, grouped-query ratios 1 to 8, head dimensions 64 to
// 256 (80: column pairs that leave threads idle), chunks merged (Skv past
// 1024, not a multiple of it), masks and causality, rows that see no key.
TEST(GpuAttention, Decode) {
  REQUIRE_GPU();
  std::vector<Case> cases;
  for (int64_t d : {64, 80, 128, 256}) cases.push_back(sdpa_case(2, 8, 2, 1, 4097, d, "bf16", false));
  cases.push_back(sdpa_case(3, 32, 8, 1, 8192, 128, "f16", false));
  cases.push_back(sdpa_case(2, 8, 1, 2, 1000, 128, "bf16", true));       // 16 rows: 8 heads x 2 queries
  cases.push_back(sdpa_case(2, 4, 4, 16, 600, 64, "bf16", true));        // 16 queries of one head
  cases.push_back(sdpa_case(2, 8, 2, 3, 2000, 128, "bf16", false, "[2,1,1,2000]", "bool"));
  cases.push_back(sdpa_case(2, 8, 2, 3, 2000, 128, "f16", false, "[2,8,3,2000]", "f32"));
  cases.push_back(sdpa_case(1, 4, 4, 4, 513, 128, "bf16", false, "[1,1,1,513]", "bool", 6.0));
  check_cases(cases, 4000);
}

// Every key-tile width the autotuner may choose for the Hopper kernel (64,
// 128 and 176 up to head dimension 128; 80 and 64 at 256), at lengths that
// leave partial tiles, with a mask through the score hook.
TEST(GpuAttention, EveryKeyTileWidth) {
  REQUIRE_GPU();
  int checked = 0;
  for (const Case& c : {sdpa_case(2, 4, 2, 300, 1000, 128, "bf16", false, "[2,1,1,1000]", "bool"),
                        sdpa_case(1, 4, 4, 257, 177, 96, "f16", false), sdpa_case(1, 2, 2, 200, 200, 128, "bf16", true),
                        sdpa_case(1, 2, 2, 150, 333, 256, "bf16", true)}) {
    const Graph g = testing::must_parse(c.text);
    const codegen::GeneratedProgram heuristic =
        codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g)), 90);
    ASSERT_EQ(heuristic.kernels.size(), 1u);
    const std::vector<HostTensor> inputs = random_inputs(g, 33);
    const Expected<std::vector<HostTensor>> want = run_reference(g, inputs);
    ASSERT_TRUE(want.ok()) << want.error().message;
    for (const codegen::Tuning& t : heuristic.kernels[0].tuning_space) {
      const codegen::ProgramTuning tuning{{0, t}};
      Expected<Executable> exe = runtime::compile_executable(g, {.use_cache = false}, &tuning);
      ASSERT_TRUE(exe.ok()) << c.name << " " << t.to_string() << ": " << exe.error().message;
      const Expected<std::vector<HostTensor>> got = exe->run_host(inputs);
      ASSERT_TRUE(got.ok()) << got.error().message;
      const runtime::Comparison cmp = runtime::compare(got->front(), want->front());
      EXPECT_TRUE(cmp.passes(runtime::default_tolerance(ir_of(g), ir_of(g).outputs[0])))
          << c.name << " " << t.to_string() << ": rel err " << cmp.relative_error;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 11);  // 3 + 3 + 3 + 2 widths
}

// More query tiles than blocks run at once: without a causal mask the
// Hopper kernel's blocks take several tiles each (the ring of K and V
// slots and Q's barriers carried from one to the next), with partial
// tiles, masks, groups and every padded head dimension; under a causal
// mask as many blocks as tiles, rows that see no key (sq > skv) among them.
TEST(GpuAttention, SeveralTilesABlock) {
  REQUIRE_GPU();
  check_cases({sdpa_case(4, 16, 4, 300, 1000, 128, "bf16", false, "[4,1,1,1000]", "bool"),  // 192 tiles
               sdpa_case(8, 16, 16, 130, 77, 64, "f16", false),                             // 256 tiles of one key tile
               sdpa_case(2, 16, 8, 1000, 333, 256, "bf16", false, "[1,16,1000,1]", "f32"),   // 256 tiles
               sdpa_case(3, 12, 4, 1100, 900, 96, "bf16", false, "", "bool", 0.2),           // 324 tiles
               sdpa_case(2, 16, 4, 1000, 1000, 64, "bf16", true),                            // 256 tiles, causal
               sdpa_case(2, 16, 16, 1100, 400, 128, "f16", true, "[2,1,1100,400]", "bool"),  // 288, 160 seeing no key
               sdpa_case(3, 8, 2, 777, 1500, 256, "bf16", true)},                            // 168, causal, skv > sq
              5000);
}

// B x H past the 65535 of a grid's y dimension.
TEST(GpuAttention, ManyHeads) {
  REQUIRE_GPU();
  check_cases({sdpa_case(2, 35000, 35000, 3, 5, 64, "bf16", false), sdpa_case(1, 70000, 70000, 1, 2, 128, "f16", true)}, 3000);
}

// Inputs at pointers 2 bytes past 16-byte alignment: the Hopper kernel's
// copy-engine maps cannot take them, its producer loads element by element.
TEST(GpuAttention, UnalignedPointers) {
  REQUIRE_GPU();
  const runtime::Driver& cu = *runtime::driver().value();
  for (const Case& c : {sdpa_case(1, 4, 2, 300, 257, 128, "bf16", true), sdpa_case(2, 2, 2, 100, 150, 64, "f16", false),
                        sdpa_case(4, 16, 4, 300, 257, 128, "bf16", false),  // 192 tiles: blocks of the persistent kernel take two
                        sdpa_case(2, 8, 2, 1, 512, 128, "bf16", false)}) {  // (the last: flash decoding, one chunk)
    const Graph graph = testing::must_parse(c.text);
    Expected<Executable> exe = Executable::compile(graph);
    ASSERT_TRUE(exe.ok()) << exe.error().message;
    const ir::Graph& g = ir_of(graph);
    const std::vector<HostTensor> host = random_inputs(graph, 7);
    std::vector<CUdeviceptr> owned;
    auto allocate = [&](size_t bytes) {
      CUdeviceptr p = 0;
      EXPECT_EQ(cu.cuMemAlloc(&p, bytes + 16), CUDA_SUCCESS);
      owned.push_back(p);
      return p + 2;
    };
    std::vector<void*> inputs, outputs;
    for (size_t i = 0; i < host.size(); ++i) {
      const std::string bytes = runtime::to_storage(host[i], g.tensor(g.inputs[i]).strides);
      const CUdeviceptr p = allocate(bytes.size());
      cu.cuMemcpyHtoD(p, bytes.data(), bytes.size());
      inputs.push_back(reinterpret_cast<void*>(p));
    }
    const ir::Tensor& o = g.tensor(g.outputs[0]);
    const size_t out_bytes = exe->binding_bytes(o.name).value();
    outputs.push_back(reinterpret_cast<void*>(allocate(out_bytes)));
    const auto launched = exe->launch(BoundArgs{inputs, outputs}, nullptr, nullptr);
    ASSERT_TRUE(launched.ok()) << c.name << ": " << launched.error().message;
    ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
    std::string bytes(out_bytes, '\0');
    cu.cuMemcpyDtoH(bytes.data(), reinterpret_cast<CUdeviceptr>(outputs[0]), bytes.size());
    const HostTensor got{o.shape, o.dtype, runtime::from_storage(bytes, codegen::storage_dtype(o), element_count(o.shape))};
    const runtime::Comparison cmp = runtime::compare(got, run_reference(graph, host).value()[0]);
    EXPECT_TRUE(cmp.passes(runtime::default_tolerance(g, g.outputs[0]))) << c.name << ": rel err " << cmp.relative_error;
    for (CUdeviceptr p : owned) cu.cuMemFree(p);
  }
}

}  // namespace
}  // namespace kiln
