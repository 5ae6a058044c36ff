// kiln's graph IR.
//
// What it means. A Graph is a DAG of ops over tensors. Tensors are graph
// inputs, f32 scalar constants, or op results; each op has one result. Ops are
// stored in a valid evaluation order (every op reads only earlier tensors).
// The IR is built and fully checked by graph_construction.cpp: nothing
// downstream re-validates shapes, dtypes or attributes.
//
// Numerics (graph-format.md). All arithmetic is f32. A tensor's `dtype` is its
// storage type by numerics rule 3 (explicit `dtype`, else bool for
// comparisons, else the widest floating dtype of its tensor inputs). Its
// *value* is rounded to that dtype only where rule 2 says: graph inputs (held
// in their dtype), ops with an explicit `dtype`, casts, and graph outputs.
// Every other intermediate carries unrounded f32 values whatever its nominal
// dtype, and is stored as f32 if a plan materialises it: value_dtype() is the
// type a kernel must store and load it as.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compiler/attributes.h"
#include "compiler/op_table.h"
#include "kiln/types.h"

namespace kiln::ir {

using TensorId = int32_t;

// Symbolic dimensions (compiler/symbolic_dims.h). In a symbolic graph the
// integer `shape`s and size attributes hold the sizes at each symbol's
// smallest value; the symbolic ones hold the truth. The planner and codegen
// take integer graphs only: specialize() makes one, or a probe graph for one
// compile of every size (size_probe.h, runtime/pipeline.h).
struct SymbolicShape;
struct SymbolicAttrs;
struct DimTable;

enum class TensorKind : uint8_t { Input, Constant, OpResult };

struct Tensor {
  TensorKind kind = TensorKind::Input;
  std::string name;      // empty for constants
  Shape shape;
  Strides strides;       // inputs: as declared (contiguous by default); others: contiguous
  DType dtype = DType::f32;
  bool rounded = false;  // rule 2: the value is rounded to `dtype`
  bool is_output = false;
  float constant = 0.0f;  // TensorKind::Constant only
  int32_t producer = -1;  // OpResult: op index; Input: input index
  std::shared_ptr<const SymbolicShape> symbolic;  // set where a dimension holds a symbol

  // The type the values are exactly representable in (see above).
  DType value_dtype() const { return rounded || dtype == DType::boolean ? dtype : DType::f32; }
  // Values exact in f16 or bf16 (a tensor-core operand as it is, without a `precision`).
  bool sixteen_bit_values() const { return value_dtype() == DType::f16 || value_dtype() == DType::bf16; }
  int rank() const { return static_cast<int>(shape.size()); }
};

struct Op {
  OpKind kind;
  std::vector<TensorId> inputs;
  TensorId output = -1;
  Attributes attrs;
  bool explicit_dtype = false;  // the document gave `dtype` (rounds the result)
  std::shared_ptr<const SymbolicAttrs> symbolic;  // reshape/expand shape, slice start/end with symbols
};

// What a row of the rewrite table (rewrite_table.h) did to the graph as
// written, or declined to do and why: for the plan's text and the dumps.
struct RewriteNote {
  std::string row;    // the table's row
  bool applied = false;
  std::string where;  // the ops, named as describe() names them, and what became of them
  std::string why;    // a near miss: why the row left it as written
};

class Graph {
 public:
  std::string name;
  std::vector<Tensor> tensors;
  std::vector<TensorId> inputs;   // binding order
  std::vector<Op> ops;            // evaluation order
  std::vector<TensorId> outputs;  // the document's order
  std::vector<std::vector<int32_t>> users;  // tensor id -> indices of ops reading it
  // The graph as planned: the rewrites applied to the graph as written and
  // the near misses declined (empty for the graph as written).
  std::vector<RewriteNote> rewrites;
  // The `dims` table of a graph with symbolic dimensions; null for an integer graph.
  std::shared_ptr<const DimTable> dims;

  bool is_symbolic() const { return dims != nullptr; }

  const Tensor& tensor(TensorId id) const { return tensors[static_cast<size_t>(id)]; }
  const Tensor& result(const Op& op) const { return tensor(op.output); }
  const Tensor& operand(const Op& op, size_t i) const { return tensor(op.inputs[i]); }
  // "op 3 'cb' (add)": how messages name an op.
  std::string describe(int32_t op_index) const;
  // Fills `users` from the ops (each op once per tensor it reads).
  void index_users();
};

}  // namespace kiln::ir
