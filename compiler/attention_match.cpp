// The attention_as_sdpa row's matcher (attention_match.h): from p·v back
// through the probabilities, the softmax and the ops on the scores to q·kᵀ,
// then each condition of attention_rewrite.h, the first that fails named.
#include "compiler/attention_match.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "compiler/error.h"
#include "compiler/rewrite_table.h"
#include "compiler/shape_inference.h"

namespace kiln::ir {
namespace {

const Op* producer_of(const Graph& g, TensorId t) {
  const Tensor& x = g.tensor(t);
  return x.kind == TensorKind::OpResult && x.producer >= 0 ? &g.ops[static_cast<size_t>(x.producer)] : nullptr;
}

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

bool sixteen_bit(DType d) { return d == DType::f16 || d == DType::bf16; }

// A view that keeps the last two dimensions and the order of the elements:
// it only regroups batch dimensions (reshape), or changes nothing (expand
// to the same shape).
bool regroups_batch(const Graph& g, const Op& op) {
  if (op.kind != OpKind::Reshape && op.kind != OpKind::Expand) return false;
  const Shape& in = g.operand(op, 0).shape;
  const Shape& out = g.result(op).shape;
  if (op.kind == OpKind::Expand) return in == out;
  return in.size() >= 2 && out.size() >= 2 && in[in.size() - 2] == out[out.size() - 2] && in.back() == out.back();
}

// Ops that hand a value on unchanged but for rounding: batch regroups,
// identity, casts between floating types.
bool passes_value(const Graph& g, const Op& op) {
  if (regroups_batch(g, op) || op.kind == OpKind::Identity) return true;
  return op.kind == OpKind::Cast && g.result(op).dtype != DType::boolean && g.operand(op, 0).dtype != DType::boolean;
}

// A softmax over one axis of x: the op, or written out as
// exp(x - max(x)) / sum(exp(...)), each reduction keepdims (or reshaped to
// its keepdims shape).
struct Softmax {
  std::vector<int32_t> ops;
  TensorId x = -1, probs = -1;
  int64_t axis = -1;               // -1: the max and the sum disagree
  std::vector<TensorId> internals;  // written out: every result but the probabilities
};

// The reduction of `kind` over one axis of x behind t (through a reshape
// giving it its keepdims shape): its axis, its ops and results.
std::optional<int64_t> reduction_behind(const Graph& g, TensorId t, OpKind kind, TensorId x, Softmax& s) {
  const Op* op = producer_of(g, t);
  const Op* reshape = nullptr;
  if (op && op->kind == OpKind::Reshape) reshape = op, op = producer_of(g, op->inputs[0]);
  if (!op || op->kind != kind || op->inputs[0] != x || op->attrs.axes.size() != 1) return std::nullopt;
  const int64_t axis = op->attrs.axes[0];
  Shape kept = g.tensor(x).shape;
  kept[static_cast<size_t>(axis)] = 1;
  if (reshape ? op->attrs.keepdims || g.result(*reshape).shape != kept : !op->attrs.keepdims) return std::nullopt;
  for (const Op* o : {op, reshape})
    if (o) {
      s.ops.push_back(g.tensor(o->output).producer);
      s.internals.push_back(o->output);
    }
  return axis;
}

std::optional<Softmax> softmax_making(const Graph& g, TensorId probs) {
  const Op* op = producer_of(g, probs);
  if (!op) return std::nullopt;
  Softmax s;
  s.probs = probs;
  if (op->kind == OpKind::Softmax) {
    s.ops = {g.tensor(probs).producer};
    s.x = op->inputs[0];
    s.axis = op->attrs.axis;
    return s;
  }
  const Op* exp = op->kind == OpKind::Div ? producer_of(g, op->inputs[0]) : nullptr;
  const Op* sub = exp && exp->kind == OpKind::Exp ? producer_of(g, exp->inputs[0]) : nullptr;
  if (!sub || sub->kind != OpKind::Sub || g.result(*sub).shape != g.tensor(sub->inputs[0]).shape) return std::nullopt;
  const TensorId x = sub->inputs[0];
  const std::optional<int64_t> max_axis = reduction_behind(g, sub->inputs[1], OpKind::ReduceMax, x, s);
  const std::optional<int64_t> sum_axis = reduction_behind(g, op->inputs[1], OpKind::ReduceSum, exp->output, s);
  if (!max_axis || !sum_axis) return std::nullopt;
  s.x = x;
  s.axis = *max_axis == *sum_axis ? *max_axis : -1;
  for (const Op* o : {sub, exp}) {
    s.ops.push_back(g.tensor(o->output).producer);
    s.internals.push_back(o->output);
  }
  s.ops.push_back(g.tensor(probs).producer);
  std::sort(s.ops.begin(), s.ops.end());
  return s;
}

class Matcher {
 public:
  Matcher(const Graph& g, int32_t pv) : g_(g), pv_(pv) {}

