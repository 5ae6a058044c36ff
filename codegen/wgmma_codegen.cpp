// Matmul on Hopper: the persistent warp-specialised kernel of
// templates/kiln/wgmma.cuh (TMA loads into a ring of swizzled slices,
// wgmma on two consumer warpgroups) with this kernel's epilogue.
//
// Expects: on sm_90, a matmul whose operands are plain 16-bit tensors in
// memory (the copy engine loads them; tma_operand says which), or an NHWC
// conv of one group (gm.conv: the producer gathers its input; the weights
// by the copy engine, conv_weight_operand).
// Guarantees: the same numbers as gemm_tensor_core (f32 accumulation of
// exact products, the same epilogue code per element); any binding works:
// an operand whose pointer is not 16-byte aligned is loaded element by
// element by the producer warpgroup instead of the copy engine, a result
// that is not goes out with direct stores instead of bulk tensor stores.
#include "codegen/gemm_generator.h"

namespace kiln::codegen {

namespace {

constexpr int kWgmmaBM = 128;
constexpr int kSharedLimit = 227 * 1024;  // sm_90's dynamic shared memory per block

// The producer's loop over its block's tiles (open: the tile's m0, n0 and
// batch are declared) and the start of each slot: wait until the
// consumers have handed it back; its tiles and first k.
std::string producer_tile_loop() {
  return "for (int unit = first_unit; unit < units; unit += unit_step) {\n"
         "kiln::i64 m0, n0, batch;\ntile_at(unit, m0, n0, batch);\n";
}
std::string producer_slot() {
  return "kiln::wg::bar_wait(G::empty(smem) + ring.stage, ring.phase ^ 1);\n"
         "G::T* const a_tile = G::a_tile(smem, ring.stage);\n"
         "G::T* const b_tile = G::b_tile(smem, ring.stage);\n"
         "const kiln::i64 k0 = (kiln::i64)kt * G::kBK;\n";
}


// What a tensor map of 16-bit elements takes: a dimension's extent, and a
// stride (in elements) beyond the first dimension.
bool map_extent_fits(int64_t elements) { return elements > 0 && elements < (int64_t{1} << 31); }
// (`largest`: the stride's largest value over a symbolic graph's range; a
// symbolic stride's divisibility at the probe is its divisibility at every
// size, compiler/size_probe.h.)
bool map_stride_fits(int64_t elements, int64_t largest) {
  return elements > 0 && (elements * 2) % 16 == 0 && largest < (int64_t{1} << 39);
}

}  // namespace

// The epilogue's reads of whole result-shaped tensors (a residual), rows
// of 16-byte multiples, dense: (batch, m, n) at (batch * M + m) * N + n.
// Their rows of a tile go into L2 when its main loop starts, so that the
// epilogue, one tile later in time, finds them there instead of waiting on
// device memory (H100, 8192 x 8192 x 4096 + residual: the epilogue's
// 2-byte loads stalled the consumers for about 10 us per tile).
std::string GemmGenerator::epilogue_prefetch(const ir::Op& anchor, const Gemm& gm, int bn, const std::string& rows,
                                             const std::set<std::string>& operands) const {
  const Shape& shape = g_.result(anchor).shape;
  if (!gm.column_last || shape.size() < 2 || k_.params.pool_window) return "";  // (pooled: rows not in order)
  std::string out;
  for (const auto& [id, e] : ordered_externals()) {
    const int64_t bytes = byte_size(e.storage);
    if (operands.count(e.pointer) || g_.tensor(id).shape != shape || e.strides != contiguous_strides(shape) ||
        e.storage == DType::boolean || (gm.n * bytes) % 16 != 0)
      continue;
    out += fmt::format("if (kiln::aligned16({})) {{  // {}\n", e.pointer, g_.tensor(id).name);
    out += fmt::format("const kiln::u32 bytes = (kiln::u32)(min((kiln::i64){}, {} - n0) * {});\n", bn, sizes_(gm.n), bytes);
    out += fmt::format("#pragma unroll 1\n{} {{\n", rows);
    out += fmt::format("if (m0 + r < {}) kiln::wg::prefetch_l2(static_cast<const char*>({}) + ((batch * {} + m0 + r) * {} + n0) * {}, bytes);\n",
                       sizes_(gm.m), e.pointer, sizes_(gm.m), sizes_(gm.n), bytes);
    out += "}\n}\n";
  }
  return out;
}

auto GemmGenerator::tma_source(const std::optional<ExternalTensor>& e, Mma kind) const -> std::optional<TmaOperand> {
  if (!e || e->storage != mma_storage(kind)) return std::nullopt;
  TmaOperand op;
  op.pointer = e->pointer;
  const std::optional<ir::TensorId> tensor = tensor_behind(e->pointer);
  if (!tensor) return std::nullopt;
  op.tensor = *tensor;
  return op;
}

auto GemmGenerator::tma_operand(const ir::Op& anchor, size_t slot, Mma kind, std::string* why) const
    -> std::optional<TmaOperand> {
  // Each refusal says why where the caller asks (the wgmma tactic's reason for not fitting, gemm_tactics.cpp).
  const std::string name = fmt::format("{} ('{}')", slot == 0 ? "A" : "B", g_.operand(anchor, slot).name);
  auto refuse = [&](const std::string& reason) {
    if (why) *why = name + " " + reason;
    return std::nullopt;
  };
  if (kind == Mma::tf32) return refuse("has f32 values (tf32 MMA)");
  const std::optional<ExternalTensor> e = in_memory(anchor.inputs[slot]);
  if (slot == 0 && (!e || e->strides.back() != 1)) {
    std::optional<TmaOperand> split = split_tma_a(anchor, kind);
    if (!split) return refuse(e ? "is not contiguous along K" : "is computed in the kernel or read through views no tensor map describes");
    return split;
  }
  if (!e) return refuse("is computed in the kernel's loads");
  if (e->storage != mma_storage(kind)) return refuse(fmt::format("is stored as {}, not the MMA's type", to_string(e->storage)));
  std::optional<TmaOperand> found = tma_source(e, kind);
  if (!found) return refuse("is not a bound tensor");
  TmaOperand op = *found;
  const Shape& s = g_.operand(anchor, slot).shape;
  const size_t r = s.size();
  // The contiguous dim (inner) and the other matrix dim (outer).
  size_t inner, outer;
  if (slot == 0) {
    if (e->strides[r - 1] != 1) return refuse("is not contiguous along K");
    inner = r - 1, outer = r - 2;
  } else if (e->strides[r - 1] == 1 && s[r - 1] > 1) {
    inner = r - 1, outer = r - 2, op.k_major = false;
  } else if (e->strides[r - 2] == 1) {
    inner = r - 2, outer = r - 1, op.k_major = true;
  } else {
    return refuse("is contiguous along neither K nor N");
  }
  if (!map_extent_fits(largest(s[inner])) || !map_extent_fits(largest(s[outer])))
    return refuse("has a dimension of 2^31 elements or more");
  op.map.dtype = mma_storage(kind);
  op.map.dims[0] = static_cast<uint64_t>(s[inner]);
  op.map.dims[1] = static_cast<uint64_t>(s[outer]);
  const int64_t outer_stride = s[outer] == 1 ? s[inner] : e->strides[outer];
  if (!map_stride_fits(outer_stride, largest(outer_stride)))
    return refuse(fmt::format("has rows {} elements apart ({} bytes), no 16-byte multiple", outer_stride, outer_stride * 2));
  op.map.strides[0] = static_cast<uint64_t>(outer_stride * 2);
  op.map.rank = 2;
  // Batch dims: none that matter, or exactly the result's, one stride apart.
  const Shape& rs = g_.result(anchor).shape;
  int64_t batches = 1, batch_stride = 0, expect = -1;
  for (size_t d = r - 2; d-- > 0;) {
    batches *= s[d];
    if (s[d] == 1) continue;
    if (expect >= 0 && e->strides[d] != expect) return refuse("has batch dimensions that no single stride walks");
    if (expect < 0) batch_stride = e->strides[d];
    expect = e->strides[d] * s[d];
  }
  if (batches > 1) {
    if (r != rs.size() || !std::equal(s.begin(), s.end() - 2, rs.begin()) ||
        !map_stride_fits(batch_stride, largest(batch_stride)) || !map_extent_fits(largest(batches)))
      return refuse("has batch dimensions a tensor map cannot walk (broadcast, or strides no 16-byte multiple)");
    op.map.rank = 3;
    op.map.dims[2] = static_cast<uint64_t>(batches);
    op.map.strides[1] = static_cast<uint64_t>(batch_stride * 2);
  }
  return op;
}

// A [M, K] read through reshapes of a strided tensor (transposes and
// reshapes of a tensor in memory): that tensor, and its dimensions grouped
// into M's (a leading run) and K's, dimensions of size 1 dropped and
// neighbours that merge merged; nullopt where either side has none.
auto GemmGenerator::strided_a(const ir::Op& anchor, Mma kind) const -> std::optional<StridedView> {
  const Shape& a = g_.operand(anchor, 0).shape;
  if (a.size() != 2) return std::nullopt;
  // Back through the reshapes to a view whose strides describe it.
  ir::TensorId t = anchor.inputs[0];
  std::optional<ExternalTensor> e = in_memory(t);
  while (!e) {
    if (!computed_here(t)) return std::nullopt;
    const ir::Op& op = g_.ops[static_cast<size_t>(g_.tensor(t).producer)];
    if (op.kind != OpKind::Reshape) return std::nullopt;
    t = op.inputs[0];
    e = in_memory(t);
  }
  if (e->storage != mma_storage(kind)) return std::nullopt;
  const Shape& shape = g_.tensor(t).shape;
  size_t split = 0;
  for (int64_t product = 1; product != a[0]; product *= shape[split++])
    if (split == shape.size() || product > a[0]) return std::nullopt;
  StridedView view{*e, t, {}, {}};
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<ViewDim>& side = d < split ? view.rows : view.columns;
    if (shape[d] == 1) continue;
    if (!side.empty() && side.back().stride == e->strides[d] * shape[d])
      side.back() = {side.back().size * shape[d], e->strides[d]};  // merges with the dimension before it
    else
      side.push_back({shape[d], e->strides[d]});
  }
  if (view.rows.empty() || view.columns.empty()) return std::nullopt;
  return view;
}

