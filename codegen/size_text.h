// SizeText: the one way codegen spells a size (an extent, a stride, an
// element count) in generated source.
//
// Integer graphs: a size is a literal with the site's suffix, as it always
// was ("768LL", "768u", "768"), so their kernels' source is unchanged.
// Symbolic graphs (compiler/size_probe.h): codegen runs on the graph at
// probe sizes; a value that a probe prime divides is a product of symbols
// and a constant, spelled over the kernel's size parameters, one
// `const kiln::i64 kiln_size<i>` per symbol of the `dims` table the kernel
// reads ("(kiln_size0 * 768LL)"), so one source serves every size.
// Choices that compare a size with a bound ask lower()/upper() (compiler/dim.h).
//
// Expects: values computed from the probe graph's sizes by products.
// Guarantees: a symbolic value that is not such a product throws
// NotSymbolic (the pipeline then compiles the graph per size); every symbol a
// kernel's text reads is in used().
#pragma once

#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>

#include "compiler/dim.h"
#include "compiler/size_probe.h"

namespace kiln::codegen {

// Thrown where a kernel of a symbolic graph needs what this slice of
// symbolic codegen does not do yet (a kernel kind, a size that is not a
// product); the pipeline then compiles the graph per size and says why.
// `range_limit`: a limit met at the range's largest sizes alone (2^31 tiles,
// 2^20 blocks, 32-bit rows), which a narrower range avoids; the backend
// then declares one (python/kiln/torch.py, _compile_once).
struct NotSymbolic : std::runtime_error {
  explicit NotSymbolic(const std::string& what, bool range_limit = false)
      : std::runtime_error(what), range_limit(range_limit) {}
  bool range_limit;
};
// A NotSymbolic a narrower range avoids.
inline NotSymbolic RangeLimit(const std::string& what) { return NotSymbolic(what, true); }

class SizeText {
 public:
  SizeText() = default;
  explicit SizeText(const ir::SizeProbe* probe) : probe_(probe) {}

  bool symbolic(int64_t value) const { return probe_ && probe_->involves_symbol(value); }
  // `value` as the source spells it; `suffix` is the literal's ("LL", "u",
  // ""). A symbolic value is an i64 expression (cast to kiln::u32 where the
  // suffix is "u").
  std::string operator()(int64_t value, std::string_view suffix = "LL");
  // `a` - `b` as the source spells it: a literal where neither is symbolic
  // or both are the same size, else the difference of their expressions (a
  // sum is no product, so operator() cannot spell it: a static cache's keys
  // less a prompt's rows).
  std::string difference(int64_t a, int64_t b, std::string_view suffix = "LL");
  // `numerator` / `value` and `numerator` % `value` (numerator: an i64
  // index, at least 0). A literal divides with the operators, as it always
  // did; a symbolic size divides by its constant factor, then by each
  // symbol's kiln::Divisor (`kiln_div<i>`, made at the kernel's start:
  // divisors()): a 64-bit multiply-high instead of a 64-bit division.
  std::string quotient(const std::string& numerator, int64_t value, std::string_view suffix = "LL");
  std::string remainder(const std::string& numerator, int64_t value, std::string_view suffix = "LL");
  // The symbols (indices in the `dims` table) the text divides by so far.
  const std::set<size_t>& divisors() const { return divisors_; }
  // The size as a Dim, for the range's queries (a constant for integer graphs).
  ir::Dim dim(int64_t value) const;
  // Whether the size stays below `bound` at every size in range.
  bool known_below(int64_t value, int64_t bound) const { return dim(value).known_le(bound - 1); }
  // The smallest value of the size over the range.
  int64_t lower(int64_t value) const { return dim(value).lower(); }

  // The symbols (indices in the `dims` table) the text so far reads.
  const std::set<size_t>& used() const { return used_; }
  const ir::SizeProbe* probe() const { return probe_; }

 private:
  // The name of `symbol`'s kiln::Divisor, recorded as read and divided by.
  std::string divisor_of(const std::string& symbol);

  const ir::SizeProbe* probe_ = nullptr;
  std::set<size_t> used_, divisors_;
};

// The name of the kiln::Divisor a kernel makes of symbol i's size.
inline std::string divisor_name(size_t symbol) { return "kiln_div" + std::to_string(symbol); }

// The name of symbol i's size parameter in a kernel.
inline std::string size_param(size_t symbol) { return "kiln_size" + std::to_string(symbol); }

}  // namespace kiln::codegen
