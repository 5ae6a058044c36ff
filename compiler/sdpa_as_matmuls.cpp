// An sdpa over f32 operands as two matmuls and a softmax (sdpa_as_matmuls.h).
#include "compiler/sdpa_as_matmuls.h"

#include "compiler/error.h"

#include <cfloat>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "compiler/graph_rewrite.h"

namespace kiln::ir {
namespace {

constexpr const char* kRow = "sdpa_as_matmuls";

// The ops of one site, emitted in order into the rebuilt graph.
class SiteBuilder {
 public:
  SiteBuilder(GraphRewrite& out, const std::string& base) : out_(out), base_(base) {}

  TensorId op(OpKind kind, std::vector<TensorId> inputs, Attributes attrs = {}, AttrSet given = 0,
              std::optional<DType> dtype = {}) {
    std::vector<const Tensor*> operands;
    for (TensorId t : inputs) operands.push_back(&out_.tensor(t));
    const TensorId id = out_.add(inferred_result(kind, operands, attrs, given, fmt::format("{} '{}'", kRow, base_),
                                                 fmt::format("{}.{}{}", base_, op_name(kind), ++count_), dtype));
    out_.emit(Op{kind, std::move(inputs), id, std::move(attrs), dtype.has_value()});
    return id;
  }
  TensorId view(OpKind kind, TensorId x, const Shape& shape) {
    Attributes a;
    a.shape = shape;
    return op(kind, {x}, a, attr_bit(AttrKey::shape));
  }
  TensorId reduce(OpKind kind, TensorId x, int64_t axis) {
    Attributes a;
    a.axes = {axis};
    a.keepdims = true;
    return op(kind, {x}, a, attr_bit(AttrKey::axes) | attr_bit(AttrKey::keepdims));
  }
  TensorId constant(float value) {
    Tensor c;
    c.kind = TensorKind::Constant;
    c.constant = value;
    return out_.add(c);
  }

 private:
  GraphRewrite& out_;
  std::string base_;
  int count_ = 0;
};

// k or v [B, Hkv, S, D] with each head repeated `group` times: [B, Hkv * group, S, D].
TensorId repeat_heads(SiteBuilder& b, const Tensor& t, TensorId id, int64_t group) {
  if (group == 1) return id;
  const Shape& s = t.shape;
  const TensorId split = b.view(OpKind::Reshape, id, {s[0], s[1], 1, s[2], s[3]});
  const TensorId repeated = b.view(OpKind::Expand, split, {s[0], s[1], group, s[2], s[3]});
  return b.view(OpKind::Reshape, repeated, {s[0], s[1] * group, s[2], s[3]});
}

void emit_as_matmuls(const Graph& g, const Op& sdpa, GraphRewrite& out) {
  const Tensor& q = g.operand(sdpa, 0);
  const Tensor& k = g.operand(sdpa, 1);
  const Tensor& v = g.operand(sdpa, 2);
  const Tensor& o = g.result(sdpa);
  SiteBuilder b(out, o.name);
  const int64_t group = q.shape[1] / k.shape[1];
  const TensorId keys = repeat_heads(b, k, sdpa.inputs[1], group);
  const TensorId values = repeat_heads(b, v, sdpa.inputs[2], group);
  Attributes perm;
  perm.perm = {0, 1, 3, 2};
  const TensorId kt = b.op(OpKind::Transpose, {keys}, perm, attr_bit(AttrKey::perm));
  TensorId x = b.op(OpKind::Matmul, {sdpa.inputs[0], kt}, {}, 0, DType::f32);
  if (sdpa.attrs.scale != 1.0f) x = b.op(OpKind::Mul, {x, b.constant(sdpa.attrs.scale)});
  if (sdpa.inputs.size() > 3) {
    const TensorId mask = sdpa.inputs[3];
    x = g.tensor(mask).dtype == DType::boolean ? b.op(OpKind::Where, {mask, x, b.constant(-INFINITY)})
                                               : b.op(OpKind::Add, {x, mask});
  }
  // A row that sees no key (its max -inf): exp(x - -FLT_MAX) = 0 everywhere, 0 / FLT_MIN = 0.
  const TensorId max = b.op(OpKind::Maximum, {b.reduce(OpKind::ReduceMax, x, 3), b.constant(-FLT_MAX)});
  const TensorId e = b.op(OpKind::Exp, {b.op(OpKind::Sub, {x, max})});
  TensorId p = b.op(OpKind::Div, {e, b.op(OpKind::Maximum, {b.reduce(OpKind::ReduceSum, e, 3), b.constant(FLT_MIN)})});
  if (v.sixteen_bit_values()) p = b.op(OpKind::Cast, {p}, {}, 0, v.value_dtype());
  // o's tensor keeps its dtype and rounding; the matmul gives it that dtype where its operands would give another.
  const DType widest = out.tensor(p).dtype == DType::f32 || v.dtype == DType::f32 ? DType::f32 : v.dtype;
  out.emit(Op{OpKind::Matmul, {p, values}, sdpa.output, {}, sdpa.explicit_dtype || widest != o.dtype});
}

// Why an sdpa over f32 operands stays one (nullopt: it runs as matmuls).
std::optional<std::string> why_sdpa_stays(bool causal, int64_t score_elements) {
  if (causal) return std::string("causal: its mask needs the key positions, which no kiln op computes");
  if (score_elements * 4 > kMatmulScoresBudget)
    return fmt::format("its f32 scores would take {} MiB between the matmuls (the budget: {} MiB)",
                       score_elements * 4 >> 20, kMatmulScoresBudget >> 20);
  return std::nullopt;
}

}  // namespace

RowMatches find_f32_sdpas(const Graph& g) {
  RowMatches m;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.kind != OpKind::Sdpa) continue;
    const Tensor& q = g.operand(op, 0);
    if (q.dtype != DType::f32 && g.operand(op, 1).dtype != DType::f32 && g.operand(op, 2).dtype != DType::f32)
      continue;  // (16-bit q, k and v: the flash kernels read them)
    KILN_INTERNAL_CHECK(!rounds_scores(op.attrs));  // (attention_as_sdpa rounds scores only of 16-bit q, k and v)
    const int64_t scores = q.shape[0] * q.shape[1] * q.shape[2] * g.operand(op, 1).shape[2];
    const std::string where = op_named(g, static_cast<int32_t>(i));
    if (const std::optional<std::string> why = why_sdpa_stays(op.attrs.causal, scores))
      m.declined.push_back({kRow, false, where, *why});
    else
      m.sites.push_back({static_cast<int32_t>(i), where + " -> matmul, softmax, matmul", {}});
  }
  return m;
}

Graph sdpas_as_matmuls(const Graph& g, const RowMatches& m) {
  const std::set<int32_t> sites = site_ops(m);
  GraphRewrite out(g);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (sites.count(static_cast<int32_t>(i)))
      emit_as_matmuls(g, g.ops[i], out);
    else
      out.emit(g.ops[i]);
  }
  return out.take();
}

}  // namespace kiln::ir
