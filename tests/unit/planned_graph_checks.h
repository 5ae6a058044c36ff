// Checks shared by the tests of the passes that rewrite a graph before
// planning (the rows of rewrite_table.h: layout sinking, channel padding,
// patch convolutions): the reference interpreter on the graph as written
// and as planned, same inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>
#include <vector>

#include "compiler/graph_internal.h"
#include "runtime/random_inputs.h"
#include "tests/unit/test_helpers.h"

namespace kiln::testing {

// How many of g's ops are of `kind`.
inline int count_ops(const ir::Graph& g, ir::OpKind kind) {
  int n = 0;
  for (const ir::Op& op : g.ops) n += op.kind == kind;
  return n;
}

// Whether the rewrite table's row `row` applied to g (rewrite_table.h).
inline bool rewritten_by(const Graph& g, std::string_view row) {
  for (const ir::RewriteNote& n : ir_of(g).rewrites)
    if (n.applied && n.row == row) return true;
  return false;
}

// kBits: every output identical to the bit. kValues: equal as floats (a
// zero sum may change sign).
enum class Equality { kBits, kValues };

inline void expect_planned_equals_written(const Graph& g, uint64_t seed, Equality equality) {
  const std::vector<HostTensor> inputs = random_inputs(g, seed);
  const std::vector<HostTensor> want = must_run(Graph::Internal::unsunk(g), inputs);
  const std::vector<HostTensor> got = must_run(g, inputs);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].shape, got[i].shape) << "output " << i;
    ASSERT_EQ(want[i].values.size(), got[i].values.size());
    if (equality == Equality::kBits) {
      EXPECT_EQ(std::memcmp(want[i].values.data(), got[i].values.data(), want[i].values.size() * sizeof(float)), 0)
          << "output " << i << " of seed " << seed << "\n" << g.to_json();
      continue;
    }
    size_t differ = 0;
    for (size_t e = 0; e < want[i].values.size(); ++e) differ += !(want[i].values[e] == got[i].values[e]);
    EXPECT_EQ(differ, 0u) << "output " << i << " of seed " << seed << "\n" << g.to_json();
  }
}

// The reference's outputs for g as written and as rewritten, on `inputs`:
// within f32 rounding of the largest magnitude for f32 outputs, a rounding
// of their type for 16-bit ones (an output near the midpoint of two bf16
// values rounds either way); NaN where the graph makes NaN, the same
// infinities. For the rows that reassociate f32 sums (attention_as_sdpa,
// sdpa_as_matmuls).
inline void expect_rewritten_close_to_written(const Graph& g, const std::vector<HostTensor>& inputs, uint64_t seed) {
  const std::vector<HostTensor> want = must_run(Graph::Internal::unsunk(g), inputs);
  const std::vector<HostTensor> got = must_run(g, inputs);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].shape, got[i].shape);
    double scale = 0, worst = 0;
    for (float v : want[i].values)
      if (std::isfinite(v)) scale = std::max(scale, std::fabs(double{v}));
    for (size_t e = 0; e < want[i].values.size(); ++e) {
      const float w = want[i].values[e], r = got[i].values[e];
      if (!std::isfinite(w)) {
        EXPECT_TRUE(std::isnan(w) ? std::isnan(r) : w == r) << "output " << i << " element " << e << ": " << w << " " << r;
        continue;
      }
      worst = std::max(worst, std::fabs(double{w} - double{r}));
    }
    const double tolerance = want[i].dtype == DType::f32 ? 1e-5 : want[i].dtype == DType::f16 ? 2e-3 : 1.6e-2;
    EXPECT_LE(worst, tolerance * std::max(scale, 1e-30)) << "output " << i << " of seed " << seed;
  }
}

}  // namespace kiln::testing
