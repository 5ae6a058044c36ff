// Matmul and conv kernels: the tensor-core main loop of templates/kiln/mma.cuh
// (or f32 SIMT tiles) with this kernel's operand loaders (prologues,
// implicit im2col) and epilogue (pointwise ops, extra outputs, reductions).
#include "codegen/gemm_generator.h"

#include <climits>

namespace kiln::codegen {

auto GemmGenerator::mma_kind(const ir::Op& anchor) const -> std::optional<Mma> {
  if (sm_ < 80) return std::nullopt;
  auto effective = [&](size_t slot) {
    const DType vt = g_.operand(anchor, slot).value_dtype();
    if (vt != DType::f32) return std::optional<DType>(vt);
    switch (anchor.attrs.precision) {
      case ir::Precision::bf16: return std::optional<DType>(DType::bf16);
      case ir::Precision::f16: return std::optional<DType>(DType::f16);
      case ir::Precision::tf32: return std::optional<DType>(DType::f32);  // rounded to tf32
      case ir::Precision::f32: return std::optional<DType>();
    }
    return std::optional<DType>();
  };
  const std::optional<DType> a = effective(0), b = effective(1);
  if (!a || !b) return std::nullopt;
  if (*a == DType::bf16 && *b == DType::bf16) return Mma::bf16;
  if (*a == DType::f16 && *b == DType::f16) return Mma::f16;
  return Mma::tf32;
}

std::string GemmGenerator::no_mma_reason(const ir::Op& anchor) const {
  if (sm_ < 80) return fmt::format("tensor cores need sm_80, the target is sm_{}", sm_);
  for (size_t slot = 0; slot < 2; ++slot)
    if (g_.operand(anchor, slot).value_dtype() == DType::f32 && anchor.attrs.precision == ir::Precision::f32)
      return fmt::format("{} ('{}') is f32 at precision \"f32\": no tensor-core MMA computes it exactly",
                         slot == 0 ? "A" : "B", g_.operand(anchor, slot).name);
  KILN_UNREACHABLE("mma_kind takes every anchor whose operands are not f32 at precision f32");
}

DType GemmGenerator::mma_storage(Mma kind) {
  return kind == Mma::bf16 ? DType::bf16 : kind == Mma::f16 ? DType::f16 : DType::f32;
}

// The tensor in device memory that `t` is, seen through this kernel's
// transposes and reshapes (x @ w^T reads w in place; a [B, S, D] activation
// is the [B*S, D] operand it is in memory): its pointer, storage and strides
// in t's dimension order.
std::optional<ExternalTensor> GemmGenerator::in_memory(ir::TensorId t) const {
  return strided_in_memory(t, /*transposes_and_reshapes_only=*/true);
}

// The distance in memory between neighbours along dimension d of `t`, a
// tensor in memory seen through views (a reshape where d and the
// dimensions after it hold as many elements as some input dimension and
// those after it); nullopt where `t` is computed or the views hide it.
std::optional<int64_t> GemmGenerator::memory_stride(ir::TensorId t, size_t d) const {
  if (auto it = ext_.find(t); it != ext_.end()) return it->second.strides[d];
  if (!computed_here(t)) return std::nullopt;
  const ir::Op& op = g_.ops[static_cast<size_t>(g_.tensor(t).producer)];
  const Shape& out = g_.tensor(t).shape;
  const Shape& in = g_.operand(op, 0).shape;
  switch (op.kind) {
    case OpKind::Transpose: return memory_stride(op.inputs[0], static_cast<size_t>(op.attrs.perm[d]));
    case OpKind::Expand: {
      const size_t lead = out.size() - in.size();
      if (d < lead || in[d - lead] == 1) return 0;
      return memory_stride(op.inputs[0], d - lead);
    }
    case OpKind::Reshape: {
      const int64_t tail = element_count(Shape(out.begin() + static_cast<std::ptrdiff_t>(d), out.end()));
      for (size_t e = 0; e < in.size(); ++e)
        if (in[e] == out[d] && element_count(Shape(in.begin() + static_cast<std::ptrdiff_t>(e), in.end())) == tail)
          return memory_stride(op.inputs[0], e);
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

// Whether `t` lies one element apart along its dimension rank - from_last
// (1 or 2) and not along the other of its last two.
bool GemmGenerator::stored_along(ir::TensorId t, size_t from_last) const {
  const size_t rank = g_.tensor(t).shape.size();
  if (rank < 2) return false;
  const std::optional<int64_t> along = memory_stride(t, rank - from_last);
  const std::optional<int64_t> other = memory_stride(t, from_last == 2 ? rank - 1 : rank - 2);
  return along == 1 && other != 1;
}

// An operand read as 16-byte chunks along dimension `inner`: a tensor in
// memory (not computed here) stored as the MMA's element type, stride 1
// along `inner`, every chunk 16-byte aligned given an aligned base
// pointer (checked at run time). `views`: also through slices and
// expands (a matmul's operand; its chunk offsets add the view's `offset`).
std::optional<ExternalTensor> GemmGenerator::chunkable(ir::TensorId t, Mma kind, size_t inner, int64_t chunk, bool views) const {
  std::optional<ExternalTensor> e = views ? strided_in_memory(t) : in_memory(t);
  if (!e || e->storage != mma_storage(kind) || e->offset % chunk != 0) return std::nullopt;
  const Shape& shape = g_.tensor(t).shape;
  if (e->strides[inner] != 1 || shape[inner] % chunk != 0) return std::nullopt;
  for (size_t d = 0; d < shape.size(); ++d)
    if (d != inner && shape[d] != 1 && e->strides[d] % chunk != 0) return std::nullopt;
  return e;
}

// The SIMT tiles, largest first: 128 x 128 (8 x 8 results a thread) or
// 128 x 64 (8 x 4), the first as narrow as the result whose tiles make a
// wave of an H100's 132 SMs (any number, for a symbolic M), else 64 x 64
// (4 x 4; a pooled conv's four rows a thread are its windows,
// emit_epilogue_pool).
auto GemmGenerator::simt_tile(const Gemm& gm) const -> SimtTile {
  static constexpr SimtTile kTiles[] = {{128, 128, 8, 8, 8}, {128, 64, 8, 8, 4}, {64, 64, 16, 4, 4}};
  if (gm.window_rows != WindowRows::none) return kTiles[2];
  for (const SimtTile& t : kTiles) {
    const int64_t tiles = ((gm.m + t.bm - 1) / t.bm) * ((gm.n + t.bn - 1) / t.bn) * gm.batches;
    if (gm.n >= t.bn && (sizes_.symbolic(gm.m) || tiles >= 132)) return t;
  }
  return kTiles[2];
}

// f32 operands in full f32 (and GPUs before sm_80): a BM x BN tile per
// block of 256 threads, each TM x TN results in 4 x 4 blocks 64 rows and
// 4 * BN / TN columns apart (so a thread's reads of a slice are 16-byte
// vectors from conflict-free banks). BK-deep slices of A and B go through
// registers into one of two shared buffers: a slice's loads are issued
// before the previous slice's products, one barrier a slice. Each operand
// is walked along its contiguous dimension in memory (A along m where it
// is stored [k][m], B along k where it is stored [n][k]).
void GemmGenerator::gemm_simt(const ir::Op& anchor, const Gemm& gm) {
  const SimtTile t = simt_tile(gm);
  constexpr int kThreads = 256;
  const int tx_count = t.bn / t.tn, col_step = 4 * tx_count;  // threads along a row; columns between a thread's 4-blocks
  KILN_INTERNAL_CHECK((t.bm / t.tm) * tx_count == kThreads && t.bm * 4 / t.tm == 64);
  const int a_per_thread = t.bm * t.bk / kThreads, b_per_thread = t.bn * t.bk / kThreads;
  decided(fmt::format("SIMT f32 {}x{}x{} tiles", t.bm, t.bn, t.bk));
  // A symbolic M (rows B*S), or more tile rows than a grid's y takes
  // (65535): tile rows along x, walked by a loop (a symbolic M's grid rule
  // sizes the launch at the bound rows); otherwise tile rows along y.
  const bool symbolic_m = sizes_.symbolic(gm.m);
  const bool rows_loop = symbolic_m || (gm.m + t.bm - 1) / t.bm > 65535;
  // (With the rows' loop the column tiles lie along y; a symbolic N compiles per size, checked then.)
  KILN_USER_CHECK(!rows_loop || sizes_.symbolic(gm.n) || (gm.n + t.bn - 1) / t.bn <= 65535,
                  "{}: {} rows and {} column tiles exceed this matmul kernel's grid limits (65535 tiles of {} along "
                  "one of them)", g_.describe(k_.anchor), gm.m, (gm.n + t.bn - 1) / t.bn, t.bn);
  const std::string m_text = sizes_(gm.m);
  // Shared rows padded by 4 floats: a slice's stores land in distinct banks, its rows stay 16-byte aligned.
  std::string body = fmt::format("__shared__ __align__(16) float As[2][{0}][{1}];\n__shared__ __align__(16) float Bs[2][{0}][{2}];\n",
                                 t.bk, t.bm + 4, t.bn + 4);
  body += fmt::format("const int tid = threadIdx.x, tx = tid % {}, ty = tid / {};\n", tx_count, tx_count);
  if (rows_loop)
    body += fmt::format("const kiln::i64 n0 = (kiln::i64)blockIdx.y * {0};\n"
                        "for (kiln::i64 m0 = (kiln::i64)blockIdx.x * {1}; m0 < {2}; m0 += (kiln::i64)gridDim.x * {1}) {{\n",
                        t.bn, t.bm, m_text);
  else
    body += fmt::format("const kiln::i64 m0 = (kiln::i64)blockIdx.y * {}, n0 = (kiln::i64)blockIdx.x * {};\n", t.bm, t.bn);
  body += "const kiln::i64 batch = blockIdx.z;\n";
  body += fmt::format("float acc[{}][{}] = {{}};\nfloat ra[{}], rb[{}];\n", t.tm, t.tn, a_per_thread, b_per_thread);
  // Element e of a slice: (m, k) of A, (k, n) of B, along the walked dimension.
  const std::string a_at = gm.a_m_major ? fmt::format("const int a_m = e % {0}, a_k = e / {0};\n", t.bm)
                                        : fmt::format("const int a_m = e / {0}, a_k = e % {0};\n", t.bk);
  const std::string b_at = gm.b_k_major ? fmt::format("const int b_k = e % {0}, b_n = e / {0};\n", t.bk)
                                        : fmt::format("const int b_k = e / {0}, b_n = e % {0};\n", t.bn);
  const int64_t k_slices = (gm.k + t.bk - 1) / t.bk;
  // Slice kt's loads (kt < slices) into ra/rb; slice kt - 1 stored and multiplied.
  body += fmt::format("for (kiln::i64 kt = 0; kt <= {}LL; ++kt) {{\n", k_slices);
  body += "const int buf = (int)(kt & 1) ^ 1;  // slice kt - 1's buffer\n";
  body += "if (kt > 0) {\n";
  body += fmt::format("#pragma unroll\nfor (int r = 0; r < {}; ++r) {{\nconst int e = tid + r * {};\n{}As[buf][a_k][a_m] = ra[r];\n}}\n",
                      a_per_thread, kThreads, a_at);
  body += fmt::format("#pragma unroll\nfor (int r = 0; r < {}; ++r) {{\nconst int e = tid + r * {};\n{}Bs[buf][b_k][b_n] = rb[r];\n}}\n",
                      b_per_thread, kThreads, b_at);
  body += "__syncthreads();\n}\n";
  body += fmt::format("if (kt < {}LL) {{\n", k_slices);
  body += fmt::format("#pragma unroll\nfor (int r = 0; r < {}; ++r) {{\nconst int e = tid + r * {};\n{}", a_per_thread, kThreads, a_at);
  body += fmt::format("const kiln::i64 m = m0 + a_m, k = kt * {} + a_k;\nfloat v = 0.0f;\n", t.bk);
  body += fmt::format("if (m < {} && k < {}LL) {{\n", m_text, gm.k);
  em_.begin_block();
  gm.load_a("m", "k", "batch");
  body += em_.take() + "}\nra[r] = v;\n}\n";
  body += fmt::format("#pragma unroll\nfor (int r = 0; r < {}; ++r) {{\nconst int e = tid + r * {};\n{}", b_per_thread, kThreads, b_at);
  body += fmt::format("const kiln::i64 k = kt * {} + b_k, n = n0 + b_n;\nfloat v = 0.0f;\n", t.bk);
  body += fmt::format("if (k < {}LL && n < {}LL) {{\n", gm.k, gm.n);
  em_.begin_block();
  gm.load_b("k", "n", "batch");
  body += em_.take() + "}\nrb[r] = v;\n}\n}\n";
  body += "if (kt > 0) {\n";
  body += fmt::format("#pragma unroll\nfor (int kk = 0; kk < {}; ++kk) {{\n", t.bk);
  body += fmt::format("float a[{}], b[{}];\n", t.tm, t.tn);
  body += fmt::format("#pragma unroll\nfor (int q = 0; q < {}; ++q) *reinterpret_cast<float4*>(&a[4 * q]) = "
                      "*reinterpret_cast<const float4*>(&As[buf][kk][q * 64 + ty * 4]);\n", t.tm / 4);
  body += fmt::format("#pragma unroll\nfor (int q = 0; q < {}; ++q) *reinterpret_cast<float4*>(&b[4 * q]) = "
                      "*reinterpret_cast<const float4*>(&Bs[buf][kk][q * {} + tx * 4]);\n", t.tn / 4, col_step);
  body += fmt::format("#pragma unroll\nfor (int i = 0; i < {}; ++i)\n#pragma unroll\nfor (int j = 0; j < {}; ++j) acc[i][j] += a[i] * b[j];\n",
                      t.tm, t.tn);
  body += "}\n}\n}\n";
  // A pooled conv (emit_epilogue_pool): a thread's four rows are one window, combined in `window`.
  const std::string element_loops = gm.window_rows != WindowRows::none
                                ? "#pragma unroll\nfor (int j = 0; j < 4; ++j) {\nfloat window = 0.0f;\n#pragma unroll\nfor (int i = 0; i < 4; ++i) {\n"
                                : fmt::format("#pragma unroll\nfor (int i = 0; i < {}; ++i)\n#pragma unroll\nfor (int j = 0; j < {}; ++j) {{\n",
                                              t.tm, t.tn);
  const std::string thread_row = "m0 + (i / 4) * 64 + ty * 4 + i % 4";  // row i of a thread's
  const std::string open = element_loops +
                           fmt::format("const kiln::i64 m = {}, n = n0 + (j / 4) * {} + tx * 4 + j % 4;\n", thread_row, col_step) +
                           fmt::format("if (m >= {} || n >= {}LL) continue;\n", m_text, gm.n);
  EpilogueLoops loops{open, gm.window_rows != WindowRows::none ? "}\n}\n" : "}\n"};
  loops.thread_rows = t.tm;
  loops.thread_row = thread_row;
  body += epilogue(anchor, gm, loops, "acc[i][j]");
  // (The tile rows' loop: the next tile's first stores wait for this tile's last products.)
  if (rows_loop) body += "__syncthreads();\n}\n";
  // Two blocks an SM for the 8-row tiles (at most 128 registers a thread): one, at ~180, left the FMA
  // pipes waiting on the loads of a slice (H200, f32 4096^3: 32 TFLOP/s).
  if (t.tm == 8) min_blocks_per_sm_ = 2;
  finish(body, kThreads);
  if (rows_loop) {
    grid_over(gm.m, 1, t.bm, 1);
    out_.grid[1] = blocks_for(gm.n, t.bn);
    out_.grid[2] = static_cast<uint32_t>(gm.batches);
  } else {
    out_.grid = {blocks_for(gm.n, t.bn), blocks_for(gm.m, t.bm), static_cast<uint32_t>(gm.batches)};
  }
}

auto GemmGenerator::mma_tile(const Gemm& gm, Mma kind) const -> MmaTile {
  const int bk = kind == Mma::tf32 ? 16 : 32;
  const int64_t big_tiles = ((gm.m + 127) / 128) * ((gm.n + 127) / 128) * gm.batches;
  // Few rows (decode: m <= 64), however wide: a tile only as tall as m
  // (16-row steps), 64 columns over 4 warps, 64-deep slices; B is what
  // costs, streamed by many small blocks (with split_k) instead of a few
  // wide ones; a 128-row tile would multiply zero rows (an LM head at 7
  // rows and 50257 columns took 128 x 128 tiles: 18x the MMA work). (64-deep
  // slices in every type: a computed operand's 8-element runs then divide
  // evenly among the 128 threads.)
  const bool conv = g_.ops[static_cast<size_t>(k_.anchor)].kind == ir::OpKind::Conv2d;
  if (gm.m <= kFewRows && !conv) return {static_cast<int>((gm.m + 15) / 16 * 16), 64, 64, 1, 4, 4};
  // A grouped conv's groups of 16 or 32 output channels (ResNeXt's later
  // stages; narrower groups take the depthwise_conv kernel): a tile as
  // narrow as a group, 128 rows over 4 warps, instead of a 128-wide tile
  // whose columns past the group multiply zeros (75-88% of its MMAs).
  if (conv && gm.batches > 1 && gm.n <= 32) return {128, gm.n <= 16 ? 16 : 32, bk, 4, 1, 4};
  // 128x128 tiles once they fill most of a GPU's SMs; else 64x64. With
  // both operands copied straight from memory, 4 warps of 64x64 and a
  // deeper K-slice (measured on H100, bf16 8192x8192x4096: 209 TFLOP/s
  // against 167 for 8 warps of 64x32 and 165 for 256x128); computed
  // operands keep 8 warps so each thread stages only two 8-element runs.
  if (big_tiles >= 96 && gm.chunk_a && gm.chunk_b) return {128, 128, 2 * bk, 2, 2, 3};
  if (big_tiles >= 96) return {128, 128, bk, 2, 4, 4};
  // Few tiles, operands copied straight from memory: 64-deep slices (the few blocks wait on
  // memory once a slice, and unsplit, split_k, a 1x1 conv over a 7 x 7 map is 36 slices of 32),
  // and N up to 32 (DenseNet's 3x3 128 -> 32 over 14 x 14 and 7 x 7 maps) in a tile as narrow as
  // N, not 64 columns that multiply zeros and check each element's column.
  if (gm.chunk_a && gm.chunk_b) {
    if (gm.n <= 16) return {64, 16, 2 * bk, 4, 1, 4};
    const int bn = gm.n <= 32 ? 32 : 64;
    // Where 64-row tiles fill under half the SMs (and K is unsplit, kUnsplitDepth), 32-row tiles:
    // twice the blocks. Such a block runs one warp a scheduler and waits on each slice's loads in
    // turn, about 0.8 us a slice whatever the tile's rows (H200, `kiln bench`: DenseNet-121's 3x3
    // 128 -> 32 over 14 x 14 and 7 x 7 maps at B16, 49 and 13 blocks, both 0.0186 ms, 0.0130 in
    // 32-row tiles; its 1x1 992 -> 128 over 7 x 7, 26 blocks, 0.0162 -> 0.0131; over 14 x 14, 98
    // blocks of 64 rows, 32 rows were 6% slower, 512 -> 128 7%).
    // Those 32-row tiles in 6 stages, and 32 columns wide where 64 still fill under half the SMs
    // (H200, `kiln bench`, v0.53: DenseNet's 1x1 512/768/992 -> 128 over 7 x 7 at B16, 50 blocks
    // of 32 x 64 in 4 stages 0.0079/0.0100/0.0113 ms, 100 of 32 x 32 in 6 stages 0.0067/0.0083/0.0098;
    // its 3x3 128 -> 32 over 14 x 14, 98 blocks of 32 x 32, 0.0111 in 4 stages, 0.0104 in 8).
    const int64_t blocks = ((gm.m + 63) / 64) * ((gm.n + bn - 1) / bn) * gm.batches;
    if (!sizes_.symbolic(gm.m) && blocks < 132 / 2 && gm.k <= kUnsplitDepth) {
      const int64_t narrow_blocks = ((gm.m + 31) / 32) * ((gm.n + bn - 1) / bn) * gm.batches;
      return {32, bn == 64 && narrow_blocks < 132 / 2 ? 32 : bn, 2 * bk, 2, 2, 6};
    }
    return {64, bn, 2 * bk, 2, 2, 4};
  }
  return {64, 64, bk, 2, 2, 4};
}

// EfficientNet's and MobileNet's 1x1 expansions (K = 16-48 over a
// million rows, with batch norm and SiLU or hardswish) write far more than
// they read or multiply: the time is the epilogue's, and the Hopper
// kernel's one block an SM (two consumer warpgroups) cannot issue it fast
// enough. One slice of the whole depth needs no pipeline: a stage of shared
// memory, and room for several blocks an SM. H200, ncu, against wgmma,
// the zoo's CNNs at their serving batch (bench/NOTES.md v0.50):
// - K <= 48: 401408 x 96 x 16 + BN + SiLU 244 -> 92 us, 100352 x 144 x 24
//   133 -> 76, 12544 x 288 x 48 71 -> 52, every such kernel faster;
// - N <= 32 (stems and narrow projections; measured to K = 96): 802816 x 16 x 72
//   315 -> 107, 100352 x 24 x 96 23 -> 19;
// - N > 128 over fewer than four rounds of 132 SMs, in 64-row tiles:
//   6272 x 480 x 80 28 -> 18, 6272 x 672 x 112 40 -> 32.
// Elsewhere wgmma stays: ResNet-50's 100352 x 256 x 64 + BN + ReLU took
// 63.5 us in one slice against 33.8, DenseNet's 50176 x 128 x 128 26 against
// 16 (a 128-column tile's accumulators leave one block an SM; a ReLU
// epilogue is cheap enough for the Hopper kernel).
// Only tall GEMMs (M at least 4 N: a conv's pixels), where these were
// measured. Tiles of 128 rows over 8 warps (a warp's 16 rows); 64 rows
// over 4 warps where the width passes 128 columns with fewer than four
// rounds of tiles.
auto GemmGenerator::one_slice_tile(const ir::Op& anchor, const Gemm& gm, std::optional<Mma> kind, std::string* why) const
    -> std::optional<MmaTile> {
  auto refuse = [&](std::string reason) -> std::optional<MmaTile> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (sm_ != 90) return refuse(fmt::format("measured against the Hopper kernel on sm_90 only, the target is sm_{}", sm_));
  if (!kind) return refuse(no_mma_reason(anchor));
  if (*kind == Mma::tf32) return refuse("f32 operands (tf32 MMA): the pipelined kernels take them");
  if (sizes_.symbolic(gm.n) || sizes_.symbolic(gm.k)) return refuse("N or K is symbolic: the tile is theirs");
  if (gm.batches != 1) return refuse(fmt::format("{} batches (grouped convs and batched matmuls keep their tiles)", gm.batches));
  // The measured rule's bounds: any N up to this depth; N up to this width up to kOneSliceDepth;
  // N past 128 where its 128 x 128 tiles take fewer rounds of 132 SMs than this.
  constexpr int64_t kShallow = 48, kNarrow = 32, kFewRoundsTiles = 4 * 132;
  const int64_t tiles = ((gm.m + 127) / 128) * ((gm.n + 127) / 128);
  if (tiles < 96) return refuse(fmt::format("{} tiles of 128 x 128, under 96", tiles));
  if (gm.m < 4 * gm.n)
    return refuse(fmt::format("M = {} under 4 x N = {}: one slice is measured on tall GEMMs (a conv's pixels) only", gm.m, gm.n));
  const bool few_rounds = gm.n > 128 && tiles < kFewRoundsTiles;
  if (gm.k > kOneSliceDepth || (gm.k > kShallow && gm.n > kNarrow && !few_rounds))
    return refuse(fmt::format("K = {} over N = {} in {} tiles: one slice takes K <= {}, or K <= {} where N <= {} or "
                              "N > 128 in under {} tiles",
                              gm.k, gm.n, tiles, kShallow, kOneSliceDepth, kNarrow, kFewRoundsTiles));
  if (!gm.chunk_b) return refuse("B is not a tensor in memory copied in 16-byte chunks");
  // Past 128 columns, the widest tile of 48 to 128 that divides N where one does: a tile that
  // overhangs N checks each element's column, a branch around each element's code (56 x 56
  // 24 -> 144 + BN + SiLU: 3400 SASS instructions and 113 branch regions at 128 columns, where
  // 24 -> 128 is 2496 and 14).
  const int bk = static_cast<int>((gm.k + 15) / 16 * 16);
  int bn = static_cast<int>(std::min<int64_t>((gm.n + 15) / 16 * 16, 128));
  for (int width = 128; gm.n > 128 && width >= 48; width -= 16)
    if (gm.n % width == 0) {
      bn = width;
      break;
    }
  if (few_rounds) return MmaTile{64, bn, bk, 4, 1, 1};
  return MmaTile{128, bn, bk, 8, 1, 1};
}

int GemmGenerator::split_k(const Gemm& gm, const MmaTile& t) const {
  // The few-rows tile, and the 64-row tile of a GEMM whose tiles leave most
  // SMs idle (a pointwise conv over a 7 x 7 map: 1568 x 192 x 1152 in 75
  // tiles). The split the K could take: tensor_core_tuning_space says which
  // tile takes it and which has it as an alternative.
  const bool few_tiles = t.bm == 64 && t.bn <= 64 &&
                         ((gm.m + 63) / 64) * ((gm.n + t.bn - 1) / t.bn) * gm.batches < 132;
  if (t.warps_m != 1 && !few_tiles) return 1;
  if (k_.params.pool_window) return 1;  // (the pool takes whole sums)
  for (const ir::Op* r : ops_of({ir::OpFamily::Reduce}))
    if (writes_.count(r->output)) return 1;  // (its last-block finalisation counts whole tiles)
  const int64_t tiles = ((gm.m + t.bm - 1) / t.bm) * ((gm.n + t.bn - 1) / t.bn) * gm.batches;
  const int64_t k_tiles = (gm.k + t.bk - 1) / t.bk;
  // About four small blocks per SM of an H100 (132), each at least 8 slices deep.
  const int64_t splits = std::min<int64_t>({4 * 132 / tiles, k_tiles / 8, 16});
  if (splits < 2 || splits * gm.batches * gm.m * gm.n > (int64_t{1} << 26)) return 1;
  return even_splits(k_tiles, static_cast<int>(splits));
}

int64_t GemmGenerator::k_slices(const Gemm& gm, int bk) const {
  const int64_t slices = (gm.k + bk - 1) / bk;
  KILN_USER_CHECK(slices <= INT32_MAX, "{}: K = {} is {} slices of {}, more than the 2^31 - 1 this matmul kernel counts",
                  g_.describe(k_.anchor), gm.k, slices, bk);
  return slices;
}

int GemmGenerator::even_splits(int64_t k_tiles, int splits) {
  const int64_t per_split = (k_tiles + splits - 1) / splits;
  return static_cast<int>((k_tiles + per_split - 1) / per_split);  // none empty
}

// The tile orders and K splits the tensor-core kernel accepts, the
// heuristic's first: tiles walked 8 rows at a time (4 or 16 the
// alternatives); the K split as split_k() says, or half, double or none of
// it. The few-rows tile takes split_k()'s split; the few-tiles tile none up
// to K = 1152, where it was measured, its splits are alternatives: H200,
// autotuned, 1x1 convs over 7 x 7 and 14 x 14 maps ran faster unsplit in
// every case (1568 x 192 x 1152 + BN + residual 0.019 ms, 0.028-0.042 in 2-4
// splits; 3136 x 128 x 992 0.017, 0.022 in 3), DenseNet's 3x3 128 -> 32 over
// 7 x 7 too, over 14 x 14 11% slower.
std::vector<Tuning> GemmGenerator::tensor_core_tuning_space(const Gemm& gm, const MmaTile& t, int64_t k_tiles) const {
  const int most = split_k(gm, t);
  const int heuristic_splits = t.warps_m == 1 || gm.k > kUnsplitDepth ? most : 1;
  std::vector<Tuning> space;
  std::vector<int> split_choices{heuristic_splits};
  if (most > 1)
    for (int s : {1, most, most / 2, most * 2})
      if (s >= 1 && s <= 16 && s * 2 <= k_tiles && s * gm.batches * gm.m * gm.n <= (int64_t{1} << 26) &&
          std::ranges::find(split_choices, even_splits(k_tiles, s)) == split_choices.end())
        split_choices.push_back(even_splits(k_tiles, s));
  for (int s : split_choices)
    for (int raster : {8, 4, 16}) space.push_back({0, 0, raster, most > 1 ? s : 0});
  return space;
}

// One operand's tile in shared memory: rows x cols, cols contiguous, and
// the GEMM coordinates of (row, col).
auto GemmGenerator::tensor_core_operand(const Gemm& gm, const MmaTile& t, bool is_a) const -> TileOperand {
  TileOperand o;
  o.is_a = is_a;
  o.x = is_a ? "a" : "b";
  const bool k_major = is_a || gm.b_k_major;
  o.rows = is_a ? t.bm : (k_major ? t.bn : t.bk), o.cols = k_major ? t.bk : t.bn;
  o.row_base = is_a ? "m0" : (k_major ? "n0" : "k0"), o.col_base = k_major ? "k0" : "n0";
  o.row_name = is_a ? "m" : (k_major ? "n" : "k"), o.col_name = k_major ? "k" : "n";
  o.index = is_a ? "G::a_index(row, col)" : (k_major ? "G::b_index(col, row)" : "G::b_index(row, col)");
  o.row_limit = is_a ? gm.m : (k_major ? gm.n : gm.k), o.col_limit = k_major ? gm.k : gm.n;
  o.gemm_coords = fmt::format("const kiln::i64 {} = {} + row, {} = {} + col", o.row_name, o.row_base, o.col_name, o.col_base);
  return o;
}

// The 16-byte asynchronous copies of a plain aligned operand (chunk_fn).
// Where the address splits (chunk_rows), each chunk's row part is computed
// once a tile (`decls`) and a slice adds its k part: recomputed from
// threadIdx.x each slice, 64-bit offsets, their bounds and selects cost
// about 45 instructions a copy (DenseNet-121's 1 x 1 convs over 14 x 14:
// 650 instructions a slice for 32 MMAs), split about 8.
void GemmGenerator::chunk_loader(const TileOperand& o, const ChunkFn& chunk_fn, const ChunkRows& chunk_rows,
                                 const std::string& pointer, int threads, int chunk, TileLoader& out) {
  // Each thread's chunks counted at compile time and unrolled: a loop from
  // threadIdx.x (a trip count the compiler cannot know) was built with its
  // remainder iterations and 64-bit offsets recomputed for each 16-byte copy.
  const int chunks = o.rows * o.cols / chunk, per_thread = (chunks + threads - 1) / threads;
  auto chunk_header = [&]() {
    std::string h = fmt::format("#pragma unroll\nfor (int i = 0; i < {}; ++i) {{\n", per_thread);
    const int across = o.cols / chunk;  // chunks across a row
    if (threads % across == 0) {  // a thread's chunks share their column
      h += fmt::format("const int row = (int)(threadIdx.x / {}u) + i * {}, col = (int)(threadIdx.x % {}u) * {};\n", across,
                       threads / across, across, chunk);
      if (per_thread * threads != chunks) h += fmt::format("if (row >= {}) break;\n", o.rows);
      return h;
    }
    h += fmt::format("const int c = threadIdx.x + i * {};\n", threads);
    if (per_thread * threads != chunks) h += fmt::format("if (c >= {}) break;\n", chunks);
    return h + fmt::format("const int row = c / {0}, col = (c % {0}) * {1};\n", across, chunk);
  };
  const std::string mn = o.row_name == "k" ? o.col_name : o.row_name, tile_k = o.col_name == "k" ? "col" : "row";
  out.load += fmt::format("if (kiln::aligned16({})) {{\n", pointer);
  if (chunk_rows) {
    // Once a tile, before the loaders: the kept arrays, then a loop that fills them.
    em_.begin_block();
    const auto [inside, kept] = chunk_rows.keep(mn, "k", "batch");
    std::string fill = "{\n" + chunk_header();
    fill += fmt::format("const kiln::i64 {} = {} + {}, k = {};\n", mn, mn == o.row_name ? o.row_base : o.col_base,
                        tile_k == "col" ? "row" : "col", tile_k);
    fill += em_.take() + fmt::format("{}_inside[i] = kiln::kept({});\n", o.x, inside);
    out.decls += fmt::format("bool {}_inside[{}];\n", o.x, per_thread);
    for (const ChunkRows::Kept& v : kept) {
      out.decls += fmt::format("{} {}_{}[{}];\n", v.type, o.x, v.name, per_thread);
      fill += fmt::format("{}_{}[i] = kiln::kept({});\n", o.x, v.name, v.value);
    }
    out.decls += fill + "}\n}\n";
    // The slice's K bound: none where K is whole slices; else the depth left,
    // at most the slice's (an int).
    const int64_t k_limit = o.col_name == "k" ? o.col_limit : o.row_limit;
    const int depth = o.col_name == "k" ? o.cols : o.rows;
    const bool whole_slices = !sizes_.symbolic(k_limit) && k_limit % depth == 0;
    if (!whole_slices)
      out.load += fmt::format("const int k_left = {0} - k0 < {1} ? (int)({0} - k0) : {1};\n", sizes_(k_limit), depth);
    out.load += chunk_header() + fmt::format("const kiln::i64 k = k0 + {};\n", tile_k);
    em_.begin_block();
    const auto [bounds, address] =
        chunk_rows.slice("k", "batch", [&](const std::string& name) { return fmt::format("{}_{}[i]", o.x, name); });
    std::string ok = o.x + "_inside[i]";
    if (!whole_slices) ok += fmt::format(" && {} < k_left", tile_k);
    if (!bounds.empty()) ok += " && " + bounds;
    // A chunk outside is zero-filled: its address is not read.
    out.load += em_.take() + fmt::format("const bool ok = {};\n", ok);
    out.load += fmt::format("kiln::tc::cp_async16(tile + {}, {}, ok);\n}}\n", o.index, address);
  } else {
    out.load += chunk_header() + o.gemm_coords + ";\n";
    em_.begin_block();
    const auto [valid, offset] = o.is_a ? chunk_fn("m", "k", "batch") : chunk_fn("k", "n", "batch");
    out.load += em_.take() + fmt::format("const bool ok = {};\n", valid);
    out.load += fmt::format("kiln::tc::cp_async16(tile + {}, static_cast<const T*>({}) + (ok ? {} : 0), ok);\n}}\n", o.index,
                            pointer, offset);
  }
  out.load += "return;\n}\n";
}

auto GemmGenerator::linear_rows(const ChunkFn& chunk_fn, bool is_a, const std::string& pointer, int64_t k_stride) -> ChunkRows {
  ChunkRows rows;
  rows.keep = [chunk_fn, is_a, pointer](const std::string& mn, const std::string& kk, const std::string& batch) {
    const auto [valid, offset] = is_a ? chunk_fn(mn, kk, batch) : chunk_fn(kk, mn, batch);
    const std::string from = fmt::format("static_cast<const T*>({}) + (({}) ? {} : 0)", pointer, valid, offset);
    return std::pair(valid, std::vector<ChunkRows::Kept>{{"const T*", "from", from}});
  };
  rows.slice = [this, k_stride](const std::string&, const std::string&, const std::function<std::string(const std::string&)>& kept) {
    const std::string step = k_stride == 1 ? "k0" : fmt::format("k0 * {}", sizes_(k_stride));
    return std::pair(std::string(), fmt::format("{} + {}", kept("from"), step));
  };
  return rows;
}

// A computed operand whose inputs run along its last dimension, contiguous:
// `load` reads them 8 at a time into registers (run<id>[i][8], declared in
// `decls`) and `stash` computes the operand from them and stores it, after
// the next slice's math.
void GemmGenerator::run_loader(const ir::Op& anchor, const Gemm& gm, const MmaTile& t, const TileOperand& o, int threads,
                               const char* kind_name, TileLoader& out) {
  const size_t slot = o.is_a ? 0 : 1;
  const Shape& shape = g_.operand(anchor, slot).shape;
  // The tensors in memory that the operand is computed from (not the epilogue's).
  std::set<ir::TensorId> sources, seen;
  for (std::vector<ir::TensorId> todo{anchor.inputs[slot]}; !todo.empty();) {
    const ir::TensorId t = todo.back();
    todo.pop_back();
    if (!seen.insert(t).second) continue;
    if (ext_.count(t))
      sources.insert(t);
    else if (computed_here(t))
      for (ir::TensorId in : g_.ops[static_cast<size_t>(g_.tensor(t).producer)].inputs) todo.push_back(in);
  }
  std::vector<ir::TensorId> runs;
  for (const auto& [id, e] : ordered_externals()) {
    if (!sources.count(id)) continue;
    const Shape& ts = g_.tensor(id).shape;
    if (e.storage == DType::boolean || ts.empty() || ts.size() > shape.size() || ts.back() != shape.back() ||
        !std::equal(ts.begin(), ts.end(), shape.end() - static_cast<std::ptrdiff_t>(ts.size())))
      continue;
    bool ok = e.strides.back() == 1;
    for (size_t d = 0; d + 1 < ts.size(); ++d) ok = ok && (ts[d] == 1 || e.strides[d] % 8 == 0);
    if (ok) runs.push_back(id);
  }
  const int per_thread = o.rows * o.cols / 8 / threads;
  KILN_INTERNAL_CHECK(per_thread * 8 * threads == o.rows * o.cols);
  std::string aligned = "true";
  for (ir::TensorId id : runs) {
    out.decls += fmt::format("float run{}[{}][8];  // {}\n", id, per_thread, g_.tensor(id).name);
    aligned += fmt::format(" && kiln::aligned16({})", ext_.at(id).pointer);
  }
  out.decls += fmt::format("const bool runs_{} = {};\n", o.x, aligned);
  auto at = [&]() { return o.is_a ? gm.at_a("m", "k", "batch") : gm.at_b("k", "n", "batch"); };
  auto run_coords = [&](ir::TensorId id, const Coords& c) {
    const Shape& ts = g_.tensor(id).shape;
    Coords tc(ts.size());
    for (size_t d = 0; d < ts.size(); ++d) tc[d] = ts[d] == 1 ? "0" : c[c.size() - ts.size() + d];
    return tc;
  };
  const std::string chunk_header =
      fmt::format("#pragma unroll\nfor (int i = 0; i < {}; ++i) {{\n", per_thread) +
      fmt::format("const int row = (threadIdx.x + i * {0}) / {1}, col = ((threadIdx.x + i * {0}) % {1}) * 8;\n", threads,
                  o.cols / 8);
  out.load += fmt::format("if (runs_{}) {{\n", o.x) + chunk_header + o.gemm_coords + ";\n";
  em_.begin_block();
  {
    const auto [coords, valid] = at();
    em_.emit(fmt::format("if ({}) {{", valid));
    for (ir::TensorId id : runs) {
      const ExternalTensor& e = ext_.at(id);
      em_.emit(fmt::format("kiln::load_vec_{}<8>({}, {}, run{}[i]);", to_string(e.storage), e.pointer,
                           em_.offset_of(e, g_.tensor(id).shape, run_coords(id, coords)), id));
    }
    em_.emit("}");
  }
  out.load += em_.take() + "}\nreturn;\n}\n";
  out.stash += fmt::format("if (!runs_{}) return;\nconst kiln::i64 k0 = (kiln::i64)kt * {};\n", o.x, t.bk) + chunk_header;
  out.stash += "float vals[8];\n#pragma unroll\nfor (int j = 0; j < 8; ++j) {\n";
  out.stash += fmt::format("const kiln::i64 {} = {} + row, {} = {} + col + j;\n", o.row_name, o.row_base, o.col_name,
                           o.col_base);
  em_.begin_block();
  {
    const auto [coords, valid] = at();
    for (ir::TensorId id : runs) em_.set_vector_source(id, run_coords(id, coords), fmt::format("run{}[i]", id), "j");
    em_.emit("float v = 0.0f;");
    em_.emit(fmt::format("if ({}) {{", valid));
    em_.emit("v = " + operand_value(anchor, slot, coords) + ";");
    em_.emit("}");
    em_.emit("vals[j] = v;");
    em_.clear_vector_sources();
  }
  out.stash += em_.take() + "}\n";
  out.stash += fmt::format("kiln::tc::store_chunk8<kiln::tc::{}>(tile + {}, vals);\n}}\n", kind_name, o.index);
}

// One loader per operand (load_a/b, and stash_a/b for operands computed
// from registers): 16-byte asynchronous copies where the operand is a plain
// aligned tensor; else its inputs 8 at a time into registers (computed and
// stored after the next slice's math); else, and as the fallback of both,
// element by element through the emitter.
std::string GemmGenerator::tensor_core_loader(const ir::Op& anchor, const Gemm& gm, const MmaTile& t, int threads, int chunk,
                                              const char* kind_name, bool is_a) {
  const TileOperand o = tensor_core_operand(gm, t, is_a);
  TileLoader out;
  out.load = fmt::format("auto load_{} = [&](T* tile, int kt) {{\n", o.x);
  out.load += fmt::format("const kiln::i64 k0 = (kiln::i64)kt * {};\n", t.bk);
  out.stash = fmt::format("auto stash_{} = [&](T* tile, int kt) {{\n", o.x);
  if (const ChunkFn& chunk_fn = is_a ? gm.chunk_a : gm.chunk_b)
    chunk_loader(o, chunk_fn, is_a ? gm.rows_a : gm.rows_b, is_a ? gm.pointer_a : gm.pointer_b, threads, chunk, out);
  else if (is_a ? gm.a_runs_last : gm.b_runs_last)
    run_loader(anchor, gm, t, o, threads, kind_name, out);
  out.stash += "};\n";
  out.load += fmt::format("for (int e = threadIdx.x; e < {}; e += {}) {{\n", o.rows * o.cols, threads);
  out.load += fmt::format("const int row = e / {0}, col = e % {0};\n", o.cols);
  out.load += o.gemm_coords + ";\n";
  out.load += fmt::format("float v = 0.0f;\nif ({} < {} && {} < {}) {{\n", o.row_name, sizes_(o.row_limit), o.col_name,
                          sizes_(o.col_limit));
  em_.begin_block();
  if (is_a)
    gm.load_a("m", "k", "batch");
  else
    gm.load_b("k", "n", "batch");
  out.load += em_.take() + "}\n";
  out.load += fmt::format("tile[{}] = kiln::tc::Element<kiln::tc::{}>::from_float(v);\n}}\n", o.index, kind_name);
  out.load += "};\n";
  return out.decls + out.load + out.stash;
}

void GemmGenerator::gemm_tensor_core(const ir::Op& anchor, const Gemm& gm, Mma kind, MmaTile t) {
  // A symbolic M's size buckets of few rows: the tile is chosen at the probe's M (many rows), and
  // where M is at most kFewRows the integer graph's few-rows tiles are built too, variants launched
  // there (generate_program), one per kFewRowsBuckets height. BERT's pooler, M = B: 6 tiles of
  // 128 x 128 took twice the 12 tiles of 32 x 64 of the graph written with B = 32 (H200, 55 against
  // 28 us), one bucket of 64 rows 1.4x (40 us). Without their K split: a split's workspace would
  // be the variant's alone.
  const bool symbolic_m = sizes_.symbolic(gm.m);  // (tiles_m counted by the kernel, and a grid rule)
  const bool conv = anchor.kind == ir::OpKind::Conv2d;
  const bool few_rows_variant = symbolic_m && !conv && sizes_.dim(gm.m).lower() <= kFewRows &&
                                std::ranges::count(kFewRowsBuckets, wanted_.tile_m) == 1;
  if (few_rows_variant) t = {wanted_.tile_m, 64, 64, 1, 4, 4};
  decided(fmt::format("mma.sync {}x{}x{}, {}x{} warps, {} stages", t.bm, t.bn, t.bk, t.warps_m, t.warps_n, t.stages));
  const int threads = t.warps_m * t.warps_n * 32;
  const int elem = kind == Mma::tf32 ? 4 : 2, chunk = 16 / elem;
  const char* kind_name = kind == Mma::bf16 ? "kBf16" : kind == Mma::f16 ? "kF16" : "kTf32";
  const int a_stride = t.bk + chunk, b_stride = gm.b_k_major ? t.bk + chunk : t.bn + 8;
  const int shared_bytes = t.stages * (t.bm * a_stride + (gm.b_k_major ? t.bn : t.bk) * b_stride) * elem;
  const int64_t tiles_m = (gm.m + t.bm - 1) / t.bm, tiles_n = (gm.n + t.bn - 1) / t.bn;
  const int64_t k_tiles = k_slices(gm, t.bk);
  std::vector<Tuning> space = tensor_core_tuning_space(gm, t, k_tiles);
  if (few_rows_variant)
    for (Tuning& x : space) x.splits = 0, x.tile_m = t.bm;
  const Tuning choice = choose_tuning(space);
  if (symbolic_m && !conv && !few_rows_variant && !(t.warps_m == 1 && t.bm <= kFewRows) && !sizes_.symbolic(gm.batches) &&
      sizes_.dim(gm.m).lower() <= kFewRows) {
    const ir::Dim& m = sizes_.dim(gm.m);
    int64_t above = 0;  // (the rows the bucket before covers)
    for (int rows : kFewRowsBuckets) {
      const int64_t lo = std::max<int64_t>({m.lower(), above + 1, 1}), hi = std::min<int64_t>(m.upper(), rows);
      above = rows;
      if (lo > hi) continue;
      Tuning few = choice;
      few.splits = 0, few.tile_m = rows;
      out_.other_sizes.push_back({few, SizeCondition{m.expr(), {{lo, hi}}}});
    }
  }
  const int splits = std::max(choice.splits, 1);
  if (symbolic_m && sizes_.symbolic(gm.batches))
    throw NotSymbolic(fmt::format("{}: the mma.sync kernel's tiles of a symbolic M over symbolic batches",
                                  g_.describe(k_.anchor)));
  if (symbolic_m && ((largest(gm.m) + t.bm - 1) / t.bm) * tiles_n >= (int64_t{1} << 31))
    throw RangeLimit(fmt::format("{}: the mma.sync kernel's tiles of a symbolic M reach 2^31 at the largest sizes",
                                 g_.describe(k_.anchor)));
  KILN_USER_CHECK(symbolic_m || (tiles_m * tiles_n < (int64_t{1} << 31) && gm.batches <= 65535),
                  "{}: {} x {} tiles in {} batches exceed this matmul kernel's grid limits", g_.describe(k_.anchor), tiles_m,
                  tiles_n, gm.batches);
  std::string body;
  body += fmt::format("typedef kiln::tc::Gemm<{}, {}, {}, {}, {}, {}, kiln::tc::{}, {}> G;\n", t.bm, t.bn, t.bk, t.warps_m,
                      t.warps_n, t.stages, kind_name, gm.b_k_major ? "true" : "false");
  body += fmt::format("static_assert(G::kSharedBytes == {}, \"shared memory size as launched\");\n", shared_bytes);
  body += "typedef G::T T;\nextern __shared__ __align__(16) unsigned char kiln_shared[];\n";
  body += "T* smem = reinterpret_cast<T*>(kiln_shared);\n";
  body += "int tile_m, tile_n;\n";
  const std::string tiles_m_text =
      symbolic_m ? fmt::format("(int)(({} + {}LL) / {}LL)", sizes_(gm.m), t.bm - 1, t.bm) : std::to_string(tiles_m);
  body += fmt::format("kiln::tc::swizzled_tile(blockIdx.x, {}, {}, {}, tile_m, tile_n);\n", tiles_m_text, tiles_n, choice.raster);
  body += fmt::format("const kiln::i64 m0 = (kiln::i64)tile_m * {}, n0 = (kiln::i64)tile_n * {};\n", t.bm, t.bn);
  body += "const kiln::i64 batch = blockIdx.z;\n";
  body += tensor_core_loader(anchor, gm, t, threads, chunk, kind_name, true);
  body += tensor_core_loader(anchor, gm, t, threads, chunk, kind_name, false);
  body += "G gemm;\n";
  if (splits == 1) {
    body += fmt::format("gemm.run(smem, {}, load_a, load_b, stash_a, stash_b);\n", k_tiles);
  } else {
    body += split_k_main_loop(gm, t, splits, k_tiles);
  }
  body += epilogue(anchor, gm, {"", "", true, gm.m % t.bm != 0, gm.n % t.bn != 0}, "gemm.acc[mi][ni][e]");
  finish(body, threads, "", "#include \"kiln/mma.cuh\"\n");
  out_.shared_bytes = static_cast<uint32_t>(shared_bytes);
  out_.grid = {static_cast<uint32_t>(std::min<int64_t>(tiles_m * tiles_n, (int64_t{1} << 31) - 1)), static_cast<uint32_t>(splits),
               static_cast<uint32_t>(gm.batches)};
  if (symbolic_m) out_.grid_rule = GridRule{sizes_.dim(gm.m).expr(), 1, t.bm, static_cast<uint32_t>(tiles_n)};
}

// Split K: block (tile, split) multiplies its share of the K slices and
// stores the f32 partial tile in a workspace; the last of a tile's blocks
// to finish (a counter per tile) sums the partials in split order, so the
// result does not depend on which block came last, and runs the epilogue.
std::string GemmGenerator::split_k_main_loop(const Gemm& gm, const MmaTile& t, int splits, int64_t k_tiles) {
  const int64_t tiles = ((gm.m + t.bm - 1) / t.bm) * ((gm.n + t.bn - 1) / t.bn);
  const int64_t per_split = (k_tiles + splits - 1) / splits, plane = gm.m * gm.n;
  const std::string result = g_.result(g_.ops[static_cast<size_t>(k_.anchor)]).name;
  const std::string partials = workspace_param(result + ".split_partials", splits * gm.batches * plane, 0, false);
  const std::string arrived = workspace_param(result + ".splits_arrived", tiles * gm.batches, 0, true);
  std::string b;
  b += fmt::format("const int k_first = blockIdx.y * {};\n", per_split);
  b += "auto load_a_split = [&](T* tile, int kt) { load_a(tile, k_first + kt); };\n";
  b += "auto load_b_split = [&](T* tile, int kt) { load_b(tile, k_first + kt); };\n";
  b += "auto stash_a_split = [&](T* tile, int kt) { stash_a(tile, k_first + kt); };\n";
  b += "auto stash_b_split = [&](T* tile, int kt) { stash_b(tile, k_first + kt); };\n";
  b += fmt::format("gemm.run(smem, min({}, {} - k_first), load_a_split, load_b_split, stash_a_split, stash_b_split);\n",
                   per_split, k_tiles);
  // Partial (split, batch) is the plane of M x N floats at that index. Elements past M or N are
  // predicated, not skipped: a `continue` is a branch around each element's code, and the sums
  // then wait for L2 one element at a time.
  auto each_element = [&](const std::string& what) {
    std::string loop = "#pragma unroll\nfor (int mi = 0; mi < G::kMI; ++mi)\n#pragma unroll\n";
    loop += "for (int ni = 0; ni < G::kNI; ++ni)\n#pragma unroll\nfor (int e = 0; e < 4; ++e) {\n";
    loop += "const kiln::i64 m = m0 + G::acc_row(mi, e), n = n0 + G::acc_col(ni, e);\n";
    loop += fmt::format("const bool inside = m < {} && n < {};\n", sizes_(gm.m), sizes_(gm.n));
    loop += fmt::format("const kiln::i64 at = batch * {} + m * {} + n;\n", sizes_(plane), sizes_(gm.n));
    return loop + what + "}\n";
  };
  b += fmt::format("float* const partials = static_cast<float*>({});\n", partials);
  b += each_element(fmt::format("if (inside) partials[blockIdx.y * {} + at] = gemm.acc[mi][ni][e];\n", sizes_(gm.batches * plane)));
  b += "__threadfence();\n__syncthreads();\n__shared__ bool kiln_split_last;\n";
  b += fmt::format("if (threadIdx.x == 0) kiln_split_last = atomicAdd(static_cast<unsigned int*>({}) + batch * {} + blockIdx.x, 1u) "
                   "== {}u;\n", arrived, tiles, splits - 1);
  b += "__syncthreads();\nif (!kiln_split_last) return;\n__threadfence();\n";
  // In split order, each split's loads of the whole tile at once.
  b += "float split_sum[G::kMI][G::kNI][4] = {};\n";
  b += fmt::format("#pragma unroll\nfor (int s = 0; s < {}; ++s) {{\n", splits);
  b += each_element(fmt::format("split_sum[mi][ni][e] += inside ? __ldcg(partials + s * {} + at) : 0.0f;\n",
                                sizes_(gm.batches * plane)));
  b += "}\n";
  b += "#pragma unroll\nfor (int mi = 0; mi < G::kMI; ++mi)\n#pragma unroll\nfor (int ni = 0; ni < G::kNI; ++ni)\n"
       "#pragma unroll\nfor (int e = 0; e < 4; ++e) gemm.acc[mi][ni][e] = split_sum[mi][ni][e];\n";
  return b;
}

auto GemmGenerator::matmul() -> Emitted {
  const ir::Op& mm = g_.ops[static_cast<size_t>(k_.anchor)];
  const ir::Tensor& result = g_.result(mm);
  const Shape batch_shape(result.shape.begin(), result.shape.end() - 2);
  Gemm gm;
  gm.m = result.shape[result.shape.size() - 2];
  gm.n = result.shape.back();
  gm.k = g_.operand(mm, 0).shape.back();
  gm.batches = element_count(batch_shape);
  if (sizes_.symbolic(gm.batches))  // (a grid's batches are an integer so far)
    throw NotSymbolic(fmt::format("{}: symbolic batches of a matmul", g_.describe(k_.anchor)));
  KILN_USER_CHECK(gm.batches <= 65535, "{}: {} batches exceed this matmul kernel's grid limit of 65535",
                  g_.describe(k_.anchor), gm.batches);
  auto batch_coords = [&](const std::string& batch) { return em_.delinearize(batch, batch_shape); };
  gm.load_a = [&](const std::string& m, const std::string& k, const std::string& batch) {
    Coords c = broadcast_batch(batch_coords(batch), g_.operand(mm, 0).shape);
    c.push_back(m);
    c.push_back(k);
    em_.emit("v = " + operand_value(mm, 0, c) + ";");
  };
  gm.load_b = [&](const std::string& k, const std::string& n, const std::string& batch) {
    Coords c = broadcast_batch(batch_coords(batch), g_.operand(mm, 1).shape);
    c.push_back(k);
    c.push_back(n);
    em_.emit("v = " + operand_value(mm, 1, c) + ";");
  };
  gm.out_coords = [&](const std::string& m, const std::string& n, const std::string& batch) {
    Coords c = batch_coords(batch);
    c.push_back(m);
    c.push_back(n);
    return c;
  };
  gm.at_a = [&](const std::string& m, const std::string& k, const std::string& batch) {
    Coords c = broadcast_batch(batch_coords(batch), g_.operand(mm, 0).shape);
    c.push_back(m);
    c.push_back(k);
    return std::pair(c, fmt::format("{} < {} && {} < {}", m, sizes_(gm.m), k, sizes_(gm.k)));
  };
  gm.at_b = [&](const std::string& k, const std::string& n, const std::string& batch) {
    Coords c = broadcast_batch(batch_coords(batch), g_.operand(mm, 1).shape);
    c.push_back(k);
    c.push_back(n);
    return std::pair(c, fmt::format("{} < {} && {} < {}", k, sizes_(gm.k), n, sizes_(gm.n)));
  };
  gm.a_runs_last = gm.k % 8 == 0;
  if (const std::optional<Mma> kind = mma_kind(mm)) {
    matmul_chunks(mm, *kind, batch_shape, gm);
  } else {  // SIMT alone: each operand walked along its contiguous dimension in memory
    gm.a_m_major = stored_along(mm.inputs[0], 2);
    gm.b_k_major = stored_along(mm.inputs[1], 2);
  }
  gm.b_runs_last = !gm.b_k_major && gm.n % 8 == 0;
  setup_norm_prologue();
  return gemm(mm, gm);
}

// A matmul's operands that the tensor-core kernels can read as 16-byte
// chunks: A along k; B along n, or along k where B is stored transposed.
void GemmGenerator::matmul_chunks(const ir::Op& mm, Mma kind, const Shape& batch_shape, Gemm& gm) {
  const int64_t chunk = kind == Mma::tf32 ? 4 : 8;
  const Shape& as = g_.operand(mm, 0).shape;
  const Shape& bs = g_.operand(mm, 1).shape;
  const int64_t m = gm.m, n = gm.n, k = gm.k;
  auto at = [this, batch_shape](const Shape& shape, const std::string& batch, const std::string& row, const std::string& col) {
    Coords c = broadcast_batch(em_.delinearize(batch, batch_shape), shape);
    c.push_back(row);
    c.push_back(col);
    return c;
  };
  auto in_range = [this, m, k](const std::string& x, const std::string& y) {
    return fmt::format("{} < {} && {} < {}", x, sizes_(m), y, sizes_(k));
  };
  // An element's offset in a chunked operand (a slice starts `offset` elements in).
  auto offset_in = [this](const ExternalTensor& e, const Shape& shape, const Coords& c) {
    const std::string within = em_.offset_of(e, shape, c);
    return e.offset == 0 ? within : fmt::format("{} + {}", sizes_(e.offset), within);
  };
  if (const std::optional<ExternalTensor> e = chunkable(mm.inputs[0], kind, as.size() - 1, chunk, true)) {
    gm.pointer_a = e->pointer;
    gm.chunk_a = [e = *e, as, at, in_range, offset_in](const std::string& m, const std::string& k, const std::string& batch) {
      return std::pair(in_range(m, k), offset_in(e, as, at(as, batch, m, k)));
    };
    gm.rows_a = linear_rows(gm.chunk_a, true, e->pointer, e->strides[as.size() - 1]);
  }
  auto b_range = [this, n, k](const std::string& kk, const std::string& nn) {
    return fmt::format("{} < {} && {} < {}", kk, sizes_(k), nn, sizes_(n));
  };
  std::optional<ExternalTensor> e = chunkable(mm.inputs[1], kind, bs.size() - 1, chunk, true);
  if (!e) {
    e = chunkable(mm.inputs[1], kind, bs.size() - 2, chunk, true);
    gm.b_k_major = e.has_value();  // B is stored transposed ([n][k] in memory)
  }
  if (e) {
    gm.pointer_b = e->pointer;
    gm.chunk_b = [e = *e, bs, at, b_range, offset_in](const std::string& k, const std::string& n, const std::string& batch) {
      return std::pair(b_range(k, n), offset_in(e, bs, at(bs, batch, k, n)));
    };
    gm.rows_b = linear_rows(gm.chunk_b, false, e->pointer, e->strides[bs.size() - 2]);
  }
}

// The matmul applies a split layer_norm/rms_norm from its row statistics
// (the norm, and any pointwise ops after it, are recomputed in its prologue).
void GemmGenerator::setup_norm_prologue() {
  for (int32_t oi : k_.recomputed) {
    const ir::Op& norm = g_.ops[static_cast<size_t>(oi)];
    if (norm.kind != OpKind::LayerNorm && norm.kind != OpKind::RmsNorm) continue;
    const ir::Tensor& x = g_.operand(norm, 0);
    const int64_t rows = element_count(x.shape) / x.shape.back();
    const std::string p = workspace_param(g_.result(norm).name + ".rowstats", rows * 2, 0, false);
    em_.set_norm_stats(norm.output, "static_cast<const float*>(" + p + ")");
  }
}

// A pooled conv's GEMM row m as its output pixel: the rows run window by
// window over [N, P/2, Q/2] (Gemm::WindowRows): window m / 4, pixel m % 4
// (consecutive), or in each 16 rows windows 4 (m / 16) + m % 4, pixel
// (m / 4) % 4 (interleaved).
std::string GemmGenerator::pooled_pixel(const std::string& m, const std::string& type, const std::array<std::string, 3>& names,
                                        int64_t p, int64_t q, WindowRows order) {
  KILN_INTERNAL_CHECK(order != WindowRows::none);
  const std::string wide = type == "int" ? "" : "LL", at = "(" + m + ")";
  const bool consecutive = order == WindowRows::consecutive;
  const std::string window = consecutive ? at + " >> 2" : fmt::format("({0} >> 4) * 4 + ({0} & 3)", at);
  const std::string dy = consecutive ? at + " >> 1 & 1" : at + " >> 3 & 1", dx = consecutive ? at + " & 1" : at + " >> 2 & 1";
  const std::string w = names[0] + "_window";
  return fmt::format("const {0} {1} = {2}, {3} = {1} / {4}{5}, {6} = {1} / {7}{5} % {8}{5} * 2 + ({9}), "
                     "{10} = {1} % {7}{5} * 2 + ({11});",
                     type, w, window, names[0], p * q / 4, wide, names[1], q / 2, p / 2, dy, names[2], dx);
}

auto GemmGenerator::conv() -> Emitted {
  const ir::Op& cv = g_.ops[static_cast<size_t>(k_.anchor)];
  const ir::Attributes& at = cv.attrs;
  const bool nhwc = at.layout == ir::Layout::NHWC;
  const Shape& xs = g_.operand(cv, 0).shape;
  const Shape& ws = g_.operand(cv, 1).shape;
  const Shape& os = g_.result(cv).shape;
  const int64_t n = xs[0], c = nhwc ? xs[3] : xs[1], h = nhwc ? xs[1] : xs[2], w = nhwc ? xs[2] : xs[3];
  const int64_t k = ws[0], r = nhwc ? ws[1] : ws[2], s = nhwc ? ws[2] : ws[3];
  const int64_t p = nhwc ? os[1] : os[2], q = nhwc ? os[2] : os[3];
  const int64_t cg = c / at.groups, kg = k / at.groups;
  Gemm gm;
  gm.m = n * p * q;
  gm.n = kg;
  gm.k = r * s * cg;
  gm.batches = at.groups;
  KILN_USER_CHECK(gm.k <= INT32_MAX - 64, "{}: K = R x S x C/groups = {} exceeds the 2^31 - 64 this convolution kernel indexes",
                  g_.describe(k_.anchor), gm.k);
  // Implicit im2col: GEMM row m is output pixel (ni, pi, qi), row-major or
  // window by window (pooled_pixel); GEMM k is (ri, si, ci), ci fastest.
  // Pooled (KernelParams::pool_window): over fragments, interleaved where the
  // windows fill whole 16-row groups (emit_epilogue_pool), else consecutive.
  const std::optional<Mma> kind = mma_kind(cv);
  // (A symbolic batch: interleaved where every batch's windows fill whole 16-row groups.)
  const bool whole_groups = sizes_.symbolic(gm.m) ? (p * q) % 16 == 0 : (n * p * q / 4) % 4 == 0;
  const WindowRows pool = !k_.params.pool_window ? WindowRows::none
                          : kind && whole_groups ? WindowRows::interleaved
                                                 : WindowRows::consecutive;
  gm.window_rows = pool;
  // The im2col indices in 32 bits where every row, tap and pixel fits (the
  // offsets they make stay 64-bit): the loaders compute them for each
  // 16-byte chunk of every K slice, and in 64 bits their divisions by
  // constants were most of a small conv's instructions (ncu, H100, DenseNet's
  // 3x3 conv of 16 x 14 x 14 x 128 -> 32 channels: about 570 instructions a
  // warp for each slice's 16 MMAs, 152 registers, 26 us where cuDNN takes 17).
  const bool narrow = sizes_.known_below(gm.m, INT32_MAX - 256) && sizes_.known_below(n * c * h * w, INT32_MAX) &&
                      gm.k + 64 < INT32_MAX;
  const std::string it = narrow ? "int" : "kiln::i64", lit = narrow ? "" : "LL";
  const auto output_pixel = [&, pool, it, lit](const std::string& m) {  // ni, pi, qi
    const std::string row = fmt::format("({})({})", it, m);
    if (pool != WindowRows::none)
      em_.emit(pooled_pixel(m, it, {"ni", "pi", "qi"}, p, q, pool));
    else
      em_.emit(fmt::format("const {4} ni = {0} / {1}{5}, pi = ({0} / {2}{5}) % {3}{5}, qi = {0} % {2}{5};", row, p * q, q, p,
                           it, lit));
  };
  const ConvIndex input_pixel = [&, it, lit](const std::string& m, const std::string& kk, const std::string& g) {
    const std::string tap = fmt::format("({})({})", it, kk);
    output_pixel(m);
    em_.emit(fmt::format("const {5} ri = {0} / {1}{6}, si = ({0} / {2}{6}) % {3}{6}, ci = ({5})({4}) * {2}{6} + {0} % {2}{6};",
                         tap, s * cg, cg, s, g, it, lit));
    em_.emit(fmt::format("const {6} hi = pi * {0}{7} - {1}{7} + ri * {2}{7}, wi = qi * {3}{7} - {4}{7} + si * {5}{7};",
                         at.stride[0], at.padding[0], at.dilation[0], at.stride[1], at.padding[1], at.dilation[1], it, lit));
    return fmt::format("hi >= 0 && hi < {0}{2} && wi >= 0 && wi < {1}{2}", h, w, lit);
  };
  const ConvTap filter_tap = [&, it, lit](const std::string& kk, const std::string& nn, const std::string& g) {
    const std::string tap = fmt::format("({})({})", it, kk);
    em_.emit(fmt::format("const {4} ri = {0} / {1}{5}, si = ({0} / {2}{5}) % {3}{5}, ci = {0} % {2}{5};", tap, s * cg, cg, s,
                         it, lit));
    em_.emit(fmt::format("const kiln::i64 ko = {} * {}LL + {};", g, kg, nn));
    return nhwc ? Coords{"ko", "ri", "si", "ci"} : Coords{"ko", "ci", "ri", "si"};
  };
  gm.load_a = [&, nhwc](const std::string& m, const std::string& kk, const std::string& g) {
    em_.emit(fmt::format("if ({}) {{", input_pixel(m, kk, g)));
    const Coords xc = nhwc ? Coords{"ni", "hi", "wi", "ci"} : Coords{"ni", "ci", "hi", "wi"};
    em_.emit("v = " + operand_value(cv, 0, xc) + ";");
    em_.emit("}");
  };
  gm.load_b = [&](const std::string& kk, const std::string& nn, const std::string& g) {
    em_.emit("v = " + operand_value(cv, 1, filter_tap(kk, nn, g)) + ";");
  };
  gm.column_last = nhwc;
  gm.out_row = [&, pool](const std::string& m) {
    if (pool != WindowRows::none) return pooled_pixel(m, "kiln::i64", {"on", "op", "oq"}, p, q, pool);
    return fmt::format("const kiln::i64 on = {0} / {1}LL, op = ({0} / {2}LL) % {3}LL, oq = {0} % {2}LL;", m, p * q, q, p);
  };
  gm.column_vars = {"ok"};
  gm.out_coords = [&, nhwc](const std::string&, const std::string& nn, const std::string& g) {
    em_.emit(fmt::format("const kiln::i64 ok = {} * {}LL + {};", g, kg, nn));
    return nhwc ? Coords{"on", "op", "oq", "ok"} : Coords{"on", "ok", "op", "oq"};
  };
  gm.at_a = [&, nhwc](const std::string& m, const std::string& kk, const std::string& g) {
    const std::string inside = input_pixel(m, kk, g);
    return std::pair(nhwc ? Coords{"ni", "hi", "wi", "ci"} : Coords{"ni", "ci", "hi", "wi"},
                     fmt::format("{} < {} && {} < {}LL && {}", m, sizes_(gm.m), kk, gm.k, inside));
  };
  gm.at_b = [&](const std::string& kk, const std::string& nn, const std::string& g) {
    return std::pair(filter_tap(kk, nn, g), fmt::format("{} < {}LL && {} < {}LL", kk, gm.k, nn, gm.n));
  };
  gm.a_runs_last = gm.b_runs_last = nhwc && cg % 8 == 0;  // k runs along ci within one filter tap
  // B's tile is [k-out][ri, si, ci]: the weights' own order in NHWC.
  gm.b_k_major = true;
  if (kind && nhwc && cg % (*kind == Mma::tf32 ? 4 : 8) == 0) conv_chunks(cv, *kind, input_pixel, filter_tap, gm);
  // A's chunks in two parts: the output pixel's window corner and pointer
  // once a tile, the filter tap each slice (here beside conv_chunks: it
  // takes the output_pixel closure and the index type).
  if (gm.chunk_a) {
    const ExternalTensor e = *in_memory(cv.inputs[0]);
    gm.rows_a.keep = [&, e, it, lit](const std::string& mm, const std::string&, const std::string& g) {
      output_pixel(mm);
      em_.emit(fmt::format("const {0} hb = pi * {1}{5} - {2}{5}, wb = qi * {3}{5} - {4}{5};", it, at.stride[0], at.padding[0],
                           at.stride[1], at.padding[1], lit));
      em_.emit(fmt::format("const kiln::i64 gc = {} * {}LL;", g, cg));
      const std::string from = fmt::format("static_cast<const T*>({}) + ({})", e.pointer,
                                           em_.offset_of(e, g_.operand(cv, 0).shape, Coords{"ni", "hb", "wb", "gc"}));
      return std::pair(fmt::format("{} < {}", mm, sizes_(gm.m)),
                       std::vector<ChunkRows::Kept>{{"const T*", "from", from}, {it, "hb", "hb"}, {it, "wb", "wb"}});
    };
    gm.rows_a.slice = [&, e, it, lit](const std::string& kk, const std::string&,
                                      const std::function<std::string(const std::string&)>& kept) {
      const std::string tap = fmt::format("({})({})", it, kk);
      em_.emit(fmt::format("const {4} dh = {0} / {1}{5} * {6}{5}, dw = ({0} / {2}{5}) % {3}{5} * {7}{5}, ci = {0} % {2}{5};", tap,
                           s * cg, cg, s, it, lit, at.dilation[0], at.dilation[1]));
      em_.emit(fmt::format("const {} hi = {} + dh, wi = {} + dw;", it, kept("hb"), kept("wb")));
      return std::pair(fmt::format("hi >= 0 && hi < {0}{2} && wi >= 0 && wi < {1}{2}", h, w, lit),
                       fmt::format("{} + ({})", kept("from"), em_.offset_of(e, g_.operand(cv, 0).shape, Coords{"0", "dh", "dw", "ci"})));
    };
  }
  return gemm(cv, gm);
}

// An NHWC conv's operands that the tensor-core kernels can read as 16-byte
// chunks along the channels; one group's input also gives the Hopper
// kernel its geometry, so that it gathers A's rows itself.
void GemmGenerator::conv_chunks(const ir::Op& cv, Mma kind, const ConvIndex& input_pixel, const ConvTap& filter_tap,
                                Gemm& gm) {
  const ir::Attributes& at = cv.attrs;
  const Shape& xs = g_.operand(cv, 0).shape;
  const Shape& ws = g_.operand(cv, 1).shape;
  const Shape& os = g_.result(cv).shape;
  const int64_t chunk = kind == Mma::tf32 ? 4 : 8, m = gm.m, n = gm.n, k = gm.k;
  if (const std::optional<ExternalTensor> e = chunkable(cv.inputs[0], kind, 3, chunk)) {
    gm.pointer_a = e->pointer;
    if (at.groups == 1)
      gm.conv = Gemm::ConvGeometry{xs[1], xs[2], xs[3], os[1], os[2], ws[2], {e->strides[0], e->strides[1], e->strides[2]},
                                   {at.stride[0], at.stride[1]}, {at.padding[0], at.padding[1]},
                                   {at.dilation[0], at.dilation[1]}};
    gm.chunk_a = [this, &input_pixel, e = *e, xs, m, k](const std::string& mm, const std::string& kk, const std::string& g) {
      const std::string inside = input_pixel(mm, kk, g);
      return std::pair(fmt::format("{} < {} && {} < {}LL && {}", mm, sizes_(m), kk, k, inside),
                       em_.offset_of(e, xs, Coords{"ni", "hi", "wi", "ci"}));
    };
  }
  if (const std::optional<ExternalTensor> e = chunkable(cv.inputs[1], kind, 3, chunk)) {
    gm.pointer_b = e->pointer;
    gm.chunk_b = [this, &filter_tap, e = *e, ws, n, k](const std::string& kk, const std::string& nn, const std::string& g) {
      const Coords wc = filter_tap(kk, nn, g);
      return std::pair(fmt::format("{} < {}LL && {} < {}LL", kk, k, nn, n), em_.offset_of(e, ws, wc));
    };
    // Linear in k where each filter's taps are stored contiguously ([ko][ri][si][ci]).
    if ((ws[2] == 1 || e->strides[2] == ws[3]) && (ws[1] == 1 || e->strides[1] == ws[2] * ws[3]))
      gm.rows_b = linear_rows(gm.chunk_b, false, e->pointer, 1);
  }
}

}  // namespace kiln::codegen