// A [M, K] whose rows and columns are each at most two dimensions of a
// strided tensor (strided_a): the attention output [B, H, S, D] read as
// [B*S, H*D] through transpose + reshape (an output projection). The copy
// engine loads a 128 x 64 slice as one box of a rank-4 map (d, s, h, b)
// where a slice never crosses a split (S a multiple of 128, D of 64), so
// a slice's rows are consecutive s of one b and its columns consecutive d
// of one h.
auto GemmGenerator::split_tma_a(const ir::Op& anchor, Mma kind) const -> std::optional<TmaOperand> {
  const std::optional<StridedView> view = strided_a(anchor, kind);
  if (!view) return std::nullopt;
  std::optional<TmaOperand> found = tma_source(view->memory, kind);
  if (!found || view->memory.offset != 0) return std::nullopt;
  const std::vector<ViewDim>&rows = view->rows, &columns = view->columns;
  if (rows.size() > 2 || columns.size() > 2) return std::nullopt;
  if (columns.back().stride != 1 || (rows.size() == 2 && rows.back().size % kWgmmaBM != 0) ||
      (columns.size() == 2 && columns.back().size % 64 != 0))
    return std::nullopt;
  TmaOperand op = *found;
  op.map.dtype = mma_storage(kind);
  // Dimensions (d, s[, h][, b]): the inner ones first.
  std::vector<ViewDim> dims{columns.back(), rows.back()};
  if (columns.size() == 2) dims.push_back(columns[0]), op.columns_inner = columns.back().size;
  if (rows.size() == 2) dims.push_back(rows[0]), op.rows_inner = rows.back().size;
  for (size_t r = 0; r < dims.size(); ++r) {
    if (!map_extent_fits(largest(dims[r].size)) || (r > 0 && !map_stride_fits(dims[r].stride, largest(dims[r].stride))))
      return std::nullopt;
    op.map.dims[r] = static_cast<uint64_t>(dims[r].size);
    if (r > 0) op.map.strides[r - 1] = static_cast<uint64_t>(dims[r].stride * 2);
  }
  op.map.rank = static_cast<int>(dims.size());
  return op;
}

// ViT's attention output projection at S = 197 (rows (b, s) of [B, S, H,
// D] never a whole 128-row box) and a patch convolution's input patches
// (patch_convolutions.h: rows (n, hp, wp), columns (c, r, s) of NCHW).
auto GemmGenerator::gathered_a(const ir::Op& anchor, Mma kind) const -> std::optional<StridedView> {
  std::optional<StridedView> view = strided_a(anchor, kind);
  if (!view || view->columns.back().stride != 1 || view->columns.back().size % 8 != 0 || view->memory.offset % 8 != 0)
    return std::nullopt;
  // Every stride but the innermost (1) keeps a run 16-byte aligned.
  for (const ViewDim& d : view->rows)
    if (d.stride % 8 != 0) return std::nullopt;
  for (size_t d = 0; d + 1 < view->columns.size(); ++d)
    if (view->columns[d].stride % 8 != 0) return std::nullopt;
  return view;
}

