// GPU tests of the cuBLASLt tactic (codegen/vendor_codegen.cpp,
// runtime/vendor_gemm.h): kiln's declarations of cuBLASLt's ABI against its
// header where installed, then matmuls of every layout the tactic takes
// (row- and column-major operands, batches broadcast, slices that start
// past the pointer and leave it unaligned, one row, one column of K) in
// bf16, f16, f32 and TF32, run by cuBLASLt (KILN_VENDOR=always) against the
// reference interpreter, outputs poisoned first. Label `gpu`; without a GPU
// or without cuBLASLt each test skips and says why.
#include <cstdio>

#include <fmt/format.h>

#include "codegen/kernel_codegen.h"
#include "compiler/graph_internal.h"
#include "compiler/planner/planner.h"
#include "kiln/options.h"
#include "runtime/cublaslt.h"
#include "runtime/pipeline.h"
#include "tests/gpu/check_graphs.h"
#include "tests/gpu/require_gpu.h"
#include "tests/unit/test_helpers.h"

#if __has_include(<cublasLt.h>)
#include <cublasLt.h>
#include <cstddef>
namespace lt = kiln::runtime::cublaslt;
static_assert(lt::kR32F == CUDA_R_32F && lt::kR16F == CUDA_R_16F && lt::kR16BF == CUDA_R_16BF);
static_assert(lt::kCompute32F == CUBLAS_COMPUTE_32F && lt::kCompute32FFastTF32 == CUBLAS_COMPUTE_32F_FAST_TF32);
static_assert(lt::kOpN == CUBLAS_OP_N && lt::kOpT == CUBLAS_OP_T && lt::kSuccess == CUBLAS_STATUS_SUCCESS);
static_assert(lt::kDescTransA == CUBLASLT_MATMUL_DESC_TRANSA && lt::kDescTransB == CUBLASLT_MATMUL_DESC_TRANSB);
static_assert(lt::kLayoutBatchCount == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT &&
              lt::kLayoutStridedBatchOffset == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
static_assert(lt::kPrefMaxWorkspaceBytes == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES &&
              lt::kPrefMinAlignmentA == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
              lt::kPrefMinAlignmentD == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES);
static_assert(sizeof(lt::Algo) == sizeof(cublasLtMatmulAlgo_t));
static_assert(sizeof(lt::HeuristicResult) == sizeof(cublasLtMatmulHeuristicResult_t) &&
              offsetof(lt::HeuristicResult, workspace_size) == offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize) &&
              offsetof(lt::HeuristicResult, state) == offsetof(cublasLtMatmulHeuristicResult_t, state));
#define KILN_CHECKED_CUBLASLT_ABI 1
#endif

namespace kiln {
namespace {

// Every later compile of this scope sees KILN_VENDOR=always.
class VendorAlways {
 public:
  VendorAlways() : saved_(*current_options()) {
    Options o = saved_;
    o.vendor = Options::Vendor::kAlways;
    set_options(o);
  }
  ~VendorAlways() { set_options(saved_); }

