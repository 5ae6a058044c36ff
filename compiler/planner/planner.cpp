#include "compiler/planner/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <queue>
#include <set>
#include <unordered_map>

#include "compiler/error.h"
#include "compiler/memory_budget.h"
#include "compiler/planner/strategies.h"
#include "compiler/planner/strided_operands.h"

namespace kiln::ir {
namespace {

// A normalisation prologue is recomputed for each column tile of the
// matmul: it pays only while the output has at most two 128-wide tiles.
constexpr int64_t kNormPrologueMaxColumns = 256;
// The tile width that rule counts in (the Hopper kernel's 128 columns).
constexpr int64_t kPrologueTileColumns = 128;
// An attention mask computed in the kernel's loads is computed once per
// score, for every head and query that broadcasts it: past this many ops
// (views not counted) it is written once and read instead (a shifted Swin
// window's mask from its region map, five ops and two gathers a score: its
// attention ran at twice the unshifted one's time, H200). BERT's
// (1 - mask) * min, two ops, stays in the loads.
constexpr size_t kMaskPrologueMaxOps = 3;
// Ops one kernel may compute: bounds its source, codegen's expression depth
// and NVRTC time (a 100 000-op chain becomes several kernels).
constexpr size_t kMaxOpsPerKernel = 256;

using planner::Group;
using planner::pointwise_like;
using planner::Verdict;

bool is_view(OpKind k) { return op_info(k).family == OpFamily::View; }
// A boundary's reason gains a clause once (a tensor's readers may name it twice).
void append_once(std::string& reason, const std::string& clause) {
  if (reason.find(clause) == std::string::npos) reason += clause;
}
bool is_anchor(OpKind k) {
  const OpFamily f = op_info(k).family;
  return f == OpFamily::Matmul || f == OpFamily::Conv || f == OpFamily::Attention;
}

class Planner {
 public:
  // `kept_from_siblings`: ops that start or join a kernel of their own producers only, never a
  // sibling's (see sibling_joins_that_cross_memory).
  Planner(const Graph& g, const PlanOptions& options, std::set<int32_t> kept_from_siblings = {})
      : g_(g),
        options_(options),
        owner_(g.tensors.size(), -1),
        written_once_(planner::strided_operands(g, options.cublaslt_f32_matmuls)),
        kept_from_siblings_(std::move(kept_from_siblings)) {}

  Plan run() {
    for (size_t i = 0; i < g_.ops.size(); ++i) place(static_cast<int32_t>(i));
    if (options_.fuse) {
      absorb_prologues();
      split_norm_prologues();
      split_held_rows_prologues();
      recompute_cheap_producers();
      fuse_horizontally();
    }
    place_output_views();
    return finish();
  }

  // Ops that joined a sibling kernel (one reading the same inputs, not their result) whose
  // result that kernel then writes for another kernel to read back: without the join, the op
  // would start a kernel of its own and its reader could compute it there. Call after run().
  std::set<int32_t> sibling_joins_that_cross_memory() const {
    std::set<int32_t> crossing;
    const auto read_elsewhere = readers_outside_producers();
    std::set<TensorId> output_sources;
    for (TensorId t : g_.outputs) output_sources.insert(source(t));
    for (int32_t oi : sibling_joined_) {
      const TensorId t = g_.ops[static_cast<size_t>(oi)].output;
      if (read_elsewhere.count(t) && !output_sources.count(t)) crossing.insert(oi);
    }
    return crossing;
  }

 private:
  // ---- views -----------------------------------------------------------
  const Op* producer(TensorId t) const {
    const Tensor& tensor = g_.tensor(t);
    return tensor.kind == TensorKind::OpResult ? &g_.ops[static_cast<size_t>(tensor.producer)] : nullptr;
  }
  // A view folded into the kernels that read it: every view but the
  // transposes a copy writes once (start_copy).
  bool folded(const Op* op) const { return op && is_view(op->kind) && !written_once_.count(op->output); }
  // The tensor a value is a view of (itself if it is not a view, or a view
  // written once).
  TensorId source(TensorId t) const {
    while (const Op* op = producer(t)) {
      if (!folded(op)) break;
      t = op->inputs[0];
    }
    return t;
  }
  int owner_of(TensorId t) const { return owner_[static_cast<size_t>(source(t))]; }

  // ---- groups ----------------------------------------------------------
  Group& group(int id) { return groups_[static_cast<size_t>(id)]; }

  int new_group(KernelKind kind, int32_t op_index) {
    Group gr;
    gr.kind = kind;
    const Op& op = g_.ops[static_cast<size_t>(op_index)];
    const Shape& out = g_.result(op).shape;
    const OpFamily family = op_info(op.kind).family;
    const bool reduces = family == OpFamily::Reduce || family == OpFamily::Pool;
    gr.domain = reduces || kind == KernelKind::Norm ? g_.operand(op, 0).shape : out;
    gr.count[0] = element_count(gr.domain);
    const int id = append_group(std::move(gr));
    add(id, op_index, reduces ? 1 : 0);
    return id;
  }

  // A group (its id the next one's) with no edges yet.
  int append_group(Group gr) {
    gr.id = static_cast<int>(groups_.size());
    groups_.push_back(std::move(gr));
    succ_.emplace_back();
    forward_.push_back(-1);
    return groups_.back().id;
  }

  // Adds an op (with the views its operands are read through) to a group.
  void add(int gid, int32_t op_index, int stage) {
    Group& gr = group(gid);
    const Op& op = g_.ops[static_cast<size_t>(op_index)];
    const OpFamily family = op_info(op.kind).family;
    const bool fresh = gr.ops.empty();  // the op that starts the group
    const bool convertible = fresh || gr.kind == KernelKind::Pointwise;
    gr.ops.insert(op_index);
    for (TensorId t : op.inputs) {
      std::vector<int>& readers = readers_[source(t)];
      if (readers.empty() || readers.back() != gid) readers.push_back(gid);
    }
    for (TensorId t : op.inputs)
      for (const Op* p = producer(t); folded(p); p = producer(p->inputs[0])) {
        gr.ops.insert(g_.tensor(p->output).producer);
        if (owner_of(p->inputs[0]) == gid) gr.stage[p->output] = gr.stage[source(p->inputs[0])];
      }
    for (TensorId t : op.inputs)
      if (const int from = owner_of(t); from >= 0 && from != gid) succ_[static_cast<size_t>(from)].insert(gid);
    gr.stage[op.output] = stage;
    if (stage == 0 && reads_after_reduction(gid, op)) {
      gr.after_reduction.insert(op.output);
      if (!gr.holds_rows)
        gr.notes.push_back(fmt::format("rows held: each row of {} elements stays on chip and the finished reductions "
                                       "are read back at its elements, one read of the row for every pass",
                                       element_count(gr.domain) / std::max<int64_t>(gr.count[1], 1)));
      gr.holds_rows = true;
    }
    owner_[static_cast<size_t>(op.output)] = gid;
    if (stage == 1) gr.count[1] = element_count(g_.result(op).shape);
    if (is_anchor(op.kind) && gr.anchor < 0) gr.anchor = op_index;
    if (family == OpFamily::Norm && op.kind != OpKind::BatchNorm && convertible) {
      gr.kind = KernelKind::Norm;
      gr.norm_op = op_index;
    }
    if (family == OpFamily::Reduce && convertible) {
      gr.kind = KernelKind::Reduction;
      gr.domain = g_.operand(op, 0).shape;
      gr.reduce_axes = op.attrs.axes;
    } else if (family == OpFamily::Reduce && (gr.kind == KernelKind::Matmul || gr.kind == KernelKind::Conv)) {
      ++gr.epilogue_reductions;
    }
    if (family == OpFamily::Pool && gr.kind == KernelKind::Conv) gr.epilogue_pool = true;
    if (family == OpFamily::Pool && convertible) {
      gr.kind = KernelKind::Reduction;
      gr.pooling = true;
      gr.domain = g_.operand(op, 0).shape;
    }
  }

