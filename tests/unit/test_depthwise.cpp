// The depthwise_conv kernel kind without a GPU: which convs the planner puts
// on it and what it fuses, the tiles its generator decides, the code it
// writes, and NVRTC compiles of every shape the GPU tests run (sm_80 and
// sm_90).
#include <future>

#include "codegen/depthwise_generator.h"
#include "codegen/kernel_codegen.h"
#include "compiler/graph_internal.h"
#include "compiler/plan_printer.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "compiler/planner/strategies.h"
#include "kiln/executable.h"
#include "tests/unit/depthwise_graphs.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ir::KernelKind;
using testing::DepthwiseCase;
using testing::must_parse;

ir::Plan plan_of(const Graph& g, bool fuse = true) {
  ir::Plan plan = ir::plan_fusion(ir_of(g), {.fuse = fuse});
  EXPECT_EQ(ir::verify_plan(ir_of(g), plan), "");
  return plan;
}

std::vector<std::string> op_names(const Graph& g, const ir::PlannedKernel& k) {
  std::vector<std::string> out;
  for (int32_t oi : k.ops) out.push_back(ir_of(g).result(ir_of(g).ops[static_cast<size_t>(oi)]).name);
  return out;
}

std::string conv_graph(const std::string& x, const std::string& w, const std::string& attrs) {
  return fmt::format(R"({{"kiln": 1, "inputs": {{"x": {{"shape": {}, "dtype": "bf16"}}, "w": {{"shape": {}, "dtype": "bf16"}}}},
    "ops": [{{"op": "conv2d", "in": ["x", "w"], "out": "c"{}}}, {{"op": "relu", "in": ["c"], "out": "y"}}], "outputs": ["y"]}})",
                     x, w, attrs);
}

TEST(Depthwise, BatchNormAndRelu6AreTheEpilogueOfOneKernel) {
  const Graph g = must_parse(DepthwiseCase{.c = 96, .epilogue = "bn_relu6"}.json());
  const ir::Plan p = plan_of(g);
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_EQ(p.kernels[0].kind, KernelKind::DepthwiseConv);
  EXPECT_EQ(op_names(g, p.kernels[0]), (std::vector<std::string>{"c", "bn", "y"}));
  EXPECT_EQ(p.kernels[0].params.to_string(p.kernels[0].kind),
            "domain=[2,9,11,96] groups=96 multiplier=1 pixels=198 k=9");
  EXPECT_THAT(ir::plan_to_text(ir_of(g), p), HasSubstr("kernel 0: depthwise_conv, anchor c"));
}

