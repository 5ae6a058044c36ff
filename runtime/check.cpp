#include "runtime/check.h"

#include <cmath>
#include <vector>

namespace kiln::runtime {
namespace {

double tolerance_of(DType d) {
  switch (d) {
    case DType::bf16: return 1e-2;
    case DType::f16: return 2e-3;
    case DType::f32:
    case DType::boolean: return 1e-4;
  }
  return 1e-4;
}

double tolerance_of(ir::Precision p) {
  switch (p) {
    case ir::Precision::tf32: return 1e-3;
    case ir::Precision::f16: return 2e-3;
    case ir::Precision::bf16: return 1e-2;
    case ir::Precision::f32: return 1e-4;
  }
  return 1e-4;
}

}  // namespace

double default_tolerance(const ir::Graph& g, ir::TensorId output) {
  double tolerance = tolerance_of(g.tensor(output).dtype);
  std::vector<bool> seen(g.tensors.size(), false);
  std::vector<ir::TensorId> stack{output};
  while (!stack.empty()) {
    const ir::TensorId t = stack.back();
    stack.pop_back();
    if (seen[static_cast<size_t>(t)]) continue;
    seen[static_cast<size_t>(t)] = true;
    const ir::Tensor& tensor = g.tensor(t);
    if (tensor.kind != ir::TensorKind::OpResult) continue;
    if (tensor.rounded) tolerance = std::max(tolerance, tolerance_of(tensor.dtype));
    const ir::Op& op = g.ops[static_cast<size_t>(tensor.producer)];
    if (op.kind == ir::OpKind::Matmul || op.kind == ir::OpKind::Conv2d)
      tolerance = std::max(tolerance, tolerance_of(op.attrs.precision));
    if (op.kind == ir::OpKind::Sdpa) tolerance = std::max(tolerance, tolerance_of(g.operand(op, 2).value_dtype()));
    for (ir::TensorId in : op.inputs) stack.push_back(in);
  }
  return tolerance;
}

Comparison compare(const HostTensor& out, const HostTensor& ref) {
  Comparison c;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.values.size() && i < out.values.size(); ++i) {
    const double a = out.values[i], b = ref.values[i];
    const bool fa = std::isfinite(a), fb = std::isfinite(b);
    if (!fa || !fb) {
      const bool same = (std::isnan(a) && std::isnan(b)) || (!std::isnan(a) && !std::isnan(b) && a == b);
      if (!same && c.nonfinite_match) c.nonfinite_match = false, c.first_mismatch = static_cast<int64_t>(i);
      continue;
    }
    num += (a - b) * (a - b);
    den += b * b;
  }
  if (out.values.size() != ref.values.size()) c.nonfinite_match = false;
  c.relative_error = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}

}  // namespace kiln::runtime