 private:
  Options saved_;
};

#define REQUIRE_CUBLASLT()                                                                   \
  do {                                                                                       \
    REQUIRE_GPU();                                                                           \
    if (Expected<const runtime::cublaslt::Library*> lt = runtime::cublaslt::library(); !lt) \
      GTEST_SKIP() << lt.error().message;                                                   \
  } while (0)

TEST(GpuVendorGemm, TheLibraryLoadsAndKilnsAbiIsItsHeaders) {
  REQUIRE_CUBLASLT();
  const runtime::cublaslt::Library& l = *runtime::cublaslt::library().value();
  std::printf("FIGURE cuBLASLt %zu from %s; ABI checked against cublasLt.h: %s\n", l.version(), l.path.c_str(),
#ifdef KILN_CHECKED_CUBLASLT_ABI
              "yes"
#else
              "no (header not installed)"
#endif
  );
  // Under KILN_VENDOR=auto a compile here offers cuBLASLt.
  EXPECT_TRUE(runtime::vendor_libraries(Options{}).cublaslt);
}

struct Case {
  std::string name, json;
};

// x [batch.., m, k] (or stored [k][m] and transposed) times w [k, n] (or [n][k] transposed).
Case gemm(const char* dtype, const char* precision, int64_t batch, int64_t m, int64_t n, int64_t k, bool a_t, bool b_t,
          const char* out_dtype = nullptr) {
  const std::string lead = batch > 1 ? fmt::format("{}, ", batch) : "";
  const std::string a_shape = a_t ? fmt::format("[{}{}, {}]", lead, k, m) : fmt::format("[{}{}, {}]", lead, m, k);
  const std::string b_shape = b_t ? fmt::format("[{}, {}]", n, k) : fmt::format("[{}, {}]", k, n);
  const std::string a_perm = batch > 1 ? (a_t ? "[0, 2, 1]" : "[0, 1, 2]") : (a_t ? "[1, 0]" : "[0, 1]");
  Case c;
  c.name = fmt::format("{} {} b{} m{} n{} k{}{}{}{}", dtype, precision, batch, m, n, k, a_t ? " A^T" : "", b_t ? " B^T" : "",
                       out_dtype ? fmt::format(" -> {}", out_dtype) : "");
  c.json = fmt::format(R"({{"kiln": 1, "inputs": {{"a": {{"shape": {}, "dtype": "{}"}}, "b": {{"shape": {}, "dtype": "{}"}}}},
    "ops": [{{"op": "transpose", "in": ["a"], "out": "at", "perm": {}}}, {{"op": "transpose", "in": ["b"], "out": "bt", "perm": {}}},
            {{"op": "matmul", "in": ["at", "bt"], "out": "y", "precision": "{}"{}}}], "outputs": ["y"]}})",
                       a_shape, dtype, b_shape, dtype, a_perm, b_t ? "[1, 0]" : "[0, 1]", precision,
                       out_dtype ? fmt::format(R"(, "dtype": "{}")", out_dtype) : "");
  return c;
}

TEST(GpuVendorGemm, EveryLayoutItTakesMatchesTheReference) {
  REQUIRE_CUBLASLT();
  std::vector<Case> cases = {
      gemm("bf16", "f32", 1, 256, 512, 128, false, false), gemm("bf16", "f32", 1, 64, 50257, 96, false, true),
      gemm("bf16", "f32", 1, 1, 4096, 512, false, true),   gemm("bf16", "f32", 6, 100, 70, 40, true, false),
      gemm("bf16", "f32", 6, 33, 17, 1, false, true),      gemm("f16", "f32", 3, 128, 64, 80, true, true),
      gemm("f16", "f32", 1, 96, 80, 64, false, false, "f32"),
      gemm("f32", "f32", 1, 300, 260, 70, false, false),   gemm("f32", "f32", 20, 129, 66, 33, true, true),
      gemm("f32", "tf32", 4, 200, 100, 64, false, true),
  };
  // A q slice of a fused projection: A starts 3 elements past its pointer (unaligned), rows 99 apart.
  cases.push_back({"bf16 A sliced at column 3", R"({"kiln": 1, "inputs": {"qkv": {"shape": [128, 99], "dtype": "bf16"},
    "w": {"shape": [32, 48], "dtype": "bf16"}}, "ops": [{"op": "slice", "in": ["qkv"], "out": "q", "axis": 1, "start": 3, "end": 35},
    {"op": "matmul", "in": ["q", "w"], "out": "y"}], "outputs": ["y"]})"});
  // Scores times values, batches of two dims in both operands.
  cases.push_back({"f32 batched over [2, 3]", R"({"kiln": 1, "inputs": {"p": {"shape": [2, 3, 64, 40], "dtype": "f32"},
    "v": {"shape": [2, 3, 40, 24], "dtype": "f32"}}, "ops": [{"op": "matmul", "in": ["p", "v"], "out": "o"}], "outputs": ["o"]})"});
  std::vector<Graph> graphs;
  std::vector<std::string> names;
  for (const Case& c : cases) {
    graphs.push_back(testing::must_parse(c.json));
    names.push_back(c.name);
    const codegen::GeneratedProgram p = codegen::generate_program(ir_of(graphs.back()), ir::plan_fusion(ir_of(graphs.back())),
                                                                  90, {}, nullptr, {.cublaslt = true, .always = true});
    bool called = false;
    for (const codegen::GeneratedKernel& k : p.kernels) called = called || k.library.has_value();
    EXPECT_TRUE(called) << c.name << ": not a cuBLASLt call: " << p.kernels.back().tactics.rejected.at(0).reason;
  }
  VendorAlways always;
  const testing::Outcome o = testing::check_graphs(graphs, names, 47);
  std::printf("FIGURE cuBLASLt calls against the reference: %zu graphs, %d failed\n", graphs.size(), o.failed);
  EXPECT_EQ(o.failed, 0);
}