  // Whether group `to` depends on group `from` (a path from -> ... -> to).
  bool depends(int to, int from) const {
    if (to == from) return true;
    std::vector<int> stack{from};
    std::vector<bool> seen(groups_.size(), false);
    seen[static_cast<size_t>(from)] = true;
    while (!stack.empty()) {
      const int cur = stack.back();
      stack.pop_back();
      for (int next : succ_[static_cast<size_t>(cur)]) {
        if (next == to) return true;
        if (!seen[static_cast<size_t>(next)]) seen[static_cast<size_t>(next)] = true, stack.push_back(next);
      }
    }
    return false;
  }

  // ---- step 2: greedy placement ------------------------------------------
  void place(int32_t op_index) {
    const Op& op = g_.ops[static_cast<size_t>(op_index)];
    if (written_once_.count(op.output)) return start_copy(op_index);
    if (is_view(op.kind)) return;  // folded into the kernels that read it
    if (!options_.fuse || is_anchor(op.kind)) {
      new_group(planner::kind_for(g_, op), op_index);
      return;
    }
    // Candidate groups: those owning an operand, in operand order.
    std::vector<int> candidates;
    for (TensorId t : op.inputs) {
      const int gid = owner_of(t);
      if (gid >= 0 && std::find(candidates.begin(), candidates.end(), gid) == candidates.end()) candidates.push_back(gid);
    }
    for (int gid : candidates) {
      const std::optional<std::string> why = why_not_join(gid, op);
      if (!why) {
        // Producer kernels of the op's other operands that `gid` does not
        // read yet may merge in (see merge_producer_groups).
        std::vector<int> mergeable;
        for (int hid : candidates)
          if (hid != gid && !succ_[static_cast<size_t>(hid)].count(gid)) mergeable.push_back(hid);
        add(gid, op_index, join_stage_);
        merge_producer_groups(gid, join_stage_, mergeable);
        return;
      }
      for (TensorId t : op.inputs)
        if (owner_of(t) == gid) reasons_.emplace(std::make_pair(source(t), op_index), *why);
    }
    // Siblings: a kernel that already reads the same tensors over the same
    // space takes the op (one pass over the shared input instead of two).
    const bool kept_apart = kept_from_siblings_.count(op_index) > 0;
    if (op_info(op.kind).family != OpFamily::Norm && op_info(op.kind).family != OpFamily::Pool && !kept_apart) {
      for (int gid : sibling_candidates(op)) {
        if (std::find(candidates.begin(), candidates.end(), gid) != candidates.end()) continue;
        const Group& gr = group(gid);
        if (full(gid) || !why_vendor_alone(gr).empty()) continue;
        const planner::Verdict v = planner::can_take(g_, gr, op, 0);
        if (v.ok && !creates_cycle(gid, op)) {
          add(gid, op_index, v.stage);
          sibling_joined_.push_back(op_index);
          return;
        }
      }
    }
    const int gid = new_group(planner::kind_for(op.kind), op_index);
    if (kept_apart)
      group(gid).notes.push_back(fmt::format("'{}' kept out of a sibling kernel: that kernel would write it for its "
                                             "reader to load back",
                                             g_.result(op).name));
  }

  // A conv operand that its kernel could read only element by element,
  // written once by a kernel of its own (strided_operands.h): a copy,
  // unless pointwise ops over the same input join it as siblings (it starts
  // as a pointwise group, which the plan calls a copy while it holds only
  // views; absorb_prologues keeps it out of the conv's loads).
  void start_copy(int32_t op_index) {
    const TensorId t = g_.ops[static_cast<size_t>(op_index)].output;
    new_group(KernelKind::Pointwise, op_index);
    for (int32_t user : g_.users[static_cast<size_t>(t)]) reasons_.emplace(std::make_pair(t, user), written_once_.at(t));
  }

  // Groups that read one of the op's operands (by source), newest first
  // (through the readers index: linear in the graph, not quadratic).
  std::vector<int> sibling_candidates(const Op& op) const {
    std::vector<int> out;
    for (TensorId t : op.inputs) {
      const TensorId s = source(t);
      if (g_.tensor(s).kind == TensorKind::Constant) continue;
      auto it = readers_.find(s);
      if (it == readers_.end()) continue;
      for (int gid : it->second) {
        gid = alive_group(gid);
        if (owner_[static_cast<size_t>(s)] == gid || std::find(out.begin(), out.end(), gid) != out.end()) continue;
        out.push_back(gid);
      }
    }
    std::sort(out.begin(), out.end(), std::greater<int>());
    return out;
  }

  // The group a (possibly merged) group lives on in.
  int alive_group(int gid) const {
    while (forward_[static_cast<size_t>(gid)] >= 0) gid = forward_[static_cast<size_t>(gid)];
    return gid;
  }

  bool full(int gid, size_t more = 1) const { return groups_[static_cast<size_t>(gid)].ops.size() + more > kMaxOpsPerKernel; }

  bool creates_cycle(int gid, const Op& op) const {
    for (TensorId t : op.inputs) {
      const int other = owner_of(t);
      if (other >= 0 && other != gid && depends(other, gid)) return true;
    }
    return false;
  }

  // After an op joined group `gid`, a pointwise group computing another of
  // its operands on the same space is merged in too: only one that `gid` did
  // not read before (else its values may be an anchor's operand, not an
  // epilogue value), and unless a third group sits on a path between them.
  void merge_producer_groups(int gid, int stage, const std::vector<int>& candidates) {
    for (int hid : candidates) {
      if (!group(hid).alive) continue;
      Group& h = group(hid);
      Group& gr = group(gid);
      if (h.kind != KernelKind::Pointwise || h.count[0] != gr.count[stage] || full(gid, h.ops.size())) continue;
      bool through_third = false;
      for (int next : succ_[static_cast<size_t>(hid)])
        if (next != gid && depends(gid, next)) through_third = true;
      if (through_third) continue;
      absorb(gid, hid, stage);
    }
  }

  // Group `from` joins `into`: its ops (and what it recomputes), its values at
  // `stage` (nullopt: at their own), the results it owned; then it retires.
  void absorb(int into, int from, std::optional<int> stage) {
    Group& a = group(into);
    const Group& p = group(from);
    a.ops.insert(p.ops.begin(), p.ops.end());
    a.recomputed.insert(p.recomputed.begin(), p.recomputed.end());
    for (const auto& [t, st] : p.stage) {
      a.stage[t] = stage.value_or(st);
      if (owner_[static_cast<size_t>(t)] == from) owner_[static_cast<size_t>(t)] = into;
    }
    retire(from, into);
  }

  // Group `from` disappears into `into`: edges follow.
  void retire(int from, int into) {
    for (Group& other : groups_) {
      auto& next = succ_[static_cast<size_t>(other.id)];
      if (next.erase(from) && other.id != into) next.insert(into);
    }
    for (int next : succ_[static_cast<size_t>(from)])
      if (next != into) succ_[static_cast<size_t>(into)].insert(next);
    succ_[static_cast<size_t>(from)].clear();
    group(from).alive = false;
    forward_[static_cast<size_t>(from)] = into;
  }

