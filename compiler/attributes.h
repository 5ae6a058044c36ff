// Resolved op attributes. Construction (graph_construction.cpp) fills every
// attribute an op accepts: defaults applied, negative axes made non-negative,
// `axes` sorted, `scale` and pooling `stride` derived from the shapes. So two
// ops that compute the same thing have equal Attributes, whether or not the
// document spelt out the defaults: the hash and the printer rely on this.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/op_table.h"
#include "kiln/graph.h"

namespace kiln::ir {

using kiln::to_string;

// matmul/conv2d operand rounding (graph-format.md, numerics rule 5).
enum class Precision : uint8_t { f32, tf32, bf16, f16 };
enum class Layout : uint8_t { NHWC, NCHW };

std::string_view to_string(Precision p);
std::string_view to_string(Layout l);

struct Attributes {
  float alpha = 0.01f;                 // leaky_relu
  std::optional<float> min, max;       // clamp (each optional)
  std::vector<int64_t> axes;           // reduce_*: sorted, distinct, non-negative
  bool keepdims = false;               // reduce_*
  int64_t axis = 0;                    // norms: non-negative
  float eps = 0.0f;                    // norms
  int64_t groups = 1;                  // conv2d, group_norm
  Precision precision = Precision::f32;
  Layout layout = Layout::NHWC;        // conv2d, pooling
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  std::array<int64_t, 2> kernel{1, 1};  // pooling
  bool count_include_pad = true;        // avg_pool2d
  std::vector<int64_t> perm;            // transpose: non-negative
  std::vector<int64_t> shape;           // reshape: resolved (no -1)
  bool causal = false;                  // sdpa
  float scale = 1.0f;                   // sdpa
  int64_t start = 0, end = 0, step = 1;  // slice: resolved (clamped, non-negative); axis in `axis`
  // sdpa made by attention_as_sdpa from scores the graph rounds (never read
  // from or written to JSON: no document's sdpa rounds its scores): each
  // score rounded to `scores_rounded_to` at the points `score_roundings`
  // names (ScoreRounding bits), and the probabilities formed whole (the
  // division by the row's sum before they are rounded), as a softmax op
  // forms them (attention_rewrite.h).
  DType scores_rounded_to = DType::f32;
  uint8_t score_roundings = 0;

  bool operator==(const Attributes&) const = default;
};

// Where an sdpa's scores are rounded (Attributes::score_roundings):
// score = round(round(round(round(q·k) * scale) + mask) + mask2), each round
// where its bit is set; mask2 is the sdpa's fifth input, which only an sdpa
// attention_as_sdpa makes has (a shifted Swin window's bias, then its mask).
enum ScoreRounding : uint8_t { kRoundProduct = 1, kRoundScaled = 2, kRoundMasked = 4, kRoundMasked2 = 8 };
inline bool rounds_scores(const Attributes& a) { return a.score_roundings != 0; }
// "bf16 (q·kᵀ, scaled, masked)": the type and the points, for plans and IR dumps.
std::string score_rounding_text(DType to, uint8_t roundings);

// `value` as the double whose shortest decimal form is the shortest form of
// the f32 (0.01f -> 0.01): what printers and the JSON writer show. Reading it
// back as f32 gives `value` exactly.
double printable(float value);

// The resolved value of `key`, as its JSON value; nullopt where the op leaves
// it unset (clamp's min/max). Drives the printer, the writer and the hash.
std::optional<AttrValue> attr_value(const Attributes& attrs, AttrKey key);

}  // namespace kiln::ir
