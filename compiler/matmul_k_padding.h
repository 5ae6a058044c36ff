// K padding of matmuls: a matmul of 16-bit operands whose K is not a
// multiple of 8 (rows of K elements are then no 16-byte multiple) reads its
// operands padded with zeros along K to the next multiple of 8, where the
// GEMM is large enough to pay for the copies.
//
// A row of the rewrite table (rewrite_table.h).
//
// Expects: a constructed Graph (graph_construction.cpp), after layout
// sinking (the rows before it in the table).
// Guarantees: a Graph that computes what the given one computes (the added
// columns of A meet added rows of B: products 0 * 0, the same f32 sums up to
// the sign of a zero sum), with the same inputs and outputs under the same
// ids. A is concat(A, zeros) along its last axis. B read through a transpose
// of its last two axes (x @ w^T, nn.Linear's weight [N, K]) has its source
// padded along that source's last axis and transposed again, so that it
// stays K-major; any other B is concat(B, zeros) along K (its axis -2). A
// transpose left with no reader is dropped. Near misses, with why: a B whose
// rows of N elements are no 16-byte multiple either (no layout of it loads
// by TMA), and a GEMM too small for the copies (decode: M of a few rows, the
// weights copied for each call).
//
// Why. The Hopper kernel (codegen/wgmma_codegen.cpp) loads an operand by TMA
// only where its rows are 16-byte multiples; with K = 4099 neither operand
// qualifies and the matmul runs on mma.sync, each element loaded alone. The
// planner writes the padded operands once (on sm_90 a concat is never a
// matmul's prologue), and the matmul takes the Hopper kernel. The copies
// read each operand once and write it padded, 2 x 2 x rows x K' bytes for
// a 16-bit operand of `rows` rows (for x [4096, 4099] and w [4096, 4099]:
// 128 MiB against 137.5 GFLOP). They are made where the GEMM does at least
// kFlopsPerCopiedByte (256) flops per byte copied: at H100's ~800 TFLOP/s
// and ~3 TB/s a byte copied takes the time of about 270 flops, so the
// copies take at most about the GEMM's own time on wgmma, while loading
// the unpadded operands element by element costs 1.4-5.9x the GEMM
// (bench/NOTES.md, computed operands on H100). An estimate, not measured on
// odd K: the GPU machine's timings of the padded and unpadded GEMM set it.
#pragma once

#include "compiler/rewrite_table.h"

namespace kiln::ir {

// The matcher: each matmul that qualifies, a site; the near misses.
RowMatches find_odd_k_matmuls(const Graph& g);
// The replacement: each site's operands padded along K.
Graph pad_matmul_k(const Graph& g, const RowMatches& m);

}  // namespace kiln::ir
