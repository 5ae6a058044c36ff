#include "runtime/random_inputs.h"

#include <cmath>
#include <random>

#include "compiler/graph_internal.h"
#include "compiler/ir.h"
#include "compiler/numerics.h"

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

bool read_as_batch_norm_var(const ir::Graph& g, ir::TensorId id) {
  for (const ir::Op& op : g.ops)
    if (op.kind == ir::OpKind::BatchNorm && op.inputs[2] == id) return true;
  return false;
}

}  // namespace

std::vector<HostTensor> random_inputs(const Graph& graph, uint64_t seed) {
  const ir::Graph& g = ir_of(graph);
  std::vector<HostTensor> inputs;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const ir::Tensor& t = g.tensor(g.inputs[i]);
    // One stream per input, so adding an input does not change the others.
    Normal normal(seed * 0x9E3779B97F4A7C15ull + i + 1);
    const bool variance = read_as_batch_norm_var(g, g.inputs[i]);
    HostTensor h{t.shape, t.dtype, std::vector<float>(static_cast<size_t>(element_count(t.shape)))};
    for (float& v : h.values) {
      if (t.dtype == DType::boolean) v = normal.uniform() < 0.5 ? 1.0f : 0.0f;
      else if (variance) v = round_to(t.dtype, static_cast<float>(std::fabs(normal.next()) + 0.5));
      else v = round_to(t.dtype, static_cast<float>(normal.next()));
    }
    inputs.push_back(std::move(h));
  }
  return inputs;
}

}  // namespace kiln
