// Written-out attention as sdpa (attention_rewrite.h): the row's matcher
// over every matmul, and its replacement, which rebuilds the graph with
// each site's ops dropped and its sdpa (with the views and mask ops it
// reads) emitted where p·v was, then drops the ops that only fed what was
// replaced.
#include "compiler/attention_rewrite.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "compiler/attention_match.h"
#include "compiler/error.h"
#include "compiler/graph_rewrite.h"
#include "compiler/shape_inference.h"

namespace kiln::ir {
namespace {

using Perm = std::vector<int64_t>;

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }
Shape last_two(const Shape& s) { return Shape(s.end() - 2, s.end()); }
Shape concat(Shape a, const Shape& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bool is_identity(const Perm& p) {
  for (size_t d = 0; d < p.size(); ++d)
    if (p[d] != static_cast<int64_t>(d)) return false;
  return true;
}

// Consecutive runs of `from` and `to` with equal products, in order: how a
// reshape between them regroups dimensions. Each pair is [begin, end) in
// `from`, then in `to`.
struct Group {
  size_t from_begin, from_end, to_begin, to_end;
};
std::vector<Group> groups_of(const Shape& from, const Shape& to) {
  std::vector<Group> out;
  size_t i = 0, j = 0;
  while (i < from.size() || j < to.size()) {
    Group gr{i, i, j, j};
    int64_t pf = 1, pt = 1;
    if (i < from.size()) pf *= from[i++];
    if (j < to.size()) pt *= to[j++];
    while (pf != pt) {
      if (pf < pt) {
        KILN_INTERNAL_CHECK(i < from.size());
        pf *= from[i++];
      } else {
        KILN_INTERNAL_CHECK(j < to.size());
        pt *= to[j++];
      }
    }
    gr.from_end = i, gr.to_end = j;
    out.push_back(gr);
  }
  return out;
}

std::string describe_site(const Graph& g, const AttentionMatch& a) {
  int masks = 0, fills = 0;
  for (const ScoreStep& s : a.steps) masks += s.kind == ScoreStep::Kind::Add, fills += s.kind == ScoreStep::Kind::Fill;
  std::string mask = masks == 0 && fills == 0 ? "no mask"
                     : masks == 0 && fills == 1 ? "a bool mask"
                                                : fmt::format("an additive mask ({} added, {} filled)", masks, fills);
  std::string rounded;
  if (a.score_roundings != 0)
    rounded = fmt::format(", scores rounded to {} as the graph rounds them",
                          score_rounding_text(a.scores_rounded_to, a.score_roundings));
  return fmt::format("{} and the {} ops before it from q·kᵀ -> sdpa (scale {}, {}{}, B={} H={} Sq={} Skv={} D={})",
                     op_named(g, a.pv), a.ops.size() - 1, static_cast<float>(a.scale), mask, rounded, a.heads[0], a.heads[1],
                     a.sq, a.skv, a.d);
}

class SdpaBuilder {
 public:
  SdpaBuilder(const Graph& g, const RowMatches& m) : g_(g) {
    out_.name = g.name;
    out_.tensors = g.tensors;
    out_.inputs = g.inputs;
    out_.outputs = g.outputs;
    for (Tensor& t : out_.tensors) {
      if (t.kind == TensorKind::OpResult) t.producer = -1;
      names_.insert(t.name);
    }
    for (const RewriteSite& s : m.sites) sites_.emplace(s.op, std::any_cast<AttentionMatch>(s.detail));
  }

  Graph run() {
    std::vector<bool> replaced(g_.ops.size(), false);
    for (const auto& [pv, a] : sites_)
      for (int32_t oi : a.ops) replaced[static_cast<size_t>(oi)] = true;
    const std::vector<bool> feeder = only_fed_replaced(replaced);
    for (size_t i = 0; i < g_.ops.size(); ++i) {
      if (auto it = sites_.find(static_cast<int32_t>(i)); it != sites_.end()) {
        emit_sdpa(it->second);
      } else if (!replaced[i]) {
        ops_.push_back(g_.ops[i]);
        feeders_.push_back(feeder[i]);
      }
    }
    return take();
  }

 private:
  // Per op: whether everything it fed is replaced (directly, or through ops
  // of which that holds): it goes where no new op reads it either. An op
  // nothing read stays, as the graph as written has it.
  std::vector<bool> only_fed_replaced(const std::vector<bool>& replaced) const {
    std::vector<bool> feeder(g_.ops.size(), false);
    for (size_t i = g_.ops.size(); i-- > 0;) {
      const TensorId out = g_.ops[i].output;
      const std::vector<int32_t>& users = g_.users[static_cast<size_t>(out)];
      if (replaced[i] || g_.tensor(out).is_output || users.empty()) continue;
      feeder[i] = std::all_of(users.begin(), users.end(), [&](int32_t u) {
        return replaced[static_cast<size_t>(u)] || feeder[static_cast<size_t>(u)];
      });
    }
    return feeder;
  }

  // The ops in order, those that only fed replaced ops dropped unless a new op reads them.
  Graph take() {
    std::vector<bool> needed(out_.tensors.size(), false);
    for (TensorId t : out_.outputs) needed[static_cast<size_t>(t)] = true;
    std::vector<bool> keep(ops_.size(), false);
    for (size_t i = ops_.size(); i-- > 0;) {
      keep[i] = !feeders_[i] || needed[static_cast<size_t>(ops_[i].output)];
      if (keep[i])
        for (TensorId in : ops_[i].inputs) needed[static_cast<size_t>(in)] = true;
    }
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (!keep[i]) continue;
      out_.tensors[static_cast<size_t>(ops_[i].output)].producer = static_cast<int32_t>(out_.ops.size());
      out_.ops.push_back(std::move(ops_[i]));
    }
    out_.index_users();
    return std::move(out_);
  }

  std::string fresh_name(const std::string& base) {
    std::string name = base;
    for (int n = 2; names_.count(name); ++n) name = fmt::format("{}{}", base, n);
    names_.insert(name);
    return name;
  }

  // A new op, its result's shape and dtype by shape inference (`given`: the
  // attributes set), f32 values unless it is a view of a rounded tensor or
  // a cast.
  TensorId add_op(OpKind kind, std::vector<TensorId> inputs, Attributes attrs, AttrSet given, const std::string& name) {
    std::vector<const Tensor*> operands;
    for (TensorId t : inputs) operands.push_back(&out_.tensor(t));
    out_.tensors.push_back(
        inferred_result(kind, operands, attrs, given, fmt::format("attention_as_sdpa '{}'", name), fresh_name(name)));
    const TensorId id = static_cast<TensorId>(out_.tensors.size() - 1);
    new_producers_[id] = ops_.size();
    ops_.push_back(Op{kind, std::move(inputs), id, std::move(attrs), false});
    feeders_.push_back(false);
    return id;
  }
  TensorId reshape(TensorId x, const Shape& shape, const std::string& name) {
    if (out_.tensor(x).shape == shape) return x;
    Attributes a;
    a.shape = shape;
    return add_op(OpKind::Reshape, {x}, a, attr_bit(AttrKey::shape), name);
  }
  TensorId expand(TensorId x, const Shape& shape, const std::string& name) {
    if (out_.tensor(x).shape == shape) return x;
    Attributes a;
    a.shape = shape;
    return add_op(OpKind::Expand, {x}, a, attr_bit(AttrKey::shape), name);
  }
  TensorId transpose(TensorId x, const Perm& perm, const std::string& name) {
    if (is_identity(perm)) return x;
    Attributes a;
    a.perm = perm;
    return add_op(OpKind::Transpose, {x}, a, attr_bit(AttrKey::perm), name);
  }
  TensorId constant(float value) {
    Tensor c;
    c.kind = TensorKind::Constant;
    c.constant = value;
    out_.tensors.push_back(c);
    return static_cast<TensorId>(out_.tensors.size() - 1);
  }
  TensorId pointwise(OpKind kind, std::vector<TensorId> inputs, const std::string& name, std::optional<DType> cast = {}) {
    TensorId r = add_op(kind, std::move(inputs), {}, 0, name);
    if (cast) out_.tensors[static_cast<size_t>(r)].dtype = *cast;
    return r;
  }

  // The op that makes t: an op of the graph as written, or a new one.
  std::optional<Op> producer(TensorId t) const {
    if (static_cast<size_t>(t) >= g_.tensors.size()) {
      auto it = new_producers_.find(t);
      return it == new_producers_.end() ? std::nullopt : std::optional<Op>(ops_[it->second]);
    }
    const Tensor& x = g_.tensor(t);
    if (x.kind != TensorKind::OpResult || x.producer < 0) return std::nullopt;
    return g_.ops[static_cast<size_t>(x.producer)];
  }

  // t (its batch dimensions `from`, broadcast where t has 1s or fewer
  // dimensions) as a tensor whose batch dimensions are `to`, 1 where t
  // broadcasts along all of a group of them (all of them where `full`).
  TensorId regroup(TensorId t, const Shape& from, const Shape& to, bool full, const std::string& name) {
    const size_t rank = from.size() + 2;
    Shape shape = out_.tensor(t).shape;
    if (shape.size() < rank) shape.insert(shape.begin(), rank - shape.size(), 1);
    const Shape tb = batch_of(shape), tail = last_two(shape);
    Shape expanded, regrouped;
    for (const Group& gr : groups_of(from, to)) {
      bool broadcast = true;
      for (size_t i = gr.from_begin; i < gr.from_end; ++i) broadcast = broadcast && tb[i] == 1;
      for (size_t i = gr.from_begin; i < gr.from_end; ++i) expanded.push_back(broadcast ? 1 : from[i]);
      for (size_t j = gr.to_begin; j < gr.to_end; ++j) regrouped.push_back(broadcast ? 1 : to[j]);
    }
    TensorId x = reshape(t, shape, name);
    x = expand(x, concat(expanded, tail), name);
    x = reshape(x, concat(regrouped, tail), name);
    return full ? expand(x, concat(to, tail), name) : x;
  }

  // An operand of a matmul as [B, H, ...]: the tensor it is a batch
  // regroup of, where one has those batch dimensions, else regrouped.
  TensorId to_heads(TensorId t, const Shape& from, const Shape& heads, bool full, const std::string& name) {
    const Tensor& tensor = out_.tensor(t);
    if (tensor.rank() == static_cast<int>(from.size()) + 2 && batch_of(tensor.shape) == from) {
      std::optional<TensorId> found;
      for (TensorId cur = t;;) {
        if (batch_of(out_.tensor(cur).shape) == heads) found = cur;
        const std::optional<Op> op = producer(cur);
        if (!op || (op->kind != OpKind::Reshape && op->kind != OpKind::Expand)) break;
        const Shape& in = out_.tensor(op->inputs[0]).shape;
        const Shape& out = out_.tensor(op->output).shape;
        const bool regroups = op->kind == OpKind::Expand ? in == out : in.size() >= 2 && last_two(in) == last_two(out);
        if (!regroups) break;
        cur = op->inputs[0];
      }
      if (found) return *found;
    }
    return regroup(t, from, heads, full, name);
  }

  // The view ops `views` (of the graph as written, in order) applied to x,
  // each result named after the one it stands for.
  TensorId reapplied(TensorId x, const std::vector<int32_t>& views, const std::string& suffix) {
    for (int32_t v : views) {
      const Op& op = g_.ops[static_cast<size_t>(v)];
      x = add_op(op.kind, {x}, op.attrs, ~AttrSet{0}, g_.result(op).name + suffix);
    }
    return x;
  }
  // A matmul's operand, its constant factor (folded into the scale) left out.
  TensorId unscaled(TensorId t, const std::optional<OperandScale>& scale) {
    return scale ? reapplied(scale->source, scale->views, ".unscaled") : t;
  }

  // not(cond): an eq or ne behind views inverted (exactly, NaN included),
  // else cast(cond) == 0.
  TensorId negated(TensorId cond, const std::string& name) {
    std::vector<int32_t> views;  // cond is a tensor of the graph as written
    TensorId t = cond;
    for (std::optional<Op> op = producer(t); op && op_info(op->kind).family == OpFamily::View; op = producer(t)) {
      views.insert(views.begin(), g_.tensor(t).producer);
      t = op->inputs[0];
    }
    const std::optional<Op> compare = producer(t);
    if (static_cast<size_t>(t) < g_.tensors.size() && compare && (compare->kind == OpKind::Eq || compare->kind == OpKind::Ne))
      return reapplied(pointwise(compare->kind == OpKind::Eq ? OpKind::Ne : OpKind::Eq, compare->inputs, name), views, ".keep");
    const TensorId as_number = pointwise(OpKind::Cast, {cond}, name, DType::f32);
    return pointwise(OpKind::Eq, {as_number, constant(0.0f)}, name);
  }

  // kᵀ [.., D, Skv] as k [.., Skv, D]: the transposes that made kᵀ folded.
  TensorId untransposed(TensorId kt, const std::string& name) {
    const int rank = out_.tensor(kt).rank();
    Perm perm(static_cast<size_t>(rank));
    for (int d = 0; d < rank; ++d) perm[static_cast<size_t>(d)] = d;
    std::swap(perm[static_cast<size_t>(rank - 1)], perm[static_cast<size_t>(rank - 2)]);
    TensorId base = kt;
    // transpose(transpose(a, p), q) = transpose(a, r), r[d] = p[q[d]]
    while (!is_identity(perm)) {
      const std::optional<Op> op = producer(base);
      if (!op || op->kind != OpKind::Transpose) break;
      Perm r(perm.size());
      for (size_t d = 0; d < perm.size(); ++d) r[d] = op->attrs.perm[static_cast<size_t>(perm[d])];
      perm = r;
      base = op->inputs[0];
    }
    return transpose(base, perm, name);
  }

  // The sdpa's masks from the steps on the scores (attention_rewrite.h):
  // one, or none; for rounded scores each added tensor its own (at most two).
  std::vector<TensorId> masks(const AttentionMatch& a, const std::string& base) {
    int adds = 0, fills = 0;
    for (const ScoreStep& s : a.steps) adds += s.kind == ScoreStep::Kind::Add, fills += s.kind == ScoreStep::Kind::Fill;
    auto side = [&](const ScoreStep& s) {
      const Shape from = batch_of(s.space);
      if (from == a.heads && g_.tensor(s.side).rank() <= 4) return s.side;
      return regroup(s.side, from, a.heads, false, base + ".mask");
    };
    auto kept_where_true = [&](const ScoreStep& s) {  // masked_fill's condition says which keys go
      if (!s.fill_where_true) return side(s);
      const Shape from = batch_of(s.space);
      const TensorId keep = negated(s.side, base + ".keep");
      return from == a.heads && out_.tensor(keep).rank() <= 4 ? keep : regroup(keep, from, a.heads, false, base + ".mask");
    };
    if (a.score_roundings != 0) {  // (no fills: attention_match.cpp)
      std::vector<TensorId> out;
      for (const ScoreStep& s : a.steps)
        if (s.kind == ScoreStep::Kind::Add)
          out.push_back(s.negate ? pointwise(OpKind::Neg, {side(s)}, base + ".mask") : side(s));
      return out;
    }
    if (adds == 0 && fills == 1) {
      for (const ScoreStep& s : a.steps)
        if (s.kind == ScoreStep::Kind::Fill) return {kept_where_true(s)};
    }
    std::optional<TensorId> e;
    for (const ScoreStep& s : a.steps) {
      switch (s.kind) {
        case ScoreStep::Kind::Scale:
          if (e) e = pointwise(s.divide ? OpKind::Div : OpKind::Mul, {*e, constant(s.constant)}, base + ".mask");
          break;
        case ScoreStep::Kind::Add: {
          TensorId term = side(s);
          if (s.negate) term = pointwise(OpKind::Neg, {term}, base + ".mask");
          e = e ? pointwise(OpKind::Add, {*e, term}, base + ".mask") : term;
          break;
        }
        case ScoreStep::Kind::Fill: {
          const TensorId kept = e ? *e : constant(0.0f);
          const TensorId fill = constant(s.constant);
          e = pointwise(OpKind::Where, {side(s), s.fill_where_true ? fill : kept, s.fill_where_true ? kept : fill},
                        base + ".mask");
          break;
        }
      }
    }
    if (e) return {*e};
    return {};
  }

  void emit_sdpa(const AttentionMatch& a) {
    const Op& pv = g_.ops[static_cast<size_t>(a.pv)];
    const Tensor& o = g_.result(pv);
    const std::string& base = o.name;
    const int64_t b = a.heads[0], h = a.heads[1];
    const TensorId q = to_heads(unscaled(a.q, a.q_scale), a.qk_batch, a.heads, true, base + ".q");
    TensorId k = untransposed(to_heads(unscaled(a.kt, a.kt_scale), a.qk_batch, a.heads, false, base + ".kt"), base + ".k");
    TensorId v = to_heads(a.v, a.pv_batch, a.heads, false, base + ".v");
    // k and v: B batches, one head count (1 or H) for both.
    const int64_t kv_heads = std::max(out_.tensor(k).shape[1], out_.tensor(v).shape[1]);
    k = expand(k, {b, kv_heads, a.skv, a.d}, base + ".k");
    v = expand(v, {b, kv_heads, a.skv, a.d}, base + ".v");
    std::vector<TensorId> inputs{q, k, v};
    for (TensorId m : masks(a, base)) inputs.push_back(m);
    Attributes attrs;
    attrs.scale = static_cast<float>(a.scale);
    attrs.scores_rounded_to = a.scores_rounded_to;
    attrs.score_roundings = a.score_roundings;
    std::vector<const Tensor*> operands;
    for (TensorId t : inputs) operands.push_back(&out_.tensor(t));
    const InferredResult r = infer_result(OpKind::Sdpa, operands, attrs, attr_bit(AttrKey::scale) | attr_bit(AttrKey::causal),
                                          op_named(g_, a.pv));
    KILN_INTERNAL_CHECK(r.shape == (Shape{b, h, a.sq, a.d}));
    // The result: o itself where it is [B, H, Sq, D], else viewed as o.
    TensorId result = pv.output;
    if (o.shape != r.shape) {
      Tensor t = o;
      t.name = fresh_name(base + ".sdpa");
      t.shape = r.shape;
      t.strides = contiguous_strides(r.shape);
      t.is_output = false;
      out_.tensors.push_back(std::move(t));
      result = static_cast<TensorId>(out_.tensors.size() - 1);
    }
    // o keeps its type and rounding; the sdpa's dtype is o's where inference gives another.
    ops_.push_back(Op{OpKind::Sdpa, inputs, result, attrs, pv.explicit_dtype || r.dtype != o.dtype});
    feeders_.push_back(false);
    if (result != pv.output) {
      Attributes view;
      view.shape = o.shape;
      ops_.push_back(Op{OpKind::Reshape, {result}, pv.output, view, false});
      feeders_.push_back(false);
    }
  }

  const Graph& g_;
  Graph out_;
  std::map<int32_t, AttentionMatch> sites_;  // p·v's op -> its site
  std::vector<Op> ops_;                      // emitted, in order
  std::vector<bool> feeders_;                // ops_[i] only fed replaced ops
  std::map<TensorId, size_t> new_producers_;  // a new tensor -> its op in ops_
  std::set<std::string> names_;
};

}  // namespace

RowMatches find_written_attention(const Graph& g) {
  RowMatches m;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    std::optional<AttentionOrWhy> found = match_attention(g, static_cast<int32_t>(i));
    if (!found) continue;
    if (const std::string* why = std::get_if<std::string>(&*found)) {
      m.declined.push_back({"attention_as_sdpa", false, op_named(g, static_cast<int32_t>(i)), *why});
      continue;
    }
    const AttentionMatch& a = std::get<AttentionMatch>(*found);
    m.sites.push_back({a.pv, describe_site(g, a), a});
  }
  return m;
}

Graph attention_as_sdpa(const Graph& g, const RowMatches& m) { return SdpaBuilder(g, m).run(); }

}  // namespace kiln::ir
