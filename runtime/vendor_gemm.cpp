#include "runtime/vendor_gemm.h"

#include <fmt/format.h>

#include "runtime/cuda_driver.h"

namespace kiln::runtime {
namespace {

int data_type(DType t) {
  switch (t) {
    case DType::bf16: return cublaslt::kR16BF;
    case DType::f16: return cublaslt::kR16F;
    default: return cublaslt::kR32F;
  }
}

}  // namespace

Status VendorGemmCall::make(const char* what, cublaslt::Status s) const {
  if (s == cublaslt::kSuccess) return {};
  return Error{ErrorCode::CompileOrDevice, fmt::format("kernel {} ({}): {} failed: {}", plan_kernel_, call_.to_string(), what,
                                                       cublaslt::status_text(lt_, s))};
}

Expected<std::unique_ptr<VendorGemmCall>> VendorGemmCall::prepare(const codegen::VendorGemm& v, int plan_kernel) {
  Expected<const cublaslt::Library*> lt = cublaslt::library();
  if (!lt)
    return Error{ErrorCode::CompileOrDevice,
                 fmt::format("kernel {} is a cuBLASLt call, and {} (compile with KILN_VENDOR=off for kiln's own kernels)",
                             plan_kernel, lt.error().message)};
  std::unique_ptr<VendorGemmCall> c(new VendorGemmCall(**lt, v, plan_kernel));
  const cublaslt::Library& l = **lt;
  if (Status s = c->make("cublasLtCreate", l.create(&c->handle_)); !s) return s.error();
  const int compute = v.tf32 ? cublaslt::kCompute32FFastTF32 : cublaslt::kCompute32F;
  if (Status s = c->make("cublasLtMatmulDescCreate", l.desc_create(&c->desc_, compute, cublaslt::kR32F)); !s) return s.error();
  // cuBLASLt's A is kiln's B as N x K: stored [k][n] (column stride 1) it is that, untransposed.
  const bool b_rows = v.b.row_major(), a_rows = v.a.row_major();
  const int32_t trans_a = b_rows ? cublaslt::kOpN : cublaslt::kOpT, trans_b = a_rows ? cublaslt::kOpN : cublaslt::kOpT;
  if (Status s = c->make("setting TRANSA", l.desc_set(c->desc_, cublaslt::kDescTransA, &trans_a, sizeof trans_a)); !s) return s.error();
  if (Status s = c->make("setting TRANSB", l.desc_set(c->desc_, cublaslt::kDescTransB, &trans_b, sizeof trans_b)); !s) return s.error();
  if (!v.m_expr) {  // (a symbolic M's problems are made at launch)
    Expected<std::shared_ptr<const Problem>> fixed = c->make_problem(v.m);
    if (!fixed) return fixed.error();
    c->fixed_ = std::move(*fixed);
  }
  return c;
}

VendorGemmCall::Problem::~Problem() {
  for (cublaslt::Layout x : {a, b, d})
    if (x) lt.layout_destroy(x);
}

Expected<std::shared_ptr<const VendorGemmCall::Problem>> VendorGemmCall::make_problem(int64_t rows) const {
  const codegen::VendorGemm& v = call_;
  const cublaslt::Library& l = lt_;
  auto p = std::make_shared<Problem>(l, rows);
  auto layout = [&](cublaslt::Layout& out, const codegen::VendorGemm::Matrix& x, uint64_t r, uint64_t cols, int64_t ld) -> Status {
    if (Status s = make("cublasLtMatrixLayoutCreate", l.layout_create(&out, data_type(x.dtype), r, cols, ld)); !s) return s;
    if (v.batches == 1) return {};
    const int32_t count = static_cast<int32_t>(v.batches);
    const int64_t stride = x.batch_stride;
    if (Status s = make("setting BATCH_COUNT", l.layout_set(out, cublaslt::kLayoutBatchCount, &count, sizeof count)); !s) return s;
    return make("setting STRIDED_BATCH_OFFSET", l.layout_set(out, cublaslt::kLayoutStridedBatchOffset, &stride, sizeof stride));
  };
  const bool b_rows = v.b.row_major(), a_rows = v.a.row_major();
  const auto m = static_cast<uint64_t>(rows), n = static_cast<uint64_t>(v.n), k = static_cast<uint64_t>(v.k);
  if (Status s = b_rows ? layout(p->a, v.b, n, k, v.b.leading()) : layout(p->a, v.b, k, n, v.b.leading()); !s)
    return s.error();
  if (Status s = a_rows ? layout(p->b, v.a, k, m, v.a.leading()) : layout(p->b, v.a, m, k, v.a.leading()); !s)
    return s.error();
  if (Status s = layout(p->d, v.d, n, m, v.d.row_stride); !s) return s.error();

  // The algorithms: the heuristic's candidates under each alignment.
  auto pick = [&](uint32_t alignment, Algorithms& algos) -> Status {
    cublaslt::Preference preference = nullptr;
    if (Status s = make("cublasLtMatmulPreferenceCreate", l.preference_create(&preference)); !s) return s.error();
    const uint64_t bytes = static_cast<uint64_t>(v.workspace_bytes);
    cublaslt::Status status = l.preference_set(preference, cublaslt::kPrefMaxWorkspaceBytes, &bytes, sizeof bytes);
    for (int attribute : {cublaslt::kPrefMinAlignmentA, cublaslt::kPrefMinAlignmentB, cublaslt::kPrefMinAlignmentC,
                          cublaslt::kPrefMinAlignmentD})
      if (status == cublaslt::kSuccess) status = l.preference_set(preference, attribute, &alignment, sizeof alignment);
    cublaslt::HeuristicResult results[kCandidates]{};
    int found = 0;
    if (status == cublaslt::kSuccess)
      status = l.heuristic(handle_, desc_, p->a, p->b, p->d, p->d, preference, kCandidates, results, &found);
    l.preference_destroy(preference);
    if (Status s = make("cublasLtMatmulAlgoGetHeuristic", status); !s) return s;
    for (int i = 0; i < found && i < kCandidates; ++i)
      if (results[i].state == cublaslt::kSuccess) algos.candidates.push_back(results[i].algo);
    return {};
  };
  if (Status s = pick(16, p->aligned); !s) return s.error();
  if (Status s = pick(static_cast<uint32_t>(byte_size(v.a.dtype)), p->unaligned); !s) return s.error();
  if (p->unaligned.candidates.empty())
    return Error{ErrorCode::CompileOrDevice,
                 fmt::format("kernel {}: cuBLASLt has no algorithm for {} at M = {} (compile with KILN_VENDOR=off for kiln's "
                             "own kernels)", plan_kernel_, v.to_string(), rows)};
  return std::shared_ptr<const Problem>(std::move(p));
}

Expected<std::shared_ptr<const VendorGemmCall::Problem>> VendorGemmCall::problem_at(int64_t m) const {
  if (fixed_) return fixed_;
  {
    std::lock_guard<std::mutex> lock(problems_);
    for (const std::shared_ptr<const Problem>& p : by_m_)
      if (p->m == m) return p;
  }
  Expected<std::shared_ptr<const Problem>> made = make_problem(m);  // (host calls alone; two threads may both make one)
  if (!made) return made.error();
  std::lock_guard<std::mutex> lock(problems_);
  for (const std::shared_ptr<const Problem>& p : by_m_)
    if (p->m == m) return p;
  by_m_.push_back(*made);
  if (by_m_.size() > kProblemsKept) by_m_.pop_front();
  return made;
}

VendorGemmCall::~VendorGemmCall() {
  fixed_.reset();
  by_m_.clear();
  if (desc_) lt_.desc_destroy(desc_);
  if (handle_) lt_.destroy(handle_);
}

Status VendorGemmCall::run(const Problem& problem, const Pointers& p, const cublaslt::Algo& algo, CUstream stream) const {
  const float alpha = 1.0f, beta = 0.0f;
  // cuBLASLt's A is kiln's B, its B kiln's A (Dᵀ = Bᵀ x Aᵀ); C is D (beta 0).
  return make("cublasLtMatmul", lt_.matmul(handle_, desc_, &alpha, p.b, problem.a, p.a, problem.b, &beta, p.d, problem.d, p.d,
                                           problem.d, &algo, p.workspace, static_cast<size_t>(call_.workspace_bytes), stream));
}

Expected<const cublaslt::Algo*> VendorGemmCall::algorithm(const Problem& problem, const Algorithms& algos, const Pointers& p,
                                                          CUstream stream) const {
  if (const int chosen = algos.chosen.load(std::memory_order_acquire); chosen >= 0) return &algos.candidates[chosen];
  const cublaslt::Algo* first = &algos.candidates.front();
  if (algos.candidates.size() == 1) {  // (nothing to time)
    algos.chosen.store(0, std::memory_order_release);
    return first;
  }
  // Under a capture (or where the driver cannot say) the heuristic's first; timed at a later launch.
  const Driver* cu = loaded_driver();
  CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  if (!cu || cu->cuStreamIsCapturing(stream, &capturing) != CUDA_SUCCESS || capturing != CU_STREAM_CAPTURE_STATUS_NONE)
    return first;
  std::lock_guard<std::mutex> lock(timing_);
  if (const int chosen = algos.chosen.load(std::memory_order_acquire); chosen >= 0) return &algos.candidates[chosen];
  CUevent start = nullptr, stop = nullptr;
  if (Status s = check(cu->cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate"); !s) return s.error();
  if (Status s = check(cu->cuEventCreate(&stop, CU_EVENT_DEFAULT), "cuEventCreate"); !s) {
    cu->cuEventDestroy(start);
    return s.error();
  }
  int best = -1;
  float best_ms = 0;
  Status first_failure;
  for (size_t i = 0; i < algos.candidates.size(); ++i) {
    Status s = run(problem, p, algos.candidates[i], stream);  // (once untimed: the algorithm's first load)
    if (s) s = check(cu->cuEventRecord(start, stream), "cuEventRecord");
    for (int r = 0; r < kTimedRuns && s; ++r) s = run(problem, p, algos.candidates[i], stream);
    if (s) s = check(cu->cuEventRecord(stop, stream), "cuEventRecord");
    if (s) s = check(cu->cuEventSynchronize(stop), "timing cuBLASLt's algorithms");
    float ms = 0;
    if (s) s = check(cu->cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
    if (!s) {  // (an algorithm the heuristic offered that does not run here: the next)
      if (first_failure) first_failure = s;  // (the first failure: reported if none runs)
      continue;
    }
    if (best < 0 || ms < best_ms) best = static_cast<int>(i), best_ms = ms;
  }
  cu->cuEventDestroy(start);
  cu->cuEventDestroy(stop);
  if (best < 0) return first_failure.error();
  algos.chosen.store(best, std::memory_order_release);
  return &algos.candidates[static_cast<size_t>(best)];
}

Status VendorGemmCall::launch(const CUdeviceptr* args, const ir::DimValues& sizes, CUstream stream) const {
  Expected<std::shared_ptr<const Problem>> problem = problem_at(call_.m_at(sizes));
  if (!problem) return problem.error();
  const Problem& at = **problem;
  auto pointer = [&](const codegen::VendorGemm::Matrix& x) {
    return args[x.arg] + static_cast<CUdeviceptr>(x.offset * byte_size(x.dtype));
  };
  const CUdeviceptr a = pointer(call_.a), b = pointer(call_.b), d = pointer(call_.d);
  const bool aligned = !at.aligned.candidates.empty() && a % 16 == 0 && b % 16 == 0 && d % 16 == 0;
  const Pointers p{reinterpret_cast<const void*>(a), reinterpret_cast<const void*>(b), reinterpret_cast<void*>(d),
                   reinterpret_cast<void*>(args[call_.workspace_arg])};
  Expected<const cublaslt::Algo*> algo = algorithm(at, aligned ? at.aligned : at.unaligned, p, stream);
  if (!algo) return algo.error();
  return run(at, p, **algo, stream);
}

}  // namespace kiln::runtime
