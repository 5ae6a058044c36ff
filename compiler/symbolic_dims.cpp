#include "compiler/symbolic_dims.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "compiler/error.h"

namespace kiln::ir {
namespace {

// a * b, saturating at INT64_MAX (both >= 0).
int64_t saturating_multiply(int64_t a, int64_t b) {
  if (a != 0 && b > INT64_MAX / a) return INT64_MAX;
  return a * b;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

std::string declared_symbols(const DimTable* table) {
  if (!table || table->symbols.empty()) return "the graph declares no \"dims\"";
  std::vector<std::string_view> names;
  for (const DimSymbol& s : table->symbols) names.push_back(s.name);
  return fmt::format("declared: {}", fmt::join(names, ", "));
}

}  // namespace

std::string DimSymbol::range_text() const {
  std::string text = fmt::format("{} in [{}, {}]", name, min, max);
  if (multiple_of != 1) text += fmt::format(", a multiple of {}", multiple_of);
  return text;
}

const DimSymbol* DimTable::find(std::string_view name) const {
  for (const DimSymbol& s : symbols)
    if (s.name == name) return &s;
  return nullptr;
}

std::optional<DimExpr> multiply(const DimExpr& a, const DimExpr& b) {
  if (b.factor != 0 && a.factor > kMaxElements / b.factor) return std::nullopt;
  DimExpr out{a.factor * b.factor, a.symbols};
  out.symbols.insert(out.symbols.end(), b.symbols.begin(), b.symbols.end());
  std::sort(out.symbols.begin(), out.symbols.end());
  return out;
}

std::optional<DimExpr> divide_exactly(const DimExpr& a, const DimExpr& b) {
  if (b.factor == 0 || a.factor % b.factor != 0) return std::nullopt;
  DimExpr out{a.factor / b.factor, {}};
  std::vector<std::string> rest = a.symbols;
  for (const std::string& s : b.symbols) {
    auto it = std::find(rest.begin(), rest.end(), s);
    if (it == rest.end()) return std::nullopt;
    rest.erase(it);
  }
  out.symbols = std::move(rest);
  return out;
}

std::optional<DimExpr> product(const SymDims& dims) {
  DimExpr out = DimExpr::constant(1);
  for (const DimExpr& d : dims) {
    std::optional<DimExpr> next = multiply(out, d);
    if (!next) return std::nullopt;
    out = std::move(*next);
  }
  return out;
}

int64_t evaluate(const DimExpr& e, const DimValues& values) {
  int64_t v = e.factor;
  for (const std::string& s : e.symbols) {
    auto it = values.find(s);
    KILN_INTERNAL_CHECK(it != values.end());
    v = saturating_multiply(v, it->second);
  }
  return v;
}

int64_t smallest_value(const DimExpr& e, const DimTable& table) {
  int64_t v = e.factor;
  for (const std::string& s : e.symbols) v = saturating_multiply(v, table.find(s)->smallest());
  return v;
}

int64_t largest_value(const DimExpr& e, const DimTable& table) {
  int64_t v = e.factor;
  for (const std::string& s : e.symbols) v = saturating_multiply(v, table.find(s)->largest());
  return v;
}

DimValues smallest_values(const DimTable& table) {
  DimValues values;
  for (const DimSymbol& s : table.symbols) values[s.name] = s.smallest();
  return values;
}

std::string to_string(const DimExpr& e) {
  if (e.is_constant()) return std::to_string(e.factor);
  std::string text = fmt::format("{}", fmt::join(e.symbols, "*"));
  if (e.factor != 1) text += fmt::format("*{}", e.factor);
  return text;
}

std::string to_string(const SymDims& dims) {
  std::vector<std::string> parts;
  for (const DimExpr& d : dims) parts.push_back(to_string(d));
  return fmt::format("[{}]", fmt::join(parts, ","));
}

DimExpr parse_dim_expr(std::string_view text, const DimTable* table, const std::string& where) {
  const std::string shown = detail::quoted(text);
  KILN_USER_CHECK(text.find_first_of("+-") == std::string_view::npos,
                  "{}: dimension {} is a sum or difference; a dimension is a product of symbols and positive "
                  "integers (\"B\", \"B*S\", \"3*S\")",
                  where, shown);
  KILN_USER_CHECK(text.find_first_of("/%") == std::string_view::npos,
                  "{}: dimension {} is a quotient; a dimension is a product of symbols and positive integers "
                  "(\"B\", \"B*S\", \"3*S\")",
                  where, shown);
  DimExpr e = DimExpr::constant(1);
  size_t begin = 0;
  while (true) {
    const size_t star = text.find('*', begin);
    const std::string_view factor = trim(text.substr(begin, star == std::string_view::npos ? std::string_view::npos : star - begin));
    KILN_USER_CHECK(!factor.empty(), "{}: dimension {} is not a product of symbols and positive integers", where, shown);
    if (factor.front() >= '0' && factor.front() <= '9') {
      int64_t value = 0;
      for (char c : factor) {
        KILN_USER_CHECK(c >= '0' && c <= '9' && value <= (kMaxElements - (c - '0')) / 10,
                        "{}: dimension {} has factor '{}', which is not a positive integer up to 2^62", where, shown,
                        factor);
        value = value * 10 + (c - '0');
      }
      KILN_USER_CHECK(value >= 1, "{}: dimension {} has factor 0 (dimensions are >= 1)", where, shown);
      std::optional<DimExpr> next = multiply(e, DimExpr::constant(value));
      KILN_USER_CHECK(next.has_value(), "{}: dimension {} is larger than 2^62", where, shown);
      e = *next;
    } else {
      const DimSymbol* symbol = table ? table->find(factor) : nullptr;
      KILN_USER_CHECK(symbol != nullptr, "{}: dimension {} uses unknown symbol {} ({})", where, shown,
                      detail::quoted(factor), declared_symbols(table));
      e.symbols.push_back(symbol->name);
    }
    if (star == std::string_view::npos) break;
    begin = star + 1;
  }
  std::sort(e.symbols.begin(), e.symbols.end());
  return e;
}

int64_t evaluate(const SlicePosition& p, const DimValues& values) {
  return (p.term ? evaluate(*p.term, values) : 0) + p.offset;
}

std::string to_string(const SlicePosition& p, const DimExpr& axis_size) {
  if (!p.term) return std::to_string(p.offset);
  if (p.offset == 0) return to_string(*p.term);
  KILN_INTERNAL_CHECK(*p.term == axis_size && p.offset < 0);
  return std::to_string(p.offset);
}

SymDims symbolic_dims(const Tensor& t) {
  if (t.symbolic) return t.symbolic->dims;
  SymDims dims;
  for (int64_t d : t.shape) dims.push_back(DimExpr::constant(d));
  return dims;
}

std::string shape_text(const Tensor& t) { return t.symbolic ? to_string(t.symbolic->dims) : to_string(t.shape); }

}  // namespace kiln::ir
