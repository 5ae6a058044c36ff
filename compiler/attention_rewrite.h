// Written-out attention as sdpa: the attention_as_sdpa row of the rewrite
// table (rewrite_table.h).
//
// What it matches, from the last op back:
//   o = matmul(p', v')        p' the probabilities through views that only
//                             regroup batch dimensions (reshape keeping the
//                             last two, expand to the same shape) and casts
//   p = softmax(x, last axis) or written out: exp(x - max(x)) / sum(...),
//                             max and sum over the last axis, keepdims
//   x = the scores through    mul or div by a constant (the scale),
//       any of, in any order: add of a tensor (an additive mask or position
//                             bias, any broadcast), sub of one, where(cond,
//                             s, c) or where(cond, c, s) with a constant
//                             fill c (a bool mask: masked_fill), views that
//                             regroup batch dimensions, casts to f32
//   s = matmul(q', kᵀ')       q', kᵀ' and v' through views and
//                             broadcasting batch dimensions; q' or kᵀ' may
//                             be a constant times a tensor (q / sqrt(d)).
// Each intermediate is read only by the next step and is not a graph
// output.
//
// What it makes: sdpa(q, k, v, mask) {scale = the product of the constants,
// causal = false}, q, k, v the operands as [B, H, S, D] views of the
// tensors the matmuls read (reshapes regrouping batch dimensions and
// transposes removed where they cancel, added where they do not, expands
// where a matmul broadcast; a constant factor on q or kᵀ left out and
// folded into the scale), B and H the probabilities' batch dimensions (more
// than two: the leading ones merged into B). The mask: one fill alone ->
// its condition as sdpa's bool mask (for masked_fill's sense negated: an eq
// or ne behind views inverted, NaN included, else cast(cond) == 0);
// otherwise an additive mask, the sum of the added tensors and each fill as
// where(cond, ..., c), every term carried through the scales after it, each
// broadcasting to [B, H, Sq, Skv] (regrouped by views where it was added in
// another view of the scores). The result is o's tensor (a reshape of the
// sdpa's where o is not [B, H, Sq, D]); ops that only fed the replaced ops
// go too.
//
// Numerics (graph-format.md rules 4 to 6; a rewrite may not drop a rounding
// the graph asks for). It matches only where the sdpa computes what the
// chain does, up to f32 rounding of the same operations:
//   - the scores are f32 values from q·kᵀ to the softmax: no op on them
//     rounds to f16/bf16 (sdpa keeps its scores in f32); or they are
//     rounded to q's, k's and v's 16-bit type where the graph rounds them,
//     which the sdpa then does too (Attributes::score_roundings): scores
//     round(round(round(round(q·kᵀ) * scale) + mask) + mask2), each
//     rounding where the graph has one, at most one scale and then at most
//     two added tensors (the second the sdpa's fifth input, which only
//     this rewrite gives an sdpa), no fill, rows of at most
//     kRoundedScoresMaxKeys keys; its kernels
//     form those probabilities whole (divided by the row's sum, then
//     rounded), as the graph's softmax does (a bf16 Swin's window
//     attention);
//   - the probabilities reach v as sdpa's do (rule 6): rounded to v's type
//     where v holds f16/bf16 values (the softmax's dtype, a cast, or p·v's
//     precision), f32 where v holds f32;
//   - neither matmul's precision rounds an f32 operand the sdpa reads as is;
//   - a division by c becomes the scale 1/c, and a factor on q or kᵀ moves
//     onto the scores (exact where c is a power of two, else one f32
//     rounding of each score or product apart, as an FMA contraction is);
//     not where the scaled q or kᵀ is rounded to 16 bits;
//   - a fill c reads as masking the key out: it must be at most -1e4 after
//     the scales that follow it, so that exp(c - row max) is 0 in f32 in
//     every row whose best visible score is above c + 104 (any row with a
//     key in view, in practice).
// Where they differ: a row whose keys are all masked (by fills, or by an
// additive mask of -inf): the chain gives v's mean (c everywhere) or NaN
// (-inf everywhere), sdpa zeros (rule 6: a query that sees no key).
// Near misses stay as written, each with why (the rewrites' notes, printed
// by the plan): the probabilities read elsewhere, a softmax over another
// axis, a mask computed from the scores, a scale that is not a constant, an
// op on the scores that is none of the above, a rounding, v's head
// dimension unlike q's.
#pragma once

#include "compiler/rewrite_table.h"

namespace kiln::ir {

// The matcher: each written-out attention a site (its detail an
// AttentionMatch, attention_match.h); each matmul whose first operand is a
// softmax's probabilities but that is not one, a near miss.
RowMatches find_written_attention(const Graph& g);
// The replacement: each site as one sdpa.
Graph attention_as_sdpa(const Graph& g, const RowMatches& m);

}  // namespace kiln::ir