  int join_stage_ = 0;
  std::optional<std::string> why_not_join(int gid, const Op& op) {
    const Group& gr = group(gid);
    if (std::string why = why_vendor_alone(gr); !why.empty()) return why;
    if (full(gid))
      return fmt::format("its kernel already computes {} ops, the most one kernel takes (a bound on its source and "
                         "compile time)", gr.ops.size());
    std::set<int> stages;
    for (TensorId t : op.inputs)
      if (owner_of(t) == gid) stages.insert(gr.stage.at(source(t)));
    // A domain value from a finished reduction: the kernel must hold its rows.
    const int64_t count = element_count(g_.result(op).shape);
    const bool reads_back = stages.size() > 1 || (stages.count(1) && is_pointwise(op.kind) && count == gr.count[0] &&
                                                  count != gr.count[1]);
    if (reads_back) {
      if (std::optional<std::string> why = why_not_read_back(gr, op))
        return stages.size() > 1 ? fmt::format("'{}' reads both the domain the {} kernel reduces and its finished "
                                               "reduction; that needs a second pass over the domain ({})",
                                               g_.result(op).name, to_string(gr.kind), *why)
                                 : fmt::format("'{}' combines a finished reduction with the domain it reduces; that "
                                               "needs a second pass over the domain ({})",
                                               g_.result(op).name, *why);
      stages = {0};
    }
    if (reads_back || gr.holds_rows)
      if (std::optional<std::string> why = why_not_within_row(gid, gr, op)) return why;
    if (gr.kind == KernelKind::Norm && op_info(op.kind).family == OpFamily::Norm)
      return fmt::format("'{}' would be a second normalisation in one kernel", g_.result(op).name);
    if ((op_info(op.kind).family == OpFamily::Norm && op.kind != OpKind::BatchNorm) ||
        op_info(op.kind).family == OpFamily::Pool) {
      if (owner_of(op.inputs[0]) != gid)
        return fmt::format("only the normalised input of '{}' can come from the same kernel", g_.result(op).name);
    }
    const Verdict v = planner::can_take(g_, gr, op, *stages.begin());
    if (!v.ok) return v.reason;
    if (creates_cycle(gid, op))
      return fmt::format("fusing '{}' there would create a cycle between kernels", g_.result(op).name);
    join_stage_ = v.stage;
    return std::nullopt;
  }

  // ---- rows held: reductions read back ---------------------------------------
  // Whether a pointwise op over a reduction kernel's domain may read the
  // kernel's finished reductions: only where the kernel reduces the last
  // axes, so that a block holds whole rows.
  std::optional<std::string> why_not_read_back(const Group& gr, const Op& op) const {
    if (gr.kind != KernelKind::Reduction || gr.pooling || gr.norm_op >= 0 || gr.reduce_axes.empty())
      return fmt::format("a {} kernel does not hold rows", to_string(gr.kind));
    const auto rank = static_cast<int64_t>(gr.domain.size()), kept = rank - static_cast<int64_t>(gr.reduce_axes.size());
    for (size_t i = 0; i < gr.reduce_axes.size(); ++i)
      if (gr.reduce_axes[i] != kept + static_cast<int64_t>(i))
        return fmt::format("it reduces axes [{}] of {}, not the last ones, so a block does not hold whole rows",
                           fmt::join(gr.reduce_axes, ","), to_string(gr.domain));
    if (gr.count[0] == gr.count[1]) return std::string("its rows have one element");
    if (!is_pointwise(op.kind) || g_.result(op).shape != gr.domain)
      return fmt::format("only a pointwise op with the domain's shape {} reads a reduction back", to_string(gr.domain));
    return std::nullopt;
  }

  // In a kernel holding rows, the finished reductions and the values
  // computed from them are known for the current row only: they must be read
  // at the reader's own row (a reduction through reshapes to its keepdim
  // shape, then at most an expand; a value after it, at the same element).
  std::optional<std::string> why_not_within_row(int gid, const Group& gr, const Op& op) const {
    Shape keep = gr.domain;
    for (int64_t a : gr.reduce_axes) keep[static_cast<size_t>(a)] = 1;
    auto keepdim = [&](const Shape& s) {
      if (s.size() > keep.size()) return false;
      Shape padded(keep.size() - s.size(), 1);
      padded.insert(padded.end(), s.begin(), s.end());
      return padded == keep;
    };
    for (TensorId t : op.inputs) {
      if (owner_of(t) != gid) continue;
      const TensorId s = source(t);
      const bool finished = gr.stage.at(s) == 1;
      if (!finished && !gr.after_reduction.count(s)) continue;
      bool within = t == s && g_.tensor(t).shape == gr.domain;
      if (finished) {
        TensorId at = t;
        if (const Op* p = producer(at); p && p->kind == OpKind::Expand && g_.tensor(at).shape == gr.domain) at = p->inputs[0];
        within = keepdim(g_.tensor(at).shape);
        for (const Op* p = producer(at); p && is_view(p->kind) && at != s; p = producer(at)) {
          within = within && p->kind == OpKind::Reshape;
          at = p->inputs[0];
        }
      }
      if (!within)
        return fmt::format("'{}' reads '{}' at other rows than its own, and the {} kernel holds one row at a time",
                           g_.result(op).name, g_.tensor(t).name, to_string(gr.kind));
    }
    return std::nullopt;
  }

  // Whether `op` reads a finished reduction of group `gid`, or a value
  // computed from one, on the group's domain.
  bool reads_after_reduction(int gid, const Op& op) const {
    const Group& gr = groups_[static_cast<size_t>(gid)];
    if (gr.kind != KernelKind::Reduction || gr.pooling) return false;
    for (TensorId t : op.inputs)
      if (owner_of(t) == gid) {
        const TensorId s = source(t);
        if (gr.stage.at(s) == 1 || gr.after_reduction.count(s)) return true;
      }
    return false;
  }

  // ---- step 3: prologues ---------------------------------------------------
  // Tensors of group `gid` that another group (or the caller) needs.
  bool only_used_by(TensorId t, int32_t op_index) const {
    if (g_.tensor(t).is_output) return false;
    for (int32_t user : g_.users[static_cast<size_t>(t)]) {
      const Op& u = g_.ops[static_cast<size_t>(user)];
      if (user == op_index) continue;
      if (is_view(u.kind) && only_used_by(u.output, op_index)) continue;
      return false;
    }
    return true;
  }

  // The results of group `p` that something other than op `except` needs
  // (directly or through views only `except` reads).
  std::vector<TensorId> escaping(const Group& p, int32_t except) const {
    std::vector<TensorId> out;
    for (int32_t oi : p.ops) {
      const Op& op = g_.ops[static_cast<size_t>(oi)];
      if (is_view(op.kind)) continue;
      if (!only_used_within(op.output, p, except)) out.push_back(op.output);
    }
    return out;
  }
  bool only_used_within(TensorId t, const Group& p, int32_t except) const {
    if (g_.tensor(t).is_output) return false;
    for (int32_t user : g_.users[static_cast<size_t>(t)]) {
      if (user == except || p.ops.count(user)) continue;
      const Op& u = g_.ops[static_cast<size_t>(user)];
      if (is_view(u.kind) && only_used_by(u.output, except)) continue;
      return false;
    }
    return true;
  }

  void merge_into(int into, int from, const std::string& note) {
    absorb(into, from, -1);  // prologue values: on the operand's index space
    group(into).notes.push_back(note);
  }

  // How many times a prologue on operand `slot` of a matmul or conv would
  // run: once per output tile along the other operand's side (columns for
  // A, rows for B); nullopt for other anchors.
  std::optional<int64_t> prologue_recomputations(const Op& op, size_t slot) const {
    const Shape& out = g_.result(op).shape;
    int64_t other = 0;
    if (op.kind == OpKind::Matmul) {
      other = slot == 0 ? out[out.size() - 1] : out[out.size() - 2];
    } else if (op.kind == OpKind::Conv2d) {
      const bool nhwc = op.attrs.layout == Layout::NHWC;
      other = slot == 0 ? (nhwc ? out[3] : out[1]) : element_count(out) / (nhwc ? out[3] : out[1]);
    } else {
      return std::nullopt;
    }
    return (other + kPrologueTileColumns - 1) / kPrologueTileColumns;
  }