  std::optional<AttentionOrWhy> run() {
    const Op& pv = g_.ops[static_cast<size_t>(pv_)];
    if (pv.kind != OpKind::Matmul) return std::nullopt;
    TensorId p = pv.inputs[0];
    for (const Op* op = producer_of(g_, p); op && passes_value(g_, *op); op = producer_of(g_, p)) {
      p_path_.push_back(g_.tensor(p).producer);
      p = op->inputs[0];
    }
    std::optional<Softmax> softmax = softmax_making(g_, p);
    if (!softmax) return std::nullopt;
    sm_ = std::move(*softmax);
    for (std::string (Matcher::*check)() : {&Matcher::softmax_axis, &Matcher::scores, &Matcher::operands, &Matcher::masks,
                                             &Matcher::reads, &Matcher::rounding})
      if (std::string why = (this->*check)(); !why.empty()) return AttentionOrWhy(std::move(why));
    return AttentionOrWhy(description());
  }

 private:
  std::string name(TensorId t) const { return detail::quoted(g_.tensor(t).name); }
  std::string op_of(TensorId t) const { return op_named(g_, g_.tensor(t).producer); }

  std::string softmax_axis() {
    const Tensor& probs = g_.tensor(sm_.probs);
    if (sm_.axis == probs.rank() - 1) return {};
    if (sm_.axis < 0) return fmt::format("the written-out softmax {} takes its max and its sum over different axes", op_of(sm_.probs));
    return fmt::format("the softmax {} normalises over axis {} of {}, not over the keys (its last axis)", op_of(sm_.probs),
                       sm_.axis, describe_tensor(g_.tensor(sm_.x)));
  }

  // Whether t is computed from a matmul through ops a chain of scores may
  // hold (a bounded search: which operand of a step carries the scores).
  bool from_matmul(TensorId t, int& budget) const {
    if (--budget < 0) return false;
    const Op* op = producer_of(g_, t);
    if (!op) return false;
    if (op->kind == OpKind::Matmul) return true;
    if (passes_value(g_, *op)) return from_matmul(op->inputs[0], budget);
    if (op->kind != OpKind::Mul && op->kind != OpKind::Div && op->kind != OpKind::Add && op->kind != OpKind::Sub &&
        op->kind != OpKind::Where)
      return false;
    for (size_t k = op->kind == OpKind::Where ? 1 : 0; k < op->inputs.size(); ++k)
      if (from_matmul(op->inputs[k], budget)) return true;
    return false;
  }