auto GemmGenerator::conv_weight_operand(const ir::Op& anchor, Mma kind) const -> std::optional<TmaOperand> {
  const std::optional<ExternalTensor> e = in_memory(anchor.inputs[1]);
  const Shape& ws = g_.operand(anchor, 1).shape;  // [K, R, S, C]
  if (!e || anchor.attrs.layout != ir::Layout::NHWC || anchor.attrs.groups != 1) return std::nullopt;
  // Contiguous, a 1-wide filter side at any stride (an NCHW model's 1x1
  // weights [K, C, 1, 1] read as [K, 1, 1, C] have strides [C, 1, 1, 1]).
  if (e->strides[3] != 1 || (ws[2] != 1 && e->strides[2] != ws[3]) || (ws[1] != 1 && e->strides[1] != ws[2] * ws[3]))
    return std::nullopt;
  const int64_t k = ws[1] * ws[2] * ws[3], outer = ws[0] == 1 ? k : e->strides[0];
  if (!map_extent_fits(k) || !map_extent_fits(ws[0]) || !map_stride_fits(outer, outer)) return std::nullopt;
  std::optional<TmaOperand> op = tma_source(e, kind);
  if (!op) return std::nullopt;
  op->map.dtype = mma_storage(kind);
  op->map.rank = 2;
  op->map.dims[0] = static_cast<uint64_t>(k);
  op->map.dims[1] = static_cast<uint64_t>(ws[0]);
  op->map.strides[0] = static_cast<uint64_t>(outer * 2);
  op->k_major = true;
  return op;
}

auto GemmGenerator::wgmma_operands(const ir::Op& anchor, const Gemm& gm, Mma kind, std::string* why) const
    -> std::optional<WgmmaOperands> {
  auto refuse = [&](const std::string& reason) {
    if (why) *why = reason;
    return std::nullopt;
  };
  if (sm_ != 90) return std::nullopt;
  if (kind == Mma::tf32) return refuse("f32 operands (tf32 MMA)");
  // At least 32 tiles of 128 x 128: a wgmma tile's rate per SM beats the
  // mma.sync kernel even where that one covers more SMs (H100, bf16, K =
  // 768, one run: 32 tiles 19.6 -> 11.2 us, 64 tiles 22.2 -> 12.4, 96
  // tiles 23.8 -> 12.2; a 3x3 conv 7x7x512 -> 512 at batch 32, 52 tiles of
  // K = 4608, ran at 41 TFLOP/s on mma.sync). One row of tiles (decode)
  // keeps mma.sync and its K split unless it alone fills the GPU.
  const int64_t tiles_m = (gm.m + 127) / 128, tiles = tiles_m * ((gm.n + 127) / 128) * gm.batches;
  if (tiles < 32) return refuse(fmt::format("{} tiles of 128 x 128, under 32", tiles));
  if (tiles_m < 2 && tiles < 132)
    return refuse(fmt::format("one row of tiles (M = {}) in {} tiles, under 132: mma.sync splits K", gm.m, tiles));
  if (((largest(gm.m) + 127) / 128) * ((gm.n + 127) / 128) * largest(gm.batches) >= (int64_t{1} << 31))
    return refuse("2^31 tiles or more");
  if (anchor.kind == OpKind::Matmul) {
    std::string why_a, why_b;
    std::optional<TmaOperand> a = tma_operand(anchor, 0, kind, &why_a), b = tma_operand(anchor, 1, kind, &why_b);
    if (!b) return refuse(why_b);
    if (a) return WgmmaOperands{a, *b, std::nullopt};
    // A through views no tensor map describes: gathered in 16-byte runs, one batch.
    std::optional<StridedView> gathered = gathered_a(anchor, kind);
    if (!gathered || gm.batches != 1 || largest(gm.m) >= (int64_t{1} << 31) || gm.k >= (int64_t{1} << 31))
      return refuse(why_a + ", nor gathered in 16-byte runs");
    return WgmmaOperands{std::nullopt, *b, gathered};
  }
  // A symbolic conv whose rows fit 32 bits at the probe but not at its range's largest sizes: the
  // range, not the conv, keeps it off this kernel, and mma.sync over the whole range is slow (H200,
  // ResNet-50 through the backend: 2.73 ms at B32 against 1.77 for the graph compiled for B32). A
  // limit of the range (RangeLimit): the backend declares a narrower one, a graph file is told to.
  if (anchor.kind == OpKind::Conv2d && gm.conv && sizes_.symbolic(gm.m) && gm.m < (int64_t{1} << 31) &&
      largest(gm.m) >= (int64_t{1} << 31) && conv_weight_operand(anchor, kind))
    throw RangeLimit(fmt::format("{}: the Hopper kernel's conv rows reach {} (2^31 or more) at the largest sizes; "
                                 "a smaller max keeps it",
                                 g_.describe(k_.anchor), largest(gm.m)));
  if (anchor.kind == OpKind::Conv2d && gm.conv && largest(gm.m) < (int64_t{1} << 31)) {
    std::optional<TmaOperand> b = conv_weight_operand(anchor, kind);
    if (!b) return refuse("the weights are not [K, R, S, C] rows a tensor map loads");
    return WgmmaOperands{std::nullopt, *b, std::nullopt};
  }
  if (anchor.kind == OpKind::Conv2d)
    return refuse("the input is not gathered in 16-byte runs (one group, NHWC, channels a multiple of 8)");
  return std::nullopt;
}

std::string GemmGenerator::tensor_map_param(const TmaOperand& op, const std::string& what) {
  return KernelBuilder::tensor_map_param(op.tensor, op.map, what);
}