  // From sm_90 on, a matmul or conv loads its operands by TMA into wgmma;
  // computed in its loads, an operand forces the mma.sync kernel with
  // element loads (see planner.h): empty where prologues are allowed.
  std::string why_no_operand_prologue(TensorId s, const Op& anchor) const {
    if (std::string why = why_vendor_operand(anchor); !why.empty()) return why;
    if (options_.sm < 90 || (anchor.kind != OpKind::Matmul && anchor.kind != OpKind::Conv2d)) return {};
    return fmt::format("'{}' is written once, so that '{}' loads it by TMA on sm_{}: computed in the anchor's loads it "
                       "ran 1.4-5.9x slower on H100",
                       g_.tensor(s).name, g_.result(anchor).name, options_.sm);
  }

  // A matmul that cuBLASLt computes (PlanOptions::cublaslt_f32_matmuls):
  // why its kernel takes nothing else; empty for any other anchor.
  std::string why_vendor_operand(const Op& anchor) const {
    if (!options_.cublaslt_f32_matmuls || options_.sm < 80 || !planner::cublaslt_f32_matmul(g_, anchor)) return {};
    return fmt::format("cuBLASLt computes '{}' (f32 operands): its kernel is the product alone", g_.result(anchor).name);
  }
  std::string why_vendor_alone(const Group& gr) const {
    if (gr.kind != KernelKind::Matmul || gr.anchor < 0) return {};
    return why_vendor_operand(g_.ops[static_cast<size_t>(gr.anchor)]);
  }

  // The ops of a kernel that compute values (not views).
  size_t computing_ops(const Group& p) const {
    size_t n = 0;
    for (int32_t oi : p.ops) n += !is_view(g_.ops[static_cast<size_t>(oi)].kind);
    return n;
  }
  // Whether an sdpa's scores outnumber the elements of mask `s`: each mask
  // element is read for several scores (heads, queries or batches).
  bool broadcast_over_scores(const Op& sdpa, TensorId s) const {
    const Shape& q = g_.operand(sdpa, 0).shape;
    const int64_t scores = q[0] * q[1] * q[2] * g_.operand(sdpa, 1).shape[2];
    return scores > element_count(g_.tensor(s).shape);
  }

  void absorb_prologues() {
    for (Group& a : groups_) {
      if (!a.alive || (a.kind != KernelKind::Matmul && a.kind != KernelKind::Conv && a.kind != KernelKind::Attention))
        continue;
      for (int32_t oi : std::vector<int32_t>(a.ops.begin(), a.ops.end())) {
        const Op& op = g_.ops[static_cast<size_t>(oi)];
        if (!is_anchor(op.kind)) continue;
        for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
          const TensorId s = source(op.inputs[slot]);
          const int pid = owner_[static_cast<size_t>(s)];
          if (pid < 0 || pid == a.id) continue;
          const Group& p = group(pid);
          std::string why;
          if (const auto once = written_once_.find(s); once != written_once_.end())
            why = once->second;
          else if (p.kind != KernelKind::Pointwise)
            why = fmt::format("'{}' comes from a {} kernel, which cannot run inside the anchor's operand loads",
                              g_.tensor(s).name, to_string(p.kind));
          else if (const std::optional<int64_t> tiles = prologue_recomputations(op, slot);
                   tiles && *tiles * kPrologueTileColumns > kNormPrologueMaxColumns)
            // Computed while the operand is loaded, a prologue runs once per
            // tile of the other operand's side, and the operand is loaded
            // element by element instead of by the copy engine.
            why = fmt::format("'{}' would be recomputed for each of the {} tiles across the other side of '{}' "
                              "(at most {}): it is written once instead",
                              g_.tensor(s).name, *tiles, g_.result(op).name, kNormPrologueMaxColumns / kPrologueTileColumns);
          else if (op.kind == OpKind::Conv2d && g_.tensor(s).kind == TensorKind::OpResult &&
                   op_info(g_.ops[static_cast<size_t>(g_.tensor(s).producer)].kind).family == OpFamily::Concat)
            // A conv gathers its operands from memory in 16-byte runs (a
            // thin conv's channels padded to 8: conv_channel_padding.h);
            // computed in its loads, each element would be read alone.
            why = fmt::format("'{}' is a concatenation: it is written once and the conv reads it from memory",
                              g_.tensor(s).name);
          else if (op.kind == OpKind::Sdpa && slot < 3)
            // q, k and v are read tile by tile from memory by the flash kernel;
            // computed in its loads they would be recomputed for every tile.
            why = fmt::format("'{}' is an attention operand (q, k, v), read from memory, not computed in the kernel",
                              g_.tensor(s).name);
          else if (const size_t computed = computing_ops(p);
                   op.kind == OpKind::Sdpa && computed > kMaskPrologueMaxOps && broadcast_over_scores(op, s))
            why = fmt::format("'{}' is a mask of {} ops the kernel would compute for each score it broadcasts to "
                              "(at most {} ops): it is written once and read instead",
                              g_.tensor(s).name, computed, kMaskPrologueMaxOps);
          else if (!only_used_by(s, oi))
            why = fmt::format("'{}' is needed elsewhere too, so it is written once rather than recomputed",
                              g_.tensor(s).name);
          else if (!escaping(p, oi).empty())
            why = fmt::format("the kernel computing '{}' has other results", g_.tensor(s).name);
          else if (full(a.id, p.ops.size()))
            why = fmt::format("the anchor's kernel and the prologue of '{}' together exceed {} ops", g_.tensor(s).name,
                              kMaxOpsPerKernel);
          if (why.empty()) why = why_no_operand_prologue(s, op);
          if (!why.empty()) {
            reasons_.emplace(std::make_pair(s, oi), why);
            continue;
          }
          merge_into(a.id, pid, fmt::format("prologue: '{}' is computed while operand {} of '{}' is loaded",
                                            g_.tensor(s).name, slot, g_.result(op).name));
        }
      }
    }
  }

  // rms_norm/layer_norm over the last axis feeding only a matmul's A: a small
  // row-statistics kernel, and the normalisation applied while A is loaded.
  void split_norm_prologues() {
    for (Group& a : groups_) {
      if (!a.alive || a.kind != KernelKind::Matmul) continue;
      const Op& mm = g_.ops[static_cast<size_t>(a.anchor)];
      const TensorId s = mm.inputs[0];
      const int nid = owner_[static_cast<size_t>(s)];
      if (nid < 0 || nid == a.id || source(s) != s) continue;
      Group& n = group(nid);
      if (n.kind != KernelKind::Norm) continue;
      const Op& norm = g_.ops[static_cast<size_t>(n.norm_op)];
      const Tensor& x = g_.operand(norm, 0);
      const bool last_axis = norm.attrs.axis == x.rank() - 1;
      std::string why;
      if (norm.kind != OpKind::LayerNorm && norm.kind != OpKind::RmsNorm)
        why = fmt::format("only layer_norm and rms_norm become matmul prologues, not {}", op_name(norm.kind));
      else if (!last_axis)
        why = fmt::format("'{}' normalises over more than the matmul's K axis", g_.result(norm).name);
      else if (!only_used_by(s, a.anchor))
        why = fmt::format("'{}' is needed elsewhere too", g_.tensor(s).name);
      else if (!escaping(n, a.anchor).empty())
        why = fmt::format("the normalisation kernel of '{}' has other results", g_.tensor(s).name);
      else if (const int64_t n_cols = g_.result(mm).shape.back(); n_cols > kNormPrologueMaxColumns)
        // The prologue runs once per column tile of the output: past a few
        // tiles its recomputation costs more than writing A once saves
        // (measured: rms_norm 8192x4096 -> matmul N=4096 ran 3.4x slower).
        why = fmt::format("'{}' would be recomputed for every column tile of the {}-wide output; written once instead",
                          g_.tensor(s).name, n_cols);
      if (why.empty()) why = why_no_operand_prologue(s, mm);
      if (!why.empty()) {
        reasons_.insert_or_assign(std::make_pair(s, a.anchor), why);  // more specific than absorb_prologues' reason
        continue;
      }
      // The statistics kernel keeps the norm's ops; the matmul recomputes them.
      for (int32_t oi : n.ops) {
        a.ops.insert(oi);
        a.recomputed.insert(oi);
        n.recomputed.insert(oi);
        a.stage[g_.ops[static_cast<size_t>(oi)].output] = -1;
      }
      owner_[static_cast<size_t>(s)] = a.id;
      n.kind = KernelKind::Reduction;
      const std::string stats = g_.result(norm).name + ".rowstats";
      n.workspace.push_back(stats);
      n.notes.push_back(fmt::format("row statistics of '{}' only ({} per row); '{}' itself is never written",
                                    g_.result(norm).name, norm.kind == OpKind::RmsNorm ? "rms" : "mean and rstd",
                                    g_.tensor(s).name));
      a.notes.push_back(fmt::format("prologue: '{}' ({}{}) is applied while A is loaded, from the row statistics in "
                                    "'{}'",
                                    g_.tensor(s).name, op_name(norm.kind),
                                    s == norm.output ? "" : " and what follows it", stats));
      a.workspace.push_back(stats);
      norm_stat_edges_.emplace_back(n.id, a.id);
    }
  }

