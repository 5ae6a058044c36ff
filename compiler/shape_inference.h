// Shape and dtype inference for one op: the per-family rules of
// graph-format.md's op catalogue.
//
// Expects: operands already resolved to tensors, their count within the op's
// arity, attributes type-checked and stored in `attrs` (`given` says which the
// document wrote), the bool-reading rule already enforced.
// Guarantees: on return the op is valid, `attrs` is fully resolved (defaults
// filled, axes normalised: see attributes.h), and the result's shape and
// inferred dtype (numerics rule 3, before any explicit `dtype`) are returned.
// Any violation throws a UserError whose message starts with `where`.
#pragma once

#include <string>
#include <vector>

#include "compiler/ir.h"

namespace kiln::ir {

struct InferredResult {
  Shape shape;
  DType dtype;
};

InferredResult infer_result(OpKind kind, const std::vector<const Tensor*>& operands,
                            Attributes& attrs, AttrSet given, const std::string& where);

// "'x' bf16[2,3]" (or "scalar 0.5"): how messages name an operand.
std::string describe_tensor(const Tensor& t);

// NumPy broadcasting of two shapes; nullopt where they do not broadcast.
std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b);

}  // namespace kiln::ir
