// The generator of attention kernels (attention_codegen.cpp): flash
// attention on tensor cores (templates/kiln/attention.cuh) and the exact
// two-pass kernel for what it does not take (f32 or mixed operands); which
// of them builds a kernel is the ordered list of attention_tactics.cpp.
// Every attention kernel's anchor is an sdpa: written-out attention became
// one before planning (compiler/attention_rewrite.h).
#pragma once

#include "codegen/kernel_builder.h"
#include "codegen/tactic.h"

namespace kiln::codegen {

class AttentionGenerator : public KernelBuilder {
 public:
  using KernelBuilder::KernelBuilder;

  // ---- tactics: attention_tactics.cpp -----------------------------------------------
  // In order of preference: flash decoding, the Hopper flash kernel, the
  // mma.sync flash kernel, the exact two-pass kernel (the last resort:
  // always fits). Each sees the sdpa.
  using AttentionTactic = Tactic<AttentionGenerator, ir::Op>;
  // Flash decoding takes at least this many keys; below, the flash kernels' tiles of query rows
  // (a symbolic cache length whose range reaches below it: a size bucket's variant, asked for by
  // Tuning::tile_m = kFlashQueryRows).
  static constexpr int64_t kDecodeFewestKeys = 512;
  static constexpr int kFlashQueryRows = 128;
  static std::span<const AttentionTactic> tactics();
  // The kernel of the first tactic that fits the kernel's sdpa.
  Emitted attention();

  // ---- attention on tensor cores: templates/kiln/attention.cuh -------------------
  // sdpa with q, k, v in memory as one 16-bit type (through transposes),
  // d contiguous, head dimension a multiple of 16 up to 256; else why not.
  std::optional<std::string> why_not_flash(const ir::Op& op) const;
  // Keys the mma.sync kernel's one tile holds: the rows of rounded scores
  // it takes, their probabilities formed whole; 64 for head dimensions up to
  // 128, and up to 160 (a tile of the row's keys rounded up to 16: Swin-B's
  // windows of 12 x 12 at 384 pixels) for head dimensions up to 64, its
  // scores 80 registers a thread.
  static constexpr int64_t kWholeRowKeys = 160;
  static int64_t whole_row_keys(int64_t head_dim) { return head_dim <= 64 ? kWholeRowKeys : 64; }
  // k or v of an sdpa as the flash kernel reads it: a tensor in memory and
  // its head count; grouped-query heads written as reshape -> expand ->
  // reshape of a [B, Hkv, S, D] tensor (PyTorch's repeat_kv) read in place.
  struct AttentionOperand {
    ExternalTensor memory;
    int64_t heads = 0;
  };
  std::optional<AttentionOperand> attention_operand(ir::TensorId t) const;

  void flash_attention(const ir::Op& op);

  // ---- attention on Hopper: templates/kiln/attention_wgmma.cuh ---------------------
  // The kernel decided before it is written: tiles, stages, the operands'
  // copy-engine maps.
  struct HopperAttention {
    struct Operand {
      ExternalTensor memory;
      ir::TensorId tensor = -1;  // whose pointer the map is encoded from
      TensorMapSpec map;         // (d, row, head, batch); the box set when written
    };
    Operand q, k, v;
    DType type = DType::bf16;
    int64_t batches = 0, heads = 0, kv_heads = 0, sq = 0, skv = 0;
    int head_dim = 0, padded_dim = 0, bkv = 0, stages = 0, shared_bytes = 0;
    bool causal = false;
    std::string to_string() const;
  };
  // sm_90 and operands the copy engine loads; else why not.
  std::optional<std::string> why_not_hopper(const ir::Op& op) const;
  HopperAttention hopper_attention(const ir::Op& op);
  std::optional<HopperAttention::Operand> hopper_operand(const ExternalTensor& e, const Shape& shape) const;
  void flash_attention_wgmma(const ir::Op& op, const HopperAttention& a);

  // ---- flash decoding: templates/kiln/attention_decode.cuh ------------------------------
  // Few query rows a key head (at most 16) over at least 512 keys; else why not.
  std::optional<std::string> why_not_decode(const ir::Op& op) const;
  void decode_attention(const ir::Op& op);

  // Pieces the kernels share: the score hook (`coordinates` defines qi and
  // kj, and hi where the kernel's rows span heads, from row and key), and
  // the output loops.
  std::string score_hook(const ir::Op& op, bool causal_in_hook, const std::string& coordinates, bool scale_in_softmax = false);
  // The score from the dot product `dot` (scaled unless scale_in_softmax)
  // and the masks' values there (`mask_values`: inputs 3 and on; a bool
  // mask alone), rounded where the sdpa's scores are
  // (Attributes::score_roundings).
  static std::string score_of(const ir::Op& op, const std::string& dot, const std::vector<std::string>& mask_values,
                              bool bool_mask, bool scale_in_softmax);
  // The values of the sdpa's masks (inputs 3 and on) at the scores'
  // coordinates `full` (b, h, query, key), into the emitter's open block.
  std::vector<std::string> mask_values(const ir::Op& op, const Coords& full);
  std::string flash_outputs(const ir::Op& op, int64_t head_dim, bool padded);
  std::string attention_outputs(const ir::Op& op, const std::string& open, const std::string& value);
  struct PairText;
  void output_element(const ir::Op& op, const std::string& value, PairText* pairs);

  // ---- attention without tensor cores: a block per query row, exact softmax in
  // two passes (f32 or mixed operands).

  // Pass 1 finds the row's max and sum, pass 2 forms each probability as
  // sdpa defines it (rounded to v's type) and accumulates p * v.
  void exact_attention();
  // The exact two-pass attention kernel (what flash attention does not take).
  struct ExactAttention {
    const ir::Op* last = nullptr;      // the anchor: the sdpa
    int64_t sq = 0, skv = 0, dq = 0, dv = 0, batches = 0, heads_per_kv = 1;
    Shape batch_shape;
    int per_thread = 1;                // output columns per thread (128 threads)
  };
  ExactAttention exact_attention_shape() const;
  std::string exact_attention_score(const ExactAttention& a, const Coords& bc, const std::string& j);
  std::string exact_attention_pass2(const ExactAttention& a, const Coords& bc);

};

}  // namespace kiln::codegen