  // A kernel holding rows whose only result is a narrow matmul's A (RMSNorm
  // or LayerNorm written op by op): the pointwise tail after its reductions
  // becomes the matmul's prologue, as split_norm_prologues does for the ops.
  // The held-rows kernel keeps what the reductions need and writes only the
  // finished row values the tail reads ([rows, 1]); the tail, recomputed for
  // each column tile, is held to cheap ops by the same two-tile rule.
  void split_held_rows_prologues() {
    for (size_t ai = 0; ai < groups_.size(); ++ai) {
      if (!groups_[ai].alive || groups_[ai].kind != KernelKind::Matmul) continue;
      const int aid = groups_[ai].id;
      const Op& mm = g_.ops[static_cast<size_t>(groups_[ai].anchor)];
      const TensorId s = source(mm.inputs[0]);
      const int hid = owner_[static_cast<size_t>(s)];
      if (hid < 0 || hid == aid || !group(hid).holds_rows) continue;
      const Group& h = group(hid);
      std::string why;
      std::set<int32_t> tail;
      if (const int64_t tiles = *prologue_recomputations(mm, 0); tiles * kPrologueTileColumns > kNormPrologueMaxColumns)
        why = fmt::format("'{}' would be recomputed for each of the {} column tiles of '{}' (at most {}); written once "
                          "instead",
                          g_.tensor(s).name, tiles, g_.result(mm).name, kNormPrologueMaxColumns / kPrologueTileColumns);
      else if (!only_used_by(s, groups_[ai].anchor) || !escaping(h, groups_[ai].anchor).empty())
        why = fmt::format("the kernel holding the rows of '{}' has other results", g_.tensor(s).name);
      else
        why = row_tail(h, s, tail);
      if (why.empty()) why = why_no_operand_prologue(s, mm);
      if (!why.empty()) {
        reasons_.insert_or_assign(std::make_pair(s, groups_[ai].anchor), why);
        continue;
      }
      move_tail_into_prologue(hid, aid, s, tail);
    }
  }

  // The ops of held-rows group `h` that `s` is computed by on the rows'
  // domain, back to the finished reductions (which stay); empty when all
  // are cheap pointwise ops or views, else why not.
  std::string row_tail(const Group& h, TensorId s, std::set<int32_t>& tail) const {
    std::vector<TensorId> todo{s};
    while (!todo.empty()) {
      const TensorId v = todo.back();
      todo.pop_back();
      const Tensor& tensor = g_.tensor(v);
      if (tensor.kind != TensorKind::OpResult || !h.ops.count(tensor.producer)) continue;
      if (auto st = h.stage.find(v); st != h.stage.end() && st->second == 1) continue;  // a finished row value
      const Op& op = g_.ops[static_cast<size_t>(tensor.producer)];
      if (!is_view(op.kind) && (!is_pointwise(op.kind) || op_info(op.kind).cost == OpCost::Heavy))
        return fmt::format("'{}' is computed by {}, too costly to compute again in each column tile's loads of '{}'",
                           tensor.name, op_name(op.kind), g_.tensor(s).name);
      if (!tail.insert(tensor.producer).second) continue;
      for (TensorId in : op.inputs) todo.push_back(in);
    }
    return {};
  }

  void move_tail_into_prologue(int hid, int aid, TensorId s, const std::set<int32_t>& tail) {
    // What the held-rows kernel still computes: everything its other ops read.
    std::set<int32_t> kept;
    std::vector<int32_t> todo;
    for (int32_t oi : group(hid).ops)
      if (!tail.count(oi)) todo.push_back(oi);
    while (!todo.empty()) {
      const int32_t oi = todo.back();
      todo.pop_back();
      if (!kept.insert(oi).second) continue;
      for (TensorId in : g_.ops[static_cast<size_t>(oi)].inputs)
        if (const Tensor& t = g_.tensor(in); t.kind == TensorKind::OpResult && group(hid).ops.count(t.producer))
          todo.push_back(t.producer);
    }
    // The tail, a pointwise group of its own for a moment, joins the matmul.
    Group t;
    t.id = static_cast<int>(groups_.size());
    t.domain = g_.tensor(s).shape;
    t.count[0] = element_count(t.domain);
    std::set<std::string> row_values;
    for (int32_t oi : tail) {
      const Op& op = g_.ops[static_cast<size_t>(oi)];
      t.ops.insert(oi);
      t.stage[op.output] = 0;
      if (kept.count(oi))
        t.recomputed.insert(oi);
      else if (!is_view(op.kind))  // (views have no owner: they fold into their readers)
        owner_[static_cast<size_t>(op.output)] = t.id;
      for (TensorId in : op.inputs)  // the views it reads through fold into its indexing, as in add()
        for (const Op* p = producer(in); p && is_view(p->kind); p = producer(p->inputs[0]))
          t.ops.insert(g_.tensor(p->output).producer);
      for (TensorId in : op.inputs)
        if (const Tensor& v = g_.tensor(source(in)); v.kind == TensorKind::OpResult && group(hid).ops.count(v.producer) &&
                                                     !tail.count(v.producer)) {
          row_values.insert(fmt::format("'{}'", v.name));
          reasons_.insert_or_assign(std::make_pair(source(in), oi),
                                    fmt::format("a finished row value, written for the prologue of '{}'",
                                                g_.tensor(s).name));
        }
    }
    const int tid = append_group(std::move(t));
    succ_[static_cast<size_t>(hid)].insert(tid);
    succ_[static_cast<size_t>(tid)].insert(aid);
    Group& h = group(hid);
    for (int32_t oi : tail) {
      if (kept.count(oi)) {
        h.recomputed.insert(oi);
        continue;
      }
      const TensorId out = g_.ops[static_cast<size_t>(oi)].output;
      h.ops.erase(oi);
      h.stage.erase(out);
      h.after_reduction.erase(out);
    }
    if (h.after_reduction.empty()) {  // no value read back at its row any more: an ordinary reduction
      h.holds_rows = false;
      h.notes.erase(std::remove_if(h.notes.begin(), h.notes.end(),
                                   [](const std::string& n) { return n.rfind("rows held:", 0) == 0; }),
                    h.notes.end());
    }
    h.notes.push_back(fmt::format("writes the row values {} only, for the prologue of '{}'; '{}' itself is never "
                                  "written",
                                  fmt::join(row_values, ", "), g_.tensor(s).name, g_.tensor(s).name));
    merge_into(aid, tid, fmt::format("prologue: '{}' (the tail after the row reductions) is applied while A is "
                                     "loaded, from {}",
                                     g_.tensor(s).name, fmt::join(row_values, ", ")));
  }

