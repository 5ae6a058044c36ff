// The embedder's API on the GPU: launches bound by index with a caller's
// workspace, from many threads on many streams, in a context of the
// caller's own; host time of a launch. Label `gpu`; skips without a GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "compiler/graph_internal.h"
#include "kiln/kiln.h"
#include "runtime/check.h"
#include "runtime/cuda_driver.h"
#include "runtime/random_inputs.h"
#include "runtime/storage.h"
#include "codegen/kernel_codegen.h"
#include "compiler/planner/planner.h"
#include "tests/gpu/require_gpu.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {


// Device buffers holding one set of inputs, outputs poisoned, and a
// workspace, in the context current when made.
struct Buffers {
  const runtime::Driver& cu;
  std::vector<void*> inputs, outputs;
  void* workspace = nullptr;
  std::vector<HostTensor> host_inputs;
  Buffers(const runtime::Driver& driver, const Executable& exe, uint64_t seed) : cu(driver) {
    const ir::Graph& g = ir_of(exe.graph());
    host_inputs = random_inputs(exe.graph(), seed);
    for (size_t i = 0; i < host_inputs.size(); ++i) {
      const std::string bytes = runtime::to_storage(host_inputs[i], g.tensor(g.inputs[i]).strides);
      inputs.push_back(allocate(bytes.size()));
      EXPECT_EQ(cu.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(inputs.back()), bytes.data(), bytes.size()), CUDA_SUCCESS);
    }
    for (const TensorDesc& t : exe.graph().outputs()) {
      const size_t bytes = exe.binding_bytes(t.name).value();
      outputs.push_back(allocate(bytes));
      cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(outputs.back()), 0xff, bytes, nullptr);
    }
    if (exe.workspace_bytes()) workspace = allocate(exe.workspace_bytes());
    cu.cuCtxSynchronize();
  }
  void* allocate(size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cu.cuMemAlloc(&p, std::max<size_t>(bytes, 4)), CUDA_SUCCESS);
    owned.push_back(p);
    return reinterpret_cast<void*>(p);
  }
  BoundArgs args() const { return {inputs, outputs}; }
  // Output `o` against the reference on the same inputs.
  ::testing::AssertionResult matches_reference(const Executable& exe) const {
    const ir::Graph& g = ir_of(exe.graph());
    std::vector<HostTensor> want = run_reference(exe.graph(), host_inputs).value();
    for (size_t o = 0; o < outputs.size(); ++o) {
      const ir::Tensor& t = g.tensor(g.outputs[o]);
      const DType storage = codegen::storage_dtype(t);
      std::string bytes(exe.binding_bytes(t.name).value(), '\0');
      cu.cuMemcpyDtoH(bytes.data(), reinterpret_cast<CUdeviceptr>(outputs[o]), bytes.size());
      const HostTensor got{t.shape, t.dtype, runtime::from_storage(bytes, storage, element_count(t.shape))};
      const runtime::Comparison c = runtime::compare(got, want[o]);
      if (!c.passes(runtime::default_tolerance(g, g.outputs[o])))
        return ::testing::AssertionFailure() << "output '" << t.name << "': relative error " << c.relative_error;
    }
    return ::testing::AssertionSuccess();
  }
  ~Buffers() {
    for (CUdeviceptr p : owned) cu.cuMemFree(p);
  }
  std::vector<CUdeviceptr> owned;
};

// Two kernels, an intermediate between them (so a workspace), a tensor map
// where the GPU has TMA: a matmul whose result a softmax over the other
// axis reads.
const char* kTwoKernels = R"({"kiln": 1, "name": "two_kernels",
  "inputs": {"a": {"shape": [256, 128], "dtype": "bf16"}, "b": {"shape": [128, 192], "dtype": "bf16"}},
  "ops": [{"op": "matmul", "in": ["a", "b"], "out": "m"},
          {"op": "softmax", "in": ["m"], "out": "y", "axis": 0, "dtype": "bf16"}],
  "outputs": ["y"]})";

TEST(Embedding, WorkspaceIsReportedAndRequired) {
  REQUIRE_GPU();
  const runtime::Driver& cu = *runtime::driver().value();
  Expected<Executable> exe = Executable::compile(testing::must_parse(kTwoKernels), {.use_cache = false});
  ASSERT_TRUE(exe.ok()) << exe.error().message;
  ASSERT_GT(exe->workspace_bytes(), 0u);
  Buffers b(cu, *exe, 1);
  Status none = exe->launch(b.args(), nullptr, nullptr);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.error().message, ::testing::HasSubstr("needs a workspace"));
  Status skewed = exe->launch(b.args(), static_cast<char*>(b.workspace) + 16, nullptr);
  ASSERT_FALSE(skewed.ok());
  EXPECT_THAT(skewed.error().message, ::testing::HasSubstr("not aligned"));
  ASSERT_TRUE(exe->launch(b.args(), b.workspace, nullptr).ok());
  ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_TRUE(b.matches_reference(*exe));
}

