// Symbolic dimensions (graph-format.md, "Symbolic dimensions"): the `dims`
// table, dim expressions and symbolic shapes.
//
// What it means. A dim expression is a product of a positive integer and
// declared symbols: "B", "B*S", "3*S", "64". Two expressions are equal when
// they are the same product ("S*B" is "B*S"); nothing else is known about a
// symbol but its range [min, max] and that it is a multiple of
// `multiple_of`. Sums and quotients are not expressions.
//
// How the IR holds it (ir.h). A symbolic graph is an ordinary ir::Graph
// whose integer shapes and size attributes are those at every symbol's
// smallest valid value, plus: `Graph::dims` (this table), a SymbolicShape on
// every tensor with a symbol in its shape, and SymbolicAttrs on every
// reshape/expand/slice whose size attributes hold one. Construction
// (graph_construction.cpp, symbolic_inference.h) checks the graph for every
// size in range; specialize.h makes the integer graph of given sizes.
//
// Expects: symbol names that passed the name rule; DimValues inside the
// symbols' ranges where an expression is evaluated.
// Guarantees: expressions are canonical (symbols sorted, factor >= 1), so
// `==` is equality of products and to_string() is the one spelling used by
// the printer, the JSON writer and the hash ("S*4": symbols first).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir.h"

namespace kiln::ir {

struct DimSymbol {
  std::string name;
  int64_t min = 1;
  int64_t max = 1;
  int64_t multiple_of = 1;
  // The smallest value in [min, max] that is a multiple of multiple_of.
  int64_t smallest() const { return (min + multiple_of - 1) / multiple_of * multiple_of; }
  // The largest such value.
  int64_t largest() const { return max / multiple_of * multiple_of; }
  // "S in [1, 4096], a multiple of 8": how messages state the range.
  std::string range_text() const;
};

struct DimTable {
  std::vector<DimSymbol> symbols;  // in the document's order
  const DimSymbol* find(std::string_view name) const;
};

// A value for each symbol, by name.
using DimValues = std::map<std::string, int64_t, std::less<>>;

struct DimExpr {
  int64_t factor = 1;
  std::vector<std::string> symbols;  // sorted; a symbol repeats for a power

  static DimExpr constant(int64_t value) { return {value, {}}; }
  bool is_constant() const { return symbols.empty(); }
  // A declared symbol standing alone ("B", not "2*B" or "B*S").
  bool is_single_symbol() const { return factor == 1 && symbols.size() == 1; }
  bool operator==(const DimExpr&) const = default;
};

using SymDims = std::vector<DimExpr>;

// The product; nullopt if the integer factor would pass 2^62.
std::optional<DimExpr> multiply(const DimExpr& a, const DimExpr& b);
// a / b where it is again a product (b's symbols among a's, b's factor
// dividing a's); nullopt otherwise (a quotient is not an expression).
std::optional<DimExpr> divide_exactly(const DimExpr& a, const DimExpr& b);
// The product of a whole shape (its element count as an expression).
std::optional<DimExpr> product(const SymDims& dims);

// The value at `values` (every symbol of `e` must have one).
int64_t evaluate(const DimExpr& e, const DimValues& values);
// The smallest and largest values over the table's ranges; largest
// saturates at INT64_MAX.
int64_t smallest_value(const DimExpr& e, const DimTable& table);
int64_t largest_value(const DimExpr& e, const DimTable& table);
// Every symbol at its smallest valid value.
DimValues smallest_values(const DimTable& table);

std::string to_string(const DimExpr& e);  // "64", "B", "S*4", "B*S"
std::string to_string(const SymDims& dims);  // "[B,S*4,64]"

// Parses a dim expression written as a string. A UserError starting with
// `where` names what is wrong: an unknown symbol (or a graph without
// `dims`), a sum, difference or quotient, a factor that is not a positive
// integer, bad syntax.
DimExpr parse_dim_expr(std::string_view text, const DimTable* table, const std::string& where);

struct SymbolicShape {
  SymDims dims;
  bool strides_declared = false;  // inputs: the document gave (integer) strides
};

// A slice bound after resolution: term + offset, where term (if any) is a
// product. An integer k >= 0 is {none, k}; a negative k on an axis of size E
// is {E, k}; an expression X is {X, 0}.
struct SlicePosition {
  std::optional<DimExpr> term;
  int64_t offset = 0;
  bool operator==(const SlicePosition&) const = default;
};

struct SymbolicAttrs {
  SymDims shape;                       // reshape/expand: resolved (no -1)
  std::optional<SlicePosition> start;  // slice, where a bound involves a symbol
  std::optional<SlicePosition> end;
};

int64_t evaluate(const SlicePosition& p, const DimValues& values);
// How the JSON writer and the printer spell a resolved bound: an integer, a
// negative integer counting from the end of `axis_size`, or an expression.
std::string to_string(const SlicePosition& p, const DimExpr& axis_size);

// A tensor's shape as expressions (integer dimensions as constants).
SymDims symbolic_dims(const Tensor& t);
// Its shape as messages and the printer show it: "[B,S*4,64]" or "[4,8]".
std::string shape_text(const Tensor& t);

}  // namespace kiln::ir