namespace {

// A matmul's width: 256 where those tiles fill the GPU (132 SMs on H100
// and H200) in no more rounds than 128 takes, a 128 x 256 tile counted as
// 1.84 of a 128 x 128 one (it reads less per flop). H100, bf16, autotuned:
// GPT-2's c_fc 2048 x 3072 x 768 + GELU ran 29.8 us at 128 (384 tiles, 3
// rounds) against 41.1 at 256 (192 tiles: 2 rounds of 2); 8192 x 8192 x
// 4096 keeps 256.
// Else 192 (no multicast pairs; a symbolic M's size bucket) where its
// rounds, each counted 1.5 (its work), are fewer than 128's; a last round
// of 128 under 8 tiles counted as its share of the SMs (it runs nearly
// alone). H200, `kiln bench`, 192 against 128 (bench/NOTES.md v0.50):
// BERT B32 S128's forward 0.413 -> 0.381 ms (its 4096 x 768 projections
// 18.5 -> 15.5 us under ncu: 192 tiles of 128 are two rounds, the second
// 45% full; 128 tiles of 192 one), ViT-S B32 1.589 -> 1.542, ConvNeXt-T
// B32 2.356 -> 2.296, a 1600 x 1536 x 128 projection with a residual and
// RMSNorm's row sums 30.5 -> 24.9 us; 1024 x 2176 x 256 + residual (136
// tiles of 128: a last round of 4) 13.5 -> 15.6 us, which the tail rule
// keeps at 128.
int wide_tiles_width(int64_t m, int64_t n, int64_t batches) {
  const int64_t tiles_m = (m + kWgmmaBM - 1) / kWgmmaBM;
  auto tiles = [&](int width) { return tiles_m * ((n + width - 1) / width) * batches; };
  auto rounds = [&](int width) { return static_cast<double>((tiles(width) + 131) / 132); };
  if (n <= 128) return 128;
  if (tiles(256) >= 132 && 1.84 * rounds(256) <= rounds(128)) return 256;
  const int64_t last = tiles(128) % 132;
  const double rounds_128 = last > 0 && last < 8 ? static_cast<double>(tiles(128) / 132) + last / 132.0 : rounds(128);
  return 1.5 * rounds(192) < rounds_128 ? 192 : 128;
}

// The rows of a symbolic M at which the width rule takes `width` (192 or 256; its tile rows walked
// up to kBucketTileRows, past which the last answer stands), as ranges of M; empty where it never does.
// More than kBucketRanges ranges (an answer that alternates) keep the first ones.
constexpr int64_t kBucketTileRows = int64_t{1} << 16;
constexpr size_t kBucketRanges = 32;
std::vector<std::pair<int64_t, int64_t>> wide_tile_rows(const ir::Dim& m, int64_t n, int64_t batches, int width) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  const int64_t lo = std::max<int64_t>(m.lower(), 1), hi = m.upper();
  const int64_t first = (lo + kWgmmaBM - 1) / kWgmmaBM, last = std::min((hi + kWgmmaBM - 1) / kWgmmaBM, kBucketTileRows);
  for (int64_t t = first; t <= last && ranges.size() <= kBucketRanges; ++t) {
    if (wide_tiles_width(t * kWgmmaBM, n, batches) != width) continue;
    const int64_t from = std::max(lo, (t - 1) * kWgmmaBM + 1), to = t == last ? hi : std::min(hi, t * kWgmmaBM);
    if (!ranges.empty() && ranges.back().second + 1 == from)
      ranges.back().second = to;
    else
      ranges.emplace_back(from, to);
  }
  if (ranges.size() > kBucketRanges) ranges.resize(kBucketRanges);
  return ranges;
}

}  // namespace

// The tile widths, cluster shapes, tile orders and epilogue loops the Hopper
// kernel accepts, the heuristic's choice first, and ping-pong alternatives
// (Tuning::pingpong). A gathering producer keeps 128 registers for its row offsets, which leaves
// the consumers room for 128 columns (64 when the problem has no more).
std::vector<Tuning> GemmGenerator::wgmma_tuning_space(const Gemm& gm, bool gathered) const {
  const int64_t tiles_m = (gm.m + kWgmmaBM - 1) / kWgmmaBM;
  // A symbolic M takes 128 (256 loses most where the rows are few: H100, 2000 x 3072 x 768 +
  // GELU with 256 took 1.54x the time of the graph written at that size, which takes 128); the
  // sizes where the rule takes 256 or 192 get a variant of their own (wide_tile_rows, gemm_wgmma).
  // A gathered A takes 64 columns where 128-column tiles fill under half the SMs (twice the
  // tiles; H200, autotuned, v0.52: ResNet-50's 3x3 512 -> 512 over 7 x 7 at B32, 52 tiles of 128
  // columns in clusters of 2 0.041 ms, 104 of 64 columns 0.036).
  const int64_t tiles_128 = tiles_m * ((gm.n + 127) / 128) * gm.batches;
  const bool few_tiles = !sizes_.symbolic(gm.m) && !sizes_.symbolic(gm.batches) && tiles_128 < 132 / 2;
  const int heuristic_bn = gathered ? (gm.n <= 64 || few_tiles ? 64 : 128)
                           : sizes_.symbolic(gm.m) ? 128
                                                   : wide_tiles_width(gm.m, gm.n, gm.batches);
  // Two blocks along M share each B slice (multicast) once there are two
  // tile rows: the heuristic's for a conv. A matmul's heuristic keeps
  // blocks alone (H100, this session's autotuning, bf16: 8192 x 8192 x
  // 4096 0.847 ms alone against 0.858 in pairs; 2048 x 3072 x 768 + GELU
  // and 2048 x 2816 x 1024 + SiLU x up 20-25% faster alone at width 128).
  auto pairs_allowed = [&](int width) { return tiles_m >= 2 && width % 128 == 0; };
  const int heuristic_pair = gathered && pairs_allowed(heuristic_bn) ? 2 : 1;
  // Tiles walked 8 rows at a time. The alternatives: the other width where
  // the problem has the columns (a gathering producer allows 128 at most),
  // clusters of one, and rows walked 4 or 16 at a time.
  // Each with the staged epilogue's column blocks in a loop, unrolled, or
  // as the element code's cost says (0); gemm_wgmma turns 0 into what that
  // chose, or every entry into 0 where the epilogue has no such choice.
  std::vector<Tuning> space{{heuristic_bn, heuristic_pair, 8, 0, 0}};
  std::vector<int> widths = gathered ? std::vector<int>{64, 128} : std::vector<int>{128, 192, 256};
  for (int width : widths) {
    if (width > 64 && gm.n <= width / 2) continue;  // no columns for it
    for (int pair : {2, 1}) {
      if (pair == 2 && !pairs_allowed(width)) continue;
      for (int raster : {8, 4, 16})
        for (int loop : {0, Tuning::kRolled, Tuning::kUnrolled}) space.push_back({width, pair, raster, 0, loop});
    }
  }
  // Ping-pong: each consumer warpgroup's own tiles of 64 rows (a copy-engine A only).
  if (!gathered)
    for (int width : widths) {
      if (gm.n <= width / 2 || width == 192) continue;  // (192: untried in ping-pong)
      for (int pair : {2, 1})
        if (pair == 1 || pairs_allowed(width))
          for (int loop : {0, Tuning::kRolled, Tuning::kUnrolled}) space.push_back({width, pair, 8, 0, loop, 1});
    }
  return space;
}

