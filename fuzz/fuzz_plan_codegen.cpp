// libFuzzer target: load -> plan -> verify the plan -> generate CUDA C++ for
// sm_80 and sm_90 (up to source text; NVRTC is not run: it is slow and not
// kiln's code).
//
// Any graph that loads must plan into a plan the verifier accepts and
// generate, or fail with a user Error (a size a kernel cannot take); a
// crash, sanitizer report, uncaught exception or internal error is a
// finding. A symbolic graph is planned at its smallest sizes (until the
// planner takes symbolic graphs, issue #49); that it specializes there is
// checked too.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "compiler/graph_internal.h"
#include "codegen/kernel_codegen.h"
#include "compiler/error.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "kiln/graph.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kiln::Expected<kiln::Graph> g = kiln::Graph::from_json(text);
  if (!g) return 0;
  if (g->is_symbolic()) {
    kiln::Graph::DimValues smallest;
    for (const kiln::Graph::Dim& d : g->dims()) smallest[d.name] = (d.min + d.multiple_of - 1) / d.multiple_of * d.multiple_of;
    g = g->specialize(smallest);
    if (!g) {
      std::fprintf(stderr, "a symbolic graph that loads does not specialize at its smallest sizes: %s\n",
                   g.error().message.c_str());
      std::abort();
    }
  }
  for (bool fuse : {true, false})
    for (int sm : {80, 90}) {  // the plan depends on the target (PlanOptions::sm)
      kiln::Expected<kiln::ir::Plan> plan =
          kiln::detail::catch_errors([&] { return kiln::ir::plan_fusion(kiln::ir_of(*g), {.fuse = fuse, .sm = sm}); });
      if (!plan) {
        std::fprintf(stderr, "planning failed: %s\n", plan.error().message.c_str());
        std::abort();
      }
      if (const std::string bad = kiln::ir::verify_plan(kiln::ir_of(*g), *plan); !bad.empty()) {
        std::fprintf(stderr, "invalid plan: %s\n", bad.c_str());
        std::abort();
      }
      kiln::Expected<kiln::codegen::GeneratedProgram> program =
          kiln::detail::catch_errors([&] { return kiln::codegen::generate_program(kiln::ir_of(*g), *plan, sm); });
      if (!program && program.error().code == kiln::ErrorCode::Internal) {
        std::fprintf(stderr, "codegen: %s\n", program.error().message.c_str());
        std::abort();
      }
    }
  return 0;
}