  // ---- step 3b: recompute instead of materialise ---------------------------
  // A value a kernel writes only for other kernels, computed in its kernel by
  // cheap pointwise ops (cost Free or Cheap) from tensors in memory anyway
  // (what the kernel reads, graph outputs it writes, its anchor's result), is
  // recomputed by every kernel that reads it, when each such reader reads it
  // only in pointwise ops or a concat and the inputs it then reads besides
  // those it reads already are no more bytes than the value: its readers
  // read no more than before, and its kernel writes it no more (a kernel
  // left with nothing to write is gone). RoPE after q's projection: the
  // negated half and q * cos are recomputed by the rotation's kernel, which
  // reads the projection anyway. The Llama residual + RMSNorm
  // is the case: rsqrt(mean + eps) over [rows, 1], read by the multiply over
  // [rows, hidden], is recomputed there from the mean; and the f32 cast of
  // the residual sum, read from the bf16 sum that is written anyway.
  void recompute_cheap_producers() {
    std::set<TensorId> output_sources;
    for (TensorId t : g_.outputs) output_sources.insert(source(t));
    std::map<int, std::set<int32_t>> copied;  // producing group -> its ops now computed by readers
    for (const auto& [t, users] : readers_outside_producers()) recompute_in_readers(t, users, output_sources, copied);
    drop_emptied_groups(copied, output_sources);
  }

  // The tensors a group reads from memory: made by other kernels or the caller.
  std::set<TensorId> reads_of(const Group& gr) const {
    std::set<TensorId> read;
    for (int32_t oi : gr.ops)
      for (TensorId in : g_.ops[static_cast<size_t>(oi)].inputs) {
        const TensorId s = source(in);
        if (g_.tensor(s).kind != TensorKind::Constant && owner_[static_cast<size_t>(s)] != gr.id) read.insert(s);
      }
    return read;
  }

  // The readers of each value: (group, op) pairs outside its group.
  std::map<TensorId, std::vector<std::pair<int, int32_t>>> readers_outside_producers() const {
    std::map<TensorId, std::vector<std::pair<int, int32_t>>> readers;
    for (const Group& gr : groups_) {
      if (!gr.alive) continue;
      for (int32_t oi : gr.ops)
        for (TensorId t : g_.ops[static_cast<size_t>(oi)].inputs) {
          const TensorId s = source(t);
          const int from = owner_[static_cast<size_t>(s)];
          const bool computed_here = g_.tensor(s).kind == TensorKind::OpResult && gr.ops.count(g_.tensor(s).producer);
          if (from >= 0 && from != gr.id && !computed_here) readers[s].push_back({gr.id, oi});
        }
    }
    return readers;
  }

  // Recomputes `t` in every one of its readers if the rule above allows;
  // else adds why not to the boundary's reason.
  void recompute_in_readers(TensorId t, const std::vector<std::pair<int, int32_t>>& users,
                            const std::set<TensorId>& output_sources, std::map<int, std::set<int32_t>>& copied) {
    const int gid = owner_[static_cast<size_t>(t)];
    // (A strided operand written once keeps its copy: its readers would load it element by element.)
    if (output_sources.count(t) || !group(gid).alive || written_once_.count(t)) return;
    std::set<TensorId> leaves;
    std::string why_not;
    const std::optional<std::set<int32_t>> cone = recompute_cone(group(gid), t, output_sources, leaves, why_not);
    // The bytes a reader would read besides what it reads already: the most over the readers.
    int64_t leaf_bytes = 0;
    std::vector<std::string> leaf_names;
    std::set<int> reader_groups;
    for (auto [rid, oi] : users) reader_groups.insert(rid);
    for (int rid : reader_groups) {
      const std::set<TensorId> read = reads_of(group(rid));
      int64_t bytes = 0;
      std::vector<std::string> names;
      for (TensorId leaf : leaves)
        if (!read.count(leaf)) {
          bytes += materialised_bytes(g_.tensor(leaf));
          names.push_back(fmt::format("'{}'", g_.tensor(leaf).name));
        }
      if (leaf_names.empty() || bytes > leaf_bytes) leaf_bytes = bytes, leaf_names = names;
    }
    if (leaf_names.empty()) leaf_names.push_back("only what it reads already");
    if (cone && leaf_bytes > materialised_bytes(g_.tensor(t))) {
      why_not = fmt::format("recomputing it would read {} ({}) instead of {}", fmt::join(leaf_names, ", "),
                            human_bytes(leaf_bytes), human_bytes(materialised_bytes(g_.tensor(t))));
    }
    if (!why_not.empty()) {
      for (auto [rid, oi] : users)
        if (auto it = reasons_.find({t, oi}); it != reasons_.end()) append_once(it->second, "; not recomputed here: " + why_not);
      return;
    }
    std::set<int> into;
    for (auto [rid, oi] : users) {  // pointwise readers (or views, folded into their readers' indexing)
      const Group& r = group(rid);
      const OpKind kind = g_.ops[static_cast<size_t>(oi)].kind;
      const bool vendor = !why_vendor_alone(r).empty();
      if (!(pointwise_like(kind) || is_view(kind) || kind == OpKind::Concat) || r.kind == KernelKind::Attention || r.holds_rows ||
          full(rid, cone->size()) || vendor) {
        for (auto [other, reader] : users)
          if (auto it = reasons_.find({t, reader}); it != reasons_.end())
            append_once(it->second, fmt::format("; not recomputed here: '{}' ({}) reads it in a {} kernel{}",
                                                g_.result(g_.ops[static_cast<size_t>(oi)]).name, op_name(kind), to_string(r.kind),
                                                vendor ? " that cuBLASLt computes" : ""));
        return;
      }
      into.insert(rid);
    }
    std::vector<std::string> names;
    for (int32_t oi : *cone) names.push_back(fmt::format("'{}'", g_.result(g_.ops[static_cast<size_t>(oi)]).name));
    for (int32_t oi : *cone)  // why the leaves cross memory into the readers
      for (TensorId in : g_.ops[static_cast<size_t>(oi)].inputs)
        if (leaves.count(in))
          reasons_.emplace(std::make_pair(source(in), oi),
                           fmt::format("read to recompute {} in this kernel, cheaper than reading '{}'",
                                       fmt::join(names, ", "), g_.tensor(t).name));
    for (int rid : into) {
      Group& r = group(rid);
      r.ops.insert(cone->begin(), cone->end());
      r.recomputed.insert(cone->begin(), cone->end());
      for (TensorId leaf : leaves)
        if (const int from = owner_[static_cast<size_t>(leaf)]; from >= 0 && from != rid) succ_[static_cast<size_t>(from)].insert(rid);
      r.notes.push_back(fmt::format("recomputes {} from {} ({}) instead of reading '{}' ({})", fmt::join(names, ", "),
                                    fmt::join(leaf_names, ", "), human_bytes(leaf_bytes), g_.tensor(t).name,
                                    human_bytes(materialised_bytes(g_.tensor(t)))));
    }
    group(gid).recomputed.insert(cone->begin(), cone->end());
    copied[gid].insert(cone->begin(), cone->end());
  }

