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

// Ops whose result is one of their operands' values or its negation: exact
// in any type that holds the operands (codegen leaves out a rounding there).
inline bool picks_an_operand(OpKind k) {
  return k == OpKind::Relu || k == OpKind::Abs || k == OpKind::Neg || k == OpKind::Maximum || k == OpKind::Minimum;
}

// Pointwise families: one output element from the same element of each
// (broadcast) input.
inline bool is_pointwise(OpFamily f) {
  return f == OpFamily::Unary || f == OpFamily::Binary || f == OpFamily::Compare ||
         f == OpFamily::Select;
}
inline bool is_pointwise(OpKind k) { return is_pointwise(op_info(k).family); }

}  // namespace kiln::ir

// Exhaustive switches over OpKind that handle some families. Such a switch
// names each op it handles and then, generated from ops.def, every op of the
// other families, with no `default:`; so a new op in a handled family is a
// build error (-Werror=switch) until the switch handles it:
//
//   switch (kind) {
//     case OpKind::Neg: ...                    // every Unary op
//   #define KILN_OP(kind, name, family, ...) KILN_CASE_UNLESS(family, Unary, kind)
//   #include "compiler/ops.def"
//   #undef KILN_OP
//       break;
//   }
//
// KILN_CASE_UNLESS(family, Handled, kind) is `case OpKind::kind:` unless
// `family` is `Handled`; KILN_CASE_UNLESS_EITHER does the same for two
// handled families. (KILN_SAME_F_F expands to `~,`, which shifts
// KILN_SECOND_'s arguments so that it picks the empty one.)
#define KILN_SAME_Unary_Unary ~,
#define KILN_SAME_Binary_Binary ~,
#define KILN_SAME_Compare_Compare ~,
#define KILN_SAME_Select_Select ~,
#define KILN_SAME_Reduce_Reduce ~,
#define KILN_SAME_Norm_Norm ~,
#define KILN_SAME_Matmul_Matmul ~,
#define KILN_SAME_Conv_Conv ~,
#define KILN_SAME_Pool_Pool ~,
#define KILN_SAME_View_View ~,
#define KILN_SAME_Attention_Attention ~,
#define KILN_SAME_Concat_Concat ~,
#define KILN_SECOND(...) KILN_SECOND_(__VA_ARGS__)
#define KILN_SECOND_(first, second, ...) second
#define KILN_CASE_UNLESS(family, Handled, kind) \
  KILN_SECOND(KILN_SAME_##family##_##Handled, case ::kiln::ir::OpKind::kind:, ~)
#define KILN_CASE_UNLESS_EITHER(family, Handled, AlsoHandled, kind) \
  KILN_SECOND(KILN_SAME_##family##_##Handled, KILN_CASE_UNLESS(family, AlsoHandled, kind), ~)
