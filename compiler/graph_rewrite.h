// A graph rebuilt op by op by a pass that replaces some ops (the rows of
// rewrite_table.h): it starts with the given graph's name, tensors, inputs
// and outputs and no ops; the pass emits ops in evaluation order, adding the
// tensors its new ops make.
//
// Guarantees: each emitted op is its result's producer; a result that no
// emitted op makes (an op the pass dropped) has none (-1); take() returns
// the graph with its users indexed.
#pragma once

#include <utility>

#include "compiler/ir.h"

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

}  // namespace kiln::ir
