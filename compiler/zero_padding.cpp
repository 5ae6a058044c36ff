// A tensor extended with zeros along one axis (zero_padding.h).
#include "compiler/zero_padding.h"

#include <fmt/format.h>

#include "compiler/error.h"

namespace kiln::ir {

TensorId zero_padded(GraphRewrite& out, TensorId t, size_t axis, int64_t to, const std::string& zeros_suffix,
                     const std::string& padded_suffix) {
  const Tensor source = out.tensor(t);
  KILN_INTERNAL_CHECK(axis < source.shape.size() && to > source.shape[axis]);
  Shape zeros_shape = source.shape;
  zeros_shape[axis] = to - source.shape[axis];
  Shape padded_shape = source.shape;
  padded_shape[axis] = to;

  Tensor zero;
  zero.kind = TensorKind::Constant;
  zero.rounded = true;
  const TensorId zero_id = out.add(zero);
  auto result = [&](const std::string& suffix, const Shape& shape) {
    Tensor r;
    r.kind = TensorKind::OpResult;
    r.name = fmt::format("{}.{}", source.name, suffix);
    r.shape = shape;
    r.strides = contiguous_strides(shape);
    r.dtype = source.dtype;
    r.rounded = true;
    return out.add(std::move(r));
  };
  // (A zero is exact in every type: the expanded constant is of the operand's.)
  Op expand{OpKind::Expand, {zero_id}, result(zeros_suffix, zeros_shape), {}, false};
  expand.attrs.shape = zeros_shape;
  const TensorId zeros = expand.output;
  out.emit(std::move(expand));
  Op concat{OpKind::Concat, {t, zeros}, result(padded_suffix, padded_shape), {}, false};
  concat.attrs.axis = static_cast<int64_t>(axis);
  const TensorId padded = concat.output;
  out.emit(std::move(concat));
  return padded;
}

}  // namespace kiln::ir
