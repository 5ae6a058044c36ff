// The tactics of matmul and conv kernels, in order of preference:
// cuBLASLt where the rule (or the tuning) picks it, mma.sync with the whole
// depth in one slice (a small K), the Hopper kernel (wgmma, TMA), the
// pipelined mma.sync tensor-core kernel, the f32 SIMT kernel.
//
// Expects: the GEMM view of a matmul or conv anchor (GemmGenerator::matmul,
// conv) and the tensor-core MMA that computes it exactly, if any.
// Guarantees: the first tactic that fits builds the kernel; SIMT, the last,
// always fits. Every refusal says why in words ("B ('w') has rows 4001
// elements apart ..."): the plan prints them (`kiln plan --arch`).
#include "codegen/gemm_generator.h"

namespace kiln::codegen {
namespace {

using Input = GemmGenerator::TacticInput;

// A vocabulary's projection: this many columns or more, over this depth or
// less, every matrix's rows a 16-byte multiple apart. (On rows of 50257
// bf16 the heuristic offers cuBLASLt's 2-byte-aligned kernels alone: H100,
// GPT-2's LM head took 3.04 ms against kiln's 0.79.)
constexpr int64_t kVocabularyColumns = 16384, kVocabularyDepth = 1024;
bool rows_of_16_bytes(const VendorGemm::Matrix& x) { return (x.leading() * byte_size(x.dtype)) % 16 == 0; }
bool vocabulary_projection(const VendorGemm& v) {
  return v.n >= kVocabularyColumns && v.k <= kVocabularyDepth && rows_of_16_bytes(v.a) && rows_of_16_bytes(v.b) &&
         rows_of_16_bytes(v.d);
}

// cuBLASLt, a floor under kiln's own kernels: where it computes the kernel
// exactly (vendor_codegen.cpp) and the rule, measured on the GPU machine,
// says it is faster; anywhere it can with --autotune's measured choice or
// KILN_VENDOR=always.
std::optional<std::string> cublaslt_fits(const GemmGenerator& gen, const Input& in) {
  if (!in.vendor) return in.vendor_why;
  if (gen.vendor_wanted_ == Tuning::kCublasLt || gen.vendors().always) return std::nullopt;
  if (gen.vendor_wanted_ == Tuning::kOwn) return "the tuning chose kiln's own kernel";
  // bench/vendor_gemm.py (H100, v0.36): f32 operands in full f32 took
  // cuBLASLt 0.65-0.72x the SIMT kernel's time (0.22x at 8 rows), and in
  // TF32 0.22x kiln's mma.sync kernel's; 16-bit operands 0.9-1.0x kiln's
  // tensor-core kernels, and 4.2x on rows of 50257 (no 16-byte multiple).
  if (!in.kind || *in.kind == GemmGenerator::Mma::tf32) return std::nullopt;
  // A vocabulary's projection (an LM head: N >= 16384 columns over K <=
  // 1024) writes more than its main loop computes per tile, and kiln's
  // kernel does not hide those writes as well as cuBLAS's: cuBLASLt's timed
  // algorithm (runtime/vendor_gemm.h). H100, the zoo's LM heads in their
  // models: Llama's 4096 x 32000 x 1024 0.325 ms (kiln's 0.382, PyTorch's
  // cuBLAS 0.368), Qwen2's 4096 x 151936 x 896 1.381 (2.044, 1.529).
  if (vocabulary_projection(*in.vendor)) return std::nullopt;
  return std::string("the rule keeps kiln's tensor-core kernels for 16-bit operands other than a vocabulary's "
                     "projection (--autotune times cuBLASLt beside them)");
}

Emitted cublaslt_emit(GemmGenerator& gen, const Input& in) {
  gen.gemm_vendor(*in.vendor);
  return gen.take();
}

// mma.sync with the whole depth in one slice: a small K over a GEMM that
// fills the GPU (one_slice_tile).
std::optional<std::string> one_slice_fits(const GemmGenerator& gen, const Input& in) {
  std::string why;
  if (gen.one_slice_tile(in.anchor, in.gm, in.kind, &why)) return std::nullopt;
  return why;
}

Emitted one_slice_emit(GemmGenerator& gen, const Input& in) {
  gen.gemm_tensor_core(in.anchor, in.gm, *in.kind, *gen.one_slice_tile(in.anchor, in.gm, in.kind, nullptr));
  return gen.take();
}

// The Hopper kernel: sm_90, 16-bit operands, a problem that fills the GPU
// with 128 x 128 tiles, operands its producer loads (wgmma_operands).
std::optional<std::string> wgmma_fits(const GemmGenerator& gen, const Input& in) {
  if (gen.sm() != 90) return fmt::format("the Hopper kernel needs sm_90, the target is sm_{}", gen.sm());
  if (!in.kind) return gen.no_mma_reason(in.anchor);
  std::string why;
  if (gen.wgmma_operands(in.anchor, in.gm, *in.kind, &why)) return std::nullopt;
  KILN_INTERNAL_CHECK(!why.empty());
  return why;
}

Emitted wgmma_emit(GemmGenerator& gen, const Input& in) {
  gen.gemm_wgmma(in.anchor, in.gm, *in.kind, *gen.wgmma_operands(in.anchor, in.gm, *in.kind));
  return gen.take();
}

// Tensor cores from sm_80 on, where an MMA computes the operands exactly.
std::optional<std::string> mma_sync_fits(const GemmGenerator& gen, const Input& in) {
  if (!in.kind) return gen.no_mma_reason(in.anchor);
  return std::nullopt;
}

Emitted mma_sync_emit(GemmGenerator& gen, const Input& in) {
  gen.gemm_tensor_core(in.anchor, in.gm, *in.kind, gen.mma_tile(in.gm, *in.kind));
  return gen.take();
}

// f32 tiles on the CUDA cores: any operands, any GPU.
std::optional<std::string> simt_fits(const GemmGenerator&, const Input&) { return std::nullopt; }

Emitted simt_emit(GemmGenerator& gen, const Input& in) {
  gen.gemm_simt(in.anchor, in.gm);
  return gen.take();
}

constexpr GemmGenerator::GemmTactic kTactics[] = {
    {"cublasLt", &cublaslt_fits, &cublaslt_emit},
    {"mma.sync one slice", &one_slice_fits, &one_slice_emit},
    {"wgmma", &wgmma_fits, &wgmma_emit},
    {"mma.sync", &mma_sync_fits, &mma_sync_emit},
    {"simt", &simt_fits, &simt_emit},
};

}  // namespace

std::span<const GemmGenerator::GemmTactic> GemmGenerator::tactics() { return kTactics; }

// A kernel cuBLASLt can take offers both to the tuning (Tuning::vendor):
// the heuristic's choice first, then the other.
auto GemmGenerator::gemm(const ir::Op& anchor, const Gemm& gm) -> Emitted {
  TacticInput in{anchor, gm, mma_kind(anchor), std::nullopt, {}};
  in.vendor = vendor_gemm(anchor, gm, in.kind, in.vendor_why);
  vendor_wanted_ = wanted_.vendor;
  wanted_.vendor = 0;  // kiln's own tactics choose among their own tunings
  const bool vendor_can = in.vendor.has_value();
  GeneratedKernel k = first_fitting(tactics(), *this, in, out_.tactics).emit(*this, in);
  if (vendor_can) {
    const Tuning vendor{.vendor = Tuning::kCublasLt}, own{.vendor = Tuning::kOwn};
    if (k.library) {
      k.tuning = vendor;
      k.tuning_space = {vendor, own};
    } else {
      if (vendor_wanted_ == Tuning::kOwn) k.tuning.vendor = Tuning::kOwn;
      if (k.tuning_space.empty()) k.tuning_space.push_back(k.tuning);
      k.tuning_space.push_back(vendor);
    }
  }
  return k;
}

}  // namespace kiln::codegen