TEST(Depthwise, OnlyNhwcConvsWithNarrowGroupsWithinBoundsTakeIt) {
  auto kind_of = [](const std::string& json) {  // the conv's kernel (a thin conv's padded channels come first)
    const Graph g = must_parse(json);
    for (const ir::PlannedKernel& k : plan_of(g).kernels)
      if (k.anchor >= 0) return k.kind;
    return KernelKind::Copy;
  };
  EXPECT_EQ(kind_of(conv_graph("[1,8,8,16]", "[16,3,3,1]", R"(, "padding": [1, 1], "groups": 16)")), KernelKind::DepthwiseConv);
  EXPECT_EQ(kind_of(conv_graph("[1,8,8,16]", "[128,3,3,1]", R"(, "groups": 16)")), KernelKind::DepthwiseConv);  // multiplier 8
  // NCHW: an NHWC conv between transposes (compiler/nchw_convs_as_nhwc.h), so the depthwise kernel too.
  EXPECT_EQ(kind_of(conv_graph("[1,16,8,8]", "[16,1,3,3]", R"(, "layout": "NCHW", "groups": 16)")), KernelKind::DepthwiseConv);
  // Groups of 2, 4 or 8 channels that one 16-byte load holds (f32: 2 or 4), outputs at most 8 a group.
  EXPECT_EQ(kind_of(conv_graph("[1,8,8,16]", "[16,3,3,2]", R"(, "groups": 8)")), KernelKind::DepthwiseConv);
  EXPECT_EQ(kind_of(conv_graph("[1,8,8,16]", "[16,3,3,4]", R"(, "groups": 4)")), KernelKind::DepthwiseConv);
  EXPECT_EQ(kind_of(conv_graph("[1,8,8,16]", "[16,3,3,8]", R"(, "groups": 2)")), KernelKind::DepthwiseConv);
  std::string f32_groups_of_8 = conv_graph("[1,8,8,16]", "[16,3,3,8]", R"(, "groups": 2)");
  for (size_t at; (at = f32_groups_of_8.find("bf16")) != std::string::npos;) f32_groups_of_8.replace(at, 4, "f32");
  EXPECT_EQ(kind_of(f32_groups_of_8), KernelKind::Conv);  // 32 bytes a group
  // Groups of 3 or 16 channels (32 bytes), more than 8 outputs a group, a multiplier past 8, a filter past 15
  // taps or a window past 32 pixels, one channel, sides past 32-bit indexing: the implicit-GEMM conv kernel.
  EXPECT_EQ(kind_of(conv_graph("[1,8,8,18]", "[18,3,3,3]", R"(, "groups": 6)")), KernelKind::Conv);
  EXPECT_EQ(kind_of(conv_graph("[1,8,8,32]", "[32,3,3,16]", R"(, "groups": 2)")), KernelKind::Conv);
  EXPECT_EQ(kind_of(conv_graph("[1,8,8,16]", "[36,3,3,4]", R"(, "groups": 4)")), KernelKind::Conv);
  EXPECT_EQ(kind_of(conv_graph("[1,8,8,16]", "[144,3,3,1]", R"(, "groups": 16)")), KernelKind::Conv);
  EXPECT_EQ(kind_of(conv_graph("[1,20,20,16]", "[16,17,17,1]", R"(, "groups": 16)")), KernelKind::Conv);
  EXPECT_EQ(kind_of(conv_graph("[1,40,40,16]", "[16,3,3,1]", R"(, "dilation": [17, 1], "groups": 16)")), KernelKind::Conv);
  EXPECT_EQ(kind_of(conv_graph("[1,8,8,1]", "[4,3,3,1]", R"(, "groups": 1)")), KernelKind::Conv);
  EXPECT_EQ(kind_of(conv_graph("[1,1073741824,1,2]", "[2,1,1,1]", R"(, "groups": 2)")), KernelKind::Conv);  // 2^30 rows
  // Without fusion the conv is still the depthwise kernel's, alone.
  const ir::Plan unfused = plan_of(must_parse(DepthwiseCase{.epilogue = "bn_relu6"}.json()), false);
  ASSERT_EQ(unfused.kernels.size(), 3u);
  EXPECT_EQ(unfused.kernels[0].kind, KernelKind::DepthwiseConv);
}

TEST(Depthwise, AReductionAfterItIsAKernelOfItsOwnAndSaysWhy) {
  const Graph g = must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [2, 8, 8, 32], "dtype": "bf16"},
    "w": {"shape": [32, 3, 3, 1], "dtype": "bf16"}},
    "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "c", "padding": [1, 1], "groups": 32},
            {"op": "silu", "in": ["c"], "out": "a"},
            {"op": "reduce_mean", "in": ["a"], "out": "s", "axes": [1, 2]}], "outputs": ["a", "s"]})");
  const ir::Plan p = plan_of(g);
  ASSERT_EQ(p.kernels.size(), 2u);
  EXPECT_EQ(op_names(g, p.kernels[0]), (std::vector<std::string>{"c", "a"}));
  EXPECT_EQ(p.kernels[1].kind, KernelKind::Reduction);
  ASSERT_EQ(p.boundaries.size(), 1u);
  EXPECT_THAT(p.boundaries[0].reason, HasSubstr("cannot be the epilogue of a depthwise_conv kernel"));
}

