// Layout sinking (layout_sinking.h): one pass over the ops in order, each
// value carried as (tensor in the new graph, perm) until an op needs it as
// written.
#include "compiler/layout_sinking.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "compiler/error.h"

namespace kiln::ir {
namespace {

using Perm = std::vector<int64_t>;

bool is_identity(const Perm& p) {
  for (size_t d = 0; d < p.size(); ++d)
    if (p[d] != static_cast<int64_t>(d)) return false;
  return true;
}

Perm identity_perm(size_t rank) {
  Perm p(rank);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

// transpose(transpose(a, p), q) = transpose(a, r): r[d] = p[q[d]].
Perm compose(const Perm& p, const Perm& q) {
  Perm r(q.size());
  for (size_t d = 0; d < q.size(); ++d) r[d] = p[static_cast<size_t>(q[d])];
  return r;
}

const Perm kNhwcAsNchw = {0, 3, 1, 2};  // an NHWC tensor read as NCHW
const Perm kNchwAsNhwc = {0, 2, 3, 1};  // an NCHW tensor read as NHWC

class Sinker {
 public:
  explicit Sinker(const Graph& g) : old_(g) {
    out_.name = g.name;
    out_.tensors = g.tensors;  // every id keeps its meaning; results are re-linked below
    out_.inputs = g.inputs;
    out_.outputs = g.outputs;
    for (Tensor& t : out_.tensors)
      if (t.kind == TensorKind::OpResult) t.producer = -1;
  }

  // The rewritten graph, or nothing when no op moved.
  std::optional<Graph> run() {
    for (size_t i = 0; i < old_.ops.size(); ++i) {
      current_ = static_cast<int32_t>(i);
      if (!rewrite(old_.ops[i])) keep(old_.ops[i]);
    }
    if (!moved_) return std::nullopt;
    check_every_read_is_made_first();
    out_.index_users();
    return std::move(out_);
  }
  // The old ops run() computed over their operands' untransposed sources.
  const std::vector<int32_t>& rewritten() const { return rewritten_; }

 private:
  // Each op reads inputs, constants or results of earlier ops; each output
  // is made: a value left carried where it is read would be read unmade.
  void check_every_read_is_made_first() const {
    std::vector<bool> made(out_.tensors.size(), false);
    for (size_t t = 0; t < out_.tensors.size(); ++t) made[t] = out_.tensors[t].kind != TensorKind::OpResult;
    for (const Op& op : out_.ops) {
      for (TensorId in : op.inputs) KILN_INTERNAL_CHECK(made[static_cast<size_t>(in)]);
      made[static_cast<size_t>(op.output)] = true;
    }
    for (TensorId t : out_.outputs) KILN_INTERNAL_CHECK(made[static_cast<size_t>(t)]);
  }

  struct Carried {
    TensorId base;
    Perm perm;  // the value is transpose(base, perm)
  };

  // How the value of old tensor t is carried (itself, unpermuted, by default).
  Carried carried(TensorId t) const {
    if (auto it = carried_.find(t); it != carried_.end()) return it->second;
    return {t, identity_perm(old_.tensor(t).shape.size())};
  }

  // Old tensor t as written, in the new graph: its transpose made where it is
  // carried permuted (once; the op writes t's own id).
  TensorId materialised(TensorId t) {
    const Carried c = carried(t);
    if (is_identity(c.perm)) return c.base;  // t itself, or the tensor its transposes cancelled back to
    if (done_.count(t)) return t;
    Op transpose{OpKind::Transpose, {c.base}, t, {}, false, nullptr};
    transpose.attrs.perm = c.perm;
    emit(std::move(transpose));
    done_.insert(t);
    made_views_.emplace(std::make_pair(c.base, c.perm), t);
    return t;
  }

  void emit(Op op) {
    out_.tensors[static_cast<size_t>(op.output)].producer = static_cast<int32_t>(out_.ops.size());
    out_.ops.push_back(std::move(op));
  }

  void keep(const Op& op) {
    Op copy = op;
    for (TensorId& in : copy.inputs) in = materialised(in);
    emit(std::move(copy));
  }

  // A new tensor for old tensor t's values laid out as its carrier `base`
  // holds them: t's shape with dimension perm[d] of the new one t's d.
  TensorId permuted_result(TensorId t, const Perm& perm) {
    Tensor tensor = old_.tensor(t);
    Shape shape(tensor.shape.size());
    for (size_t d = 0; d < perm.size(); ++d) shape[static_cast<size_t>(perm[d])] = tensor.shape[d];
    tensor.shape = shape;
    tensor.strides = contiguous_strides(shape);
    tensor.is_output = false;
    std::string digits;
    for (int64_t d : perm) digits += std::to_string(d);
    tensor.name = fmt::format("{}.perm{}", tensor.name, digits);
    out_.tensors.push_back(std::move(tensor));
    return static_cast<TensorId>(out_.tensors.size() - 1);
  }

  // Emits `op` rewritten over the carriers (inputs already replaced), its
  // result carried as (new tensor, perm).
  void sink(Op op, TensorId old_result, const Perm& perm) {
    op.output = permuted_result(old_result, perm);
    carried_[old_result] = {op.output, perm};
    emit(std::move(op));
    moved_ = true;
    rewritten_.push_back(current_);
  }

  bool rewrite(const Op& op) {
    if (old_.tensor(op.output).is_output) return false;
    const OpFamily family = op_info(op.kind).family;
    if (op.kind == OpKind::Transpose) return transpose(op);
    if (is_pointwise(family)) return pointwise(op);
    if (op.kind == OpKind::BatchNorm) return batch_norm(op);
    if (family == OpFamily::Reduce) return reduction(op);
    if (family == OpFamily::Pool) return pool(op);
    if (family == OpFamily::Concat) return concat(op);
    return false;
  }

  bool transpose(const Op& op) {
    const Carried c = carried(op.inputs[0]);
    const Perm perm = compose(c.perm, op.attrs.perm);
    carried_[op.output] = {c.base, perm};  // the identity where the two cancel: the value is c.base
    if (!is_identity(c.perm)) moved_ = true;  // else deferred only: made where first read, as written
    return true;
  }

  // Operands of the op's rank carried with one common non-identity perm P,
  // or holding one value (any rank: broadcasting gives it everywhere). The
  // other operands are read through the inverse transpose, as P's carriers
  // hold values, where that read is in memory order: graph inputs of the
  // op's rank whose strides lay them out so (a channels-last input read as
  // NCHW); and, where P reads an NHWC carrier as NCHW (a conv's result,
  // nchw_convs_as_nhwc.h) and a carried operand has the result's own shape,
  // any value whose dimensions other than 1s keep their order under P (a
  // bias [K, 1, 1] broadcast over an NCHW conv's [N, K, P, Q]: aligned to
  // [1, K, 1, 1] and read as [1, 1, 1, K]), and a graph input that an
  // earlier op read through the same transpose (an NCHW network's input that
  // its first conv reads as NHWC, read again by the residual add: the
  // planner writes that transpose once, planner/strided_operands.h).
  // (Only then: over a result with
  // 1s, such as a squeeze-excite's [N, K, 1, 1], a carried broadcast operand
  // would otherwise pull a plain full one the other way, round after round;
  // other perms, such as attention's heads, keep the rule for inputs only.)
  bool pointwise(const Op& op) {
    const Shape& shape = old_.tensor(op.output).shape;
    const size_t rank = shape.size();
    std::optional<Perm> common;
    bool full = false;            // a carried operand of the result's shape
    std::vector<TensorId> plain;  // operands read through carrier_view
    for (TensorId in : op.inputs) {
      const Tensor& t = old_.tensor(in);
      if (element_count(t.shape) == 1) continue;
      const Carried c = carried(in);
      if (is_identity(c.perm)) {
        plain.push_back(in);
        continue;
      }
      if (t.shape.size() != rank) return false;
      if (common && *common != c.perm) return false;
      common = c.perm;
      full |= t.shape == shape;
    }
    if (!common) return false;
    for (TensorId in : plain) {
      const Tensor& t = old_.tensor(in);
      if (t.kind == TensorKind::Input && *common == kNhwcAsNchw && made_view(in, *common)) continue;
      const bool input_of_rank = t.kind == TensorKind::Input && t.shape.size() == rank;
      if (!input_of_rank && !(full && *common == kNhwcAsNchw)) return false;
      if (!laid_out_as_carrier(aligned(out_.tensor(carried(in).base), rank), *common)) return false;
    }
    Op rewritten = op;
    for (TensorId& in : rewritten.inputs) {
      const Tensor& t = old_.tensor(in);
      if (element_count(t.shape) == 1) {
        in = materialised(in);  // as written (it may itself be a deferred transpose)
        continue;
      }
      const bool is_plain = std::find(plain.begin(), plain.end(), in) != plain.end();
      in = is_plain ? carrier_view(in, *common) : carried(in).base;
    }
    sink(std::move(rewritten), op.output, *common);
    return true;
  }

  // t as broadcasting aligns it with a result of `rank` dimensions: 1s
  // (any stride) prepended.
  static Tensor aligned(Tensor t, size_t rank) {
    if (t.shape.size() >= rank) return t;
    const size_t missing = rank - t.shape.size();
    t.shape.insert(t.shape.begin(), missing, 1);
    t.strides.insert(t.strides.begin(), missing, 0);
    return t;
  }

  // Whether t, read as transpose(t, inverse of p), is in memory order.
  static bool laid_out_as_carrier(const Tensor& t, const Perm& p) {
    if (t.shape.size() != p.size()) return false;
    Shape shape(p.size());
    Strides strides(p.size());
    for (size_t d = 0; d < p.size(); ++d) {
      shape[static_cast<size_t>(p[d])] = t.shape[d];
      strides[static_cast<size_t>(p[d])] = t.strides[d];
    }
    const Strides packed = contiguous_strides(shape);
    for (size_t d = 0; d < p.size(); ++d)
      if (shape[d] != 1 && strides[d] != packed[d]) return false;
    return true;
  }

  // Old tensor t (not carried permuted), aligned to p's rank and read as
  // transpose(t, inverse of p): t as p's carriers hold values. Made once
  // per (t, p).
  TensorId carrier_view(TensorId t, const Perm& p) {
    if (auto it = carrier_views_.find({t, p}); it != carrier_views_.end()) return it->second;
    if (const std::optional<TensorId> made = made_view(t, p); made && p == kNhwcAsNchw) return *made;
    TensorId source = carried(t).base;
    const Tensor& from = out_.tensor(source);
    if (from.shape.size() < p.size()) {  // broadcasting's leading 1s, made explicit
      const Shape shape = aligned(from, p.size()).shape;
      const TensorId reshaped = view_result(source, shape, from.name + ".aligned");
      Op reshape{OpKind::Reshape, {source}, reshaped, {}, false, nullptr};
      reshape.attrs.shape = shape;
      emit(std::move(reshape));
      source = reshaped;
    }
    Perm inverse(p.size());
    for (size_t d = 0; d < p.size(); ++d) inverse[static_cast<size_t>(p[d])] = static_cast<int64_t>(d);
    Shape shape;
    for (int64_t d : inverse) shape.push_back(out_.tensor(source).shape[static_cast<size_t>(d)]);
    std::string digits;
    for (int64_t d : p) digits += std::to_string(d);
    const TensorId view = view_result(source, shape, fmt::format("{}.perm{}", old_.tensor(t).name, digits));
    Op transpose{OpKind::Transpose, {source}, view, {}, false, nullptr};
    transpose.attrs.perm = inverse;
    emit(std::move(transpose));
    carrier_views_[{t, p}] = view;
    return view;
  }

  // Old tensor t (not carried permuted) as p's carriers hold values, where a
  // transpose emitted for an earlier reader made it so already.
  std::optional<TensorId> made_view(TensorId t, const Perm& p) const {
    const TensorId base = carried(t).base;
    if (out_.tensor(base).shape.size() != p.size()) return std::nullopt;
    Perm inverse(p.size());
    for (size_t d = 0; d < p.size(); ++d) inverse[static_cast<size_t>(p[d])] = static_cast<int64_t>(d);
    const auto it = made_views_.find({base, inverse});
    if (it == made_views_.end()) return std::nullopt;
    return it->second;
  }

  // A new tensor: `source`'s type and rounding, seen in `shape`.
  TensorId view_result(TensorId source, const Shape& shape, const std::string& name) {
    Tensor tensor = out_.tensor(source);
    tensor.kind = TensorKind::OpResult;
    tensor.name = name;
    tensor.shape = shape;
    tensor.strides = contiguous_strides(shape);
    tensor.is_output = false;
    out_.tensors.push_back(std::move(tensor));
    return static_cast<TensorId>(out_.tensors.size() - 1);
  }

  bool batch_norm(const Op& op) {
    const Carried c = carried(op.inputs[0]);
    if (is_identity(c.perm)) return false;
    Op rewritten = op;
    rewritten.inputs[0] = c.base;
    for (size_t i = 1; i < rewritten.inputs.size(); ++i) rewritten.inputs[i] = materialised(op.inputs[i]);
    rewritten.attrs.axis = c.perm[static_cast<size_t>(op.attrs.axis)];
    sink(std::move(rewritten), op.output, c.perm);
    return true;
  }

  // reduce(transpose(a, P), axes) = transpose'(reduce(a, P[axes])), where
  // transpose' is P itself (keepdims) or P over the dimensions kept.
  bool reduction(const Op& op) {
    const Carried c = carried(op.inputs[0]);
    if (is_identity(c.perm)) return false;
    Op rewritten = op;
    rewritten.inputs[0] = c.base;
    rewritten.attrs.axes.clear();
    for (int64_t a : op.attrs.axes) rewritten.attrs.axes.push_back(c.perm[static_cast<size_t>(a)]);
    std::sort(rewritten.attrs.axes.begin(), rewritten.attrs.axes.end());
    Perm perm = c.perm;
    if (!op.attrs.keepdims) {
      // the kept dimensions, renumbered in the base's order
      Perm kept;
      for (size_t d = 0; d < c.perm.size(); ++d)
        if (!std::binary_search(op.attrs.axes.begin(), op.attrs.axes.end(), static_cast<int64_t>(d)))
          kept.push_back(c.perm[d]);
      perm.clear();
      for (int64_t k : kept) perm.push_back(std::count_if(kept.begin(), kept.end(), [&](int64_t o) { return o < k; }));
    }
    if (is_identity(perm)) {  // the result is laid out as written: no carrier
      rewritten.output = op.output;
      emit(std::move(rewritten));
      moved_ = true;
      rewritten_.push_back(current_);
      return true;
    }
    sink(std::move(rewritten), op.output, perm);
    return true;
  }

  bool pool(const Op& op) {
    const Carried c = carried(op.inputs[0]);
    const bool nchw = op.attrs.layout == Layout::NCHW;
    if (c.perm != (nchw ? kNhwcAsNchw : kNchwAsNhwc)) return false;
    Op rewritten = op;
    rewritten.inputs[0] = c.base;
    rewritten.attrs.layout = nchw ? Layout::NHWC : Layout::NCHW;
    sink(std::move(rewritten), op.output, c.perm);
    return true;
  }

  // concat(transpose(a1, P), transpose(a2, P), ..., axis) =
  // transpose(concat(a1, a2, ..., P[axis]), P): only where every operand is
  // carried with the same non-identity P (a DenseNet block's concat of NCHW
  // conv results, each NHWC in memory); otherwise the op stays as written.
  bool concat(const Op& op) {
    const Perm perm = carried(op.inputs[0]).perm;
    if (is_identity(perm)) return false;
    for (TensorId in : op.inputs)
      if (carried(in).perm != perm) return false;
    Op rewritten = op;
    for (TensorId& in : rewritten.inputs) in = carried(in).base;
    rewritten.attrs.axis = perm[static_cast<size_t>(op.attrs.axis)];
    sink(std::move(rewritten), op.output, perm);
    return true;
  }

  const Graph& old_;
  Graph out_;
  std::map<TensorId, Carried> carried_;
  std::set<TensorId> done_;
  std::map<std::pair<TensorId, Perm>, TensorId> made_views_;  // (source, perm) -> the transpose materialised() made
  std::map<std::pair<TensorId, Perm>, TensorId> carrier_views_;
  bool moved_ = false;
  int32_t current_ = -1;            // the old op being rewritten
  std::vector<int32_t> rewritten_;  // old ops now computed over their operands' sources
};

// "op 3 'a' (relu), op 5 'b' (add) and 7 more"
std::string some_ops(const Graph& g, const std::vector<int32_t>& ops) {
  constexpr size_t kNamed = 3;
  std::vector<std::string> named;
  for (size_t i = 0; i < ops.size() && i < kNamed; ++i) named.push_back(op_named(g, ops[i]));
  std::string out = fmt::format("{}", fmt::join(named, ", "));
  if (ops.size() > kNamed) out += fmt::format(" and {} more", ops.size() - kNamed);
  return out;
}

}  // namespace

RowMatches find_sinkable_transposes(const Graph& g) {
  Sinker sinker(g);
  std::optional<Graph> sunk = sinker.run();
  RowMatches m;
  if (!sunk) return m;
  const int32_t first = sinker.rewritten().empty() ? -1 : sinker.rewritten().front();
  const std::string where =
      sinker.rewritten().empty() ? std::string("transposes composed (no op rewritten)")
                                : fmt::format("{} computed over their operands' untransposed sources", some_ops(g, sinker.rewritten()));
  m.sites.push_back({first, where, std::make_shared<const Graph>(std::move(*sunk))});
  return m;
}

Graph sink_transposes(const Graph&, const RowMatches& m) {
  return *std::any_cast<std::shared_ptr<const Graph>>(m.sites.front().detail);
}

}  // namespace kiln::ir
