// An sdpa over f32 operands as two matmuls and a softmax: the
// sdpa_as_matmuls row of the rewrite table (rewrite_table.h).
//
// What it matches: an sdpa (not causal) whose q, k or v is stored as f32,
// whose scores [B, H, Sq, Skv] take at most kMatmulScoresBudget bytes in f32.
//
// What it makes, for sdpa(q, k, v, mask?) {scale} with result o:
//   k', v'  k and v with each of their Hkv heads repeated H / Hkv times
//           (reshape, expand, reshape; themselves where H = Hkv)
//   s = matmul(q, transpose(k')) with dtype f32, times scale (not where 1)
//   x = s + mask (a numeric mask), where(mask, s, -inf) (a bool one), or s
//   p = exp(x - max(x)) / sum(...), max and sum over the keys, keepdims
//   p = where(max(x) < -FLT_MAX, 0, p): a row that sees no key gives zeros
//   p cast to v's type where v holds f16/bf16 values (rule 6)
//   o = matmul(p, v') with o's dtype, under o's id.
//
// Numerics (graph-format.md rules 4 to 6): the sdpa's scores and softmax in
// f32, its probabilities rounded as it rounds them; the scale multiplies
// each f32 score once (one rounding apart from a scale applied inside the
// product's sum, as an FMA contraction is).
//
// Why. No flash kernel reads f32 operands: the sdpa would take the exact
// two-pass kernel, a block a query row that reads every key and value once
// per row (H200, BERT at f32, B32 S128: 5.0 ms a layer, PyTorch's
// memory-efficient f32 kernel 0.07). The SIMT matmuls, a softmax kernel
// between them and the scores through memory take ~0.1 ms there. Past the
// budget, and for causal masks (which need the key positions, which no kiln
// op computes), the sdpa stays. Written-out f32 attention comes here as the
// sdpa attention_as_sdpa makes of it (one form for every way of writing
// it); this row's softmax, its max raised to -FLT_MAX, is no form that row
// matches, so the two do not undo each other.
#pragma once

#include <optional>
#include <string>

#include "compiler/rewrite_table.h"

namespace kiln::ir {

inline constexpr int64_t kMatmulScoresBudget = int64_t{1} << 30;

// The matcher: each sdpa that runs as matmuls, a site; each sdpa over f32
// operands that stays, a near miss.
RowMatches find_f32_sdpas(const Graph& g);
// The replacement: each site's sdpa as the ops above.
Graph sdpas_as_matmuls(const Graph& g, const RowMatches& m);

}  // namespace kiln::ir