  // From the softmax's input back to q·kᵀ, each op a step or a view.
  std::string scores() {
    TensorId t = sm_.x;
    for (;;) {
      const Op* op = producer_of(g_, t);
      if (!op)
        return fmt::format("the softmax's input {} is a graph input, not scores computed by a matmul (q·kᵀ)",
                           describe_tensor(g_.tensor(t)));
      chain_.push_back(t);
      const int32_t oi = g_.tensor(t).producer;
      if (op->kind == OpKind::Matmul) {
        qk_ = oi;
        break;
      }
      chain_ops_.push_back(oi);
      if (passes_value(g_, *op)) {
        t = op->inputs[0];
        continue;
      }
      if (op_info(op->kind).family == OpFamily::View)
        return fmt::format("{} rearranges the scores between q·kᵀ and the softmax", op_named(g_, oi));
      std::string why = step(*op, oi, t);
      if (!why.empty()) return why;
    }
    std::reverse(steps_.begin(), steps_.end());
    return {};
  }

  // The step op `oi` makes of the scores; `t` moves to the operand that carries them.
  std::string step(const Op& op, int32_t oi, TensorId& t) {
    const bool where = op.kind == OpKind::Where;
    if (!where && op.kind != OpKind::Mul && op.kind != OpKind::Div && op.kind != OpKind::Add && op.kind != OpKind::Sub)
      return fmt::format("the scores pass through {}, which sdpa does not compute (it scales them, adds a mask or bias, "
                         "and fills masked keys)",
                         op_named(g_, oi));
    std::vector<size_t> carriers;
    for (size_t k = where ? 1 : 0; k < op.inputs.size(); ++k) {
      int budget = 64;
      if (g_.tensor(op.inputs[k]).kind != TensorKind::Constant && from_matmul(op.inputs[k], budget)) carriers.push_back(k);
    }
    if (carriers.empty())
      return fmt::format("the softmax's input is not computed from a matmul (q·kᵀ): {} reads none", op_named(g_, oi));
    if (carriers.size() > 1) return fmt::format("{} combines the results of two matmuls", op_named(g_, oi));
    const size_t k = carriers[0];
    const TensorId other = op.inputs[where ? 3 - k : 1 - k];
    const Tensor& o = g_.tensor(other);
    const bool constant = o.kind == TensorKind::Constant;
    if (g_.result(op).shape != g_.tensor(op.inputs[k]).shape)
      return fmt::format("{} broadcasts the scores {} to {}", op_named(g_, oi), describe_tensor(g_.tensor(op.inputs[k])),
                         to_string(g_.result(op).shape));
    ScoreStep s;
    s.space = g_.result(op).shape;
    switch (op.kind) {
      case OpKind::Mul:
      case OpKind::Div:
        if (op.kind == OpKind::Div && k == 1) return fmt::format("{} divides by the scores", op_named(g_, oi));
        if (!constant)
          return fmt::format("{} {} the scores by {}, not a constant: sdpa's scale is one number", op_named(g_, oi),
                             op.kind == OpKind::Mul ? "multiplies" : "divides", describe_tensor(o));
        if (op.kind == OpKind::Div && o.constant == 0.0f) return fmt::format("{} divides the scores by zero", op_named(g_, oi));
        s.kind = ScoreStep::Kind::Scale;
        s.constant = o.constant;
        s.divide = op.kind == OpKind::Div;
        break;
      case OpKind::Add:
      case OpKind::Sub:
        if (op.kind == OpKind::Sub && k == 1) return fmt::format("{} subtracts the scores", op_named(g_, oi));
        if (constant)
          return fmt::format("{} adds the constant {} to every score (sdpa's mask is a tensor)", op_named(g_, oi),
                             op.kind == OpKind::Sub ? -o.constant : o.constant);
        s.kind = ScoreStep::Kind::Add;
        s.side = other;
        s.negate = op.kind == OpKind::Sub;
        break;
      default:  // where
        if (!constant)
          return fmt::format("{} fills masked scores with {}, a tensor, not a constant", op_named(g_, oi), describe_tensor(o));
        s.kind = ScoreStep::Kind::Fill;
        s.side = op.inputs[0];
        s.constant = o.constant;
        s.fill_where_true = k == 2;
        break;
    }
    steps_.push_back(s);
    t = op.inputs[k];
    return {};
  }

