// The expression emitter: CUDA C++ that computes any tensor of a kernel at
// given coordinates.
//
// Expects: the kernel's ops (from the plan), how external tensors are
// reached (a pointer parameter, its storage dtype and strides), and "leaf"
// values the kernel template computes itself (a reduction's result, a
// normalisation's output, an anchor's accumulator) registered with set_leaf.
// Guarantees: value(t, coords) returns the name of a `float` holding t at
// those coordinates, emitting the statements that compute it: external
// tensors are loaded through their strides and converted exactly; views map
// coordinates (transpose permutes, reshape re-linearises); broadcasting
// drops leading and size-1 coordinates; pointwise ops apply the functors of
// kiln/common.cuh and round where numerics rule 2 says. Within a block
// (begin_block) each (tensor, coordinates) is computed once. Codegen dispatch
// fails loudly on an op it cannot emit.
//
// Column values (begin_columns): in a matmul or conv epilogue, a value whose
// coordinates are the output column's alone (a bias, batch_norm's channel
// parameters and the scale computed from them) is computed once per column
// in a loop of the generator's before the rows, and the element code reads
// it from a register array: an element costs what depends on its row.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "codegen/size_text.h"
#include "compiler/ir.h"

namespace kiln::codegen {

using Coords = std::vector<std::string>;

struct ExternalTensor {
  std::string pointer;  // parameter name
  DType storage;        // how its elements are stored
  Strides strides;      // in elements
  int64_t offset = 0;   // of element 0 from `pointer`, in elements (views that slice); the emitter's loads need 0
};

class Emitter {
 public:
  Emitter(const ir::Graph& g, std::set<int32_t> ops, std::map<ir::TensorId, ExternalTensor> externals);

  // How sizes are spelled (size_text.h); integer literals until set.
  void set_sizes(SizeText* sizes) { sizes_ = sizes; }

  std::string value(ir::TensorId t, const Coords& coords);
  // A value computed by the kernel template, valid for the current block:
  // at any coordinates the kernel asks for it (the template's own output),
  // or, with `at`, only there (elsewhere t is computed as usual: a
  // normalisation's input held in registers, read through a view at other
  // coordinates).
  void set_leaf(ir::TensorId t, const std::string& var, const Coords& at = {}) { leaves_[t] = {at, var}; }
  void clear_leaf(ir::TensorId t) { leaves_.erase(t); }
  // Rows statistics for a normalisation recomputed from a workspace (the
  // norm prologue of a matmul): pointer to [rows][2] floats (mean, rstd).
  void set_norm_stats(ir::TensorId norm_result, const std::string& pointer) { norm_stats_[norm_result] = pointer; }

  // Vectorised pointwise kernels: external tensor `t` (or a concat whose
  // pieces are), read at exactly `coords`, is element `index` of the
  // register array `array`.
  void set_vector_source(ir::TensorId t, const Coords& coords, const std::string& array, const std::string& index) {
    vector_sources_[t] = {coords, array + "[" + index + "]"};
  }
  // The coordinate along a concat's axis in its piece that starts at `offset`
  // (the piece's value there is the concat's).
  std::string piece_coordinate(const std::string& coordinate, int64_t offset) const;
  void clear_vector_sources() { vector_sources_.clear(), used_vector_sources_.clear(); }
  // Whether a value of `t` was taken from its vector source since it was set.
  bool vector_source_used(ir::TensorId t) const { return used_vector_sources_.count(t) > 0; }

  // Column values, until end_columns(): `column_vars` are the variables
  // that depend on the output column alone (and the tile), `dims` the
  // arrays' extents and `index` how the element code indexes them.
  void begin_columns(std::set<std::string> column_vars, std::string dims, std::string index);
  struct ColumnCode {
    std::string declarations;  // the register arrays
    std::string statements;    // one column's statements
    std::vector<std::pair<std::string, std::string>> values;  // (value, register array) the element code reads
    bool arithmetic = false;   // whether a value is computed (more than a load)
    bool empty() const { return declarations.empty(); }
  };
  ColumnCode end_columns();