// Kernels that combine partial results across blocks through workspaces a
// launch resets before any kernel runs (one memset per fill value: the
// split reductions' partials, 0 for the sum and -inf for the max, their
// counters, the split-K matmul's arrivals): on a workspace poisoned first,
// five launches in a row, each right.
TEST(Embedding, WorkspaceResetsHoldOverRepeatedLaunches) {
  REQUIRE_GPU();
  const runtime::Driver& cu = *runtime::driver().value();
  const Graph g = testing::must_parse(R"({"kiln": 1, "name": "resets",
    "inputs": {"x": {"shape": [8, 262144], "dtype": "f32"}, "a": {"shape": [16, 8192], "dtype": "bf16"},
               "b": {"shape": [8192, 64], "dtype": "bf16"}},
    "ops": [{"op": "reduce_sum", "in": ["x"], "out": "s", "axes": [1]},
            {"op": "reduce_max", "in": ["x"], "out": "m", "axes": [1]},
            {"op": "matmul", "in": ["a", "b"], "out": "p", "dtype": "bf16"}],
    "outputs": ["s", "m", "p"]})");
  int resets = 0;  // (as the GPU's architecture plans them: sm_90 and sm_80 alike here)
  for (const codegen::GeneratedKernel& k : codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = 90}), 90).kernels)
    resets += static_cast<int>(k.reset_workspaces.size());
  ASSERT_GE(resets, 4) << "the graph no longer makes kernels that reset workspaces";
  Expected<Executable> exe = Executable::compile(g, {.use_cache = false});
  ASSERT_TRUE(exe.ok()) << exe.error().message;
  Buffers b(cu, *exe, 7);
  ASSERT_EQ(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(b.workspace), 0xab, exe->workspace_bytes(), nullptr), CUDA_SUCCESS);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(exe->launch(b.args(), b.workspace, nullptr).ok());
    ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_TRUE(b.matches_reference(*exe)) << "launch " << i;
  }
}

// One executable, eight threads, eight streams, each with its own buffers
// and workspace, many launches each: every result right.
TEST(Embedding, EightThreadsOnEightStreams) {
  REQUIRE_GPU();
  const runtime::Driver& cu = *runtime::driver().value();
  CUcontext context = nullptr;
  cu.cuCtxGetCurrent(&context);
  Expected<Executable> exe = Executable::compile(testing::must_parse(kTwoKernels), {.use_cache = false});
  ASSERT_TRUE(exe.ok()) << exe.error().message;
  std::vector<std::unique_ptr<Buffers>> buffers;
  for (int t = 0; t < 8; ++t) buffers.push_back(std::make_unique<Buffers>(cu, *exe, 100 + t));
  std::vector<std::string> failures(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      cu.cuCtxSetCurrent(context);
      CUstream stream;
      cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
      for (int i = 0; i < 50 && failures[t].empty(); ++i)
        if (Status s = exe->launch(buffers[t]->args(), buffers[t]->workspace, stream); !s) failures[t] = s.error().message;
      cu.cuStreamSynchronize(stream);
      cu.cuStreamDestroy(stream);
    });
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(failures[t], "") << "thread " << t;
    EXPECT_TRUE(buffers[t]->matches_reference(*exe)) << "thread " << t;
  }
}

