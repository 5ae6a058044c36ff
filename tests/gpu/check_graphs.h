// The GPU tests' common check: each graph compiled (in parallel: NVRTC is
// the slow part) and run serially on the GPU against the reference
// interpreter on the same random inputs (seed + the graph's index), its
// outputs poisoned first (Executable::run_host). A failure is reported with
// the graph's name and JSON.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "compiler/graph_internal.h"
#include "kiln/executable.h"
#include "kiln/reference.h"
#include "runtime/check.h"
#include "runtime/random_inputs.h"

namespace kiln::testing {

struct Outcome {
  int passed = 0, failed = 0;
};

inline Outcome check_graphs(const std::vector<Graph>& graphs, const std::vector<std::string>& names, uint64_t seed) {
  std::vector<std::future<Expected<Executable>>> compiled;
  for (const Graph& g : graphs)
    compiled.push_back(std::async(std::launch::async, [&g] { return Executable::compile(g); }));
  Outcome o;
  for (size_t i = 0; i < graphs.size(); ++i) {
    Expected<Executable> exe = compiled[i].get();
    if (!exe) {
      ADD_FAILURE() << names[i] << ": " << exe.error().message;
      ++o.failed;
      continue;
    }
    const std::vector<HostTensor> inputs = random_inputs(graphs[i], seed + i);
    Expected<std::vector<HostTensor>> got = exe->run_host(inputs);
    Expected<std::vector<HostTensor>> want = run_reference(graphs[i], inputs);
    if (!got || !want) {
      ADD_FAILURE() << names[i] << ": " << (!got ? got.error().message : want.error().message);
      ++o.failed;
      continue;
    }
    bool ok = true;
    for (size_t k = 0; k < want->size(); ++k) {
      const ir::TensorId id = ir_of(graphs[i]).outputs[k];
      const double tolerance = runtime::default_tolerance(ir_of(graphs[i]), id);
      const runtime::Comparison c = runtime::compare((*got)[k], (*want)[k]);
      if (!c.passes(tolerance)) {
        ok = false;
        ADD_FAILURE() << names[i] << " output '" << ir_of(graphs[i]).tensor(id).name << "': rel err " << c.relative_error
                      << " (tolerance " << tolerance << ")"
                      << (c.nonfinite_match ? "" : ", NaN/inf differ at element " + std::to_string(c.first_mismatch))
                      << "\n" << graphs[i].to_json();
      }
    }
    ok ? ++o.passed : ++o.failed;
  }
  return o;
}

}  // namespace kiln::testing
