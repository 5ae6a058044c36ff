#include <algorithm>
#include <cmath>
#include <limits>

#include "compiler/error.h"
#include "compiler/reference/evaluate.h"

namespace kiln::reference {

std::vector<float> eval_reduce(const ir::Op& op, const Shape& out_shape, const Operands& in) {
  const Value& x = *in[0];
  const auto& axes = op.attrs.axes;
  // Each input dimension's stride into the output: 0 along reduced axes.
  Shape kept;
  for (size_t d = 0; d < x.shape.size(); ++d)
    if (!std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(d))) kept.push_back(x.shape[d]);
  const Strides kept_strides = contiguous_strides(kept);
  Strides to_out(x.shape.size(), 0);
  for (size_t d = 0, k = 0; d < x.shape.size(); ++d)
    if (!std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(d))) to_out[d] = kept_strides[k++];

  const size_t out_count = static_cast<size_t>(element_count(out_shape));
  const bool is_max = op.kind == ir::OpKind::ReduceMax, is_min = op.kind == ir::OpKind::ReduceMin;
  const double init = is_max ? -INFINITY : is_min ? INFINITY : 0.0;
  std::vector<double> acc(out_count, init);
  for_each_index(x.shape, {to_out}, [&](int64_t i, const std::vector<int64_t>& at) {
    double& a = acc[static_cast<size_t>(at[0])];
    const double v = x.data[static_cast<size_t>(i)];
    if (is_max) a = std::isnan(a) || std::isnan(v) ? NAN : std::max(a, v);
    else if (is_min) a = std::isnan(a) || std::isnan(v) ? NAN : std::min(a, v);
    else a += v;
  });
  int64_t count = 1;
  for (int64_t axis : axes) count *= x.shape[static_cast<size_t>(axis)];
  std::vector<float> out(out_count);
  for (size_t i = 0; i < out_count; ++i)
    out[i] = static_cast<float>(op.kind == ir::OpKind::ReduceMean ? acc[i] / static_cast<double>(count) : acc[i]);
  return out;
}

}  // namespace kiln::reference
