// Random valid graphs for property tests: every op family, random shapes
// with broadcasting and size-1 dimensions, every dtype, and structures that
// fusion likes (chains) and dislikes (diamonds, shared intermediates,
// intermediates that are outputs).
#pragma once

#include <cstdint>
#include <string>

#include "kiln/graph.h"

namespace kiln::testing {

struct RandomGraphOptions {
  int max_ops = 12;
  int64_t max_dim = 12;  // keeps the reference interpreter fast
};

// Deterministic in `seed`. Fails the test (ADD_FAILURE) if the generator
// makes an invalid graph, which would be a generator bug.
Graph random_graph(uint64_t seed, const RandomGraphOptions& options = {});

}  // namespace kiln::testing
