// Tactics: the ways a kernel kind's generator can build one kernel, as an
// ordered list (the model: nvFuser's scheduler registry, Inductor's extern
// kernel choices beside its templates).
//
// Expects: a generator (a KernelBuilder of its kind) and the input its
// tactics share (the GEMM view of an anchor, an sdpa).
// Guarantees: first_fitting() tries a list in order and takes the first
// tactic whose fits() gives no reason; the tactics before it and their
// reasons are recorded (GeneratedKernel::tactics, printed by `kiln plan
// --arch`). Every list ends with a tactic that always fits (its fits()
// returns nullopt), so a list never runs out. A tactic's emit yields NVRTC
// source (the generator's kernel) or a library call.
//
// The lists: gemm_tactics.cpp (matmul and conv: cuBLASLt, mma.sync in one slice, wgmma, mma.sync, SIMT),
// attention_tactics.cpp (flash decoding, Hopper and mma.sync flash
// attention, the exact two-pass kernel).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "codegen/kernel_codegen.h"
#include "compiler/error.h"

namespace kiln::codegen {

// What a tactic's emit yields: a kernel of NVRTC source or, where
// GeneratedKernel::library is set, a vendor library's call.
using Emitted = GeneratedKernel;

// One way to build a kernel: `fits` says why it cannot take `Input`
// (nullopt: it can), `emit` builds the kernel (called only where it fits).
template <class Generator, class Input>
struct Tactic {
  std::string_view name;
  std::optional<std::string> (*fits)(const Generator&, const Input&);
  Emitted (*emit)(Generator&, const Input&);
};

// The first tactic of `tactics` that fits `in`; `record` learns it and the
// rejected ones before it, with their reasons.
template <class Generator, class Input>
const Tactic<Generator, Input>& first_fitting(std::span<const Tactic<Generator, Input>> tactics, const Generator& generator,
                                              const Input& in, TacticRecord& record) {
  for (const Tactic<Generator, Input>& tactic : tactics) {
    if (std::optional<std::string> why = tactic.fits(generator, in)) {
      record.rejected.push_back({std::string(tactic.name), std::move(*why)});
      continue;
    }
    record.chosen = tactic.name;
    return tactic;
  }
  KILN_UNREACHABLE("every tactic list ends with one that always fits");
}

}  // namespace kiln::codegen
