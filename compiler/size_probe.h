// Probe sizes: how one plan and one set of kernels serve every size of a
// symbolic graph while the planner and codegen keep computing with integers.
//
// Symbol i is bound to multiple_of_i * q_i, q_i a distinct prime above
// `first_prime` that divides no integer size of the graph. The planner and
// codegen run on the graph specialized at these values (probe_graph); an
// extent they compute as a product of sizes is then a constant times
// multiple_of_i * q_i per symbol occurrence, and expr_of() factors it back
// into its expression (codegen prints that, over kernel parameters:
// codegen/size_text.h). What the probe gives:
//  - two extents are equal at the probe exactly when they are the same
//    product (distinct primes): no accidental equality of B with 1 or with S,
//    so a symbol is never taken for a broadcast 1;
//  - an extent is divisible by k (any k below the primes) at the probe
//    exactly when Dim::known_multiple_of(k) says so.
// What it does not give: orderings (a probe lies above every max): a choice
// that compares a size with a bound asks Dim (dim.h) for the range's lower
// or upper end instead. Arithmetic other than products (a ceiling, a sum)
// gives values that do not factor; a kernel whose source or launch depends
// on one is caught by generating at two probes with different primes and
// comparing (runtime/pipeline.cpp), and refused.
//
// Expects: a constructed symbolic graph.
// Guarantees: probe_graph() is the graph at the probe values, built through
// GraphConstructor without the range check (the values lie outside the
// ranges on purpose), or a UserError (an element count past 2^62).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir.h"
#include "compiler/plan.h"
#include "compiler/plan_printer.h"
#include "compiler/symbolic_dims.h"

namespace kiln::ir {

class SizeProbe {
 public:
  // Primes from `first_prime` up (two probes of one graph take disjoint primes).
  SizeProbe(const Graph& symbolic, int64_t first_prime);

  const DimTable& table() const { return table_; }
  const DimValues& values() const { return values_; }
  // The symbol's index in the `dims` table (the kernels' size parameter).
  size_t index_of(const std::string& symbol) const;
  // The expression of a value computed at the probe as a product of sizes
  // (a constant where no probe prime divides it); nullopt where a prime
  // divides it without its symbol's whole probe value (not a product).
  std::optional<DimExpr> expr_of(int64_t value) const;
  // Whether any symbol's prime divides `value`.
  bool involves_symbol(int64_t value) const;

 private:
  DimTable table_;
  std::vector<int64_t> primes_;  // per symbol of table_
  DimValues values_;
};

// `text` (a plan's or a kernel's description at the probe) with each
// integer that involves a symbol written as its expression: "[131071,768]"
// becomes "[B,768]".
std::string with_symbols(const std::string& text, const SizeProbe& probe);

// A plan of the probe graph as `kiln plan` prints it, sizes as their
// expressions, without the bytes through memory (which depend on the sizes);
// with the kernels' tactics where given (their refusals at the probe's sizes).
std::string symbolic_plan_text(const Graph& probe_graph, const Plan& plan, const SizeProbe& probe,
                               const PlanTactics& tactics = {});

// The graph at the probe's values (no range check).
Graph probe_graph(const Graph& symbolic, const SizeProbe& probe);

}  // namespace kiln::ir
