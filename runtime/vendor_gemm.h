// A matmul kernel that cuBLASLt runs (codegen::VendorGemm), made ready in
// one CUDA context: its descriptors, and the algorithms cuBLASLt's
// heuristic picks for it, once; each launch then is one cublasLtMatmul on
// the caller's stream, into kiln's workspace (nothing allocated, so a CUDA
// graph can capture it).
//
// kiln's matrices are row-major, cuBLASLt's column-major: D = A x B is
// asked as Dᵀ = Bᵀ x Aᵀ, each operand transposed or not as it lies.
#pragma once

#include <cuda.h>

#include <memory>

#include "codegen/kernel_codegen.h"
#include "kiln/status.h"
#include "runtime/cublaslt.h"

namespace kiln::runtime {

class VendorGemmCall {
 public:
  // In the current context. `plan_kernel` names the kernel in errors.
  static Expected<std::unique_ptr<VendorGemmCall>> prepare(const codegen::VendorGemm& call, int plan_kernel);
  ~VendorGemmCall();
  VendorGemmCall(const VendorGemmCall&) = delete;
  VendorGemmCall& operator=(const VendorGemmCall&) = delete;

  // `args`: the kernel's arguments as bound (pointers).
  Status launch(const CUdeviceptr* args, CUstream stream) const;

 private:
  VendorGemmCall(const cublaslt::Library& lt, const codegen::VendorGemm& call, int plan_kernel)
      : lt_(lt), call_(call), plan_kernel_(plan_kernel) {}
  Status make(const char* what, cublaslt::Status s) const;

  const cublaslt::Library& lt_;
  codegen::VendorGemm call_;
  int plan_kernel_;
  cublaslt::Handle handle_ = nullptr;
  cublaslt::MatmulDesc desc_ = nullptr;
  cublaslt::Layout a_ = nullptr, b_ = nullptr, d_ = nullptr;  // cuBLASLt's A (kiln's B), B (kiln's A), C and D
  // The heuristic's first algorithm for 16-byte aligned pointers, and for
  // pointers aligned to an element only.
  cublaslt::Algo aligned_{}, unaligned_{};
  bool has_aligned_ = false;
};

}  // namespace kiln::runtime
