// GPU tests of the depthwise_conv kernel (codegen/depthwise_generator.h):
// every shape it distinguishes (tests/unit/depthwise_graphs.h), the bench's
// zoo shapes, and pointers that are not 16-byte aligned, against the
// reference interpreter with fresh random inputs and outputs poisoned
// before each run. Each graph's plan is checked to run its conv on the
// depthwise_conv kernel. Label `gpu`; without a GPU every test skips and
// says why.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <future>

#include "codegen/kernel_codegen.h"
#include "compiler/graph_internal.h"
#include "compiler/planner/planner.h"
#include "kiln/executable.h"
#include "kiln/reference.h"
#include "runtime/check.h"
#include "runtime/cuda_driver.h"
#include "runtime/random_inputs.h"
#include "runtime/storage.h"
#include "tests/gpu/check_graphs.h"
#include "tests/gpu/require_gpu.h"
#include "tests/unit/depthwise_graphs.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

bool planned_on_depthwise_kernel(const Graph& g) {
  const ir::Plan plan = ir::plan_fusion(ir_of(g));
  return std::any_of(plan.kernels.begin(), plan.kernels.end(),
                     [](const ir::PlannedKernel& k) { return k.kind == ir::KernelKind::DepthwiseConv; });
}

// Each graph planned on the depthwise_conv kernel, and its outputs against
// the reference on the same inputs, two seeds (testing::check_graphs).
// Returns the number of failed runs.
int failures(const std::vector<Graph>& graphs, const std::vector<std::string>& names) {
  for (size_t i = 0; i < graphs.size(); ++i)
    EXPECT_TRUE(planned_on_depthwise_kernel(graphs[i])) << names[i] << ": not planned on the depthwise_conv kernel";
  int failed = 0;
  for (uint64_t seed : {21u, 22u}) failed += testing::check_graphs(graphs, names, seed).failed;
  return failed;
}

TEST(GpuDepthwise, EveryShapeMatchesTheReference) {
  REQUIRE_GPU();
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  for (const testing::DepthwiseCase& c : testing::depthwise_cases()) {
    graphs.push_back(testing::must_parse(c.json()));
    names.push_back(c.name());
  }
  const int failed = failures(graphs, names);
  std::printf("FIGURE depthwise shapes on the GPU: %zu graphs x 2 seeds, %d runs failed\n", graphs.size(), failed);
  EXPECT_EQ(failed, 0);
}

// The bench's depthwise graphs (bench/graphs/anchors/depthwise/): the zoo's
// shapes at their batch sizes.
TEST(GpuDepthwise, ZooShapesMatchTheReference) {
  REQUIRE_GPU();
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(KILN_SOURCE_DIR "/bench/graphs/anchors/depthwise"))
    if (e.path().extension() == ".json") {
      graphs.push_back(Graph::load(e.path().string()).value());
      names.push_back(e.path().filename().string());
    }
  ASSERT_GE(graphs.size(), 3u);
  EXPECT_EQ(failures(graphs, names), 0);
}

// Input and output pointers one element past a 16-byte boundary (2 bytes
// for bf16, 4 for the f32 parameters): the kernel takes its
// element-by-element halo and stores, and is as right.
TEST(GpuDepthwise, UnalignedPointersMatchTheReference) {
  REQUIRE_GPU();
  const runtime::Driver& cu = *runtime::driver().value();
  const testing::DepthwiseCase c{.n = 2, .h = 13, .w = 11, .c = 32, .dtype = "bf16", .epilogue = "bn_relu6"};
  const Graph g = testing::must_parse(c.json());
  ASSERT_TRUE(planned_on_depthwise_kernel(g));
  Expected<Executable> exe = Executable::compile(g, {.use_cache = false});
  ASSERT_TRUE(exe.ok()) << exe.error().message;
  const ir::Graph& ir = ir_of(g);
  const std::vector<HostTensor> inputs = random_inputs(g, 5);
  std::vector<CUdeviceptr> owned;
  auto allocate = [&](size_t bytes, DType element) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cu.cuMemAlloc(&p, bytes + 16), CUDA_SUCCESS);
    owned.push_back(p);
    return reinterpret_cast<char*>(p) + byte_size(element);  // 16-byte aligned + one element
  };
  std::vector<void*> in, out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string bytes = runtime::to_storage(inputs[i], ir.tensor(ir.inputs[i]).strides);
    in.push_back(allocate(bytes.size(), ir.tensor(ir.inputs[i]).dtype));
    ASSERT_EQ(cu.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(in.back()), bytes.data(), bytes.size()), CUDA_SUCCESS);
  }
  const ir::Tensor& y = ir.tensor(ir.outputs[0]);
  const size_t out_bytes = exe->binding_bytes(y.name).value();
  out.push_back(allocate(out_bytes, codegen::storage_dtype(y)));
  ASSERT_EQ(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(out.back()), 0xff, out_bytes, nullptr), CUDA_SUCCESS);
  void* workspace = nullptr;
  if (exe->workspace_bytes()) workspace = allocate(exe->workspace_bytes(), DType::bf16) - 2;
  ASSERT_TRUE(exe->launch({in, out}, workspace, nullptr).ok());
  ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
  std::string bytes(out_bytes, '\0');
  ASSERT_EQ(cu.cuMemcpyDtoH(bytes.data(), reinterpret_cast<CUdeviceptr>(out.back()), out_bytes), CUDA_SUCCESS);
  const HostTensor got{y.shape, y.dtype, runtime::from_storage(bytes, codegen::storage_dtype(y), element_count(y.shape))};
  const std::vector<HostTensor> want = run_reference(g, inputs).value();
  const runtime::Comparison cmp = runtime::compare(got, want[0]);
  EXPECT_TRUE(cmp.passes(runtime::default_tolerance(ir, ir.outputs[0]))) << "relative error " << cmp.relative_error;
  for (CUdeviceptr p : owned) cu.cuMemFree(p);
}

}  // namespace
}  // namespace kiln
