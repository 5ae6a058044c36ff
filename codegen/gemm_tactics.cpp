// The tactics of matmul and conv kernels, in order of preference: the
// Hopper kernel (wgmma, TMA), the mma.sync tensor-core kernel, the f32 SIMT
// kernel.
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
  gen.gemm_tensor_core(in.anchor, in.gm, *in.kind);
  return gen.take();
}

// f32 tiles on the CUDA cores: any operands, any GPU.
std::optional<std::string> simt_fits(const GemmGenerator&, const Input&) { return std::nullopt; }

Emitted simt_emit(GemmGenerator& gen, const Input& in) {
  gen.gemm_simt(in.anchor, in.gm);
  return gen.take();
}

constexpr GemmGenerator::GemmTactic kTactics[] = {
    {"wgmma", &wgmma_fits, &wgmma_emit},
    {"mma.sync", &mma_sync_fits, &mma_sync_emit},
    {"simt", &simt_fits, &simt_emit},
};

}  // namespace

std::span<const GemmGenerator::GemmTactic> GemmGenerator::tactics() { return kTactics; }

auto GemmGenerator::gemm(const ir::Op& anchor, const Gemm& gm) -> Emitted {
  const TacticInput in{anchor, gm, mma_kind(anchor)};
  return first_fitting(tactics(), *this, in, out_.tactics).emit(*this, in);
}

}  // namespace kiln::codegen