  // q, k and v as sdpa takes them: one head dimension, p·v's batches the probabilities'.
  std::string operands() {
    const Op& qk = g_.ops[static_cast<size_t>(qk_)];
    const Op& pv = g_.ops[static_cast<size_t>(pv_)];
    const Shape& s = g_.result(qk).shape;
    const Shape& probs = g_.tensor(sm_.probs).shape;
    const Shape& p = g_.operand(pv, 0).shape;
    const Shape& o = g_.result(pv).shape;
    sq_ = s[s.size() - 2], skv_ = s.back(), d_ = g_.operand(qk, 0).shape.back();
    KILN_INTERNAL_CHECK(probs[probs.size() - 2] == sq_ && probs.back() == skv_ && p[p.size() - 2] == sq_ && p.back() == skv_);
    const Tensor& v = g_.operand(pv, 1);
    if (v.shape.back() != d_)
      return fmt::format("v {} has head dimension {} and q {} has {}: sdpa takes one for both", describe_tensor(v),
                         v.shape.back(), describe_tensor(g_.operand(qk, 0)), d_);
    if (batch_of(o) != batch_of(p))
      return fmt::format("v {} broadcasts the probabilities {} to more batches", describe_tensor(v),
                         describe_tensor(g_.operand(pv, 0)));
    const Shape pb = batch_of(probs);
    if (pb.size() <= 2) {
      heads_ = pb;
      heads_.insert(heads_.begin(), 2 - pb.size(), 1);
    } else {
      heads_ = {element_count(Shape(pb.begin(), pb.end() - 1)), pb.back()};
    }
    return {};
  }

  // q or kᵀ as the product of a constant and a tensor, through views: the
  // constant folds into the sdpa's scale (exact for a power of two, else
  // one f32 rounding of each product apart, as for the scores' scale). Not
  // where the product is rounded (a dtype): the sdpa then reads it as is.
  std::optional<OperandScale> operand_scale(TensorId t) const {
    OperandScale s;
    for (const Op* op = producer_of(g_, t); op; op = producer_of(g_, t)) {
      if (op_info(op->kind).family == OpFamily::View) {
        s.views.insert(s.views.begin(), g_.tensor(t).producer);
        t = op->inputs[0];
        continue;
      }
      if (op->kind != OpKind::Mul && op->kind != OpKind::Div) return std::nullopt;
      if (g_.tensor(t).value_dtype() != DType::f32) return std::nullopt;
      const Tensor& c = g_.operand(*op, 1);
      const size_t other = c.kind == TensorKind::Constant ? 0 : 1;
      const Tensor& constant = g_.operand(*op, 1 - other);
      if (constant.kind != TensorKind::Constant || (op->kind == OpKind::Div && other == 1) || constant.constant == 0.0f)
        return std::nullopt;
      if (g_.operand(*op, other).shape != g_.tensor(t).shape) return std::nullopt;
      s.source = op->inputs[other];
      s.factor = op->kind == OpKind::Div ? 1.0 / constant.constant : constant.constant;
      return s;
    }
    return std::nullopt;
  }

  // Whether t is computed from the scores (ops before q·kᵀ cannot be).
  bool from_scores(TensorId t) const {
    const std::set<TensorId> scores(chain_.begin(), chain_.end());
    std::vector<TensorId> stack{t};
    std::set<TensorId> seen;
    while (!stack.empty()) {
      const TensorId cur = stack.back();
      stack.pop_back();
      if (scores.count(cur)) return true;
      const Tensor& tensor = g_.tensor(cur);
      if (tensor.kind != TensorKind::OpResult || tensor.producer < qk_ || !seen.insert(cur).second) continue;
      for (TensorId in : g_.ops[static_cast<size_t>(tensor.producer)].inputs) stack.push_back(in);
    }
    return false;
  }

