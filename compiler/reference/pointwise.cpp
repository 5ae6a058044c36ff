#include <cmath>
#include <limits>

#include "compiler/error.h"
#include "compiler/op_table.h"
#include "compiler/reference/evaluate.h"

namespace kiln::reference {
namespace {

using ir::OpKind;

// maximum/minimum/relu/clamp propagate NaN (as NumPy and PyTorch do).
double nan_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }
double nan_min(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); }

double unary(OpKind kind, const ir::Attributes& a, double x) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  switch (kind) {
    case OpKind::Identity: return x;
    case OpKind::Cast: return x;  // the rounding to the cast's dtype follows (rule 2)
    case OpKind::Neg: return -x;
    case OpKind::Abs: return std::fabs(x);
    case OpKind::Relu: return nan_max(x, 0.0);
    case OpKind::LeakyRelu: return x > 0 ? x : a.alpha * x;
    case OpKind::Gelu: return 0.5 * x * (1.0 + std::erf(x * M_SQRT1_2));
    case OpKind::GeluTanh: return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
    case OpKind::Silu: return x / (1.0 + std::exp(-x));
    case OpKind::Sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case OpKind::Tanh: return std::tanh(x);
    case OpKind::Exp: return std::exp(x);
    case OpKind::Log: return std::log(x);
    case OpKind::Sqrt: return std::sqrt(x);
    case OpKind::Rsqrt: return 1.0 / std::sqrt(x);
    case OpKind::Reciprocal: return 1.0 / x;
    case OpKind::Square: return x * x;
    case OpKind::Erf: return std::erf(x);
    case OpKind::Sin: return std::sin(x);
    case OpKind::Cos: return std::cos(x);
    case OpKind::Softplus: return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
    case OpKind::Clamp: {
      double y = x;
      if (a.min) y = nan_max(y, *a.min);
      if (a.max) y = nan_min(y, *a.max);
      return y;
    }
#define KILN_OP(kind, name, family, ...) KILN_CASE_UNLESS(family, Unary, kind)
#include "compiler/ops.def"
#undef KILN_OP
      break;
  }
  KILN_UNREACHABLE("not a unary op");
}

double binary(OpKind kind, double x, double y) {
  switch (kind) {
    case OpKind::Add: return x + y;
    case OpKind::Sub: return x - y;
    case OpKind::Mul: return x * y;
    case OpKind::Div: return x / y;
    case OpKind::Maximum: return nan_max(x, y);
    case OpKind::Minimum: return nan_min(x, y);
    case OpKind::Pow: return std::pow(x, y);
    case OpKind::Eq: return x == y;
    case OpKind::Ne: return x != y;
    case OpKind::Lt: return x < y;
    case OpKind::Le: return x <= y;
    case OpKind::Gt: return x > y;
    case OpKind::Ge: return x >= y;
#define KILN_OP(kind, name, family, ...) KILN_CASE_UNLESS_EITHER(family, Binary, Compare, kind)
#include "compiler/ops.def"
#undef KILN_OP
      break;
  }
  KILN_UNREACHABLE("not a binary op");
}

}  // namespace

Strides broadcast_strides(const Shape& in, const Shape& out) {
  Strides strides(out.size(), 0);
  const Strides contiguous = contiguous_strides(in);
  const size_t lead = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d)
    strides[lead + d] = in[d] == 1 ? 0 : contiguous[d];
  return strides;
}

std::vector<float> eval_pointwise(const ir::Op& op, const Shape& out_shape, const Operands& in) {
  std::vector<Strides> strides;
  for (const Value* v : in) strides.push_back(broadcast_strides(v->shape, out_shape));
  std::vector<float> out(static_cast<size_t>(element_count(out_shape)));
  const ir::OpFamily family = ir::op_info(op.kind).family;
  for_each_index(out_shape, strides, [&](int64_t i, const std::vector<int64_t>& at) {
    auto x = [&](size_t k) { return static_cast<double>(in[k]->data[static_cast<size_t>(at[k])]); };
    double y;
    if (family == ir::OpFamily::Unary) y = unary(op.kind, op.attrs, x(0));
    else if (family == ir::OpFamily::Select) y = x(0) != 0 ? x(1) : x(2);
    else y = binary(op.kind, x(0), x(1));
    out[static_cast<size_t>(i)] = static_cast<float>(y);
  });
  return out;
}

}  // namespace kiln::reference