  // Starts a new scope: values memoised so far are no longer visible.
  void begin_block() { memo_.clear(); }
  // The statements emitted since the last take(), a line each (the kernel's
  // CodeWriter lays them out).
  std::string take();
  // Emits a statement of the caller's own.
  void emit(const std::string& line) { lines_.push_back(line); }
  // A new variable name: `prefix` and a number, marked (kFreshMark on both
  // sides) until number_fresh_names() numbers the kernel's names in the
  // order they appear in its source, so that the source does not depend on
  // the order in which the generator asked for them (which C++ leaves
  // unspecified wherever two calls are arguments of one expression).
  std::string fresh(const char* prefix) { return kFreshMark + (prefix + std::to_string(next_++)) + kFreshMark; }
  static constexpr char kFreshMark = '\x1f';

  // `source` with every marked fresh name replaced by its prefix and the
  // order of its first appearance (one count for all prefixes). Checks that
  // no name the source writes itself is one of those.
  static std::string number_fresh_names(const std::string& source);

  // Coordinates of the element at row-major linear index `linear` of `shape`.
  Coords delinearize(const std::string& linear, const Shape& shape);
  // The row-major linear index of `coords` in `shape`.
  std::string linearize(const Coords& coords, const Shape& shape);
  // Coordinates in `target` of the element at `coords` of `shape`, both
  // shapes the same elements in the same linear order (a reshape).
  Coords same_element(const Coords& coords, const Shape& shape, const Shape& target);
  // The address offset of an external tensor at coords.
  std::string offset_of(const ExternalTensor& e, const Shape& shape, const Coords& coords);

  // `value` rounded as the result of `t` must be (rule 2).
  std::string rounded(const ir::Tensor& t, const std::string& value);
  // Whether `op`'s result is exact in its rounded type without rounding (it picks or negates
  // operands that are).
  bool stays_exact(const ir::Op& op) const;
  // `value` rounded to `dtype` (f16/bf16 rounding, bool as 0/1, f32 as is).
  static std::string round_as(DType dtype, const std::string& value);
  static std::string float_literal(float v);
  static std::string load_call(DType storage, const std::string& pointer, const std::string& offset);
  static std::string store_call(DType storage, const std::string& pointer, const std::string& offset,
                                const std::string& value);
  // The coordinates at which a pointwise op whose result has shape `result`
  // reads its operand of shape `operand` (numpy broadcasting).
  static Coords broadcast(const Shape& operand, const Shape& result, const Coords& coords);

 private:
  // value() for the emitter's own operands: a column value stays the
  // scalar of the column loop (element() turns it into its array element
  // where an element's statement reads it).
  std::string operand(ir::TensorId t, const Coords& coords);
  std::string element(const std::string& value);
  bool is_column_value(const std::string& value) const;
  bool is_column_expression(const std::string& expression) const;
  // A statement defining the float `name`: into the column loop when
  // `column`; define_index: an integer index.
  void define(const std::string& name, const std::string& line, bool column);
  void define_index(const std::string& name, const std::string& line, bool column);
  std::string compute(ir::TensorId t, const Coords& coords);
  std::string pointwise(const ir::Op& op, const Coords& coords);
  std::string view(const ir::Op& op, const Coords& coords);
  std::string concat(const ir::Op& op, const Coords& coords);
  std::string norm_from_stats(const ir::Op& op, const Coords& coords);

  const ir::Graph& g_;
  SizeText literal_sizes_;
  SizeText* sizes_ = &literal_sizes_;
  std::set<int32_t> ops_;
  std::map<ir::TensorId, ExternalTensor> externals_;
  std::map<ir::TensorId, std::pair<Coords, std::string>> leaves_;  // coordinates (empty: any), variable
  std::map<ir::TensorId, std::string> norm_stats_;
  std::string strided_sum(const Coords& coords, const Shape& shape, const Strides& strides);
  // The linear index each delinearize() split, by its coordinates and shape
  // (linearize() and offset_of() give it back instead of rebuilding it).
  std::map<std::pair<Coords, Shape>, std::string> linear_of_;
  std::map<std::string, std::string> memo_;
  std::map<ir::TensorId, std::pair<Coords, std::string>> vector_sources_;
  std::set<ir::TensorId> used_vector_sources_;
  std::vector<std::string> lines_;
  int next_ = 0;
  struct Columns {
    bool on = false;
    std::set<std::string> vars;      // column-only variables (without fresh marks)
    std::string dims, index;
    std::vector<std::string> lines;  // the column loop's statements
    std::set<std::string> values;    // names of column values
    std::map<std::string, std::string> arrays;  // column value -> its register array
    std::vector<std::string> exported;          // in order of first use
    bool arithmetic = false;                    // a column statement computes (not only loads)
  } columns_;
};

}  // namespace kiln::codegen
