// The attention_as_sdpa row's matcher (attention_rewrite.h says what it
// matches and why): a written-out attention found from its last matmul,
// described for the replacement (attention_rewrite.cpp), or why it is not
// one.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "compiler/ir.h"

namespace kiln::ir {

// One op on the scores between q·kᵀ and the softmax, in the order they run.
struct ScoreStep {
  enum class Kind : uint8_t { Scale, Add, Fill };
  Kind kind = Kind::Scale;
  float constant = 1.0f;         // Scale: the factor or divisor; Fill: the fill value
  bool divide = false;           // Scale: the scores divided by `constant`
  bool negate = false;           // Add: subtracted
  bool fill_where_true = false;  // Fill: where(cond, fill, s) (masked_fill), not where(cond, s, fill)
  TensorId side = -1;            // Add: the tensor added; Fill: the condition
  Shape space;                   // the op's result, to which `side` broadcasts
};

// A constant factor on q or on kᵀ before q·kᵀ (DistilBERT's q / sqrt(d)),
// folded into the sdpa's scale: the operand is `views` applied to `source`.
struct OperandScale {
  TensorId source = -1;         // what the constant multiplies
  std::vector<int32_t> views;   // the view ops from the product to the matmul's operand, in order
  double factor = 1.0;
};

struct AttentionMatch {
  int32_t pv = -1;               // matmul(p, v): the op whose result the sdpa makes
  std::vector<int32_t> ops;      // every op the sdpa replaces
  TensorId q = -1, kt = -1, v = -1;  // the matmuls' operands as written
  std::optional<OperandScale> q_scale, kt_scale;  // q or kᵀ a constant times a tensor: the tensor instead
  Shape qk_batch, pv_batch;      // the two matmuls' batch dimensions (their results' but the last two)
  Shape heads;                   // the sdpa's [B, H]
  int64_t sq = 0, skv = 0, d = 0;
  std::vector<ScoreStep> steps;
  double scale = 1.0;  // the steps' and the operands' factors
  // Scores the graph rounds (Attributes::score_roundings): to this type, at these points.
  DType scores_rounded_to = DType::f32;
  uint8_t score_roundings = 0;
};

// The written-out attention that ends at matmul op `pv`, or why op `pv` is
// not one (a near miss); nullopt where its first operand is not a
// softmax's probabilities (not attention at all).
using AttentionOrWhy = std::variant<AttentionMatch, std::string>;
std::optional<AttentionOrWhy> match_attention(const Graph& g, int32_t pv);

// Scores rounded to 16 bits are rewritten only where a row's keys fit one
// tile of the flash kernel (its probabilities formed whole, as the graph's
// softmax forms them): Swin's windows of 7 x 7, 8 x 8 and 12 x 12 (the
// kernel holds 160 keys at head dimensions up to 64, 64 up to 128; past
// that the exact kernel takes them, rounding the same way).
inline constexpr int64_t kRoundedScoresMaxKeys = 160;

// The fill values (after the scales that follow them) at most this much
// mask their keys out: exp(fill - row max) is 0 in f32 for any row max above
// fill + 104.
inline constexpr double kMaskingFill = -1e4;

}  // namespace kiln::ir