// Every tile fits the shared-memory budget with a thread for each lane,
// covers the output, and keeps a block's channels whole 16-byte chunks
// where the halo is copied by them.
TEST(Depthwise, TilesFitAndCoverEveryShape) {
  using G = codegen::DepthwiseGenerator;
  std::vector<G::Geometry> shapes;
  for (int64_t r : {1, 3, 5, 7, 15})
    for (int64_t dilation : {1, 2})
      for (int64_t stride : {1, 2, 4})
        for (int64_t multiplier : {1, 2, 3, 8})
          for (int64_t c : {3, 12, 96, 4096})
            for (int64_t side : {1, 7, 56, 112}) {
              if ((r - 1) * dilation + 1 > ir::planner::kMaxDepthwiseSpan) continue;
              G::Geometry geo;
              geo.n = 2, geo.h = geo.w = side, geo.c = c, geo.k = c * multiplier, geo.multiplier = multiplier;
              geo.r = geo.s = r, geo.stride[0] = geo.stride[1] = stride, geo.dilation[0] = geo.dilation[1] = dilation;
              geo.padding[0] = geo.padding[1] = r / 2;
              geo.p = geo.q = std::max<int64_t>(1, (side + 2 * (r / 2) - (r - 1) * dilation - 1) / stride + 1);
              shapes.push_back(geo);
            }
  for (const G::Geometry& geo : shapes)
    for (DType halo : {DType::bf16, DType::f32})
      for (bool vectors : {true, false}) {
        const G::Tile t = G::decide(geo, halo, vectors, 48 * 1024);
        const std::string what = fmt::format("r {} c {} m {} stride {} side {} {} {}", geo.r, geo.c, geo.multiplier,
                                             geo.stride[0], geo.h, to_string(halo), t.to_string(geo));
        EXPECT_EQ(t.shared_bytes, G::shared_bytes(geo, t)) << what;
        if (!vectors) EXPECT_LE(t.shared_bytes, 48 * 1024) << what;
        EXPECT_GE(t.threads(), 1) << what;
        EXPECT_LE(t.threads(), 256) << what;
        EXPECT_LE(t.ct * byte_size(halo), 16) << what;
        EXPECT_GE(t.blocks_c * t.block_channels(), geo.c) << what;
        EXPECT_GE(t.blocks_p * t.ty, geo.p) << what;
        EXPECT_GE(t.blocks_q * t.tx * t.tq, geo.q) << what;
        if (vectors && t.shared_bytes <= 48 * 1024) EXPECT_EQ(t.block_channels() % (16 / byte_size(halo)), 0) << what;
      }
}

// The zoo's common case: a pixel's 128 bytes of channels a block, 16-byte
// copies into the halo, 16-byte stores of the result.
TEST(Depthwise, ZooShapesTakeSixteenByteCopiesAndStores) {
  using G = codegen::DepthwiseGenerator;
  G::Geometry geo;
  geo.n = 32, geo.h = geo.w = geo.p = geo.q = 56, geo.c = geo.k = 384, geo.r = geo.s = 3, geo.padding[0] = geo.padding[1] = 1;
  const G::Tile t = G::decide(geo, DType::bf16, true, G::shared_budget(90));
  EXPECT_EQ(t.ct, 8);
  EXPECT_EQ(t.block_channels(), 64);
  EXPECT_EQ(t.threads(), 256);
  EXPECT_LE(t.shared_bytes, G::shared_budget(90));
  // C = 96: blocks of 32 channels, not 64 (half of every second block empty).
  geo.c = geo.k = 96, geo.r = geo.s = 7, geo.padding[0] = geo.padding[1] = 3;
  EXPECT_EQ(G::decide(geo, DType::bf16, true, G::shared_budget(90)).block_channels(), 32);

  const Graph g = must_parse(DepthwiseCase{.n = 2, .h = 28, .w = 28, .c = 96, .epilogue = "bn_relu6"}.json());
  const ir::Plan plan = plan_of(g);
  const codegen::GeneratedProgram program = codegen::generate_program(ir_of(g), plan, 90);
  ASSERT_EQ(program.kernels.size(), 1u);
  const std::string& src = program.kernels[0].source;
  EXPECT_THAT(src, HasSubstr("#include \"kiln/depthwise.cuh\""));
  EXPECT_THAT(src, HasSubstr("D::stage_halo_vectors(halo, static_cast<const D::T*>(p0)"));
  EXPECT_THAT(src, HasSubstr("kiln::store_chunk<kiln::Storage::bf16, 8>("));
  EXPECT_THAT(program.kernels[0].decisions, HasSubstr("by 16-byte copies"));
  EXPECT_EQ(program.kernels[0].shared_bytes, static_cast<uint32_t>(G::decide(G::geometry(ir_of(g), ir_of(g).ops[0]), DType::bf16, true, G::shared_budget(90)).shared_bytes));
  // batch_norm's parameters and scale once a thread (a column loop before the pixels), not per element.
  EXPECT_THAT(program.kernels[0].decisions, HasSubstr("3 values of the channel once a thread"));
}

