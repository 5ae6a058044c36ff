// Matmuls over K = 1 as products (matmul_k_one.h).
#include "compiler/matmul_k_one.h"

#include <set>

#include <fmt/format.h>

#include "compiler/graph_rewrite.h"

namespace kiln::ir {
namespace {

constexpr const char* kRow = "matmul_k_one";

bool transposed(const Graph& g, TensorId t) {
  const Tensor& tensor = g.tensor(t);
  return tensor.kind == TensorKind::OpResult && tensor.producer >= 0 &&
         g.ops[static_cast<size_t>(tensor.producer)].kind == OpKind::Transpose;
}

}  // namespace

RowMatches find_k_one_matmuls(const Graph& g) {
  RowMatches m;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.kind != OpKind::Matmul || g.operand(op, 0).shape.back() != 1) continue;
    const std::string where = op_named(g, static_cast<int32_t>(i));
    const bool exact = op.attrs.precision == Precision::f32 || (g.operand(op, 0).sixteen_bit_values() && g.operand(op, 1).sixteen_bit_values());
    if (!exact)
      m.declined.push_back({kRow, false, where, "its precision rounds f32 operands before the product"});
    else if (transposed(g, op.inputs[0]) || transposed(g, op.inputs[1]))
      m.declined.push_back({kRow, false, where, "an operand is a transpose (layout sinking would move it through the product and back)"});
    else
      m.sites.push_back({static_cast<int32_t>(i), where + " -> mul", {}});
  }
  return m;
}

Graph k_one_matmuls_as_products(const Graph& g, const RowMatches& m) {
  const std::set<int32_t> sites = site_ops(m);
  GraphRewrite out(g);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    Op op = g.ops[i];
    if (sites.count(static_cast<int32_t>(i))) {
      op.kind = OpKind::Mul;
      op.attrs = Attributes{};
    }
    out.emit(std::move(op));
  }
  return out.take();
}

}  // namespace kiln::ir
