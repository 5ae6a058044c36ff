#include "codegen/generator_registry.h"

#include "codegen/attention_generator.h"
#include "codegen/depthwise_generator.h"
#include "codegen/gemm_generator.h"
#include "codegen/norm_generator.h"
#include "codegen/pointwise_generator.h"
#include "codegen/reduction_generator.h"
#include "codegen/tactic.h"

namespace kiln::codegen {
namespace {

// Builds generator G for the kernel, runs its entry point, returns what it
// wrote: the kernel it kept, or what its chosen tactic emitted (tactic.h).
template <class G, auto Entry>
GeneratedKernel run(const GeneratorInput& in) {
  G generator(in.graph, in.kernel, in.state, in.sm, in.wanted);
  if constexpr (std::is_same_v<decltype((generator.*Entry)()), Emitted>) {
    return (generator.*Entry)();
  } else {
    (generator.*Entry)();
    return generator.take();
  }
}

using Kind = ir::KernelKind;

// In the order of compiler/kernel_kinds.def.
constexpr KernelGenerator kGenerators[] = {
    {Kind::Matmul, "matmul: SIMT, mma.sync tiles, or the Hopper TMA + wgmma kernel, with prologues and epilogues",
     &run<GemmGenerator, &GemmGenerator::matmul>},
    {Kind::Conv, "implicit-GEMM convolution on the matmul kernels", &run<GemmGenerator, &GemmGenerator::conv>},
    {Kind::Attention, "flash attention, or the exact two-pass kernel",
     &run<AttentionGenerator, &AttentionGenerator::attention>},
    {Kind::Pointwise, "a vectorised grid-stride loop", &run<PointwiseGenerator, &PointwiseGenerator::pointwise>},
    {Kind::Reduction, "row, split, column and held-row reductions, pools, row statistics",
     &run<ReductionGenerator, &ReductionGenerator::reduction>},
    {Kind::Norm, "normalisations: a warp, block or cluster per row, or two passes",
     &run<NormGenerator, &NormGenerator::norm>},
    {Kind::Copy, "views made real: the pointwise loop", &run<PointwiseGenerator, &PointwiseGenerator::pointwise>},
    {Kind::DepthwiseConv, "depthwise convolution: a tile of pixels x channels, its input halo in shared memory",
     &run<DepthwiseGenerator, &DepthwiseGenerator::depthwise>},
};

constexpr bool every_kind_in_order() {
  if (std::size(kGenerators) != ir::kKernelKindCount) return false;
  for (size_t i = 0; i < std::size(kGenerators); ++i)
    if (static_cast<size_t>(kGenerators[i].kind) != i) return false;
  return true;
}
static_assert(every_kind_in_order(),
              "codegen/generator_registry.cpp: one generator per kernel kind, in the order of compiler/kernel_kinds.def");

}  // namespace

const KernelGenerator& generator_for(ir::KernelKind kind) { return kGenerators[static_cast<size_t>(kind)]; }

}  // namespace kiln::codegen
