#include "compiler/dim.h"

#include <utility>

#include "compiler/error.h"

namespace kiln::ir {

Dim::Dim(DimExpr e, const DimTable* table) : e_(std::move(e)), table_(table) {
  KILN_INTERNAL_CHECK(e_.is_constant() || table_ != nullptr);
}

int64_t Dim::lower() const { return e_.is_constant() ? e_.factor : smallest_value(e_, *table_); }
int64_t Dim::upper() const { return e_.is_constant() ? e_.factor : largest_value(e_, *table_); }

bool Dim::known_multiple_of(int64_t k) const {
  KILN_INTERNAL_CHECK(k >= 1);
  // Reduce k by what each factor of the product is known to be a multiple of.
  const auto gcd = [](int64_t a, int64_t b) {
    while (b != 0) a = std::exchange(b, a % b);
    return a;
  };
  k /= gcd(k, e_.factor);
  for (const std::string& s : e_.symbols) {
    if (k == 1) break;
    k /= gcd(k, table_->find(s)->multiple_of);
  }
  return k == 1;
}

}  // namespace kiln::ir
