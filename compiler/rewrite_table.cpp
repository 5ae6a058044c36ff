// The rewrite table and its driver (rewrite_table.h).
#include "compiler/rewrite_table.h"

#include <optional>

#include <fmt/format.h>

#include "compiler/attention_rewrite.h"
#include "compiler/conv_channel_padding.h"
#include "compiler/error.h"
#include "compiler/layout_sinking.h"
#include "compiler/matmul_k_one.h"
#include "compiler/matmul_k_padding.h"
#include "compiler/nchw_convs_as_nhwc.h"
#include "compiler/patch_convolutions.h"
#include "compiler/rewrite_check.h"
#include "compiler/sdpa_as_matmuls.h"

namespace kiln::ir {
namespace {

// Each round applies at least one rewrite or ends the run; rows that undid
// one another would never reach a fixed point.
constexpr int kMaxRounds = 16;

std::string site_list(const RowMatches& m) {
  std::string out;
  for (const RewriteSite& s : m.sites) out += (out.empty() ? "" : "; ") + s.where;
  return out;
}

// The row's replacement; shape inference refusing one of its new ops is
// kiln's bug, not the graph's.
Graph replaced(const RewriteRow& row, const Graph& g, const RowMatches& m) {
  try {
    return row.replace(g, m);
  } catch (const detail::UserError& e) {
    detail::throw_internal_error(__FILE__, __LINE__, "row.replace(g, m)",
                                 fmt::format("rewrite {} at {}: {}", row.name, site_list(m), e.what()));
  }
}

}  // namespace

const std::vector<RewriteRow>& rewrite_table() {
  static const std::vector<RewriteRow> table = {
      {"patch_convolutions", find_patch_convs, patch_convs_as_matmuls},
      {"matmul_k_one", find_k_one_matmuls, k_one_matmuls_as_products},
      {"nchw_convs_as_nhwc", find_nchw_convs, nchw_convs_as_nhwc},
      {"attention_as_sdpa", find_written_attention, attention_as_sdpa},
      {"sdpa_as_matmuls", find_f32_sdpas, sdpas_as_matmuls},
      {"layout_sinking", find_sinkable_transposes, sink_transposes},
      {"conv_channel_padding", find_thin_convs, pad_conv_channels},
      {"matmul_k_padding", find_odd_k_matmuls, pad_matmul_k},
  };
  return table;
}

std::string op_named(const Graph& g, int32_t op) {
  const Op& o = g.ops[static_cast<size_t>(op)];
  return fmt::format("'{}' ({})", g.result(o).name, op_name(o.kind));
}

std::string rewrite_notes_text(const Graph& g) {
  std::string out;
  for (const RewriteNote& n : g.rewrites)
    out += n.applied ? fmt::format("rewrite {}: {}\n", n.row, n.where)
                     : fmt::format("not rewritten ({}): {}: {}\n", n.row, n.where, n.why);
  return out;
}

std::shared_ptr<const Graph> run_rewrites(const std::shared_ptr<const Graph>& graph) {
  return run_rewrites(graph, rewrite_table());
}

std::shared_ptr<const Graph> run_rewrites(const std::shared_ptr<const Graph>& graph, const std::vector<RewriteRow>& table) {
  std::optional<Graph> rewritten;  // once a row applies
  std::vector<RewriteNote> applied, declined;
  std::string last_round;  // the rows the last round applied, and where (for the error below)
  for (int round = 0;; ++round) {
    if (round == kMaxRounds)
      detail::throw_internal_error(__FILE__, __LINE__, "round < kMaxRounds",
                                   fmt::format("the rewrite table found no fixed point in {} rounds (the last applied {})",
                                               kMaxRounds, last_round));
    last_round.clear();
    bool changed = false;
    declined.clear();  // the near misses of the last round, which changes nothing
    for (const RewriteRow& row : table) {
      const Graph& g = rewritten ? *rewritten : *graph;
      RowMatches m = row.match(g);
      declined.insert(declined.end(), m.declined.begin(), m.declined.end());
      if (m.sites.empty()) continue;
      Graph next = replaced(row, g, m);
      if (const std::string problem = rewritten_graph_problem(g, next); !problem.empty())
        detail::throw_internal_error(__FILE__, __LINE__, "rewritten_graph_problem(g, next).empty()",
                                     fmt::format("rewrite {} at {}: {}", row.name, site_list(m), problem));
      for (const RewriteSite& s : m.sites) applied.push_back({std::string(row.name), true, s.where, ""});
      last_round += fmt::format("{}{} at {}", last_round.empty() ? "" : "; ", row.name, site_list(m));
      rewritten = std::move(next);
      changed = true;
    }
    if (!changed) break;
  }
  if (!rewritten && declined.empty()) return graph;
  Graph out = rewritten ? std::move(*rewritten) : *graph;
  out.rewrites = std::move(applied);
  out.rewrites.insert(out.rewrites.end(), declined.begin(), declined.end());
  return std::make_shared<const Graph>(std::move(out));
}

}  // namespace kiln::ir