// A context of the caller's own (not the primary one): the kernels load into
// it on its first launch there, and launches in both contexts are right;
// the caller's current context stays current. The executable goes before
// the context does (executable.h).
TEST(Embedding, ACallersOwnContext) {
  REQUIRE_GPU();
  const runtime::Driver& cu = *runtime::driver().value();
  CUcontext primary = nullptr, own = nullptr;
  cu.cuCtxGetCurrent(&primary);
  CUdevice device;
  ASSERT_EQ(cu.cuCtxGetDevice(&device), CUDA_SUCCESS);
  {
    Expected<Executable> exe = Executable::compile(testing::must_parse(kTwoKernels), {.use_cache = false});
    ASSERT_TRUE(exe.ok()) << exe.error().message;
    Buffers theirs(cu, *exe, 8);  // in the primary context
    ASSERT_EQ(cu.cuCtxCreate(&own, nullptr, 0, device), CUDA_SUCCESS);  // now current
    {
      Buffers mine(cu, *exe, 7);
      CUstream stream;
      ASSERT_EQ(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
      ASSERT_TRUE(exe->launch(mine.args(), mine.workspace, stream).ok());
      ASSERT_EQ(cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
      EXPECT_TRUE(mine.matches_reference(*exe));
      // The default stream of the current (own) context, too.
      ASSERT_TRUE(exe->launch(mine.args(), mine.workspace, nullptr).ok());
      ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
      EXPECT_TRUE(mine.matches_reference(*exe));
      cu.cuStreamDestroy(stream);
      CUcontext current = nullptr;
      cu.cuCtxGetCurrent(&current);
      EXPECT_EQ(current, own);
      // A stream of the primary context, launched from a thread where the own context is current.
      CUstream primary_stream;
      cu.cuCtxSetCurrent(primary);
      ASSERT_EQ(cu.cuStreamCreate(&primary_stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
      cu.cuCtxSetCurrent(own);
      ASSERT_TRUE(exe->launch(theirs.args(), theirs.workspace, primary_stream).ok());
      cu.cuCtxGetCurrent(&current);
      EXPECT_EQ(current, own);
      ASSERT_EQ(cu.cuStreamSynchronize(primary_stream), CUDA_SUCCESS);
      cu.cuStreamDestroy(primary_stream);
      cu.cuCtxSetCurrent(own);
    }
    cu.cuCtxSetCurrent(primary);
    EXPECT_TRUE(theirs.matches_reference(*exe));
  }
  EXPECT_EQ(cu.cuCtxDestroy(own), CUDA_SUCCESS);
  cu.cuCtxSetCurrent(primary);
}

// A thread with no current context launches on the default stream: the
// primary context of CompileOptions::device (0) is used.
TEST(Embedding, AThreadWithoutAContextUsesTheDevicesPrimaryContext) {
  REQUIRE_GPU();
  const runtime::Driver& cu = *runtime::driver().value();
  Expected<Executable> exe = Executable::compile(testing::must_parse(kTwoKernels), {.use_cache = false, .device = 0});
  ASSERT_TRUE(exe.ok()) << exe.error().message;
  Buffers b(cu, *exe, 9);
  std::string failure;
  std::thread([&] {
    CUcontext none = nullptr;
    cu.cuCtxGetCurrent(&none);
    if (none) failure = "a new thread had a current context";
    else if (Status s = exe->launch(b.args(), b.workspace, nullptr); !s) failure = s.error().message;
    else cu.cuCtxSynchronize();
  }).join();
  EXPECT_EQ(failure, "");
  EXPECT_TRUE(b.matches_reference(*exe));
}

// Host time of a launch: bound by index with a workspace, against by name
// (which also allocates its workspace on the stream when there is one).
// The driver's own floor: cuLaunchKernel of an empty kernel with four
// pointer arguments, nothing of kiln's around it.
constexpr const char* kEmptyKernelPtx = R"(
.version 8.0
.target sm_80
.address_size 64
.visible .entry empty(.param .u64 a, .param .u64 b, .param .u64 c, .param .u64 d) { ret; }
)";

TEST(Embedding, LaunchHostTimeFigures) {
  REQUIRE_GPU();
  const runtime::Driver& cu = *runtime::driver().value();
  for (const char* path : {KILN_SOURCE_DIR "/examples/pointwise/scale_shift_gelu.json", "two_kernels"}) {
    const Graph g = std::string(path) == "two_kernels" ? testing::must_parse(kTwoKernels) : Graph::load(path).value();
    Expected<Executable> exe = Executable::compile(g, {.use_cache = false});
    ASSERT_TRUE(exe.ok()) << exe.error().message;
    Buffers b(cu, *exe, 3);
    std::vector<DeviceBinding> named;
    for (size_t i = 0; i < b.inputs.size(); ++i) {
      const std::string name = g.inputs()[i].name;
      named.push_back({name, b.inputs[i], exe->binding_bytes(name).value()});
    }
    for (size_t o = 0; o < b.outputs.size(); ++o) {
      const std::string name = g.outputs()[o].name;
      named.push_back({name, b.outputs[o], exe->binding_bytes(name).value()});
    }
    auto median_us = [&](auto&& launch) {
      std::vector<double> us;
      for (int i = 0; i < 10000; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_TRUE(launch());
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        if (i % 500 == 499) cu.cuCtxSynchronize();  // keep the queue from filling
      }
      cu.cuCtxSynchronize();
      std::sort(us.begin(), us.end());
      return us[us.size() / 2];
    };
    const double by_index = median_us([&] { return exe->launch(b.args(), b.workspace, nullptr).ok(); });
    const double by_name = median_us([&] { return exe->launch(named, nullptr).ok(); });
    std::printf("FIGURE launch host time, %s (%zu kernels): by index with a workspace %.2f us, by name %.2f us (median of 10000)\n",
                g.name().c_str(), exe->kernel_count(), by_index, by_name);
  }
  CUmodule module;
  CUfunction empty;
  ASSERT_EQ(cu.cuModuleLoadData(&module, kEmptyKernelPtx), CUDA_SUCCESS);
  ASSERT_EQ(cu.cuModuleGetFunction(&empty, module, "empty"), CUDA_SUCCESS);
  CUdeviceptr pointers[4] = {0, 0, 0, 0};
  void* params[4] = {&pointers[0], &pointers[1], &pointers[2], &pointers[3]};
  std::vector<double> us;
  for (int i = 0; i < 10000; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(cu.cuLaunchKernel(empty, 256, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr), CUDA_SUCCESS);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (i % 500 == 499) cu.cuCtxSynchronize();
  }
  cu.cuCtxSynchronize();
  std::sort(us.begin(), us.end());
  std::printf("FIGURE launch host time, the driver alone (cuLaunchKernel of an empty kernel, 4 pointers): %.2f us (median of 10000)\n",
              us[us.size() / 2]);
  cu.cuModuleUnload(module);
}

}  // namespace
}  // namespace kiln
