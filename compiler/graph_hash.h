// The canonical graph hash (graph-format.md "Identity of a graph").
//
// Expects: a constructed Graph (attributes resolved, so defaults written out
// or left out hash alike).
// Guarantees: 128 bits (XXH3-128) that do not depend on tensor names, on the
// order of inputs, outputs or independent ops, or on the graph's name; and
// that change with any shape, stride, dtype, op, attribute, constant,
// connection or choice of outputs.
//
// How. Every tensor gets a structural hash: an op result hashes its op, dtype,
// shape, resolved attributes and its operands' hashes (a Merkle DAG, blind to
// names and op order). Graph inputs have no structure beyond their type, so
// they are told apart by refinement: a few rounds in which each input's label
// absorbs how it is used (which ops read it, in which operand slot, and what
// those ops feed). The graph hash is the hash of the sorted multiset of all
// tensor hashes, each with its is-output flag.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "compiler/ir.h"

namespace kiln::ir {

struct Hash128 {
  uint64_t high = 0;
  uint64_t low = 0;
  auto operator<=>(const Hash128&) const = default;
  std::string hex() const;  // 32 lowercase hex digits
  static std::optional<Hash128> from_hex(std::string_view hex);
};

Hash128 graph_hash(const Graph& graph);

// XXH3-128 over a byte buffer built field by field; shared by every kiln hash
// (graph, kernel source, cache keys).
class HashBuilder {
 public:
  HashBuilder& add_bytes(const void* data, size_t size);
  HashBuilder& add(int64_t value) { return add_bytes(&value, sizeof value); }
  HashBuilder& add(double value) { return add_bytes(&value, sizeof value); }
  HashBuilder& add(std::string_view text);  // length-prefixed
  HashBuilder& add(const Hash128& h) { add(static_cast<int64_t>(h.high)); return add(static_cast<int64_t>(h.low)); }
  Hash128 digest() const;

 private:
  std::string bytes_;
};

}  // namespace kiln::ir
