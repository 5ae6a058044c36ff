// The generator of normalisation kernels (norm_codegen.cpp): a block (or a
// warp, or a cluster) per row or group; rows in registers, in shared memory,
// or read in two passes.
#pragma once

#include "codegen/kernel_builder.h"

namespace kiln::codegen {

class NormGenerator : public KernelBuilder {
 public:
  using KernelBuilder::KernelBuilder;

  // Rows of at most 512 values held in registers: this many a block, a warp each.
  static constexpr int kRowsOfABlock = 8;
  // A chunked row of at most this many 16-byte chunks a lane (1024 16-bit values) is one warp's.
  static constexpr int kWarpRowChunks = 4;

  // Element j of line `line` of a normalisation -> coordinates of its input.
  Coords norm_element(const ir::Op& norm, const std::string& j);

  // The normalised value of `x` with its parameters, named "y", and the
  // stores of everything the kernel writes at this element.
  // With `ch`, chunked stores go to chunk_out(t)[v] (see element_writes).
  std::string norm_output(const ir::Op& norm, const Coords& c, const std::string& finale, const Chunking* ch = nullptr,
                          std::set<ir::TensorId>* chunked = nullptr);

  // The statistics: what to accumulate from `x` in which pass, how to
  // finish each pass into stat0/stat1, and the output from x and the stats.
  struct NormRecipe {
    std::vector<std::tuple<std::string, std::string, std::string, std::string>> passes;  // init, functor, update, finish
    std::string finale;
  };
  NormRecipe norm_recipe(const ir::Op& norm);

  void norm();

  // Rows that fit in registers, read and written a chunk at a time.
  void norm_chunked(const ir::Op& norm, const Chunking& ch);

  // Rows that fit in the shared memory of `cluster` blocks (a thread-block
  // cluster on sm_90, one block before): each block holds a slice of the
  // row; block statistics are combined across the cluster through
  // distributed shared memory, in rank order (every block gets the same
  // value). One read, one write.
  void norm_cluster(const ir::Op& norm, const Chunking& ch, int cluster);

  // How many blocks hold one row of `n` f32 values in shared memory (0: it
  // does not fit).
  int row_cluster(int64_t n) const;

  // The chunk of the row at element `j0`: its coordinates (`base`, the
  // first element) and those of lane `v`.
  Coords norm_chunk_coords(const ir::Op& norm, const Chunking& ch, Coords& base);
  // Loads a chunk of the norm's input into `slot` (an lvalue of lane v).
  std::string norm_chunk_input(const ir::Op& norm, const Chunking& ch, const std::string& slot);
  // The outputs of a chunk from x in `slot` (also the input's value there
  // when `slot_holds_input`).
  std::string norm_chunk_output(const ir::Op& norm, const Chunking& ch, const std::string& slot, const std::string& finale,
                                bool slot_holds_input);

  // How a normalisation's row is chunked (vec 1: element by element).
  Chunking row_chunking(const ir::Op& norm);

  // Softmax can keep exp(x - max) in place of x when nothing else in the
  // kernel reads x: the recipe then computes exp once per element.
  NormRecipe norm_recipe_in_place(const ir::Op& norm, bool& in_place);
};

}  // namespace kiln::codegen
