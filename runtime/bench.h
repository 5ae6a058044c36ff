// Timing a compiled graph on the GPU (`kiln bench`): the median of CUDA-event
// timings after warm-up, rotating several input sets so that repeated runs
// do not read one buffer out of L2; plus the graph's floor figures.
#pragma once

#include <string>

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

Expected<Timing> time_executable(Executable& exe, uint64_t seed);

}  // namespace kiln::runtime
