// libFuzzer target: the graph loader and validator (compiler/json_graph,
// graph construction, shape inference) and the canonical writer and hash.
//
// Any input must give a Graph or an Error: a crash, a sanitizer report, an
// uncaught exception or a hang is a finding. A graph that loads must write
// canonical JSON that loads back to the same hash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "kiln/graph.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kiln::Expected<kiln::Graph> g = kiln::Graph::from_json(text);
  if (!g) return 0;
  const std::string canonical = g->to_json();
  kiln::Expected<kiln::Graph> again = kiln::Graph::from_json(canonical);
  if (!again || again->hash() != g->hash()) {
    std::fprintf(stderr, "canonical JSON does not load back to the same graph:\n%s\n", canonical.c_str());
    std::abort();
  }
  return 0;
}