// A producer thread's loads of A's (is_a) or B's slice element by element,
// for an operand the copy engine cannot load; `guard` opens the block.
std::string GemmGenerator::wgmma_element_loads(const Gemm& gm, const WgmmaShape& s, bool b_k_major, bool is_a,
                                               const std::string& guard) {
  const std::string tile = is_a ? "a_tile" : "b_tile";
  // One element per iteration, not unrolled (the copy engine's producer has 56 registers).
  auto loop_open = [&](int elements) {
    return fmt::format("{}{{\n#pragma unroll 1\nfor (int e = threadIdx.x; e < {}; e += 128) {{\n", guard, elements);
  };
  std::string out;
  if (is_a) {
    out += loop_open(s.bm * s.bk);
    out += "const int row = e >> 6, col = e & 63;\n";
    out += "const kiln::i64 m = m0 + row, k = k0 + col;\n";
    out += fmt::format("float v = 0.0f;\nif (m < {} && k < {}) {{\n", sizes_(gm.m), sizes_(gm.k));
    em_.begin_block();
    gm.load_a("m", "k", "batch");
    out += em_.take() + "}\n";
    out += fmt::format("{}[G::a_index(row, col)] = kiln::tc::Element<kiln::tc::{}>::from_float(v);\n}}\n}}\n",
                       tile, s.kind_name);
    return out;
  }
  out += loop_open(s.bn * s.bk);
  if (b_k_major)
    out += "const int nn = e >> 6, kk = e & 63;\n";
  else
    out += fmt::format("const int nn = e % {0}, kk = e / {0};\n", s.bn);
  out += "const kiln::i64 k = k0 + kk, n = n0 + nn;\n";
  out += fmt::format("float v = 0.0f;\nif (k < {} && n < {}) {{\n", sizes_(gm.k), sizes_(gm.n));
  em_.begin_block();
  gm.load_b("k", "n", "batch");
  out += em_.take() + "}\n";
  out += fmt::format("{}[G::b_index(kk, nn)] = kiln::tc::Element<kiln::tc::{}>::from_float(v);\n}}\n}}\n", tile,
                     s.kind_name);
  return out;
}

namespace {

// A tensor copy's coordinates: (c0, c1), and the batch where the map has one.
std::string copy_coords(const TensorMapSpec& map, const std::string& c0, const std::string& c1) {
  return map.rank == 3 ? fmt::format("(int){}, (int){}, (int)batch", c0, c1) : fmt::format("(int){}, (int){}", c0, c1);
}

// A's copy coordinates: (k0, m0[, batch]), or for a split A (split_tma_a)
// each split into its inner and outer dimension.
std::string a_copy_coords(const GemmGenerator::TmaOperand& a) {
  if (!a.rows_inner && !a.columns_inner) return copy_coords(a.map, "k0", "m0");
  auto inner = [](const char* v, int64_t size) { return size ? fmt::format("(int)({} % {}LL)", v, size) : fmt::format("(int){}", v); };
  std::string out = inner("k0", a.columns_inner) + ", " + inner("m0", a.rows_inner);
  if (a.columns_inner) out += fmt::format(", (int)(k0 / {}LL)", a.columns_inner);
  if (a.rows_inner) out += fmt::format(", (int)(m0 / {}LL)", a.rows_inner);
  return out;
}

}  // namespace

// Thread 0's copies of B's slice (its share, multicast, in a cluster).
std::string GemmGenerator::wgmma_b_copy(const WgmmaShape& s, const TmaOperand& b, const std::string& map_b) const {
  std::string b_copy;
  const int bn = s.bn, bk = s.bk, cluster = s.cluster;
  if (cluster == 1 && b.k_major) {
    b_copy += fmt::format("if (tma_b) kiln::wg::tma_load(b_tile, &{}, full, {});\n", map_b, copy_coords(b.map, "k0", "n0"));
  } else if (cluster == 1) {
    b_copy += "if (tma_b)\n";
    b_copy += fmt::format("for (int j = 0; j < {}; ++j)\n", bn / 64);
    b_copy += fmt::format("kiln::wg::tma_load(b_tile + j * {}, &{}, full, {});\n", 64 * bk, map_b,
                          copy_coords(b.map, "(n0 + 64 * j)", "k0"));
  } else if (b.k_major) {
    b_copy += "// This block's share of B's rows, into every block of the cluster.\n";
    b_copy += fmt::format("if (tma_b) kiln::wg::tma_multicast(b_tile + rank * {}, &{}, full, {}, {});\n", bn / cluster * bk, map_b,
                          (1 << cluster) - 1, copy_coords(b.map, "k0", fmt::format("(n0 + rank * {})", bn / cluster)));
  } else {
    const int per_block = bn / 64 / cluster;
    b_copy += "// This block's share of B's 64-column blocks, into every block of the cluster.\n";
    b_copy += "if (tma_b)\n";
    b_copy += fmt::format("for (int j = rank * {0}; j < rank * {0} + {0}; ++j)\n", per_block);
    b_copy += fmt::format("kiln::wg::tma_multicast(b_tile + j * {}, &{}, full, {}, {});\n", 64 * bk, map_b,
                          (1 << cluster) - 1, copy_coords(b.map, "(n0 + 64 * j)", "k0"));
  }
  return b_copy;
}

// The kernel's frame before the warpgroups split: the Gemm type, shared
// memory and barriers, alignment checks, and how units map to tiles.
std::string GemmGenerator::wgmma_frame(const WgmmaShape& s, const std::string& gathered_pointer, const TmaOperand& a,
                                       const TmaOperand& b, bool staged) const {
  std::string body;
  // GATHERED, STAGED, PINGPONG: up to the last one set (the rest default to false).
  std::vector<bool> set{s.gathered, staged, s.pingpong};
  while (!set.empty() && !set.back()) set.pop_back();
  std::string flags;
  for (bool f : set) flags += f ? ", true" : ", false";
  body += fmt::format("typedef kiln::wg::Gemm<{}, {}, kiln::tc::{}, {}, {}{}> G;\n", s.bn, s.stages, s.kind_name,
                      b.k_major ? "true" : "false", s.cluster, flags);
  body += fmt::format("static_assert(G::kSharedBytes == {}, \"shared memory size as launched\");\n", s.shared_bytes);
  body += "extern __shared__ __align__(1024) unsigned char kiln_shared_raw[];\n";
  body += "unsigned char* const smem = G::base(kiln_shared_raw);\n";
  body += "G::init_barriers(smem);\n";
  if (s.gathered)
    body += fmt::format("const bool chunks_a = kiln::aligned16({}), tma_b = kiln::aligned16({});\n", gathered_pointer, b.pointer);
  else
    body += fmt::format("const bool tma_a = kiln::aligned16({}), tma_b = kiln::aligned16({});\n", a.pointer, b.pointer);
  if (s.units_m_text.empty())
    body += fmt::format("const int units_m = {}, tiles_n = {}, units = {}, k_tiles = {};\n", s.units_m, s.tiles_n, s.units,
                        s.k_tiles);
  else  // (M symbolic: the units at the bound sizes)
    body += fmt::format("const int units_m = {}, tiles_n = {}, units = units_m * {}, k_tiles = {};\n", s.units_m_text,
                        s.tiles_n, s.units / s.units_m, s.k_tiles);
  body += fmt::format("const int rank = (int)G::rank(), first_unit = blockIdx.x / {0}, unit_step = gridDim.x / {0};\n",
                      s.cluster);
  body += "  // A unit is the cluster's tile rows (one per block) at one tile column of one batch; units walk\n";
  body += fmt::format("  // groups of {} unit rows column by column for L2 reuse.\n", s.raster);
  body += "auto tile_at = [&](int unit, kiln::i64& m0, kiln::i64& n0, kiln::i64& batch) {\n";
  body += "int um, tn;\n";
  body += "batch = unit / (units_m * tiles_n);\n";
  body += fmt::format("kiln::tc::swizzled_tile(unit % (units_m * tiles_n), units_m, tiles_n, {}, um, tn);\n", s.raster);
  body += fmt::format("m0 = ((kiln::i64)um * {} + rank) * {}, n0 = (kiln::i64)tn * {};\n}};\n", s.cluster, s.bm, s.bn);
  return body;
}