  std::string masks() {
    const Op& qk = g_.ops[static_cast<size_t>(qk_)];
    q_scale_ = operand_scale(qk.inputs[0]);
    kt_scale_ = operand_scale(qk.inputs[1]);
    for (const std::optional<OperandScale>& s : {q_scale_, kt_scale_})
      if (s) scale_ *= s->factor;
    for (size_t i = 0; i < steps_.size(); ++i) {
      const ScoreStep& s = steps_[i];
      if (s.side >= 0 && from_scores(s.side))
        return fmt::format("the mask {} is computed from the scores", describe_tensor(g_.tensor(s.side)));
      if (s.kind == ScoreStep::Kind::Scale) scale_ *= s.divide ? 1.0 / s.constant : s.constant;
      if (s.kind != ScoreStep::Kind::Fill) continue;
      double fill = s.constant;
      for (size_t j = i + 1; j < steps_.size(); ++j)
        if (steps_[j].kind == ScoreStep::Kind::Scale) fill *= steps_[j].divide ? 1.0 / steps_[j].constant : steps_[j].constant;
      if (fill > kMaskingFill)
        return fmt::format("the masked fill of {} puts {} where keys are masked (after the scales that follow it): only "
                           "a fill of at most {} masks a key out as sdpa's mask does",
                           name(s.side), fill, kMaskingFill);
    }
    if (!std::isfinite(static_cast<float>(scale_)))
      return fmt::format("the scales multiply to {}, not a finite f32", scale_);
    return {};
  }

  // Readers of t other than the ops in `within`, named; empty if none.
  std::string read_elsewhere(TensorId t, const std::vector<int32_t>& within) const {
    if (g_.tensor(t).is_output) return "a graph output";
    for (int32_t user : g_.users[static_cast<size_t>(t)])
      if (std::find(within.begin(), within.end(), user) == within.end())
        return fmt::format("read elsewhere too ({})", op_named(g_, user));
    return {};
  }

  std::string reads() {
    // The probabilities through their path to p·v: each read by the next op only.
    TensorId t = sm_.probs;
    for (auto it = p_path_.rbegin(); it != p_path_.rend(); ++it) {
      if (std::string where = read_elsewhere(t, {*it}); !where.empty())
        return fmt::format("the probabilities {} are {}", name(t), where);
      t = g_.ops[static_cast<size_t>(*it)].output;
    }
    if (std::string where = read_elsewhere(t, {pv_}); !where.empty())
      return fmt::format("the probabilities {} are {}", name(t), where);
    for (TensorId i : sm_.internals)
      if (std::string where = read_elsewhere(i, sm_.ops); !where.empty())
        return fmt::format("{} of the written-out softmax is {}", name(i), where);
    // The scores: each read by the next op of the chain (the softmax's input by the softmax).
    for (size_t i = 0; i < chain_.size(); ++i) {
      const std::vector<int32_t> next = i == 0 ? sm_.ops : std::vector<int32_t>{chain_ops_[i - 1]};
      if (std::string where = read_elsewhere(chain_[i], next); !where.empty())
        return fmt::format("the scores {} are {}", name(chain_[i]), where);
    }
    return {};
  }

  std::string rounding() {
    std::optional<DType> to;  // the 16-bit type the chain rounds its scores to, if it does
    TensorId first = -1;      // (where, the softmax's side first)
    for (TensorId t : chain_) {
      const DType d = g_.tensor(t).value_dtype();
      if (d == DType::f32) continue;
      if (to && *to != d)
        return fmt::format("the scores are rounded to {} at {} and to {} at {}: sdpa's scores take one type", to_string(d),
                           op_of(t), to_string(*to), op_of(first));
      if (!to) first = t;
      to = d;
    }
    for (TensorId t : sm_.internals)
      if (g_.tensor(t).value_dtype() != DType::f32)
        return fmt::format("the written-out softmax rounds to {} at {}: sdpa keeps it in f32", to_string(g_.tensor(t).value_dtype()),
                           op_of(t));
    if (to) {
      if (std::string why = rounded_scores(*to); !why.empty()) return why;
      return probabilities_rounding();
    }
    const Op& qk = g_.ops[static_cast<size_t>(qk_)];
    if (qk.attrs.precision != Precision::f32 &&
        (g_.operand(qk, 0).value_dtype() == DType::f32 || g_.operand(qk, 1).value_dtype() == DType::f32))
      return fmt::format("{} rounds its f32 operands to {} (its precision): sdpa reads q and k as they are", op_named(g_, qk_),
                         to_string(qk.attrs.precision));
    return probabilities_rounding();
  }