  // A kernel whose every op is now computed by its readers, and which writes
  // no graph output, has nothing left to do; an op left in one kernel is
  // computed there alone, not recomputed.
  void drop_emptied_groups(const std::map<int, std::set<int32_t>>& copied, const std::set<TensorId>& output_sources) {
    for (const auto& entry : copied) {  // (no structured binding: lambdas below capture it)
      const int gid = entry.first;
      const std::set<int32_t>& ops = entry.second;
      Group& gr = group(gid);
      const bool all_copied = std::all_of(gr.ops.begin(), gr.ops.end(), [&](int32_t oi) {
        return ops.count(oi) || (is_view(g_.ops[static_cast<size_t>(oi)].kind) && !output_sources.count(g_.ops[static_cast<size_t>(oi)].output));
      });
      const bool writes_output = std::any_of(gr.ops.begin(), gr.ops.end(), [&](int32_t oi) {
        return output_sources.count(g_.ops[static_cast<size_t>(oi)].output) > 0;
      });
      if (!all_copied || writes_output || gr.anchor >= 0 || !gr.workspace.empty()) continue;
      for (auto& next : succ_) next.erase(gid);
      succ_[static_cast<size_t>(gid)].clear();
      gr.alive = false;
    }
    std::map<int32_t, std::vector<Group*>> computed_by;  // ops marked recomputed -> the live kernels computing them
    for (const Group& gr : groups_)
      if (gr.alive)
        for (int32_t oi : gr.recomputed) computed_by[oi];
    for (Group& gr : groups_)
      if (gr.alive)
        for (auto& [oi, kernels] : computed_by)
          if (gr.ops.count(oi)) kernels.push_back(&gr);
    for (const auto& [oi, kernels] : computed_by)
      if (kernels.size() == 1) kernels.front()->recomputed.erase(oi);
  }

  // The ops of group `gr` that compute `t` from tensors that stay in memory
  // (what the group reads from other kernels or the caller, and graph
  // outputs), collected with those tensors in `leaves`; nullopt, and why in
  // `why_not`, when one of them is not a cheap pointwise op.
  std::optional<std::set<int32_t>> recompute_cone(const Group& gr, TensorId t, const std::set<TensorId>& output_sources,
                                                  std::set<TensorId>& leaves, std::string& why_not) const {
    std::set<int32_t> cone;
    std::vector<TensorId> todo{t};
    while (!todo.empty()) {
      const TensorId v = todo.back();
      todo.pop_back();
      const Tensor& tensor = g_.tensor(v);
      if (tensor.kind == TensorKind::Constant) continue;
      const bool here = tensor.kind == TensorKind::OpResult && gr.ops.count(tensor.producer);
      // (an anchor's result is never recomputed: a reader that recomputes from it reads it from memory)
      const bool anchor_result = here && tensor.producer == gr.anchor;
      if (!here || (v != t && (output_sources.count(v) || anchor_result))) {
        leaves.insert(v);
        continue;
      }
      const Op& op = g_.ops[static_cast<size_t>(tensor.producer)];
      if (!is_view(op.kind) && (!is_pointwise(op.kind) || op_info(op.kind).cost == OpCost::Heavy)) {
        why_not = fmt::format("'{}' is computed by {}, {}", tensor.name, op_name(op.kind),
                              is_pointwise(op.kind) ? "too costly to compute again for every element that reads it"
                                                    : "not a pointwise op");
        return std::nullopt;
      }
      if (!cone.insert(tensor.producer).second) continue;
      for (TensorId in : op.inputs) todo.push_back(in);
    }
    return cone;
  }