// A program with a cuBLASLt call run twice on the same inputs: the call's
// descriptors and algorithm, made at the first launch, give the same result
// at the second.
TEST(GpuVendorGemm, AProgramWithACallRunsTwiceAlike) {
  REQUIRE_CUBLASLT();
  VendorAlways always;
  const Graph g = testing::must_parse(gemm("bf16", "f32", 1, 512, 512, 256, false, true).json);
  Expected<Executable> exe = Executable::compile(g);
  ASSERT_TRUE(exe.ok()) << exe.error().message;
  const std::vector<HostTensor> inputs = random_inputs(g, 5);
  Expected<std::vector<HostTensor>> first = exe->run_host(inputs), second = exe->run_host(inputs);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ((*first)[0].values, (*second)[0].values);
}

// An LM head over symbolic rows (the backend's prefill: B*S tokens), compiled once: cuBLASLt by
// the rule (KILN_VENDOR=auto), its layouts and algorithms made at the first launch of each M, every
// size against the reference interpreter and a size seen again alike.
TEST(GpuVendorGemm, ASymbolicMIsLaidOutAtEachLaunch) {
  REQUIRE_CUBLASLT();
  const Graph g = testing::must_parse(R"({"kiln": 1, "dims": {"T": {"min": 1, "max": 262144}},
    "inputs": {"h": {"shape": ["T", 256], "dtype": "bf16"}, "w": {"shape": [16384, 256], "dtype": "bf16"}},
    "ops": [{"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]}, {"op": "matmul", "in": ["h", "wt"], "out": "logits"}],
    "outputs": ["logits"]})");
  Expected<Executable> exe = Executable::compile(g);
  ASSERT_TRUE(exe.ok()) << exe.error().message;
  ASSERT_EQ(exe->kernel_count(), 1u);
  EXPECT_EQ(exe->report()[0].tactic, "cublasLt");
  for (int64_t t : {1, 333, 4096, 333}) {
    Expected<Graph> sized = g.specialize({{"T", t}});
    ASSERT_TRUE(sized.ok()) << sized.error().message;
    const std::vector<HostTensor> inputs = random_inputs(*sized, static_cast<uint64_t>(t));
    Expected<std::vector<HostTensor>> got = exe->run_host(inputs), want = run_reference(*sized, inputs);
    ASSERT_TRUE(got.ok()) << got.error().message;
    ASSERT_TRUE(want.ok()) << want.error().message;
    ASSERT_EQ((*got)[0].shape, (Shape{t, 16384}));
    const double tolerance = runtime::default_tolerance(ir_of(*sized), ir_of(*sized).outputs[0]);
    EXPECT_TRUE(runtime::compare((*got)[0], (*want)[0]).passes(tolerance)) << "T = " << t;
  }
}

}  // namespace
}  // namespace kiln
