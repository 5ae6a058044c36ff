// The reference interpreter's per-family evaluators.
//
// Expects: a constructed Graph (shapes and attributes checked and resolved)
// and operand values of the shapes the IR says. Values are logical row-major
// f32 arrays; a bool value holds 0 and 1.
// Guarantees: the op's result exactly as graph-format.md defines it, computed
// in f64 where that is cheap (sums, transcendental functions), before the
// caller rounds it to the result's dtype where numerics rule 2 says.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "compiler/ir.h"

namespace kiln::reference {

struct Value {
  Shape shape;
  std::vector<float> data;
};
using Operands = std::vector<const Value*>;

// Throws the Interrupted user error once `cancel` (if any) is set.
void stop_if_cancelled(const std::atomic<bool>* cancel);

// How far a long evaluation (an anchor) is, as a share of the op: the
// evaluators call at() once per output row; it reports nothing unless the
// interpreter was given a progress callback, and stops the run (throws)
// once the caller's cancel flag is set.
class OpProgress {
 public:
  OpProgress() = default;
  OpProgress(std::function<void(double)> report, const std::atomic<bool>* cancel)
      : report_(std::move(report)), cancel_(cancel) {}
  void at(int64_t done, int64_t total) const {
    stop_if_cancelled(cancel_);
    if (report_ && total > 0) report_(static_cast<double>(done) / static_cast<double>(total));
  }

 private:
  std::function<void(double)> report_;
  const std::atomic<bool>* cancel_ = nullptr;
};

std::vector<float> eval_pointwise(const ir::Op& op, const Shape& out_shape, const Operands& in);
std::vector<float> eval_reduce(const ir::Op& op, const Shape& out_shape, const Operands& in);
std::vector<float> eval_norm(const ir::Op& op, const Operands& in);
std::vector<float> eval_matmul(const ir::Graph& g, const ir::Op& op, const Shape& out_shape,
                               const Operands& in, const OpProgress& progress);
std::vector<float> eval_conv(const ir::Graph& g, const ir::Op& op, const Shape& out_shape,
                             const Operands& in, const OpProgress& progress);
std::vector<float> eval_pool(const ir::Op& op, const Shape& out_shape, const Operands& in);
std::vector<float> eval_view(const ir::Op& op, const Shape& out_shape, const Operands& in);
std::vector<float> eval_concat(const ir::Op& op, const Shape& out_shape, const Operands& in);
std::vector<float> eval_sdpa(const ir::Graph& g, const ir::Op& op, const Operands& in,
                             const OpProgress& progress);

// Strides (in elements) that read a contiguous tensor of shape `in` as if it
// were broadcast to `out`: 0 along broadcast dimensions.
Strides broadcast_strides(const Shape& in, const Shape& out);

// Calls f(linear output index, offsets[k]) for every index of `shape`, with
// offsets[k] = sum(index[d] * strides[k][d]), updated incrementally.
template <class F>
void for_each_index(const Shape& shape, const std::vector<Strides>& strides, F&& f) {
  const size_t rank = shape.size();
  const int64_t count = element_count(shape);
  std::vector<int64_t> index(rank, 0), offsets(strides.size(), 0);
  for (int64_t linear = 0; linear < count; ++linear) {
    f(linear, offsets);
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < shape[d]) {
        for (size_t k = 0; k < strides.size(); ++k) offsets[k] += strides[k][d];
        break;
      }
      for (size_t k = 0; k < strides.size(); ++k) offsets[k] -= (shape[d] - 1) * strides[k][d];
      index[d] = 0;
    }
  }
}

}  // namespace kiln::reference