// The producer warpgroup of a matmul: thread 0 drives the copy engine; when
// an operand's pointer is not 16-byte aligned every producer thread loads
// its share of that operand element by element instead (its registers would
// not fit in the copy engine's loop: it spilled), thread 0 still copying
// the other.
std::string GemmGenerator::wgmma_copy_producer(const WgmmaShape& s, const TmaOperand& a, const std::string& map_a,
                                               const std::string& map_b, const std::string& b_copy, const std::string& warm_l2,
                                               const std::string& a_elements, const std::string& b_elements) const {
  std::string body = "const bool by_elements = !(tma_a && tma_b);\n";
  body += "if (threadIdx.x == 0) {\n";
  body += fmt::format("if (tma_a) kiln::wg::prefetch_map(&{});\nif (tma_b) kiln::wg::prefetch_map(&{});\n}}\n",
                      map_a, map_b);
  auto copies = [&](bool both) {
    std::string c = "kiln::wg::u64* const full = G::full(smem) + ring.stage;\n";
    c += both ? "kiln::wg::bar_arrive_expect(full, G::kABytes + G::kBBytes);\n"
              : "kiln::wg::bar_arrive_expect(full, (tma_a ? G::kABytes : 0) + (tma_b ? G::kBBytes : 0));\n";
    c += fmt::format("{}kiln::wg::tma_load(a_tile, &{}, full, {});\n", both ? "" : "if (tma_a) ", map_a, a_copy_coords(a));
    return c + b_copy;
  };
  body += "if (!by_elements && threadIdx.x == 0) {\n";
  body += fmt::format("kiln::wg::Ring<{}> ring;\n", s.stages);
  body += producer_tile_loop();
  body += warm_l2;
  body += "for (int kt = 0; kt < k_tiles; ++kt, ring.advance()) {\n";
  body += producer_slot();
  body += copies(true);
  body += "}\n}\n} else if (by_elements) {\n";
  body += fmt::format("kiln::wg::Ring<{}> ring;\n", s.stages);
  body += producer_tile_loop();
  body += "for (int kt = 0; kt < k_tiles; ++kt, ring.advance()) {\n";
  body += producer_slot();
  body += a_elements + b_elements;
  body += "kiln::wg::fence_async_shared();\nkiln::wg::named_sync(1, 128);\n";
  body += "if (threadIdx.x == 0) {\n" + copies(false) + "}\n";
  body += "}\n}\n}\n";
  return body;
}

std::string GemmGenerator::WgmmaShape::to_string() const {
  return fmt::format("wgmma {}x{}x{}{}, A {}, cluster {}, {} stages, registers {}/{}", bm, bn, bk,
                     pingpong ? " per warpgroup (ping-pong)" : "", gathered ? "gathered" : "by TMA", cluster, stages,
                     producer_registers, consumer_registers);
}

