// Depthwise convolutions (depthwise_generator.h): decide the tile, then
// write the kernel around templates/kiln/depthwise.cuh: the tile's place,
// the halo and the weights into shared memory, the template's convolution,
// and the epilogue over a thread's pixels and channels.
#include "codegen/depthwise_generator.h"

#include "compiler/planner/strategies.h"

namespace kiln::codegen {
namespace {

constexpr int kBlockThreads = 256;
// Registers (f32) for a filter row's weights, and for them and a thread's accumulators.
constexpr int64_t kFilterRowRegisters = 64, kThreadRegisters = 96;

int64_t pow2_floor(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}
int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string storage_tag(DType storage) { return "kiln::Storage::" + std::string(to_string(storage)); }

// kiln::dw::Round for an operand of value type `value` under `precision` (rule 5).
int round_of(DType value, ir::Precision precision) {
  if (value != DType::f32) return 0;
  switch (precision) {
    case ir::Precision::f32: return 0;
    case ir::Precision::tf32: return 1;
    case ir::Precision::bf16: return 2;
    case ir::Precision::f16: return 3;
  }
  return 0;
}

}  // namespace

auto DepthwiseGenerator::geometry(const ir::Graph& g, const ir::Op& conv) -> Geometry {
  const Shape& x = g.operand(conv, 0).shape;  // [n, h, w, c]
  const Shape& w = g.operand(conv, 1).shape;  // [k, r, s, 1]
  const Shape& y = g.result(conv).shape;      // [n, p, q, k]
  Geometry geo;
  geo.n = x[0], geo.h = x[1], geo.w = x[2], geo.c = x[3];
  geo.p = y[1], geo.q = y[2], geo.k = y[3];
  geo.r = w[1], geo.s = w[2];
  geo.group_in = w[3];
  geo.multiplier = geo.k / (geo.c / geo.group_in);
  for (int d = 0; d < 2; ++d) {
    geo.stride[d] = conv.attrs.stride[static_cast<size_t>(d)];
    geo.padding[d] = conv.attrs.padding[static_cast<size_t>(d)];
    geo.dilation[d] = conv.attrs.dilation[static_cast<size_t>(d)];
  }
  return geo;
}

int DepthwiseGenerator::shared_bytes(const Geometry& geo, const Tile& t) {
  const int64_t bytes = byte_size(t.halo), channels = t.block_channels();
  const int64_t rows = (t.ty - 1) * geo.stride[0] + (geo.r - 1) * geo.dilation[0] + 1;
  const int64_t columns = (int64_t{t.tx} * t.tq - 1) * geo.stride[1] + (geo.s - 1) * geo.dilation[1] + 1;
  const int64_t pixel = ceil_div(channels * bytes, 16) * 16 + (channels * bytes < 128 ? 16 : 0);
  const int64_t total = rows * columns * pixel + geo.r * geo.s * channels * geo.multiplier * 4;
  return static_cast<int>(std::min<int64_t>(total, INT32_MAX));
}

int DepthwiseGenerator::shared_budget(int sm) { return sm >= 90 ? 64 * 1024 : 48 * 1024; }

// A thread: as many input channels as one load of 16 bytes holds (fewer
// with a multiplier: its accumulators are channels x multiplier; grouped,
// whole groups whose outputs one 16-byte store holds), fewer still where a
// filter row's weights (grouped: a tap's) would pass kFilterRowRegisters; four
// pixels of a row, fewer where accumulators and a filter row would pass
// kThreadRegisters or the row is shorter. A block: channel lanes for up to
// 128 bytes of a pixel (a quarter-warp's conflict-free load), fewer where
// that wastes less of C; the rest of 256 threads over a tile about as tall
// as wide, no larger than the output; halved until halo and weights fit
// `budget`: with a stride along the row, first a thread's pixels down to
// two (the halo's width is the stride times the tile's), then the tile's
// rows, its columns, the channels, the pixels a thread.
auto DepthwiseGenerator::decide(const Geometry& geo, DType halo, bool vectors, int budget) -> Tile {
  Tile t;
  t.halo = halo;
  const int bytes = byte_size(halo), v = 16 / bytes;
  const int64_t gi = geo.group_in;
  t.ct = static_cast<int>(std::max(gi, std::min<int64_t>(v, pow2_floor(std::max<int64_t>(1, v * gi / geo.multiplier)))));
  // (Depthwise holds a filter row's weights, grouped one tap's: S times fewer.)
  const int64_t taps_held = gi == 1 ? geo.s : 1;
  while (t.ct > gi && taps_held * t.ct * geo.multiplier > kFilterRowRegisters) t.ct /= 2;
  const int64_t j = t.thread_outputs(geo);
  t.tq = 4;
  if (gi == 1)
    while (t.tq > 1 && j * (t.tq + geo.s) > kThreadRegisters) t.tq /= 2;
  else
    while (t.tq > 1 && j * t.tq + t.ct * geo.multiplier > kThreadRegisters) t.tq /= 2;
  while (t.tq > 1 && t.tq / 2 >= geo.q) t.tq /= 2;
  // Channel lanes: the widest whose blocks waste at most an eighth of C, else the least wasteful.
  auto waste = [&](int cg) { return ceil_div(geo.c, int64_t{cg} * t.ct) * cg * t.ct - geo.c; };
  const int least_lanes = vectors ? std::max(1, v / t.ct) : 1;  // (16-byte copies: whole chunks a block)
  t.cg = std::max(least_lanes, 128 / (t.ct * bytes));
  for (int cg = t.cg; cg >= least_lanes; cg /= 2) {
    if (waste(cg) * 8 <= geo.c) {
      t.cg = cg;
      break;
    }
    if (waste(cg) < waste(t.cg)) t.cg = cg;
  }
  const int pixels = std::max(1, kBlockThreads / t.cg);
  t.tx = 1;
  while (int64_t{t.tx} * 2 * t.tx * 2 * t.tq <= pixels) t.tx *= 2;
  t.tx = static_cast<int>(std::min<int64_t>(t.tx, pow2_ceil(ceil_div(geo.q, t.tq))));
  t.ty = static_cast<int>(std::min<int64_t>(pixels / t.tx, pow2_ceil(geo.p)));
  while (shared_bytes(geo, t) > budget) {
    if (geo.stride[1] > 1 && t.tq > 2) t.tq /= 2;
    else if (t.ty > 1) t.ty /= 2;
    else if (t.tx > 1) t.tx /= 2;
    else if (t.cg > 1 && t.cg > least_lanes) t.cg /= 2;
    else if (t.tq > 1) t.tq /= 2;
    else break;
  }
  t.shared_bytes = shared_bytes(geo, t);
  // (strategies.h bounds the window: the smallest tile, its halo element by element, always fits)
  KILN_INTERNAL_CHECK(t.shared_bytes <= budget || vectors);
  t.blocks_c = ceil_div(geo.c, t.block_channels());
  t.blocks_p = ceil_div(geo.p, t.ty);
  t.blocks_q = ceil_div(geo.q, int64_t{t.tx} * t.tq);
  return t;
}

std::string DepthwiseGenerator::Tile::to_string(const Geometry& geo) const {
  return fmt::format("{}x{} pixels x {} channels a block, {} threads of {} channels x {} pixels, {} bytes of shared memory",
                     ty, tx * tq, block_channels(), threads(), thread_outputs(geo), tq, shared_bytes);
}

void DepthwiseGenerator::depthwise() {
  const ir::Op& conv = g_.ops[static_cast<size_t>(k_.anchor)];
  KILN_INTERNAL_CHECK(ir::planner::depthwise_conv(g_, conv));
  const Geometry geo = geometry(g_, conv);
  // The halo: 16-byte copies where the input is a tensor in memory whose
  // pixels are whole 16-byte runs of channels (alignment checked at run
  // time); element by element otherwise, through any view.
  const std::optional<ExternalTensor> x = strided_in_memory(conv.inputs[0]);
  // (Grouped, a thread's channels are whole groups in one load: through a
  // view the halo holds the values in their own type, exactly.)
  const DType values = g_.operand(conv, 0).value_dtype();
  DType halo = x && x->storage != DType::boolean ? x->storage
               : geo.group_in > 1 && values != DType::boolean ? values
                                                              : DType::f32;
  KILN_INTERNAL_CHECK(geo.group_in * byte_size(halo) <= 16);
  const int v = 16 / byte_size(halo);
  bool vectors = x && x->storage == halo && x->strides[3] == 1 && geo.c % v == 0 && x->offset % v == 0;
  for (size_t d = 0; vectors && d < 3; ++d) vectors = x->strides[d] % v == 0;
  Tile t = decide(geo, halo, vectors, shared_budget(sm_));
  if (t.shared_bytes > shared_budget(sm_)) t = decide(geo, halo, vectors = false, shared_budget(sm_));
  const int64_t blocks = t.blocks(geo);
  KILN_USER_CHECK(blocks < (int64_t{1} << 31), "{}: {} tiles of {} exceed the 2^31 - 1 blocks of one launch",
                  g_.describe(k_.anchor), blocks, t.to_string(geo));
  const std::string groups = geo.group_in == 1 ? fmt::format("depthwise {}x{}", geo.r, geo.s)
                                               : fmt::format("grouped {}x{} ({} input channels a group)", geo.r, geo.s, geo.group_in);
  decided(fmt::format("{} stride {}x{} dilation {}x{} multiplier {}: {}; halo {} {}", groups, geo.stride[0], geo.stride[1],
                      geo.dilation[0], geo.dilation[1], geo.multiplier, t.to_string(geo), to_string(halo),
                      vectors ? "by 16-byte copies (element by element where unaligned)" : "element by element"));

  const int round = round_of(g_.operand(conv, 0).value_dtype(), conv.attrs.precision);
  CodeWriter w;
  w.line("typedef kiln::dw::Tile<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}{}> D;", storage_tag(halo), geo.r, geo.s,
         geo.stride[0], geo.stride[1], geo.dilation[0], geo.dilation[1], geo.multiplier, t.ct, t.tq, t.cg, t.tx, t.ty, round,
         geo.group_in == 1 ? "" : fmt::format(", {}", geo.group_in));
  w.line("static_assert(D::kSharedBytes == {}, \"shared memory as launched\");", t.shared_bytes);
  w.line("extern __shared__ __align__(16) unsigned char kiln_shared[];");
  w.line("D::T* halo = reinterpret_cast<D::T*>(kiln_shared);");
  w.line("float* weights = reinterpret_cast<float*>(kiln_shared + D::kHaloBytes);");
  w.line("// The block's tile: image ni, output rows from tp0, columns from tq0, input channels from tc0.");
  w.line("const kiln::i64 b = blockIdx.x, ni = b / {}LL;", t.blocks_c * t.blocks_q * t.blocks_p);
  w.line("const int cb = (int)(b % {}LL), qb = (int)((b / {}LL) % {}LL), pb = (int)((b / {}LL) % {}LL);", t.blocks_c,
         t.blocks_c, t.blocks_q, t.blocks_c * t.blocks_q, t.blocks_p);
  w.line("const int tp0 = pb * D::kBP, tq0 = qb * D::kBQ, tc0 = cb * D::kCB;");
  w.line("const int h0 = tp0 * {} - {}, w0 = tq0 * {} - {};", geo.stride[0], geo.padding[0], geo.stride[1], geo.padding[1]);
  if (vectors) {
    w.block(fmt::format("if (kiln::aligned16({}))", x->pointer), [&] {
      w.line("D::stage_halo_vectors(halo, static_cast<const D::T*>({}) + {}LL + ni * {}LL, {}LL, {}LL, h0, w0, tc0, {}, {}, {});",
             x->pointer, x->offset, x->strides[0], x->strides[1], x->strides[2], geo.h, geo.w, geo.c);
    });
    w.block("else", [&] { w.lines(halo_elements(conv, geo, t)); });
  } else {
    w.lines(halo_elements(conv, geo, t));
  }
  w.line("D::stage_weights(weights, {}, {}LL, {});", first_output(geo, "tc0"), geo.k, weight_lambda(conv, geo));
  w.line("__syncthreads();");
  w.line("// This thread's pixels (one row, D::kTQ columns) and channels.");
  w.line("const D::Thread th = D::thread();");
  w.line("float acc[D::kTQ][D::kJ];");
  w.line("D::convolve(D::input_of(halo, th), D::weights_of(weights, th), acc);");
  w.lines(epilogue(conv, geo, t));
  // At least 24 warps an SM to hide the halo's loads: a thread's registers
  // capped at 80 (sm_90, the bench's zoo shapes: 3x3 and 7x7 spill nothing,
  // 5x5 a loop-invariant value or two).
  min_blocks_per_sm_ = std::clamp(768 / t.threads(), 1, 16);
  finish(w.take(), t.threads(), "", "#include \"kiln/depthwise.cuh\"\n");
  out_.shared_bytes = static_cast<uint32_t>(t.shared_bytes);
  exact_grid(blocks, fmt::format("{}: more than 2^20 tiles", g_.describe(k_.anchor)));
}

// The halo element by element (any view of the input, any alignment): e
// runs over (row, column, channel) of the halo, zero outside the image and
// past C.
std::string DepthwiseGenerator::halo_elements(const ir::Op& conv, const Geometry& geo, const Tile& t) {
  CodeWriter w;
  w.block("for (int e = threadIdx.x; e < D::kHP * D::kHQ * D::kCB; e += D::kThreads)", [&] {
    w.line("int row, column, channel;");
    w.line("D::halo_element(e, row, column, channel);");
    w.line("const kiln::i64 hi = h0 + row, wi = w0 + column, ci = tc0 + channel;");
    w.line("float x = 0.0f;");
    em_.begin_block();
    const std::string value = em_.value(conv.inputs[0], {"ni", "hi", "wi", "ci"});
    w.block(fmt::format("if (hi >= 0 && hi < {}LL && wi >= 0 && wi < {}LL && ci < {}LL)", geo.h, geo.w, geo.c), [&] {
      w.lines(em_.take());
      w.line("x = {};", value);
    });
    w.line("halo[D::halo_index(row, column, channel)] = kiln::dw::Element<{}>::from_float(x);", storage_tag(t.halo));
  });
  return w.take();
}

// The weight of output channel ko at tap (ri, si) (and its group's input
// channel i), rounded to the conv's precision.
std::string DepthwiseGenerator::weight_lambda(const ir::Op& conv, const Geometry& geo) {
  em_.begin_block();
  const bool grouped = geo.group_in > 1;
  const std::string value = operand_value(conv, 1, {"ko", "ri", "si", grouped ? "i" : "0"});
  CodeWriter w;
  w.block(grouped ? "[&](kiln::i64 ko, int i, int ri, int si) -> float" : "[&](kiln::i64 ko, int ri, int si) -> float", [&] {
    w.lines(em_.take());
    w.line("return {};", value);
  });
  std::string text = w.take();
  text.pop_back();  // (the call's closing parenthesis follows the lambda's brace)
  return text;
}

// The first output channel of the input channels from `channel` on (the
// first of a group): depthwise channel * multiplier, grouped / group_in * multiplier.
std::string DepthwiseGenerator::first_output(const Geometry& geo, const std::string& channel) {
  const std::string c = channel.find(' ') == std::string::npos ? channel : "(" + channel + ")";
  if (geo.group_in == 1) return fmt::format("(kiln::i64){} * {}LL", c, geo.multiplier);
  return fmt::format("(kiln::i64){} / {} * {}LL", c, geo.group_in, geo.multiplier);
}

auto DepthwiseGenerator::channel_runs(const Geometry& geo, const Tile& t) const -> Chunking {
  Chunking ch;
  if (geo.c % t.ct != 0) return ch;  // a thread's channels may end inside the conv's: element by element
  const int64_t j = t.thread_outputs(geo);
  const Shape& out = g_.result(g_.ops[static_cast<size_t>(k_.anchor)]).shape;
  auto whole_words = [&](DType storage) { return storage != DType::boolean && j * byte_size(storage) % 16 == 0; };
  for (const auto& [id, e] : ordered_externals())
    if (g_.tensor(id).shape == out && e.strides == contiguous_strides(out) && e.offset == 0 && whole_words(e.storage))
      ch.loads.push_back(id);
  for (ir::TensorId id : k_.writes)
    if (g_.tensor(id).shape == out && whole_words(storage_dtype(g_.tensor(id)))) ch.stores.push_back(id);
  if (ch.loads.empty() && ch.stores.empty()) return {};
  ch.vec = static_cast<int>(j);
  ch.aligned = runs_aligned(ch);
  return ch;
}

std::string DepthwiseGenerator::runs_aligned(const Chunking& ch) const {
  std::vector<std::string> pointers;
  for (ir::TensorId id : ch.loads) pointers.push_back(fmt::format("kiln::aligned16({})", ext_.at(id).pointer));
  for (ir::TensorId id : ch.stores) pointers.push_back(fmt::format("kiln::aligned16({})", writes_.at(id)));
  return pointers.empty() ? "true" : fmt::format("{}", fmt::join(pointers, " && "));
}

// The epilogue over this thread's pixels t and output channels ko = kbase + v:
// the column loop first (values of the channel and image alone: a bias,
// batch_norm's parameters and scale), then each pixel's channels.
std::string DepthwiseGenerator::epilogue(const ir::Op& conv, const Geometry& geo, const Tile& t) {
  const int64_t j = t.thread_outputs(geo);
  const Shape& out = g_.result(conv).shape;
  Chunking ch = channel_runs(geo, t);
  const bool whole = geo.c % t.ct == 0;  // a thread's channels all inside the conv's, or none
  const Coords oc{"ni", "op", "oq", "ko"}, base{"ni", "op", "oq", "kbase"};

  em_.begin_block();
  std::map<ir::TensorId, Coords> element_coords;  // each tensor's coordinates in the element code, named once
  write_coords_memo_ = &element_coords;
  em_.begin_columns({"ko", "ni"}, fmt::format("[{}]", j), "[v]");
  em_.emit(fmt::format("const float out = {};  // {}", em_.rounded(g_.result(conv), "acc[t][v]"), g_.result(conv).name));
  em_.set_leaf(conv.output, "out");
  chunk_sources(ch, out, oc);
  std::set<ir::TensorId> chunked;
  element_writes(conv.output, oc, ch, chunked);
  const std::string element = em_.take();
  write_coords_memo_ = nullptr;
  std::erase_if(ch.loads, [&](ir::TensorId id) { return !em_.vector_source_used(id); });  // (read elsewhere, or not at all)
  em_.clear_vector_sources();
  ch.aligned = runs_aligned(ch);
  const Emitter::ColumnCode columns = em_.end_columns();

  std::vector<std::string> runs;
  for (ir::TensorId id : chunked) runs.push_back(g_.tensor(id).name);
  const size_t values = columns.values.size();
  epilogue_decision_ = fmt::format(
      "epilogue: {}{}", runs.empty() ? "stores element by element" : fmt::format("{} stored {} channels a store", fmt::join(runs, ", "), j),
      values == 0 ? "" : fmt::format(", {} value{} of the channel once a thread", values, values == 1 ? "" : "s"));

  CodeWriter w;
  w.line("// The epilogue: output channels kbase + v of row op.");
  w.line("const kiln::i64 kbase = {}, op = tp0 + th.ty;", first_output(geo, "tc0 + th.lane * D::kCT"));
  if (!ch.loads.empty() || !ch.stores.empty()) w.line("const bool kiln_vec = {};", ch.aligned);
  w.block(fmt::format("if (kbase < {}LL && op < {}LL)", geo.k, geo.p), [&] {
    if (!columns.empty()) {
      w.lines(columns.declarations);
      w.line("#pragma unroll");
      w.block("for (int v = 0; v < D::kJ; ++v)", [&] {
        w.line("const kiln::i64 ko = kbase + v;");
        w.line("if (ko >= {}LL) continue;", geo.k);
        w.lines(columns.statements);
        for (const auto& [value, array] : columns.values) w.line("{}[v] = {};", array, value);
      });
    }
    w.line("#pragma unroll");
    w.block("for (int t = 0; t < D::kTQ; ++t)", [&] {
      w.line("const kiln::i64 oq = tq0 + th.tx * D::kTQ + t;");
      w.line("if (oq >= {}LL) break;", geo.q);
      w.lines(chunk_load_calls(ch, out, base, element));
      w.lines(chunk_store_arrays(ch, chunked));
      w.line("#pragma unroll");
      w.block("for (int v = 0; v < D::kJ; ++v)", [&] {
        w.line("const kiln::i64 ko = kbase + v;");
        if (!whole) w.line("if (ko >= {}LL) continue;", geo.k);
        w.lines(element);
      });
      w.lines(chunk_store_calls(ch, chunked, em_.linearize(base, out)));
    });
  });
  return w.take();
}

}  // namespace kiln::codegen
