// Strided operands written once by a copy kernel, so that the anchor that
// reads them reads a plain tensor.
//
// Conv operands, in channels-last order: an NHWC conv2d's
// input or weights that is a transpose of a tensor in memory whose
// channels are not adjacent there (an NCHW network's input read as NHWC;
// OIHW weights read as [K, R, S, C], channels R*S apart) is made by a copy
// kernel of its own, and the conv reads that copy as a plain tensor.
//
// Expects: a constructed Graph, as the rewrite table left it
// (nchw_convs_as_nhwc.h put NCHW convs' operands behind such transposes).
// Guarantees: for each such operand, the transpose's result and why; the
// planner starts a copy kernel at that transpose instead of folding it into
// the conv's loads. Only transposes, only of tensors in memory (graph inputs
// or results of other ops, which kernels write contiguous), only where the
// channel dimension has more than one element and is not stride 1 in
// memory; other views stay folded.
//
// Why. The conv kernels read an operand fast only where its channels are
// contiguous in memory: in 16-byte chunks (cp.async, and the Hopper
// kernel's gathered im2col rows) and, for weights, by TMA into wgmma
// (codegen/gemm_codegen.cpp conv_chunks, GemmGenerator::
// conv_weight_operand). Through a transpose that spreads the channels
// apart, the kernel falls back to mma.sync with every element of that
// operand loaded alone, once per output tile. The copy reads and writes the
// tensor once (weights: K*C*R*S elements, a few KiB to a few MiB per conv).
//
// The same for a matmul operand that is a transpose reshaped to rows (a
// pointwise conv as a matmul, patch_convolutions.h, over an NCHW network's
// NHWC transpose): rows that do not lie as rows in memory are no TMA tile,
// and the matmul would load them element by element in its prologue.
//
// And for an attention's mask, or a bias added to a matmul's products
// (attention scores written out), read through (reshapes of) a transpose
// that leaves its last axis strided in memory (T5's position bias: an
// embedding's [q, k, heads] read as [heads, q, k]): every score would load
// its element alone, a sector apiece, once per batch (H100, B16 H12 S256:
// 0.48 ms per layer); the copy reads and writes it once.
//
// And, where cuBLASLt computes f32 matmuls (PlanOptions::
// cublaslt_f32_matmuls), an operand read through (reshapes of) a transpose
// that leave no matrix of one batch stride in memory (attention's q, k and
// v, [B, S, H, D] read as [B*H, S, D]; its output read back as [B*S, H*D]):
// cuBLASLt reads only such matrices in place, so without the copy kiln's
// SIMT kernel would compute the product (BERT f32, H100: 0.214 ms against
// cuBLASLt's 0.06 for the same scores).
#pragma once

#include <map>
#include <string>

#include "compiler/ir.h"

namespace kiln::ir::planner {

// Transposed operands to write once: the transpose's result -> why.
std::map<TensorId, std::string> strided_operands(const Graph& g, bool cublaslt_f32_matmuls = false);

// A matmul of f32 operands, in full f32 or TF32: the matmuls cuBLASLt
// computes where the pipeline offers it (codegen's cublasLt tactic, its rule).
bool cublaslt_f32_matmul(const Graph& g, const Op& op);

}  // namespace kiln::ir::planner