void GemmGenerator::gemm_wgmma(const ir::Op& anchor, const Gemm& gm, Mma kind, const WgmmaOperands& operands) {
  WgmmaShape s;
  s.gathered = !operands.a;
  TmaOperand a = s.gathered ? TmaOperand{} : *operands.a, b = operands.b;
  const std::vector<Tuning> space = wgmma_tuning_space(gm, s.gathered);
  const Tuning choice = choose_tuning(space);
  s.bn = choice.tile_n, s.cluster = choice.cluster, s.raster = choice.raster;
  // A symbolic M's size buckets: where the integer graph's rule takes 256 or 192 columns, a
  // variant with them (generate_program builds it; the heuristic's tuning otherwise).
  if (sizes_.symbolic(gm.m) && !s.gathered && choice == space.front() && !sizes_.symbolic(gm.n) &&
      !sizes_.symbolic(gm.batches))
    for (int width : {256, 192}) {
      const Tuning wide{width, 1, 8, 0, 0};
      std::vector<std::pair<int64_t, int64_t>> rows = wide_tile_rows(sizes_.dim(gm.m), gm.n, gm.batches, width);
      if (!rows.empty() && std::ranges::find(space, wide) != space.end())
        out_.other_sizes.push_back({wide, SizeCondition{sizes_.dim(gm.m).expr(), std::move(rows)}});
    }
  s.pingpong = choice.pingpong != 0 && !s.gathered;
  if (s.pingpong) s.bm = 64;
  s.producer_registers = s.gathered ? 128 : 56, s.consumer_registers = s.gathered ? 184 : 224;
  const int64_t tiles_m = (gm.m + s.bm - 1) / s.bm;
  s.tiles_n = (gm.n + s.bn - 1) / s.bn;
  s.units_m = (tiles_m + s.cluster - 1) / s.cluster, s.units = s.units_m * s.tiles_n * gm.batches;
  s.k_tiles = k_slices(gm, s.bk);
  if (sizes_.symbolic(gm.m)) {  // units_m = ceil(M / (bm * cluster)), computed by the kernel; batches and N are integers
    if (sizes_.symbolic(gm.batches))
      throw NotSymbolic(fmt::format("{}: the Hopper kernel's tiles of a symbolic M over symbolic batches",
                                    g_.describe(k_.anchor)));
    if (((largest(gm.m) + s.bm * s.cluster - 1) / (s.bm * s.cluster)) * s.tiles_n * gm.batches * s.cluster >=
        (int64_t{1} << 31))
      throw RangeLimit(fmt::format("{}: the Hopper kernel's tiles of a symbolic M reach 2^31 at the largest sizes",
                                   g_.describe(k_.anchor)));
    s.units_m_text = fmt::format("(int)(({} + {}LL) / {}LL)", sizes_(gm.m), s.bm * s.cluster - 1, s.bm * s.cluster);
  }
  KILN_INTERNAL_CHECK(!s.units_m_text.empty() || s.units * s.cluster < (int64_t{1} << 31));
  s.kind_name = kind == Mma::bf16 ? "kBf16" : "kF16";
  a.map.box = {static_cast<uint32_t>(s.bk), static_cast<uint32_t>(s.bm), 1};
  for (int d = 3; d < a.map.rank; ++d) a.map.box[static_cast<size_t>(d)] = 1;  // a split A's outer dimensions
  b.map.box = b.k_major ? decltype(b.map.box){static_cast<uint32_t>(s.bk), static_cast<uint32_t>(s.bn / s.cluster), 1}
                        : decltype(b.map.box){64, static_cast<uint32_t>(s.bk), 1};
  const std::string map_a = s.gathered ? "" : tensor_map_param(a, g_.operand(anchor, 0).name);
  const std::string map_b = tensor_map_param(b, g_.operand(anchor, 1).name);

  // The epilogue first: whether the result goes out through shared memory sizes the ring.
  std::string finalise;
  // (A cluster's last unit may hold a block with no rows at all.)
  const bool check_m = sizes_.symbolic(gm.m) ? !sizes_.dim(gm.m).known_multiple_of(s.bm * s.cluster)
                                             : gm.m % s.bm != 0 || tiles_m % s.cluster != 0;
  // Column reductions stay in registers across tiles where 56 registers
  // are left for everything but the accumulators and the partials.
  TileLoopCarry carry{s.consumer_registers - s.bn / 2 - 56, s.bn / 4, "", "", ""};
  ir::TensorId staged = -1;
  int heuristic_loop = 0;
  EpilogueLoops loops{"", "", true, check_m, gm.n % s.bn != 0, nullptr, &staged, choice.epilogue, &heuristic_loop};
  if (s.pingpong) loops.warpgroup_m0 = "m0";
  loops.stage_map = [&](ir::TensorId t, const TensorMapSpec& map) {
    const std::string& pointer = writes_.count(t) ? writes_.at(t) : ext_.at(t).pointer;
    return tensor_map_param(TmaOperand{t, pointer, map, true}, g_.tensor(t).name);
  };
  const std::string tile_epilogue = epilogue(anchor, gm, loops, "gemm.acc[mi][ni][e]", &finalise, &carry);
  // The epilogue's choice made explicit (the heuristic's entry says what it chose), or dropped where there is none.
  restrict_tuning([&](Tuning& t) { t.epilogue = heuristic_loop == 0 ? 0 : t.epilogue == 0 ? heuristic_loop : t.epilogue; });
  const int stage_bytes = (s.bm + s.bn) * s.bk * 2, staging_bytes = staged >= 0 ? 4 * 64 * 128 + 4 * 8 : 0;
  s.stages = std::min(8, (kSharedLimit - 1024 - 8 * 16 - staging_bytes) / stage_bytes);
  s.shared_bytes = 1024 + s.stages * stage_bytes + staging_bytes + 2 * s.stages * 8;
  decided(s.to_string());
  min_blocks_per_sm_ = 1;  // setmaxnreg needs the register cap at entry
  if (s.cluster > 1) kernel_attributes_ = fmt::format("__cluster_dims__({}, 1, 1) ", s.cluster);

  const std::string gathered_pointer = operands.gathered ? operands.gathered->memory.pointer : gm.pointer_a;
  std::string body = wgmma_frame(s, gathered_pointer, a, b, staged >= 0);
  const std::string b_copy = wgmma_b_copy(s, b, map_b);
  // Thread 0 (the copy engine's producer) or each producer thread (gathering) warms L2 for the epilogue.
  const std::string warm_l2 = epilogue_prefetch(anchor, gm, s.bn,
                                                s.gathered ? "for (int r = threadIdx.x; r < 128; r += 128)"
                                                           : fmt::format("for (int r = 0; r < {}; ++r)", s.bm),
                                                {gathered_pointer, a.pointer, b.pointer});
  body += "if (threadIdx.x < 128) {\n";
  body += fmt::format("kiln::wg::registers_down<{}>();\n", s.producer_registers);
  // B's element loads are written before A's: the emitter numbers its
  // variables in the order it meets them, and this is the order the kernels
  // in existing caches were written in (an unsequenced pair of calls once
  // left it to the C++ compiler; GCC took B first).
  const std::string b_elements = wgmma_element_loads(gm, s, b.k_major, false, "if (!tma_b) ");
  const std::string a_elements = wgmma_element_loads(gm, s, b.k_major, true, s.gathered ? "" : "if (!tma_a) ");
  if (s.gathered)
    body += gathered_producer(gm, operands.gathered, s.stages, map_b, a_elements, b_elements, b_copy, warm_l2);
  else
    body += wgmma_copy_producer(s, a, map_a, map_b, b_copy, warm_l2, a_elements, b_elements);
  body += "} else {\n" + wgmma_consumers(s, carry, tile_epilogue) + "}\n";
  body += finalise;
  body += "G::finish();\n";
  finish(body, s.threads, "", "#include \"kiln/wgmma.cuh\"\n");
  out_.shared_bytes = static_cast<uint32_t>(s.shared_bytes);
  out_.grid = {static_cast<uint32_t>(std::min<int64_t>(s.units * s.cluster, int64_t{1} << 31)), 1, 1};
  if (sizes_.symbolic(gm.m))  // (persistent: the launch takes at most the blocks that run at once)
    out_.grid_rule = GridRule{sizes_.dim(gm.m).expr(), 1, s.bm * s.cluster, static_cast<uint32_t>(s.units / s.units_m * s.cluster)};
  out_.persistent_group = static_cast<uint32_t>(s.cluster);
}

// The consumer warpgroups: each tile's main loop on the ring, then its
// epilogue, with what the epilogue carries across tiles around the loop.
// Ping-pong: warpgroup w takes every other unit of its block's, starting
// with the w-th, passes over the ring's fills of the other's, and starts
// each main loop after the other's (G::await_turn).
std::string GemmGenerator::wgmma_consumers(const WgmmaShape& s, const TileLoopCarry& carry, const std::string& tile_epilogue) {
  CodeWriter w;
  w.line("kiln::wg::registers_up<{}>();", s.consumer_registers);
  w.line("G gemm;");
  w.line("kiln::wg::Ring<{}> ring;", s.stages);
  w.lines(carry.before_loop);
  std::string loop = "for (int unit = first_unit; unit < units; unit += unit_step)";
  if (s.pingpong) {
    w.line("const int warpgroup = (threadIdx.x >> 7) - 1;");
    w.line("ring.skip(warpgroup * k_tiles);");
    loop = "for (int unit = first_unit + warpgroup * unit_step; unit < units; unit += 2 * unit_step)";
  }
  w.block(loop, [&] {
    w.line("kiln::i64 m0, n0, batch;");
    w.line("tile_at(unit, m0, n0, batch);");
    w.lines(carry.tile_start);
    if (s.pingpong) w.line("if (unit != first_unit) G::await_turn();");
    w.line("gemm.mma_tile(smem, ring, k_tiles);");
    if (s.pingpong) w.line("if (unit + unit_step < units) G::pass_turn();  // the other warpgroup's next tile");
    w.lines(tile_epilogue);
    if (s.pingpong) w.line("ring.skip(k_tiles);  // the other warpgroup's tile");
  });
  w.lines(carry.after_loop);
  return w.take();
}

