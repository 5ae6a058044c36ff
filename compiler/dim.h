// Dim: one extent of a graph as the planner and codegen ask about it. A
// constant, or a product of symbols (symbolic_dims.h) whose values range
// over the graph's `dims` table. Size-dependent choices of a graph that is
// compiled once for its whole range ask what is known for every size in it,
// in the manner of Inductor's statically_known_* size queries.
//
// Expects: a DimExpr whose symbols the table declares (any table for a
// constant).
// Guarantees: every `known_*` answer true holds at every binding of the
// symbols in range; false means "not known" (it may hold for some sizes, or
// for all of them where the table's facts do not show it: a symbol in
// [4, 4] that is a multiple of 2 is not known to be a multiple of 4).
#pragma once

#include <cstdint>
#include <string>

#include "compiler/symbolic_dims.h"

namespace kiln::ir {

class Dim {
 public:
  Dim(DimExpr e, const DimTable* table);
  static Dim constant(int64_t value) { return Dim(DimExpr::constant(value), nullptr); }

  const DimExpr& expr() const { return e_; }
  bool is_constant() const { return e_.is_constant(); }
  // The smallest and largest values over the range (largest saturates at INT64_MAX).
  int64_t lower() const;
  int64_t upper() const;

  // The same product: equal at every size.
  bool known_equal(const Dim& other) const { return e_ == other.e_; }
  // Divisible by k at every size: k divides the factor times each symbol's multiple_of.
  bool known_multiple_of(int64_t k) const;
  bool known_le(int64_t k) const { return upper() <= k; }
  bool known_ge(int64_t k) const { return lower() >= k; }

  std::string to_string() const { return ir::to_string(e_); }

 private:
  DimExpr e_;
  const DimTable* table_;
};

}  // namespace kiln::ir
