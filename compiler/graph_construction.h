// Builds a checked ir::Graph from declarations, one at a time. The JSON
// loader and the public GraphBuilder both drive it, so both produce the same
// IR (and hash) for the same graph.
//
// Expects: declarations in document order (inputs, then ops, then outputs).
// Guarantees: every rule of graph-format.md is enforced as each declaration
// arrives: names (syntax, length, uniqueness, defined before use), dtypes,
// shapes and strides, arity, attribute keys and value types, scalars, the
// bool-reading rule, and each op's shape rules (shape_inference.h). finish()
// returns a Graph whose attributes are resolved, rounding flags set (numerics
// rule 2) and `users` filled. With a `dims` table, shapes and size
// attributes may hold dim expressions: symbolic_inference.h checks each op
// for every size in range, and finish() that every symbol stands alone as a
// dimension of some input (symbolic_dims.h says how the IR holds them).
// A violation throws a UserError naming the op (index, output name, op) or
// input, and the tensors and dimensions involved.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "compiler/ir.h"
#include "compiler/symbolic_inference.h"
#include "kiln/graph.h"

namespace kiln::ir {

// An op operand as declared: a tensor name or a JSON number (scalar constant).
using DeclaredOperand = std::variant<std::string, double>;
// A dimension as declared: an integer, or a dim expression ("B", "B*S", "3*S";
// symbolic_dims.h).
using DeclaredDim = DimSize;

struct OpDeclaration {
  std::string op;
  std::vector<DeclaredOperand> in;
  std::string out;
  std::optional<DType> dtype;
  Attrs attrs;  // size attributes may hold dim expressions (kiln/graph.h, AttrValue)
};

class GraphConstructor {
 public:
  explicit GraphConstructor(std::string graph_name);

  // A symbol of the `dims` table; all of them before the first input.
  void declare_dim(const std::string& name, int64_t min, int64_t max, int64_t multiple_of);
  TensorId add_input(const std::string& name, const Shape& shape, DType dtype,
                     const std::optional<Strides>& strides);
  // An input whose shape may hold dim expressions.
  TensorId add_input(const std::string& name, const std::vector<DeclaredDim>& shape, DType dtype,
                     const std::optional<Strides>& strides);
  TensorId add_op(const OpDeclaration& decl);
  void set_outputs(const std::vector<std::string>& names);
  Graph finish() &&;

  // For the builder's generated names: whether `name` is taken.
  bool has_name(const std::string& name) const { return names_.count(name) != 0; }
  const std::string& name_of(TensorId id) const { return graph_.tensor(id).name; }
  const Shape& shape_of(TensorId id) const { return graph_.tensor(id).shape; }

 private:
  TensorId add_tensor(Tensor tensor);
  TensorId resolve_operand(const DeclaredOperand& operand, const std::string& where);
  void check_operand_types(OpKind kind, const std::vector<const Tensor*>& operands, const std::string& where) const;
  // Size attributes written with dim expressions, by key (one entry for start/end).
  using DimTexts = std::vector<std::pair<AttrKey, std::vector<DeclaredDim>>>;
  AttrSet read_attrs(const OpDeclaration& decl, const OpInfo& info, Attributes& attrs, DimTexts& dim_texts,
                     const std::string& where) const;
  void check_declared_dtype(const OpDeclaration& decl, OpKind kind, const std::string& where) const;
  void check_symbols_readable() const;
  std::optional<SymbolicOpResult> infer_symbolic(const OpDeclaration& decl, const OpInfo& info,
                                                 const DimTexts& dim_texts, const std::vector<const Tensor*>& operands,
                                                 Attributes& attrs, AttrSet& given, const std::string& where) const;

  Graph graph_;
  std::shared_ptr<DimTable> dims_;  // the `dims` table as declared (null: none)
  std::map<std::string, TensorId, std::less<>> names_;
  bool outputs_set_ = false;
};

// Name rules of graph-format.md: [A-Za-z_][A-Za-z0-9_.]*, at most 128 chars.
bool is_valid_name(std::string_view name);
// Parses a dtype name with the spec's messages (reserved f8 types included).
DType parse_dtype_or_throw(std::string_view text, const std::string& where);

}  // namespace kiln::ir