// The producer warpgroup of a gathered A: each thread gathers one 16-byte
// column chunk of 8 of A's 128 rows per slice (rows threadIdx.x / 8 + 16 i:
// eight threads read 64 consecutive columns, 128 bytes of a conv's pixel's
// channels or of a view's innermost run), the rows' offsets worked out once
// per tile and the column's once per slice; cp.async zero-fills what lies
// outside (a conv's padding, rows past M, columns past K). Thread 0 adds B's
// copy. An input pointer that is not 16-byte aligned makes every thread
// load its share of A element by element (`a_elements`).
//
// A conv (gm.conv) gathers its implicit im2col; a matmul's A through views
// (`view`) its strided tensor, each row at the offset of its coordinates
// along view->rows and each chunk at its column's along view->columns.
std::string GemmGenerator::gathered_producer(const Gemm& gm, const std::optional<StridedView>& view, int stages,
                                             const std::string& map_b, const std::string& a_elements,
                                             const std::string& b_elements, const std::string& b_copy,
                                             const std::string& warm_l2) {
  // Each row's (and chunk's) offset: the sum of its coordinates along `dims` (outer first) times their strides.
  auto offset_of = [&](const std::string& index, const std::vector<ViewDim>& dims) {
    std::string sum;
    int64_t inner = 1;
    for (size_t d = dims.size(); d-- > 0;) {
      if (dims[d].size == 1) continue;
      std::string coord = inner == 1 ? index : fmt::format("({} / {})", index, sizes_(inner, ""));
      if (d > 0) coord = fmt::format("({} % {})", coord, sizes_(dims[d].size, ""));
      sum += fmt::format("{}(kiln::i64){} * {}", sum.empty() ? "" : " + ", coord, sizes_(dims[d].stride));
      inner *= dims[d].size;
    }
    return sum.empty() ? std::string("0") : sum;
  };
  std::string out;
  out += "if (threadIdx.x == 0 && tma_b) kiln::wg::prefetch_map(&" + map_b + ");\n";
  out += fmt::format("const G::T* const x = static_cast<const G::T*>({});\n", view ? view->memory.pointer : gm.pointer_a);
  out += "const int chunk_row = threadIdx.x >> 3, chunk_col = (threadIdx.x & 7) * 8;\n";
  out += fmt::format("kiln::wg::Ring<{}> ring;\n", stages);
  out += producer_tile_loop();
  out += warm_l2;
  if (view) {
    out += "// Each row's offset in the tensor behind A's views; rows past M read nothing (-1).\n";
    out += "kiln::i64 row_offset[8];\n";
    out += "#pragma unroll\nfor (int i = 0; i < 8; ++i) {\n";
    out += "const int m = (int)m0 + chunk_row + 16 * i;\n";
    out += fmt::format("row_offset[i] = m < {} ? {} + {} : -1;\n", sizes_(gm.m, ""), sizes_(view->memory.offset),
                       offset_of("m", view->rows));
    out += "}\n";
  } else {
    const Gemm::ConvGeometry& cv = *gm.conv;
    out += "// Each row's output pixel (n, p, q) reads input rows from `top` and columns from `left`,\n";
    out += "// at `pixel` (the element offset of input (n, top, left), channel 0); rows past M read nothing.\n";
    out += "kiln::i64 pixel[8];\nint top[8], left[8];\n";
    out += "#pragma unroll\nfor (int i = 0; i < 8; ++i) {\n";
    out += "const int m = (int)m0 + chunk_row + 16 * i;\n";
    if (gm.window_rows != WindowRows::none)
      out += pooled_pixel("m", "int", {"ni", "pi", "qi"}, cv.p, cv.q, gm.window_rows) + "\n";
    else
      out += fmt::format("const int ni = m / {0}, pq = m - ni * {0}, pi = pq / {1}, qi = pq - pi * {1};\n", cv.p * cv.q, cv.q);
    out += fmt::format("top[i] = m < {} ? pi * {} - {} : -(1 << 29);\n", sizes_(gm.m, ""), cv.stride[0], cv.padding[0]);
    out += fmt::format("left[i] = qi * {} - {};\n", cv.stride[1], cv.padding[1]);
    out += fmt::format("pixel[i] = (kiln::i64)ni * {}LL + (kiln::i64)top[i] * {}LL + (kiln::i64)left[i] * {}LL;\n",
                       cv.x_strides[0], cv.x_strides[1], cv.x_strides[2]);
    out += "}\n";
  }
  out += "for (int kt = 0; kt < k_tiles; ++kt, ring.advance()) {\n";
  out += producer_slot();
  out += "kiln::wg::u64* const full = G::full(smem) + ring.stage;\n";
  out += "if (chunks_a) {\n";
  if (view) {
    out += "// This thread's columns: a run of 8 along the innermost dimension.\n";
    out += "const int k = kt * 64 + chunk_col;\n";
    out += fmt::format("const kiln::i64 column_offset = {};\n", offset_of("k", view->columns));
    out += "#pragma unroll\nfor (int i = 0; i < 8; ++i) {\n";
    out += fmt::format("const bool ok = k < {} && row_offset[i] >= 0;\n", gm.k);
    out += "kiln::tc::cp_async16(a_tile + G::a_index(chunk_row + 16 * i, chunk_col), x + (ok ? row_offset[i] + column_offset : 0), ok);\n";
    out += "}\n";
  } else {
    const Gemm::ConvGeometry& cv = *gm.conv;
    out += "// This thread's column: filter tap (ri, si), channel ci.\n";
    out += "const int k = kt * 64 + chunk_col, tap = k / " + std::to_string(cv.c) + ", ci = k - tap * " +
           std::to_string(cv.c) + ";\n";
    out += fmt::format("const int ri = tap / {0}, si = tap - ri * {0}, dh = ri * {1}, dw = si * {2};\n", cv.s,
                       cv.dilation[0], cv.dilation[1]);
    out += fmt::format("const kiln::i64 tap_offset = (kiln::i64)dh * {}LL + (kiln::i64)dw * {}LL + ci;\n", cv.x_strides[1],
                       cv.x_strides[2]);
    out += "#pragma unroll\nfor (int i = 0; i < 8; ++i) {\n";
    out += fmt::format("const bool ok = k < {} && (unsigned)(top[i] + dh) < {}u && (unsigned)(left[i] + dw) < {}u;\n",
                       gm.k, cv.h, cv.w);
    out += "kiln::tc::cp_async16(a_tile + G::a_index(chunk_row + 16 * i, chunk_col), x + (ok ? pixel[i] + tap_offset : 0), ok);\n";
    out += "}\n";
  }
  out += "kiln::wg::cp_async_arrive(full);\n";
  out += "} else {\n";
  out += a_elements;
  out += "}\n";
  out += b_elements;
  out += "if (!chunks_a || !tma_b) kiln::wg::fence_async_shared();\n";
  out += "if (threadIdx.x == 0) {\n";
  out += "kiln::wg::bar_arrive_expect(full, tma_b ? G::kBBytes : 0);\n";
  out += b_copy;
  out += "} else {\nkiln::wg::bar_arrive(full);\n}\n";
  out += "}\n}\n";
  return out;
}

}  // namespace kiln::codegen
