#include "codegen/size_text.h"

#include <fmt/format.h>


namespace kiln::codegen {

ir::Dim SizeText::dim(int64_t value) const {
  if (!symbolic(value)) return ir::Dim::constant(value);
  std::optional<ir::DimExpr> e = probe_->expr_of(value);
  if (!e) throw NotSymbolic(fmt::format("a size the kernel computes ({} at the probe) is not a product of the graph's sizes", value));
  return ir::Dim(*e, &probe_->table());
}

std::string SizeText::operator()(int64_t value, std::string_view suffix) {
  if (!symbolic(value)) return fmt::format("{}{}", value, suffix);
  const ir::Dim d = dim(value);
  std::vector<std::string> terms;
  for (const std::string& s : d.expr().symbols) {
    const size_t i = probe_->index_of(s);
    used_.insert(i);
    terms.push_back(size_param(i));
  }
  if (d.expr().factor != 1) terms.push_back(fmt::format("{}LL", d.expr().factor));
  std::string text = terms.size() == 1 ? terms[0] : fmt::format("({})", fmt::join(terms, " * "));
  return suffix == "u" ? "(kiln::u32)" + text : text;
}

std::string SizeText::difference(int64_t a, int64_t b, std::string_view suffix) {
  if (a == b || (!symbolic(a) && !symbolic(b))) return fmt::format("{}{}", a - b, suffix);
  const std::string text = fmt::format("({} - {})", (*this)(a), (*this)(b));
  return suffix == "u" ? "(kiln::u32)" + text : text;
}

std::string SizeText::divisor_of(const std::string& symbol) {
  const size_t i = probe_->index_of(symbol);
  used_.insert(i);
  divisors_.insert(i);
  return divisor_name(i);
}

std::string SizeText::quotient(const std::string& numerator, int64_t value, std::string_view suffix) {
  if (!symbolic(value)) return fmt::format("({} / {}{})", numerator, value, suffix);
  const ir::Dim d = dim(value);
  std::string text = d.expr().factor == 1 ? fmt::format("(kiln::i64)({})", numerator)
                                          : fmt::format("((kiln::i64)({}) / {}LL)", numerator, d.expr().factor);
  for (const std::string& s : d.expr().symbols) text = fmt::format("{}.div({})", divisor_of(s), text);
  return text;
}

std::string SizeText::remainder(const std::string& numerator, int64_t value, std::string_view suffix) {
  if (!symbolic(value)) return fmt::format("({} % {}{})", numerator, value, suffix);
  const ir::Dim d = dim(value);
  if (d.expr().factor == 1 && d.expr().symbols.size() == 1)
    return fmt::format("{}.mod((kiln::i64)({}))", divisor_of(d.expr().symbols[0]), numerator);
  return fmt::format("((kiln::i64)({}) - {} * {})", numerator, quotient(numerator, value, suffix), (*this)(value));
}

}  // namespace kiln::codegen
