// Timing a compiled graph on the GPU (`kiln bench`): the median of CUDA-event
// timings after warm-up, rotating several input sets so that repeated runs
// do not read one buffer out of L2; plus the graph's floor figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/executable.h"

namespace kiln::runtime {

// Bytes a graph must move at least: each input read once (its dtype), each
// output written once (its storage dtype).
int64_t min_bytes(const ir::Graph& g);
// Useful floating-point operations of the anchors (2*M*N*K for matmul and
// conv, 4*B*H*Sq*Skv*D for attention, halved when causal); pointwise work is
// not counted.
int64_t anchor_flops(const ir::Graph& g);

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  int runs = 0;
  int input_sets = 0;
};

// Device buffers for timing one graph: several sets of random inputs
// (seeds seed, seed+1, ...), enough that one pass over them is several
// times the L2, and its outputs. Every executable of the same graph can be
// timed on them (the autotuner times its candidates on one set).
class BenchBuffers {
 public:
  static Expected<BenchBuffers> make(const Executable& exe, uint64_t seed);
  const std::vector<std::vector<DeviceBinding>>& sets() const { return sets_; }
  ~BenchBuffers();
  BenchBuffers(BenchBuffers&& other) noexcept;
  BenchBuffers& operator=(BenchBuffers&&) = delete;

 private:
  BenchBuffers() = default;
  std::vector<std::vector<DeviceBinding>> sets_;
  std::vector<uint64_t> allocations_;  // CUdeviceptr
};

// Times `exe` on `buffers` (made for the same graph, or for a symbolic
// `exe`, for its graph specialized at the sizes of `input_shapes`, which
// each launch binds): 3 warm-up runs, then as many as fit in about
// `budget_ms` (10 to 200).
Expected<Timing> time_runs(const Executable& exe, const BenchBuffers& buffers, double budget_ms = 300,
                           const std::vector<Shape>& input_shapes = {});
Expected<Timing> time_executable(const Executable& exe, uint64_t seed);

}  // namespace kiln::runtime
