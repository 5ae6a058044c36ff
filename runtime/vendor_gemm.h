// A matmul kernel that cuBLASLt runs (codegen::VendorGemm), made ready in
// one CUDA context: its descriptors, and the algorithms cuBLASLt's
// heuristic offers for it, once; each launch then is one cublasLtMatmul on
// the caller's stream, into kiln's workspace (nothing allocated, so a CUDA
// graph can capture it).
//
// The heuristic's first algorithm is not always its best: on GPT-2's LM
// head (4096 x 50257 x 768, bf16) it took 3.3 ms where PyTorch's cuBLAS
// took 0.45 (bench/NOTES.md v0.36). So the first launch of each alignment
// class outside a CUDA-graph capture times the heuristic's candidates (up
// to kCandidates, each run once, then timed over kTimedRuns) on the
// caller's stream, waits for them, and keeps the fastest for every later
// launch. A launch under capture before that takes the heuristic's first.
// Every candidate computes the same product up to f32 reassociation
// (graph-format.md), so the choice can differ between processes. A
// symbolic M (VendorGemm::m_expr) gets its layouts, candidates and timing
// at the first launch of each M (kProblemsKept of them kept).
//
// kiln's matrices are row-major, cuBLASLt's column-major: D = A x B is
// asked as Dᵀ = Bᵀ x Aᵀ, each operand transposed or not as it lies.
#pragma once

#include <cuda.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

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

  // `args`: the kernel's arguments as bound (pointers); `sizes`: the bound sizes of a symbolic
  // graph (its M: VendorGemm::m_at), empty for an integer graph.
  Status launch(const CUdeviceptr* args, const ir::DimValues& sizes, CUstream stream) const;

  static constexpr int kCandidates = 8, kTimedRuns = 3;
  // A symbolic M's problems kept (each its layouts and timed algorithms); past it, the least
  // recently made goes (its M is made again when it comes back).
  static constexpr size_t kProblemsKept = 256;

 private:
  // The heuristic's algorithms for one alignment class, best first by its
  // estimate, and the index of the fastest as timed (-1: not yet).
  struct Algorithms {
    std::vector<cublaslt::Algo> candidates;
    mutable std::atomic<int> chosen{-1};
  };
  // The call at one M: cuBLASLt's layouts (its A is kiln's B, its B kiln's A, C and D), and the
  // algorithms for 16-byte aligned pointers (may be empty) and for pointers aligned to an element.
  struct Problem {
    explicit Problem(const cublaslt::Library& l, int64_t rows) : lt(l), m(rows) {}
    ~Problem();
    Problem(const Problem&) = delete;
    Problem& operator=(const Problem&) = delete;
    const cublaslt::Library& lt;
    int64_t m = 0;
    cublaslt::Layout a = nullptr, b = nullptr, d = nullptr;
    Algorithms aligned, unaligned;
  };
  struct Pointers {
    const void *a, *b;
    void *d, *workspace;
  };
  Expected<std::shared_ptr<const Problem>> make_problem(int64_t m) const;
  // The problem at M: the integer graph's, or a symbolic M's, made on its first launch (held by
  // the launch that uses it: another thread may drop it from by_m_ meanwhile).
  Expected<std::shared_ptr<const Problem>> problem_at(int64_t m) const;
  Status run(const Problem& problem, const Pointers& p, const cublaslt::Algo& algo, CUstream stream) const;
  // The algorithm a launch uses: the timed choice, timing the candidates
  // first where none is made and the stream is not capturing.
  Expected<const cublaslt::Algo*> algorithm(const Problem& problem, const Algorithms& algos, const Pointers& p,
                                            CUstream stream) const;

  VendorGemmCall(const cublaslt::Library& lt, const codegen::VendorGemm& call, int plan_kernel)
      : lt_(lt), call_(call), plan_kernel_(plan_kernel) {}
  Status make(const char* what, cublaslt::Status s) const;

  const cublaslt::Library& lt_;
  codegen::VendorGemm call_;
  int plan_kernel_;
  cublaslt::Handle handle_ = nullptr;
  cublaslt::MatmulDesc desc_ = nullptr;
  std::shared_ptr<const Problem> fixed_;  // an integer M's
  mutable std::deque<std::shared_ptr<const Problem>> by_m_;  // a symbolic M's, oldest made first
  mutable std::mutex problems_;  // (by_m_)
  mutable std::mutex timing_;    // (one thread times a class's candidates)
};

}  // namespace kiln::runtime
