// Expects a checked graph (shapes inferred); guarantees counts that do not
// overflow for any shape the graph checks accepted (they saturate).
#include "compiler/op_work.h"

#include <limits>

#include "compiler/op_table.h"

namespace kiln::ir {
namespace {

int64_t saturating_product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(p, f, &p)) return std::numeric_limits<int64_t>::max();
  return p;
}

}  // namespace

int64_t anchor_flops(const Graph& g, const Op& op) {
  const int64_t out = element_count(g.result(op).shape);
  switch (op_info(op.kind).family) {
    case OpFamily::Matmul: return saturating_product({2, out, g.operand(op, 0).shape.back()});
    case OpFamily::Conv: {
      const Shape& w = g.operand(op, 1).shape;
      return saturating_product({2, out, w[1], w[2], w[3]});
    }
    case OpFamily::Attention: {
      const Shape& q = g.operand(op, 0).shape;
      const int64_t flops = saturating_product({4, q[0], q[1], q[2], g.operand(op, 1).shape[2], q[3]});
      return op.attrs.causal ? flops / 2 : flops;
    }
    case OpFamily::Unary:
    case OpFamily::Binary:
    case OpFamily::Compare:
    case OpFamily::Select:
    case OpFamily::Reduce:
    case OpFamily::Norm:
    case OpFamily::Pool:
    case OpFamily::View:
    case OpFamily::Concat: return 0;
  }
  return 0;
}

int64_t estimated_work(const Graph& g, const Op& op) {
  if (const int64_t flops = anchor_flops(g, op); flops > 0) return flops;
  int64_t elements = element_count(g.result(op).shape);
  for (TensorId id : op.inputs)
    if (__builtin_add_overflow(elements, element_count(g.tensor(id).shape), &elements))
      return std::numeric_limits<int64_t>::max();
  return elements;
}

}  // namespace kiln::ir
