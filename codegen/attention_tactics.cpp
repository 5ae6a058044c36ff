// The tactics of attention kernels, in order of preference: flash decoding
// (few query rows over many keys), the Hopper flash kernel (TMA + wgmma),
// the mma.sync flash kernel, the exact two-pass kernel.
//
// Expects: an attention kernel, its anchor an sdpa.
// Guarantees: the first tactic that fits builds the kernel; the exact
// two-pass kernel, the last, always fits (any types, any layout). Every
// refusal says why in words: the plan prints them (`kiln plan --arch`).
#include "codegen/attention_generator.h"

namespace kiln::codegen {
namespace {

using Generator = AttentionGenerator;

std::optional<std::string> decode_fits(const Generator& gen, const ir::Op& op) { return gen.why_not_decode(op); }

Emitted decode_emit(Generator& gen, const ir::Op& op) {
  gen.decode_attention(op);
  return gen.take();
}

std::optional<std::string> hopper_fits(const Generator& gen, const ir::Op& op) { return gen.why_not_hopper(op); }

Emitted hopper_emit(Generator& gen, const ir::Op& op) {
  gen.flash_attention_wgmma(op, gen.hopper_attention(op));
  return gen.take();
}

std::optional<std::string> flash_fits(const Generator& gen, const ir::Op& op) { return gen.why_not_flash(op); }

Emitted flash_emit(Generator& gen, const ir::Op& op) {
  gen.flash_attention(op);
  return gen.take();
}

std::optional<std::string> exact_fits(const Generator&, const ir::Op&) { return std::nullopt; }

Emitted exact_emit(Generator& gen, const ir::Op&) {
  gen.exact_attention();
  return gen.take();
}

constexpr Generator::AttentionTactic kTactics[] = {
    {"flash decoding", &decode_fits, &decode_emit},
    {"flash wgmma", &hopper_fits, &hopper_emit},
    {"flash mma.sync", &flash_fits, &flash_emit},
    {"exact two-pass", &exact_fits, &exact_emit},
};

}  // namespace

std::span<const AttentionGenerator::AttentionTactic> AttentionGenerator::tactics() { return kTactics; }

auto AttentionGenerator::attention() -> Emitted {
  const ir::Op& sdpa = g_.ops[static_cast<size_t>(k_.anchor)];
  const AttentionTactic& tactic = first_fitting(tactics(), *this, sdpa, out_.tactics);
  Emitted kernel = tactic.emit(*this, sdpa);
  // (a size bucket's variant asked for tiles of query rows: flash decoding refused it, why_not_decode)
  if (wanted_.tile_m == kFlashQueryRows) kernel.tuning.tile_m = kFlashQueryRows;
  return kernel;
}

}  // namespace kiln::codegen