// Channels that are not a multiple of 8, and an input read through a view
// whose channels are not contiguous: element by element, no 16-byte path.
// (An NCHW input transposed to NHWC is written once by a copy instead:
// planner/strided_operands.h, NchwInputIsCopiedForTheSixteenBytePath.)
TEST(Depthwise, OddChannelsAndViewsTakeTheElementPath) {
  for (const DepthwiseCase& c : {DepthwiseCase{.c = 12}, DepthwiseCase{.c = 16, .epilogue = "sliced_input"}}) {
    const Graph g = must_parse(c.json());
    const codegen::GeneratedProgram program = codegen::generate_program(ir_of(g), plan_of(g), 90);
    const codegen::GeneratedKernel* k = nullptr;
    for (const ir::PlannedKernel& pk : plan_of(g).kernels)
      if (pk.kind == KernelKind::DepthwiseConv)
        for (const codegen::GeneratedKernel& gk : program.kernels)
          if (gk.plan_kernel == pk.id) k = &gk;
    ASSERT_NE(k, nullptr) << c.name();
    EXPECT_THAT(k->source, Not(HasSubstr("stage_halo_vectors"))) << c.name();
    EXPECT_THAT(k->decisions, HasSubstr("halo bf16 element by element")) << c.name();
  }
}

// An NCHW input read as NHWC spreads the channels H*W apart: a copy kernel
// writes it once channels-last, and the depthwise kernel stages its halo
// from that copy by 16-byte copies.
TEST(Depthwise, NchwInputIsCopiedForTheSixteenBytePath) {
  const Graph g = must_parse(DepthwiseCase{.c = 16, .epilogue = "nchw_input"}.json());
  const ir::Plan& p = plan_of(g);
  ASSERT_EQ(p.kernels.size(), 2u) << ir::plan_to_text(ir_of(g), p);
  EXPECT_EQ(p.kernels[0].kind, KernelKind::Copy);
  EXPECT_EQ(p.kernels[1].kind, KernelKind::DepthwiseConv);
  ASSERT_EQ(p.boundaries.size(), 1u);
  EXPECT_THAT(p.boundaries[0].reason, HasSubstr("written once in channels-last order by a copy"));
  const codegen::GeneratedProgram program = codegen::generate_program(ir_of(g), p, 90);
  for (const codegen::GeneratedKernel& k : program.kernels)
    if (k.plan_kernel == 1) {
      EXPECT_THAT(k.source, HasSubstr("stage_halo_vectors"));
    }
}

// Every shape of the GPU tests (tests/gpu/test_depthwise.cpp) compiles for
// sm_80 and sm_90 (in sanitizer builds a sample: testing::kNvrtcEvery).
TEST(Depthwise, EveryShapeCompilesForSm80AndSm90) {
  std::vector<std::future<std::string>> jobs;
  const std::vector<DepthwiseCase> cases = testing::depthwise_cases();
  for (size_t i = 0; i < cases.size(); ++i)
    for (const char* arch : {"sm_80", "sm_90"})
      jobs.push_back(std::async(std::launch::async, [c = cases[i], arch, nvrtc = i % testing::kNvrtcEvery == 0] {
        return testing::compiles(testing::must_parse(c.json()), arch, nvrtc, c.name());
      }));
  for (auto& job : jobs) EXPECT_EQ(job.get(), "");
}

}  // namespace
}  // namespace kiln