  // Scores the chain rounds to `to` (a bf16 graph's, written out: Swin's
  // window attention): the sdpa rounds them where the chain does
  // (Attributes::score_roundings), which it can where the scores are
  // round(round(round(round(q·kᵀ) * scale) + mask) + mask2), each round
  // optional: at most one scale, then at most two added tensors (a shifted
  // window's bias and mask), q, k and v held as `to`, and a row's keys in
  // one tile of the flash kernel.
  std::string rounded_scores(DType to) {
    const std::string rounded = fmt::format("the scores are rounded to {}", to_string(to));
    if (skv_ > kRoundedScoresMaxKeys)
      return fmt::format("{} and a row has {} keys: sdpa keeps scores in f32 (graph-format.md rule 6), and a rewrite keeps "
                         "every rounding the graph asks for (rule 4), which the attention kernel does for rows of at most {} "
                         "keys (a row in one tile)",
                         rounded, skv_, kRoundedScoresMaxKeys);
    const Op& qk = g_.ops[static_cast<size_t>(qk_)];
    const Op& pv = g_.ops[static_cast<size_t>(pv_)];
    for (const Tensor* t : {&g_.operand(qk, 0), &g_.operand(qk, 1), &g_.operand(pv, 1)})
      if (t->value_dtype() != to)
        return fmt::format("{} and {} holds {} values: sdpa rounds scores only of q, k and v held as that type", rounded,
                           describe_tensor(*t), to_string(t->value_dtype()));
    // The chain from q·kᵀ on: the ops before each step (views, casts) and the step itself.
    int scales = 0, adds = 0;
    uint8_t roundings = 0;
    uint8_t point = kRoundProduct;  // the rounding point of the values seen so far
    auto rounds = [&](TensorId t) { return g_.tensor(t).value_dtype() == to; };
    size_t next_step = 0;  // steps_ runs q·kᵀ first; chain_ops_ runs the softmax's side first
    if (rounds(chain_.back())) roundings |= point;
    for (size_t i = chain_ops_.size(); i-- > 0;) {
      const Op& op = g_.ops[static_cast<size_t>(chain_ops_[i])];
      if (!passes_value(g_, op)) {
        const ScoreStep& s = steps_[next_step++];
        if (s.kind == ScoreStep::Kind::Fill)
          return fmt::format("{} and {} fills masked scores: the sdpa rounds its scores only around a scale and added "
                             "masks",
                             rounded, op_named(g_, chain_ops_[i]));
        if (s.kind == ScoreStep::Kind::Scale) {
          if (++scales > 1 || adds > 0)
            return fmt::format("{} and {} scales them {}: the sdpa rounds its scores only around one scale before the mask",
                               rounded, op_named(g_, chain_ops_[i]), adds > 0 ? "after the mask is added" : "a second time");
          point = kRoundScaled;
        } else {
          if (++adds > 2)
            return fmt::format("{} and {} adds a third tensor to them: the sdpa rounds its scores around at most two added "
                               "masks",
                               rounded, op_named(g_, chain_ops_[i]));
          point = adds == 1 ? kRoundMasked : kRoundMasked2;
        }
      }
      if (rounds(chain_[i])) roundings |= point;
    }
    rounded_to_ = to, roundings_ = roundings;
    return {};
  }

