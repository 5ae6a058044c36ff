// Shape inference over dim expressions: the op catalogue's shape rules for
// an op with a symbolic operand or size attribute (symbolic_dims.h).
//
// Expects: operands resolved, arity checked, the op's integer attributes
// type-checked into `attrs` as the document gave them (not yet resolved),
// `given` saying which; size attributes written as expressions in
// `dim_attrs`; a graph with a `dims` table.
// Guarantees: throws a UserError starting with `where` for what holds for
// some sizes only or needs more than products, naming the dimension:
// broadcasting a symbol against an integer other than 1 or a different
// expression, dimensions that must be equal and are different products,
// sums (concat of different products, slice bounds), quotients (reshape's
// -1, groups, GQA heads), symbolic spatial sizes of conv2d and pooling,
// slice bounds that would clamp differently across the range. Otherwise
// returns the result's shape as expressions and the op's resolved size
// attributes as expressions (null where it has none), such that for every
// binding of the symbols in range the integer graph is valid and has the
// shapes the expressions evaluate to. Returns nullopt where the op breaks a
// rule that does not depend on sizes (rank, axis, a missing attribute): the
// integer inference (shape_inference.h) then reports it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compiler/attributes.h"
#include "compiler/symbolic_dims.h"

namespace kiln::ir {

// Size attributes the document wrote with expressions. In `shape`, nullopt
// stands for an entry -1; integers are constants.
struct DimAttrs {
  std::optional<std::vector<std::optional<DimExpr>>> shape;
  std::optional<DimExpr> start, end;
};

struct SymbolicOpResult {
  SymDims shape;
  std::shared_ptr<const SymbolicAttrs> attrs;
};

std::optional<SymbolicOpResult> infer_symbolic_result(OpKind kind, const std::vector<const Tensor*>& operands,
                                                      const Attributes& attrs, AttrSet given,
                                                      const DimAttrs& dim_attrs, const DimTable& table,
                                                      const std::string& where);

}  // namespace kiln::ir
