#include "compiler/size_probe.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <set>

#include "compiler/error.h"
#include "compiler/plan_printer.h"
#include "compiler/specialize.h"

namespace kiln::ir {
namespace {

bool is_prime(int64_t n) {
  if (n < 2) return false;
  for (int64_t d = 2; d * d <= n; ++d)
    if (n % d == 0) return false;
  return true;
}

// Every integer the graph holds as a size: its tensors' constant dimensions.
std::set<int64_t> integer_sizes(const Graph& g) {
  std::set<int64_t> sizes;
  for (const Tensor& t : g.tensors) {
    const SymDims dims = symbolic_dims(t);
    for (const DimExpr& d : dims) sizes.insert(d.factor);
  }
  return sizes;
}

}  // namespace

SizeProbe::SizeProbe(const Graph& symbolic, int64_t first_prime) {
  KILN_INTERNAL_CHECK(symbolic.dims != nullptr);
  table_ = *symbolic.dims;
  const std::set<int64_t> sizes = integer_sizes(symbolic);
  int64_t candidate = first_prime;
  for (const DimSymbol& s : table_.symbols) {
    while (!is_prime(candidate) || s.multiple_of % candidate == 0 ||
           std::any_of(sizes.begin(), sizes.end(), [&](int64_t v) { return v % candidate == 0; }))
      ++candidate;
    primes_.push_back(candidate);
    values_[s.name] = s.multiple_of * candidate;
    ++candidate;
  }
}

size_t SizeProbe::index_of(const std::string& symbol) const {
  for (size_t i = 0; i < table_.symbols.size(); ++i)
    if (table_.symbols[i].name == symbol) return i;
  KILN_UNREACHABLE("not a symbol of the probe");
}

std::optional<DimExpr> SizeProbe::expr_of(int64_t value) const {
  if (value <= 0) return DimExpr::constant(value);
  DimExpr e;
  for (size_t i = 0; i < primes_.size(); ++i) {
    const int64_t whole = values_.at(table_.symbols[i].name);
    while (value % primes_[i] == 0) {
      if (value % whole != 0) return std::nullopt;
      value /= whole;
      e.symbols.push_back(table_.symbols[i].name);
    }
  }
  e.factor = value;
  std::sort(e.symbols.begin(), e.symbols.end());
  return e;
}

bool SizeProbe::involves_symbol(int64_t value) const {
  return std::any_of(primes_.begin(), primes_.end(), [&](int64_t p) { return value != 0 && value % p == 0; });
}

std::string with_symbols(const std::string& text, const SizeProbe& probe) {
  std::string out;
  for (size_t at = 0; at < text.size();) {
    const auto digit = [&](size_t i) { return i < text.size() && text[i] >= '0' && text[i] <= '9'; };
    const bool starts_number = digit(at) && (at == 0 || !(std::isalnum(static_cast<unsigned char>(text[at - 1])) ||
                                                          text[at - 1] == '_' || text[at - 1] == '.'));
    if (!starts_number) {
      out += text[at++];
      continue;
    }
    size_t end = at;
    while (digit(end)) ++end;
    const std::string number = text.substr(at, end - at);
    std::optional<DimExpr> e;
    if (number.size() < 18 && probe.involves_symbol(std::stoll(number))) e = probe.expr_of(std::stoll(number));
    out += e ? to_string(*e) : number;
    at = end;
  }
  return out;
}

std::string symbolic_plan_text(const Graph& probe_graph, const Plan& plan, const SizeProbe& probe,
                               const PlanTactics& tactics) {
  std::string text = with_symbols(plan_to_text(probe_graph, plan, tactics), probe);
  const size_t line_end = text.find('\n');
  const size_t figure = text.rfind(", ", line_end);
  if (figure != std::string::npos && line_end >= 22 && text.compare(line_end - 22, 22, " through device memory") == 0)
    text.erase(figure, line_end - figure);
  // Bytes of tensors are the probe's too: "'g' (98355.0 GiB) from kernel 0" -> "'g' from kernel 0".
  // So are the figures a recompute's reason compares: "would read 'b1', 'c1' instead of 12.3 GiB".
  static const std::regex bytes(R"( \([0-9.]+ (B|KiB|MiB|GiB)\))");
  static const std::regex instead(R"( instead of [0-9.]+ (B|KiB|MiB|GiB))");
  return std::regex_replace(std::regex_replace(text, bytes, ""), instead, " instead of the tensor");
}

Graph probe_graph(const Graph& symbolic, const SizeProbe& probe) { return specialize_unchecked(symbolic, probe.values()); }

}  // namespace kiln::ir
