// The generator of depthwise_conv kernels (depthwise_codegen.cpp, over
// templates/kiln/depthwise.cuh): a conv2d with one group per input channel
// or groups of a few (compiler/planner/strategies.h: depthwise_conv), NHWC,
// any padding, stride, dilation and channel multiplier, and the pointwise
// ops of its epilogue.
//
// Expects: a depthwise_conv kernel of a verified plan: its anchor the conv,
// the rest pointwise ops (and views) on the conv's output.
// Guarantees: one block per tile of output pixels x input channels; the
// tile's input halo staged in shared memory (16-byte copies along the
// channels where the input is a tensor in memory with channels a multiple
// of 16 bytes, 16-byte aligned at run time; else element by element, any
// view, any alignment), the weights beside it, f32 accumulation in
// registers (rule 5's rounding of f32 operands); the epilogue's values of
// the channel alone computed once a thread, and the written tensors of the
// conv's output shape stored a thread's channels at a time (16 bytes a
// store where aligned and a multiple of 16 bytes).
#pragma once

#include "codegen/kernel_builder.h"

namespace kiln::codegen {

class DepthwiseGenerator : public KernelBuilder {
 public:
  using KernelBuilder::KernelBuilder;

  void depthwise();

  // The conv's sizes (NHWC): input n x h x w x c, output n x p x q x k, an
  // r x s filter, groups of group_in input and `multiplier` output channels
  // (depthwise: group_in 1, k = c * multiplier).
  struct Geometry {
    int64_t n = 0, h = 0, w = 0, c = 0, p = 0, q = 0, k = 0, r = 0, s = 0, multiplier = 1, group_in = 1;
    int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1};
  };
  static Geometry geometry(const ir::Graph& g, const ir::Op& conv);

  // The kernel, decided before a line of it is written: the template's
  // parameters (kiln::dw::Tile) and the launch.
  struct Tile {
    DType halo = DType::f32;  // the halo's type in shared memory: the input's storage (f32 through other views)
    int ct = 1;               // input channels a thread (whole groups; one shared-memory load of at most 16 bytes)
    int tq = 1;               // output pixels a thread, along a row
    int cg = 1, tx = 1, ty = 1;  // threads: channel lanes x column groups x rows
    int64_t blocks_c = 1, blocks_p = 1, blocks_q = 1;  // blocks along the channels, rows and columns
    int shared_bytes = 0;     // halo and weights (kiln::dw::Tile::kSharedBytes)

    int threads() const { return cg * tx * ty; }
    int64_t block_channels() const { return int64_t{cg} * ct; }
    int64_t thread_outputs(const Geometry& geo) const { return ct / geo.group_in * geo.multiplier; }
    int64_t blocks(const Geometry& geo) const { return geo.n * blocks_p * blocks_q * blocks_c; }
    // "16x8 pixels x 64 channels a block, 256 threads of 8 channels x 4 pixels"
    std::string to_string(const Geometry& geo) const;
  };
  // The tile for `geo` with a halo of type `halo`, its shared memory within
  // `budget` where it can be; `vectors`: the halo is copied 16 bytes at a
  // time (a block's channels then whole 16-byte chunks). Within budget
  // always without `vectors` (strategies.h bounds the window).
  static Tile decide(const Geometry& geo, DType halo, bool vectors, int budget);
  // A tile's shared memory for target `sm`: 64 KiB from sm_90 on (three
  // blocks of 256 threads an SM in its 228 KiB), else 48 KiB (no opting in
  // on any GPU from sm_75 on).
  static int shared_budget(int sm);
  // Shared memory the template's Tile takes for it (kSharedBytes, computed alike).
  static int shared_bytes(const Geometry& geo, const Tile& t);

 private:
  // The pieces of the kernel, in its order.
  std::string halo_elements(const ir::Op& conv, const Geometry& geo, const Tile& t);
  std::string weight_lambda(const ir::Op& conv, const Geometry& geo);
  static std::string first_output(const Geometry& geo, const std::string& channel);
  std::string epilogue(const ir::Op& conv, const Geometry& geo, const Tile& t);
  // The written tensors stored, and the tensors read in the epilogue
  // loaded, a thread's j = ct * multiplier channels at a time.
  Chunking channel_runs(const Geometry& geo, const Tile& t) const;
  std::string runs_aligned(const Chunking& ch) const;  // every pointer of ch 16-byte aligned
};

}  // namespace kiln::codegen
