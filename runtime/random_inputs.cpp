#include "runtime/random_inputs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "compiler/graph_internal.h"
#include "compiler/ir.h"
#include "compiler/numerics.h"
#include "runtime/parallel_for.h"

namespace kiln {
namespace {

class Normal {
 public:
  explicit Normal(uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return radius * std::cos(2.0 * M_PI * u2);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0;
  bool has_spare_ = false;
};

// `values` of shape `from` (size 1 where `to` repeats) repeated to `to`.
std::vector<float> broadcast_values(const std::vector<float>& values, const Shape& from, const Shape& to) {
  std::vector<float> out(static_cast<size_t>(element_count(to)));
  for (size_t e = 0; e < out.size(); ++e) {
    int64_t rest = static_cast<int64_t>(e), source = 0, step = 1;
    for (size_t d = to.size(); d-- > 0;) {
      const int64_t c = rest % to[d];
      rest /= to[d];
      if (from[d] != 1) source += c * step;
      step *= from[d];
    }
    out[e] = values[static_cast<size_t>(source)];
  }
  return out;
}

bool read_as_batch_norm_var(const ir::Graph& g, ir::TensorId id) {
  for (const ir::Op& op : g.ops)
    if (op.kind == ir::OpKind::BatchNorm && op.inputs[2] == id) return true;
  return false;
}

// Input `index` of `g`, from its own stream of `seed`.
HostTensor random_input(const ir::Graph& g, size_t index, uint64_t seed) {
  const ir::Tensor& t = g.tensor(g.inputs[index]);
  // One stream per input, so adding an input does not change the others.
  Normal normal(seed * 0x9E3779B97F4A7C15ull + index + 1);
  const bool variance = read_as_batch_norm_var(g, g.inputs[index]);
  // One value per stored element: along an axis declared with stride 0
  // every element is the same stored value, as on the device.
  Shape stored = t.shape;
  for (size_t d = 0; d < stored.size() && d < t.strides.size(); ++d)
    if (t.strides[d] == 0) stored[d] = 1;
  std::vector<float> values(static_cast<size_t>(element_count(stored)));
  for (float& v : values) {
    if (t.dtype == DType::boolean) v = normal.uniform() < 0.5 ? 1.0f : 0.0f;
    else if (variance) v = round_to(t.dtype, static_cast<float>(std::fabs(normal.next()) + 0.5));
    else v = round_to(t.dtype, static_cast<float>(normal.next()));
  }
  return HostTensor{t.shape, t.dtype, stored == t.shape ? std::move(values) : broadcast_values(values, stored, t.shape)};
}

}  // namespace

// The streams are independent, so the inputs are drawn on several threads
// (largest first), each exactly as one thread would draw it: a model's
// hundreds of weights, or attention's three 128 MB operands, in a fraction
// of the time, the values unchanged.
std::vector<HostTensor> random_inputs(const Graph& graph, uint64_t seed) {
  const ir::Graph& g = ir_of(graph);
  const size_t count = g.inputs.size();
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return element_count(g.tensor(g.inputs[a]).shape) > element_count(g.tensor(g.inputs[b]).shape);
  });
  std::vector<HostTensor> inputs(count);
  runtime::parallel_for(count, [&](size_t i) { inputs[order[i]] = random_input(g, order[i], seed); });
  return inputs;
}

std::string stored_layout_problem(const TensorDesc& desc, const HostTensor& values) {
  const Shape& shape = desc.shape;
  bool repeats = false;
  for (size_t d = 0; d < shape.size() && d < desc.strides.size(); ++d) repeats = repeats || (desc.strides[d] == 0 && shape[d] > 1);
  if (!repeats) return {};
  for (size_t e = 0; e < values.values.size(); ++e) {
    // The element this one repeats: coordinate 0 along the stride-0 axes.
    int64_t rest = static_cast<int64_t>(e), first = 0, step = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      const int64_t c = rest % shape[d];
      rest /= shape[d];
      if (desc.strides[d] != 0) first += c * step;
      step *= shape[d];
    }
    const float a = values.values[e], b = values.values[static_cast<size_t>(first)];
    if (!(a == b || (std::isnan(a) && std::isnan(b))))
      return fmt::format("input '{}' is declared with stride 0 along an axis, so the device stores one value along it, "
                         "but element {} ({}) differs from element {} ({})",
                         desc.name, e, a, first, b);
  }
  return {};
}

}  // namespace kiln
