// Prints a digest of the CUDA C++ kiln generates: one line per kernel of
// every example graph, every bench graph and random graphs 1..N, for sm_80
// and sm_90, with the xxHash64 of its source and its launch shape. Two
// builds whose digests are equal generate byte-identical code: the proof a
// refactor of codegen owes (tests/tools/codegen_identical.sh compares a
// commit with the working tree).
//
//   kiln_codegen_digest SOURCE_DIR [RANDOM_GRAPHS]   (default 1000)
//
// With KILN_DIGEST_SOURCES=DIR it also writes each kernel's source there,
// one file per digest line, for a diff of the kernels that differ.
#include <fmt/format.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "codegen/kernel_codegen.h"
#include "compiler/error.h"
#include "compiler/graph_internal.h"
#include "compiler/planner/planner.h"
#include "kiln/graph.h"
#include "tests/unit/random_graph.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

void print_kernel(const std::string& label, int sm, size_t i, const codegen::GeneratedKernel& k) {
  if (const char* dir = std::getenv("KILN_DIGEST_SOURCES")) {
    std::string name = fmt::format("{}.sm_{}.k{}.{}.cu", label, sm, i, k.tuning.to_string());
    for (char& c : name)
      if (c == '/' || c == ' ' || c == '=') c = '_';
    std::ofstream(fs::path(dir) / name) << k.source;
  }
  fmt::print("{} sm_{} k{} {} {:016x} grid {}x{}x{} block {} smem {} args {}\n", label, sm, i, k.tuning.to_string(),
             XXH64(k.source.data(), k.source.size(), 0), k.grid[0], k.grid[1], k.grid[2], k.block[0], k.shared_bytes,
             k.args.size());
}

// The plan for target `sm` (PlanOptions::sm; commits before it planned
// alike for every target, and this tool also builds against them).
template <class Options = ir::PlanOptions>
ir::Plan plan_for(const Graph& graph, bool fuse, int sm) {
  Options options{};
  options.fuse = fuse;
  if constexpr (requires { options.sm; }) options.sm = sm;
  return ir::plan_fusion(ir_of(graph), options);
}

void print_plan_digest(const std::string& label, const Graph& graph, bool fuse) {
  for (int sm : {80, 90}) {
    const ir::Plan plan = plan_for(graph, fuse, sm);
    Expected<codegen::GeneratedProgram> program =
        detail::catch_errors([&] { return codegen::generate_program(ir_of(graph), plan, sm); });
    if (!program) {
      fmt::print("{} sm_{} error {}\n", label, sm, program.error().message);
      continue;
    }
    for (size_t i = 0; i < program->kernels.size(); ++i) {
      const codegen::GeneratedKernel& k = program->kernels[i];
      print_kernel(label, sm, i, k);
      for (size_t c = 1; c < k.tuning_space.size(); ++c) {
        const codegen::GeneratedProgram other =
            codegen::generate_program(ir_of(graph), plan, sm, {{k.plan_kernel, k.tuning_space[c]}});
        print_kernel(label, sm, i, other.kernels[i]);
      }
    }
  }
}

// Each kernel as the heuristic makes it, then as every other choice of its
// tuning space (what the autotuner compiles) makes it; fused as planned, and
// one kernel per op (--no-fusion).
void print_digest(const std::string& graph_label, const Graph& graph) {
  for (bool fuse : {true, false}) print_plan_digest(fuse ? graph_label : graph_label + " unfused", graph, fuse);
}

std::vector<fs::path> json_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: kiln_codegen_digest SOURCE_DIR [RANDOM_GRAPHS]\n");
    return 2;
  }
  const fs::path source = argv[1];
  const int random_graphs = argc > 2 ? std::atoi(argv[2]) : 1000;
  for (const char* dir : {"examples", "bench/graphs"})
    for (const fs::path& path : json_files(source / dir)) {
      Expected<Graph> g = Graph::load(path.string());
      if (g) print_digest(fs::relative(path, source).string(), *g);
    }
  for (int seed = 1; seed <= random_graphs; ++seed)
    print_digest(fmt::format("random/{}", seed), testing::random_graph(static_cast<uint64_t>(seed)));
  return 0;
}
