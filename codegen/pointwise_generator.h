// The generator of pointwise and copy kernels (pointwise_codegen.cpp): a
// grid-stride loop over the written domain, 16-byte vector loads and stores
// where every tensor allows, a scalar tail.
#pragma once

#include "codegen/kernel_builder.h"

namespace kiln::codegen {

class PointwiseGenerator : public KernelBuilder {
 public:
  using KernelBuilder::KernelBuilder;

  void pointwise();

  // Elements per thread of the vectorised path (1: no vector path): 16 bytes
  // of the narrowest vectorised tensor (8 when any is 16-bit, so that every
  // vectorised tensor moves whole 16-byte words), when every written tensor
  // has the domain's shape and a floating storage type, and the domain has
  // some whole chunks.
  int vector_width(const Shape& domain);

  std::string vector_loop(const Shape& domain, int vec);
};

}  // namespace kiln::codegen
