// cuBLASLt, loaded at run time with dlopen like the Driver API: kiln builds,
// plans and tests without it, and calls it only where a plan's matmul took
// the "cublasLt" tactic (codegen/vendor_codegen.cpp). kiln declares the
// part of cuBLASLt's C API it uses itself (the values are the library's
// ABI, as its header cublasLt.h of CUDA 12 and 13 gives them; the GPU tests
// check them against that header where it is installed).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/status.h"

namespace kiln::runtime::cublaslt {

using Status = int;  // cublasStatus_t
constexpr Status kSuccess = 0;
using Handle = struct Context*;  // cublasLtHandle_t
using MatmulDesc = void*;        // cublasLtMatmulDesc_t
using Layout = void*;            // cublasLtMatrixLayout_t
using Preference = void*;        // cublasLtMatmulPreference_t
struct Algo {                    // cublasLtMatmulAlgo_t
  uint64_t data[8];
};
struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  Algo algo;
  size_t workspace_size;
  Status state;
  float waves_count;
  int reserved[4];
};

// cudaDataType_t
constexpr int kR32F = 0, kR16F = 2, kR16BF = 14;
// cublasComputeType_t
constexpr int kCompute32F = 68, kCompute32FFastTF32 = 77;
// cublasOperation_t
constexpr int32_t kOpN = 0, kOpT = 1;
// cublasLtMatmulDescAttributes_t
constexpr int kDescTransA = 3, kDescTransB = 4;
// cublasLtMatrixLayoutAttribute_t
constexpr int kLayoutBatchCount = 5, kLayoutStridedBatchOffset = 6;
// cublasLtMatmulPreferenceAttributes_t
constexpr int kPrefMaxWorkspaceBytes = 1, kPrefMinAlignmentA = 5, kPrefMinAlignmentB = 6, kPrefMinAlignmentC = 7,
              kPrefMinAlignmentD = 8;

// KILN_LT(member, exported symbol, function type): every entry point kiln uses.
#define KILN_CUBLASLT_FUNCTIONS(KILN_LT)                                                                              \
  KILN_LT(create, "cublasLtCreate", Status(Handle*))                                                              \
  KILN_LT(destroy, "cublasLtDestroy", Status(Handle))                                                             \
  KILN_LT(status_name, "cublasLtGetStatusName", const char*(Status))                                              \
  KILN_LT(version, "cublasLtGetVersion", size_t())                                                                \
  KILN_LT(desc_create, "cublasLtMatmulDescCreate", Status(MatmulDesc*, int, int))                                 \
  KILN_LT(desc_destroy, "cublasLtMatmulDescDestroy", Status(MatmulDesc))                                          \
  KILN_LT(desc_set, "cublasLtMatmulDescSetAttribute", Status(MatmulDesc, int, const void*, size_t))               \
  KILN_LT(layout_create, "cublasLtMatrixLayoutCreate", Status(Layout*, int, uint64_t, uint64_t, int64_t))         \
  KILN_LT(layout_destroy, "cublasLtMatrixLayoutDestroy", Status(Layout))                                          \
  KILN_LT(layout_set, "cublasLtMatrixLayoutSetAttribute", Status(Layout, int, const void*, size_t))               \
  KILN_LT(preference_create, "cublasLtMatmulPreferenceCreate", Status(Preference*))                               \
  KILN_LT(preference_destroy, "cublasLtMatmulPreferenceDestroy", Status(Preference))                              \
  KILN_LT(preference_set, "cublasLtMatmulPreferenceSetAttribute", Status(Preference, int, const void*, size_t))   \
  KILN_LT(heuristic, "cublasLtMatmulAlgoGetHeuristic",                                                                \
          Status(Handle, MatmulDesc, Layout, Layout, Layout, Layout, Preference, int, HeuristicResult*, int*))    \
  KILN_LT(matmul, "cublasLtMatmul",                                                                                   \
          Status(Handle, MatmulDesc, const void*, const void*, Layout, const void*, Layout, const void*,          \
                     const void*, Layout, void*, Layout, const Algo*, void*, size_t, CUstream))

template <class Function>
using Pointer = Function*;

struct Library {
#define KILN_LT(member, symbol, signature) Pointer<signature> member = nullptr;
  KILN_CUBLASLT_FUNCTIONS(KILN_LT)
#undef KILN_LT
  std::string path;  // the file loaded
};

// The library, loaded on the first call (libcublasLt.so.13, then .12, from
// the loader's path, then from CUDA's usual folders), or an Error
// (CompileOrDevice) saying why there is none.
Expected<const Library*> library();

// "CUBLAS_STATUS_NOT_SUPPORTED (15)".
std::string status_text(const Library& lt, Status s);

}  // namespace kiln::runtime::cublaslt
