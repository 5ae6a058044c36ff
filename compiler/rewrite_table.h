// The graph rewrites that run before planning: one table, each row a name,
// a matcher and a replacement, and one driver that runs the rows to a fixed
// point. (The idea is Inductor's pattern table, fx_passes/fuse_attention.py:
// a search, a replacement, one row each.)
//
// The rows, in the order each round runs them:
//   patch_convolutions   conv2d whose windows tile its input -> matmul of its
//                        patches (patch_convolutions.h)
//   matmul_k_one         matmul over K = 1 -> the broadcast product
//                        (matmul_k_one.h)
//   nchw_convs_as_nhwc   NCHW conv2d -> transposes around an NHWC conv2d
//                        (nchw_convs_as_nhwc.h)
//   attention_as_sdpa    matmul -> scale/mask -> softmax -> matmul -> sdpa
//                        (attention_rewrite.h)
//   sdpa_as_matmuls      sdpa over f32 operands -> matmul, softmax, matmul
//                        (sdpa_as_matmuls.h)
//   layout_sinking       transposes past the ops that do not care about the
//                        order of dimensions (layout_sinking.h)
//   conv_channel_padding thin channels-last convs read zero-padded channels
//                        (conv_channel_padding.h)
//   matmul_k_padding     16-bit matmuls with K no multiple of 8 read their
//                        operands zero-padded along K, where the GEMM pays
//                        for the copies (matmul_k_padding.h)
// A row finds every place it applies in one scan and rewrites them all in
// one rebuild; a round runs every row in order; rounds repeat until one
// changes nothing.
//
// Expects: a constructed Graph (graph_construction.cpp), as written.
// Guarantees: the graph the planner takes, or the given one itself when no
// row matches. After each rewrite the graph is checked (rewrite_check.h):
// the same inputs and outputs under the same ids, with the same shapes,
// dtypes and rounding; every op in evaluation order and of the shape that
// shape inference gives it; bool values read only where the format allows.
// A failed check is an internal error naming the row and the sites. Its
// `rewrites` lists each rewrite applied, where, and each near miss the last
// round's matchers declined, with why. The graph as written (its hash, JSON
// and IR dump) is not touched.
#pragma once

#include <any>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir.h"

namespace kiln::ir {

// One place a row applies.
struct RewriteSite {
  int32_t op = -1;     // the op it replaces (of several, the last)
  std::string where;   // for the log: the ops it replaces and what they become
  std::any detail;     // what the row's replacement needs (the row's own type)
};

// What a row's matcher found in a graph.
struct RowMatches {
  std::vector<RewriteSite> sites;          // disjoint: each op in one site at most
  std::vector<RewriteNote> declined;       // near misses, each with why
};

struct RewriteRow {
  std::string_view name;
  RowMatches (*match)(const Graph& g);
  // `g` with the row applied at every site of `m` (m.sites not empty).
  Graph (*replace)(const Graph& g, const RowMatches& m);
};

// The table, in the order a round runs it.
const std::vector<RewriteRow>& rewrite_table();

// How notes name an op: "'probs' (softmax)", by its result's name, which
// stays the same across the rewrites (op indices do not).
std::string op_named(const Graph& g, int32_t op);

// One line per note of g.rewrites ("rewrite ROW: WHERE", "not rewritten
// (ROW): WHERE: WHY"): what the plan's text and the dumps print.
std::string rewrite_notes_text(const Graph& g);

// The driver: `table` (rewrite_table() but for tests) to a fixed point.
std::shared_ptr<const Graph> run_rewrites(const std::shared_ptr<const Graph>& graph);
std::shared_ptr<const Graph> run_rewrites(const std::shared_ptr<const Graph>& graph,
                                          const std::vector<RewriteRow>& table);

}  // namespace kiln::ir