  // The probabilities reach v rounded as sdpa rounds them (rule 6).
  std::string probabilities_rounding() {
    DType p = g_.tensor(sm_.probs).value_dtype();
    for (auto it = p_path_.rbegin(); it != p_path_.rend(); ++it) {
      const DType next = g_.result(g_.ops[static_cast<size_t>(*it)]).value_dtype();
      if (!sixteen_bit(next)) continue;  // a widening keeps the rounded values
      if (sixteen_bit(p) && p != next)
        return fmt::format("the probabilities are rounded twice, to {} and to {}", to_string(p), to_string(next));
      p = next;
    }
    const Op& pv = g_.ops[static_cast<size_t>(pv_)];
    const Tensor& v = g_.operand(pv, 1);
    const DType vd = v.value_dtype();
    if (pv.attrs.precision != Precision::f32) {
      if (vd == DType::f32)
        return fmt::format("{} rounds v's f32 values to {} (its precision): sdpa reads v as it is", op_named(g_, pv_),
                           to_string(pv.attrs.precision));
      if (p == DType::f32 && pv.attrs.precision == Precision::tf32)
        return fmt::format("{} rounds the probabilities to tf32 (its precision), which sdpa does not", op_named(g_, pv_));
      if (p == DType::f32) p = pv.attrs.precision == Precision::bf16 ? DType::bf16 : DType::f16;
    }
    const DType want = sixteen_bit(vd) ? vd : DType::f32;
    if (p == want) return {};
    if (want == DType::f32)
      return fmt::format("the probabilities are rounded to {} and v {} holds f32 values: sdpa keeps them in f32 "
                         "(graph-format.md rule 6)",
                         to_string(p), describe_tensor(v));
    return fmt::format("the probabilities {} are {} values and v {} holds {}: sdpa rounds them to {} before they multiply "
                       "v (graph-format.md rule 6); a softmax with dtype {} would match",
                       name(sm_.probs), to_string(p), describe_tensor(v), to_string(vd), to_string(vd), to_string(vd));
  }

  AttentionMatch description() const {
    AttentionMatch a;
    const Op& qk = g_.ops[static_cast<size_t>(qk_)];
    const Op& pv = g_.ops[static_cast<size_t>(pv_)];
    a.pv = pv_;
    a.ops = chain_ops_;
    a.ops.insert(a.ops.end(), sm_.ops.begin(), sm_.ops.end());
    a.ops.insert(a.ops.end(), p_path_.begin(), p_path_.end());
    a.ops.push_back(qk_);
    a.ops.push_back(pv_);
    std::sort(a.ops.begin(), a.ops.end());
    a.q = qk.inputs[0], a.kt = qk.inputs[1], a.v = pv.inputs[1];
    a.q_scale = q_scale_, a.kt_scale = kt_scale_;
    a.qk_batch = batch_of(g_.result(qk).shape);
    a.pv_batch = batch_of(g_.result(pv).shape);
    a.heads = heads_;
    a.sq = sq_, a.skv = skv_, a.d = d_;
    a.steps = steps_;
    a.scale = scale_;
    a.scores_rounded_to = rounded_to_;
    a.score_roundings = roundings_;
    return a;
  }

  const Graph& g_;
  const int32_t pv_;
  std::vector<int32_t> p_path_;    // ops between the probabilities and p·v, p·v's side first
  Softmax sm_;
  std::vector<TensorId> chain_;    // the scores, from the softmax's input back to q·kᵀ's result
  std::vector<int32_t> chain_ops_;  // their producers but q·kᵀ (chain_ops_[i] makes chain_[i])
  std::vector<ScoreStep> steps_;
  int32_t qk_ = -1;
  int64_t sq_ = 0, skv_ = 0, d_ = 0;
  Shape heads_;
  std::optional<OperandScale> q_scale_, kt_scale_;
  double scale_ = 1.0;
  DType rounded_to_ = DType::f32;
  uint8_t roundings_ = 0;
};

}  // namespace

std::optional<AttentionOrWhy> match_attention(const Graph& g, int32_t pv) { return Matcher(g, pv).run(); }

}  // namespace kiln::ir