  // ---- step 3c: horizontal fusion -----------------------------------------
  // Kernels with no path between them (neither reads what the other writes,
  // directly or through a third) over the same domain become one: pointwise
  // kernels over one shape, reductions of one shape over the same axes. One
  // launch and one pass of indexing instead of two; bytes are unchanged. At
  // most kMaxHorizontalChecks dependency searches, for graphs of thousands
  // of kernels.
  static constexpr int kMaxHorizontalChecks = 4096;
  void fuse_horizontally() {
    std::map<std::string, std::vector<int>> buckets;  // same kind and domain, in op order
    for (const Group& gr : groups_)
      if (const std::optional<std::string> key = horizontal_key(gr)) buckets[*key].push_back(gr.id);
    int checks = 0;
    for (auto& [key, ids] : buckets)
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!group(ids[i]).alive) continue;
        for (size_t j = i + 1; j < ids.size() && checks < kMaxHorizontalChecks; ++j) {
          Group& a = group(ids[i]);
          Group& b = group(ids[j]);
          if (!b.alive || full(a.id, b.ops.size())) continue;
          ++checks;
          if (depends(a.id, b.id) || depends(b.id, a.id)) continue;
          a.notes.push_back(fmt::format("fused horizontally with the kernel of {} (the same domain, independent)",
                                        written_names(b)));
          a.notes.insert(a.notes.end(), b.notes.begin(), b.notes.end());
          absorb(a.id, b.id, std::nullopt);
        }
      }
  }

  // Groups that may fuse horizontally share this key; nullopt for the rest
  // (anchors, norms, pools, held rows, row statistics, views alone).
  std::optional<std::string> horizontal_key(const Group& gr) const {
    if (!gr.alive || gr.anchor >= 0 || gr.norm_op >= 0 || gr.pooling || gr.holds_rows || !gr.workspace.empty()) return std::nullopt;
    if (std::all_of(gr.ops.begin(), gr.ops.end(), [&](int32_t oi) { return is_view(g_.ops[static_cast<size_t>(oi)].kind); }))
      return std::nullopt;
    if (gr.kind == KernelKind::Pointwise) return fmt::format("pointwise {}", to_string(gr.domain));
    if (gr.kind == KernelKind::Reduction && !gr.reduce_axes.empty())
      return fmt::format("reduction {} over [{}]", to_string(gr.domain), fmt::join(gr.reduce_axes, ","));
    return std::nullopt;
  }

  std::string written_names(const Group& gr) const {
    std::vector<std::string> names;
    for (int32_t oi : gr.ops)
      if (!is_view(g_.ops[static_cast<size_t>(oi)].kind) && names.size() < 3)
        names.push_back(fmt::format("'{}'", g_.result(g_.ops[static_cast<size_t>(oi)]).name));
    return fmt::format("{}", fmt::join(names, ", "));
  }

  // ---- graph outputs that are views ----------------------------------------
  void place_output_views() {
    for (size_t i = 0; i < g_.ops.size(); ++i) {
      const Op& op = g_.ops[i];
      if (!is_view(op.kind) || !g_.result(op).is_output) continue;
      const int gid = owner_of(op.output);
      int target = gid;
      // A reduction across an anchor's tiles is complete only when that
      // kernel ends: a view of it is written by a copy kernel after.
      const bool after_anchor = gid >= 0 && group(gid).anchor >= 0 && group(gid).stage.count(source(op.output)) &&
                                group(gid).stage.at(source(op.output)) == 1;
      // A kernel writes what it computes at the coordinates it computes
      // them, mapped through transposes and reshapes (one element each);
      // a slice or an expand of its result is written by a copy kernel.
      bool selects = false;
      for (const Op* p = &op; p && is_view(p->kind); p = producer(p->inputs[0]))
        selects |= p->kind == OpKind::Slice || p->kind == OpKind::Expand;
      if (gid < 0 || !options_.fuse || after_anchor || selects) {
        target = static_cast<int>(groups_.size());
        Group gr;
        gr.id = target;
        gr.kind = KernelKind::Copy;
        gr.domain = g_.result(op).shape;
        gr.count[0] = element_count(gr.domain);
        groups_.push_back(std::move(gr));
      }
      Group& gr = group(target);
      for (const Op* p = &op; p && is_view(p->kind); p = producer(p->inputs[0]))
        gr.ops.insert(g_.tensor(p->output).producer);
      written_views_[op.output] = target;
    }
  }

  // ---- step 4 --------------------------------------------------------------
  Plan finish() {
    std::vector<std::set<TensorId>> reads, writes;
    memory_traffic(reads, writes);
    const std::vector<int> order = kernel_order(reads);
    Plan plan;
    plan.fused = options_.fuse;
    std::map<int, int> kernel_of;
    for (int id : order) {
      kernel_of[id] = static_cast<int>(plan.kernels.size());
      plan.kernels.push_back(planned_kernel(group(id), kernel_of[id], reads[static_cast<size_t>(id)],
                                            writes[static_cast<size_t>(id)]));
    }
    for (const PlannedKernel& k : plan.kernels)
      for (TensorId t : k.reads) {
        const int from = owner_[static_cast<size_t>(t)];
        if (from < 0) continue;
        Boundary b{t, kernel_of[from], k.id, boundary_reason(t, k)};
        plan.boundaries.push_back(std::move(b));
      }
    return plan;
  }

  // Per group: the tensors it reads from memory (operands produced outside
  // it) and those it writes (what other groups read, and graph outputs).
  void memory_traffic(std::vector<std::set<TensorId>>& reads, std::vector<std::set<TensorId>>& writes) const {
    reads.assign(groups_.size(), {});
    writes.assign(groups_.size(), {});
    for (const Group& gr : groups_) {
      if (!gr.alive) continue;
      for (int32_t oi : gr.ops)
        for (TensorId t : g_.ops[static_cast<size_t>(oi)].inputs) {
          const Tensor& tensor = g_.tensor(t);
          if (tensor.kind == TensorKind::Constant) continue;
          if (tensor.kind == TensorKind::OpResult && gr.ops.count(tensor.producer)) continue;
          reads[static_cast<size_t>(gr.id)].insert(t);
        }
    }
    for (const Group& gr : groups_) {
      if (!gr.alive) continue;
      for (TensorId t : reads[static_cast<size_t>(gr.id)]) {
        const int from = owner_[static_cast<size_t>(t)];
        if (from >= 0 && from != gr.id) writes[static_cast<size_t>(from)].insert(t);
      }
    }
    for (size_t t = 0; t < g_.tensors.size(); ++t) {
      const Tensor& tensor = g_.tensors[t];
      if (!tensor.is_output) continue;
      if (auto it = written_views_.find(static_cast<TensorId>(t)); it != written_views_.end())
        writes[static_cast<size_t>(it->second)].insert(static_cast<TensorId>(t));
      else if (tensor.kind == TensorKind::OpResult && owner_[t] >= 0)
        writes[static_cast<size_t>(owner_[t])].insert(static_cast<TensorId>(t));
    }
  }

  // The live groups in execution order: Kahn over "reads what the other
  // writes" (and the norm-statistics edges), earliest op first.
  std::vector<int> kernel_order(const std::vector<std::set<TensorId>>& reads) {
    std::vector<int> alive;
    for (const Group& gr : groups_)
      if (gr.alive) alive.push_back(gr.id);
    std::map<int, std::set<int>> succ;
    std::map<int, int> indegree;
    for (int id : alive) indegree[id] = 0;
    auto edge = [&](int from, int to) {
      if (from != to && succ[from].insert(to).second) ++indegree[to];
    };
    for (int id : alive)
      for (TensorId t : reads[static_cast<size_t>(id)])
        if (const int from = owner_[static_cast<size_t>(t)]; from >= 0) edge(from, id);
    for (auto [from, to] : norm_stat_edges_) edge(from, to);
    auto first_op = [&](int id) { return group(id).ops.empty() ? INT32_MAX : *group(id).ops.begin(); };
    auto later = [&](int a, int b) { return first_op(a) > first_op(b); };
    std::priority_queue<int, std::vector<int>, decltype(later)> ready(later);
    for (int id : alive)
      if (indegree[id] == 0) ready.push(id);
    std::vector<int> order;
    while (!ready.empty()) {
      const int id = ready.top();
      ready.pop();
      order.push_back(id);
      for (int next : succ[id])
        if (--indegree[next] == 0) ready.push(next);
    }
    KILN_INTERNAL_CHECK(order.size() == alive.size());  // the grouping is acyclic
    return order;
  }

  PlannedKernel planned_kernel(const Group& gr, int id, const std::set<TensorId>& reads,
                               const std::set<TensorId>& writes) const {
    PlannedKernel k;
    k.id = id;
    k.kind = gr.kind;
    if (k.kind == KernelKind::Pointwise && std::all_of(gr.ops.begin(), gr.ops.end(), [&](int32_t oi) {
          return is_view(g_.ops[static_cast<size_t>(oi)].kind);
        }))
      k.kind = KernelKind::Copy;
    k.anchor = gr.anchor;
    k.ops.assign(gr.ops.begin(), gr.ops.end());
    k.recomputed.assign(gr.recomputed.begin(), gr.recomputed.end());
    k.reads.assign(reads.begin(), reads.end());
    k.writes.assign(writes.begin(), writes.end());
    k.params = planner::params_for(g_, gr);
    if ((k.kind == KernelKind::Pointwise || k.kind == KernelKind::Copy) && !k.writes.empty())
      k.params.domain = g_.tensor(k.writes.front()).shape;  // iterate over what is written
    k.notes = gr.notes;
    k.workspace = gr.workspace;
    return k;
  }

  std::string boundary_reason(TensorId t, const PlannedKernel& k) const {
    if (!options_.fuse) return "fusion is off (--no-fusion)";
    for (int32_t oi : k.ops) {
      auto it = reasons_.find({t, oi});
      if (it != reasons_.end()) return it->second;
    }
    for (int32_t oi : k.ops) {
      const Op& op = g_.ops[static_cast<size_t>(oi)];
      if (std::find(op.inputs.begin(), op.inputs.end(), t) == op.inputs.end() &&
          !std::any_of(op.inputs.begin(), op.inputs.end(), [&](TensorId in) { return source(in) == t; }))
        continue;
      if (is_anchor(op.kind))
        return fmt::format("'{}' is an operand of anchor '{}', which starts its own kernel", g_.tensor(t).name,
                           g_.result(op).name);
      if (k.kind == KernelKind::Copy) return "a graph output that is a view is materialised by a copy";
    }
    return "kept apart";
  }

  const Graph& g_;
  PlanOptions options_;
  std::vector<Group> groups_;
  std::vector<std::set<int>> succ_;  // group -> groups reading its results
  std::vector<int> forward_;         // group -> the group it merged into, or -1
  std::unordered_map<TensorId, std::vector<int>> readers_;  // source tensor -> groups that read it (maybe merged since)
  std::vector<int> owner_;  // tensor -> group computing it (-1: input, constant or view)
  std::map<TensorId, std::string> written_once_;  // transposed conv operands a copy writes -> why
  std::map<std::pair<TensorId, int32_t>, std::string> reasons_;  // (tensor, reader op) -> why not fused
  std::map<TensorId, int> written_views_;
  std::vector<std::pair<int, int>> norm_stat_edges_;
  std::set<int32_t> kept_from_siblings_;  // ops never placed in a sibling's kernel
  std::vector<int32_t> sibling_joined_;   // ops placed in a sibling's kernel
};

}  // namespace

// A sibling join is a bet that the op's result stays in the kernel it joins. Where it did not
// (the kernel writes the result for another to read back), the graph is planned again with those
// ops kept apart, and the plan that moves fewer bytes (then has fewer kernels) is kept: joining
// siblings only ever makes a plan cheaper.
Plan plan_fusion(const Graph& graph, const PlanOptions& options) {
  KILN_USER_CHECK(!graph.is_symbolic(),
                  "graph {}: has symbolic dimensions; planning one needs its sizes bound first (--dim NAME=VALUE "
                  "for each symbol, or Graph::specialize)",
                  detail::quoted(graph.name));
  Planner first(graph, options);
  Plan plan = first.run();
  std::set<int32_t> crossing = first.sibling_joins_that_cross_memory();
  if (crossing.empty()) return plan;
  Plan apart = Planner(graph, options, std::move(crossing)).run();
  const auto cost = [&](const Plan& p) { return std::make_pair(bytes_through_memory(graph, p), p.kernels.size()); };
  return cost(apart) < cost(plan) ? std::move(apart) : std::move(plan);
}

}  // namespace kiln::ir
