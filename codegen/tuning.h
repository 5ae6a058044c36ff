// Tuning: the choices a tensor-core kernel's heuristic makes from the
// problem's size (tile width, cluster shape, tile order, K split) that
// `kiln compile --autotune` may replace by measured winners.
//
// Expects: nothing; a Tuning is plain data, read from a cache record or
// built by the autotuner.
// Guarantees: a generated kernel reports the choice it was built with
// (GeneratedKernel::tuning) and every alternative its generator accepts
// for it (GeneratedKernel::tuning_space, the heuristic's choice first). A
// requested Tuning outside that space is ignored, so a stale or foreign
// record can only ever select a kernel the generator itself would make.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace kiln::codegen {

struct Tuning {
  int tile_n = 0;   // columns of a block's output tile
  int cluster = 0;  // blocks per thread-block cluster along M (Hopper kernel)
  int raster = 0;   // tile rows a block sweep walks together, for L2 reuse
  int splits = 0;   // blocks sharing one output tile along K (few-row matmuls)
  // A staged epilogue's column blocks (Hopper kernel): kRolled in a loop
  // (less code: the instruction cache holds it), kUnrolled (later blocks'
  // loads start early).
  int epilogue = 0;
  static constexpr int kRolled = 1, kUnrolled = 2;
  // Hopper kernel: 1 gives each consumer warpgroup tiles of its own (64
  // rows), one warpgroup's epilogue running under the other's main loop
  // (ping-pong); 0 has both share each 128-row tile (cooperative).
  int pingpong = 0;
  // A matmul that a vendor library can take (the "cublasLt" tactic,
  // gemm_tactics.cpp): kOwn builds kiln's own kernel, kCublasLt calls
  // cuBLASLt; 0 leaves it to the rule.
  int vendor = 0;
  static constexpr int kOwn = 1, kCublasLt = 2;
  // Rows of a block's output tile where the heuristic's rows are not the
  // kernel's only choice: the few-rows tile of a symbolic M's size bucket
  // (mma.sync kernel, gemm_codegen.cpp). Last, so that the positional
  // initialisers of the fields above stand.
  int tile_m = 0;

  bool empty() const {
    return tile_n == 0 && tile_m == 0 && cluster == 0 && raster == 0 && splits == 0 && epilogue == 0 && pingpong == 0 &&
           vendor == 0;
  }
  // "tile_n=256 tile_m=64 cluster=2 raster=8 epilogue=rolled pingpong=1 vendor=cublasLt": the set fields, in this order.
  std::string to_string() const;
  // The inverse of to_string(); nullopt on anything else.
  static std::optional<Tuning> parse(const std::string& text);
  friend bool operator==(const Tuning&, const Tuning&) = default;
};

// Requested choices of a program's kernels, by plan kernel id.
using ProgramTuning = std::map<int, Tuning>;

std::string to_string(const ProgramTuning& tuning);  // "k0{tile_n=128 ...} k3{...}"; "" when empty

}  // namespace kiln::codegen
