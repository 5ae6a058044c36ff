// The op table, generated from ops.def and attrs.def: op kinds, their names,
// families, arity and accepted attributes.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln::ir {

enum class AttrKey : uint8_t {
#define KILN_ATTR(key, kind) key,
#include "compiler/attrs.def"
#undef KILN_ATTR
};
inline constexpr int kAttrKeyCount = 0
#define KILN_ATTR(key, kind) +1
#include "compiler/attrs.def"
#undef KILN_ATTR
    ;

// How an attribute's value is written in JSON.
enum class AttrKind : uint8_t {
  Float,    // a finite number, held as f32
  Int,      // an integer
  Bool,     // true or false
  Enum,     // one of a fixed set of strings
  IntPair,  // [a, b], integers
  IntList,  // [a, b, ...], integers
};

using AttrSet = uint32_t;
constexpr AttrSet attr_bit(AttrKey key) { return AttrSet{1} << static_cast<int>(key); }

enum class OpFamily : uint8_t {
  Unary,      // pointwise, one input
  Binary,     // pointwise, two inputs, broadcasting
  Compare,    // pointwise, two inputs, broadcasting, bool result
  Select,     // where(cond, a, b)
  Reduce,     // reduce_* over axes
  Norm,       // softmax, log_softmax, layer/rms/batch/group norm
  Matmul,     // anchor
  Conv,       // anchor
  Pool,       // max/avg pooling over a window
  View,       // transpose, reshape, expand, slice: no data movement of their own
  Attention,  // sdpa
  Concat,     // concat: each element read from the input that holds it
};

// What an op costs per element, for loop and recompute decisions.
enum class OpCost : uint8_t {
  Free,   // moves no value (views, identity, cast)
  Cheap,  // a few instructions
  Heavy,  // a transcendental function, or an anchor
};

enum class OpKind : uint8_t {
#define KILN_OP(kind, name, family, min_in, max_in, attrs, device, cost) kind,
#include "compiler/ops.def"
#undef KILN_OP
};
inline constexpr int kOpKindCount = 0
#define KILN_OP(kind, name, family, min_in, max_in, attrs, device, cost) +1
#include "compiler/ops.def"
#undef KILN_OP
    ;

struct OpInfo {
  OpKind kind;
  std::string_view name;
  OpFamily family;
  int min_inputs;
  int max_inputs;
  AttrSet attrs;  // the attributes the op accepts
  std::string_view device;  // what generated code calls (a functor of kiln/common.cuh), or "" (see ops.def)
  OpCost cost;
};

const OpInfo& op_info(OpKind kind);
inline std::string_view op_name(OpKind kind) { return op_info(kind).name; }
std::optional<OpKind> find_op(std::string_view name);
// The catalogue name nearest to `name` by edit distance, for "did you mean".
std::string_view closest_op_name(std::string_view name);

std::string_view attr_name(AttrKey key);
AttrKind attr_kind(AttrKey key);
std::optional<AttrKey> find_attr(std::string_view name);

// Pointwise families: one output element from the same element of each
// (broadcast) input.
inline bool is_pointwise(OpFamily f) {
  return f == OpFamily::Unary || f == OpFamily::Binary || f == OpFamily::Compare ||
         f == OpFamily::Select;
}
inline bool is_pointwise(OpKind k) { return is_pointwise(op_info(k).family); }

}  // namespace kiln::ir
