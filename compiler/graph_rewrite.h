// A graph rebuilt op by op by a pass that replaces some ops (the rows of
// rewrite_table.h): it starts with the given graph's name, tensors, inputs
// and outputs and no ops; the pass emits ops in evaluation order, adding the
// tensors its new ops make.
//
// Guarantees: each emitted op is its result's producer; a result that no
// emitted op makes (an op the pass dropped) has none (-1); take() returns
// the graph with its users indexed.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "compiler/ir.h"
#include "compiler/rewrite_table.h"
#include "compiler/shape_inference.h"

namespace kiln::ir {

class GraphRewrite {
 public:
  explicit GraphRewrite(const Graph& g) {
    out_.name = g.name;
    out_.tensors = g.tensors;
    out_.inputs = g.inputs;
    out_.outputs = g.outputs;
    for (Tensor& t : out_.tensors)
      if (t.kind == TensorKind::OpResult) t.producer = -1;
  }

  TensorId add(Tensor t) {
    out_.tensors.push_back(std::move(t));
    return static_cast<TensorId>(out_.tensors.size() - 1);
  }
  void emit(Op op) {
    out_.tensors[static_cast<size_t>(op.output)].producer = static_cast<int32_t>(out_.ops.size());
    out_.ops.push_back(std::move(op));
  }
  const Tensor& tensor(TensorId t) const { return out_.tensors[static_cast<size_t>(t)]; }
  Graph take() {
    out_.index_users();
    return std::move(out_);
  }

 private:
  Graph out_;
};

// The result tensor of a new op (a row's replacement): shape and dtype by
// shape inference (`given`: the attributes set; `where`: for its errors),
// or `dtype` where the op gives one; contiguous; f32 values unless rounded
// (that dtype, a cast, or a view of a tensor rounded to its type).
inline Tensor inferred_result(OpKind kind, const std::vector<const Tensor*>& operands, Attributes& attrs, AttrSet given,
                              const std::string& where, std::string name, std::optional<DType> dtype = {}) {
  const InferredResult r = infer_result(kind, operands, attrs, given, where);
  Tensor t;
  t.kind = TensorKind::OpResult;
  t.name = std::move(name);
  t.shape = r.shape;
  t.strides = contiguous_strides(r.shape);
  t.dtype = dtype.value_or(r.dtype);
  const bool view = op_info(kind).family == OpFamily::View;
  t.rounded = dtype.has_value() || kind == OpKind::Cast ||
              (view && operands[0]->rounded && operands[0]->dtype == t.dtype);
  return t;
}

// The ops a row's matches replace, by index.
inline std::set<int32_t> site_ops(const RowMatches& m) {
  std::set<int32_t> ops;
  for (const RewriteSite& s : m.sites) ops.insert(s.op);
  return ops;
}

}  // namespace kiln::ir
