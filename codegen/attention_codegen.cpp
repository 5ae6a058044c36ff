// Attention kernels: flash attention on tensor cores
// (templates/kiln/attention.cuh) with a score hook for scale, mask and
// causality; an exact two-pass kernel for what those do not take (f32 or
// mixed operands).
#include "codegen/attention_generator.h"

#include "compiler/attention_match.h"

namespace kiln::codegen {

static_assert(AttentionGenerator::kWholeRowKeys >= ir::kRoundedScoresMaxKeys,
              "attention_as_sdpa rewrites rows of rounded scores the flash kernel holds whole");

auto AttentionGenerator::attention_operand(ir::TensorId t) const -> std::optional<AttentionOperand> {
  if (std::optional<ExternalTensor> e = strided_in_memory(t)) return AttentionOperand{*e, g_.tensor(t).shape[1]};
  // t = reshape(expand(reshape(base))): [B,Hkv,S,D] -> [B,Hkv,1,S,D] -> [B,Hkv,n,S,D] -> [B,Hkv*n,S,D]
  auto producer_here = [&](ir::TensorId x, OpKind kind) -> const ir::Op* {
    const ir::Tensor& tensor = g_.tensor(x);
    if (tensor.producer < 0 || std::find(k_.ops.begin(), k_.ops.end(), tensor.producer) == k_.ops.end()) return nullptr;
    const ir::Op& op = g_.ops[static_cast<size_t>(tensor.producer)];
    return op.kind == kind ? &op : nullptr;
  };
  const ir::Op* merge = producer_here(t, OpKind::Reshape);
  const ir::Op* expand = merge ? producer_here(merge->inputs[0], OpKind::Expand) : nullptr;
  const ir::Op* split = expand ? producer_here(expand->inputs[0], OpKind::Reshape) : nullptr;
  if (!split) return std::nullopt;
  const Shape& base = g_.operand(*split, 0).shape;
  const Shape& five = g_.result(*split).shape;
  const Shape& grouped = g_.result(*expand).shape;
  const Shape& out = g_.tensor(t).shape;
  if (base.size() != 4 || five != Shape{base[0], base[1], 1, base[2], base[3]} ||
      grouped != Shape{base[0], base[1], grouped[2], base[2], base[3]} ||
      out != Shape{base[0], base[1] * grouped[2], base[2], base[3]})
    return std::nullopt;
  std::optional<ExternalTensor> e = strided_in_memory(split->inputs[0]);
  if (!e) return std::nullopt;
  return AttentionOperand{*e, base[1]};
}

// sdpa with q, k, v in memory as one 16-bit type (through views that
// strides express, and k, v through the grouped-query expand), d
// contiguous, rows and heads 16-byte aligned, head dimension a multiple of
// 16 up to 256.
std::optional<std::string> AttentionGenerator::why_not_flash(const ir::Op& op) const {
  if (op.kind != OpKind::Sdpa) return "not an sdpa";
  if (sm_ < 80) return fmt::format("tensor cores need sm_80, the target is sm_{}", sm_);
  const int64_t d = g_.operand(op, 0).shape[3];
  if (d % 16 != 0 || d > 256) return fmt::format("head dimension {}: not a multiple of 16 up to 256", d);
  if (ir::rounds_scores(op.attrs)) {
    const int64_t skv = g_.operand(op, 1).shape[2];
    if (sizes_.symbolic(skv) || d > 128 || skv > whole_row_keys(d))
      return fmt::format("its scores are rounded (as the graph rounds them), which the flash kernel does for rows it holds "
                         "whole: at most {} keys for head dimensions up to 64, {} up to 128; not {}{} keys and head dimension {}",
                         whole_row_keys(64), whole_row_keys(128), sizes_.symbolic(skv) ? "a symbolic " : "", skv, d);
  }
  std::optional<DType> type;
  std::optional<int64_t> kv_heads;
  for (size_t slot = 0; slot < 3; ++slot) {
    const std::string name = fmt::format("{} ('{}')", "qkv"[slot], g_.operand(op, slot).name);
    // q in memory as it is; k and v also as grouped-query heads (attention_operand)
    const std::optional<ExternalTensor> q = slot == 0 ? strided_in_memory(op.inputs[0]) : std::nullopt;
    const std::optional<AttentionOperand> a =
        slot == 0 ? (q ? std::optional<AttentionOperand>(AttentionOperand{*q, 0}) : std::nullopt) : attention_operand(op.inputs[slot]);
    if (!a) return name + " is computed in the kernel or read through views that strides do not express";
    if (slot > 0 && kv_heads && *kv_heads != a->heads) return "k and v have different head counts";
    if (slot > 0) kv_heads = a->heads;
    const std::optional<ExternalTensor> e = a->memory;
    if (e->storage != DType::bf16 && e->storage != DType::f16)
      return fmt::format("{} is stored as {}, not bf16 or f16", name, to_string(e->storage));
    if (type && *type != e->storage)
      return fmt::format("{} is stored as {}, q as {}", name, to_string(e->storage), to_string(*type));
    type = e->storage;
    if (e->strides[3] != 1 || e->strides[0] % 8 != 0 || e->strides[1] % 8 != 0 || e->strides[2] % 8 != 0 || e->offset % 8 != 0)
      return name + " is not contiguous along d with its rows and heads 16-byte aligned";
  }
  return std::nullopt;
}

// The score hook both flash kernels call: scale and mask (and, for the
// mma.sync kernel, causality), for query row `row` of the block's tile
// (q0 + row in the sequence) and key `key`. With scale_in_softmax the
// hook leaves the scale out (the softmax folds it into its exponent).
std::string AttentionGenerator::score_hook(const ir::Op& op, bool causal_in_hook, const std::string& coordinates,
                                           bool scale_in_softmax) {
  const int64_t sq = g_.operand(op, 0).shape[2], skv = g_.operand(op, 1).shape[2];
  std::string out = "auto score = [&](float dot, int row, int key) -> float {\n";
  out += coordinates;
  em_.begin_block();
  const bool bool_mask = op.inputs.size() > 3 && g_.operand(op, 3).dtype == DType::boolean;
  std::string sc = score_of(op, "dot", mask_values(op, {"bi", "hi", "qi", "kj"}), bool_mask, scale_in_softmax);
  if (causal_in_hook && op.attrs.causal) sc = fmt::format("(kj > qi + {} ? -kiln::inf() : {})", sizes_.difference(skv, sq), sc);
  em_.emit(fmt::format("return {};", sc));
  return out + em_.take() + "};\n";
}

std::vector<std::string> AttentionGenerator::mask_values(const ir::Op& op, const Coords& full) {
  std::vector<std::string> out;
  for (size_t slot = 3; slot < op.inputs.size(); ++slot) {
    const ir::Tensor& mask = g_.operand(op, slot);
    Coords mc(mask.shape.size());
    for (size_t dim = 0; dim < mask.shape.size(); ++dim)
      mc[dim] = mask.shape[dim] == 1 ? "0" : full[4 - mask.shape.size() + dim];
    out.push_back(em_.value(op.inputs[slot], mc));
  }
  return out;
}

std::string AttentionGenerator::score_of(const ir::Op& op, const std::string& dot, const std::vector<std::string>& mask_values,
                                         bool bool_mask, bool scale_in_softmax) {
  const DType to = op.attrs.scores_rounded_to;
  const uint8_t rounds = op.attrs.score_roundings;
  auto round_at = [&](uint8_t point, const std::string& x) { return rounds & point ? Emitter::round_as(to, x) : x; };
  std::string sc = round_at(ir::kRoundProduct, dot);
  if (!scale_in_softmax) sc = round_at(ir::kRoundScaled, fmt::format("{} * {}", sc, Emitter::float_literal(op.attrs.scale)));
  if (bool_mask) return fmt::format("({} != 0.0f ? {} : -kiln::inf())", mask_values.at(0), sc);
  for (size_t m = 0; m < mask_values.size(); ++m)
    sc = round_at(m == 0 ? ir::kRoundMasked : ir::kRoundMasked2, fmt::format("({} + {})", sc, mask_values[m]));
  return sc;
}

// The output element `value` (rounded as the result is) and the kernel's
// epilogue on it, into the emitter's open block: each written tensor
// stored, or, given `pairs`, gathered in column pairs where its last
// coordinate is the column d (pair declarations and stores appended to
// `pairs`).
struct AttentionGenerator::PairText {
  std::string decls, stores;
};
void AttentionGenerator::output_element(const ir::Op& op, const std::string& value, PairText* pairs) {
  const ir::Tensor& result = g_.result(op);
  em_.emit(fmt::format("const float out = {};  // {}", em_.rounded(result, value), result.name));
  em_.set_leaf(op.output, "out");
  const Coords oc{"bi", "hi", "qi", "d"};
  for (ir::TensorId t : k_.writes) {
    const ir::Tensor& tensor = g_.tensor(t);
    const Coords tc = write_coords(op.output, oc, t);
    const std::string offset = em_.linearize(tc, tensor.shape), value_t = em_.value(t, tc);
    if (pairs && tc.back() == "d" && storage_dtype(tensor) != DType::boolean && tensor.shape.back() % 2 == 0)
      pairs->stores += gather_column_pair(t, value_t, offset, pairs->decls) + "\n";
    else
      em_.emit(store(t, offset, value_t) + "  // " + tensor.name);
  }
}

// The output loop of both flash kernels: element e of column tile dn of
// `fa`, at query row q0 + A::acc_row(e) and column A::acc_col(dn, e), and
// the kernel's epilogue on it. Elements 2h and 2h + 1 are adjacent columns
// of one row: a written tensor whose last coordinate is the column is
// stored a column pair at a time, the element code run for each column of
// the pair first.
std::string AttentionGenerator::flash_outputs(const ir::Op& op, int64_t head_dim, bool padded) {
  const int64_t sq = g_.operand(op, 0).shape[2];
  std::string body = "#pragma unroll\nfor (int dn = 0; dn < A::kDN; ++dn)\n#pragma unroll\nfor (int half = 0; half < 2; ++half) {\n";
  body += fmt::format("const kiln::i64 qi = q0 + A::acc_row(2 * half);\nif (qi >= {}{}) continue;\n", sizes_(sq),
                      padded ? fmt::format(" || A::acc_col(dn, 0) >= {}LL", head_dim) : "");
  em_.begin_block();
  em_.emit("const int e = 2 * half + c;");
  em_.emit("const kiln::i64 d = A::acc_col(dn, e);");
  PairText pairs;
  output_element(op, "fa.out(dn, e)", &pairs);
  return body + pairs.decls + "#pragma unroll\nfor (int c = 0; c < 2; ++c) {\n" + em_.take() + "}\n" + pairs.stores + "}\n";
}

// A loop over output elements (`open`: its header and the coordinates bi,
// hi, qi, d of the element), the value there, and the kernel's epilogue.
std::string AttentionGenerator::attention_outputs(const ir::Op& op, const std::string& open, const std::string& value) {
  em_.begin_block();
  output_element(op, value, nullptr);
  return open + em_.take() + "}\n";
}

// The first element of (batch bi, head `head`) of an operand in memory.
static std::string head_base(SizeText& sizes, const ExternalTensor& e, const std::string& head) {
  const std::string offset = e.offset ? fmt::format(" + {}", sizes(e.offset)) : "";
  return fmt::format("static_cast<const kiln::u16*>({}){} + bi * {} + {} * {}", e.pointer, offset, sizes(e.strides[0]), head,
                     sizes(e.strides[1]));
}

// ceil(value / by): a literal with `suffix`, or for a symbolic value the
// kernel's i64 expression (an int where the suffix is "").
static std::string ceil_text(SizeText& sizes, int64_t value, int64_t by, const std::string& suffix) {
  if (!sizes.symbolic(value)) return fmt::format("{}{}", (value + by - 1) / by, suffix);
  const std::string q = fmt::format("(({} + {}LL) / {}LL)", sizes(value), by - 1, by);
  return suffix.empty() ? "(int)" + q : q;
}

// Blocks walk (query tile, batch x head) pairs in one grid dimension
// (B x H may exceed 65535), a head's query tiles one after another, so the
// blocks running at once share their heads' K and V in L2 (a head's tiles
// apart, every block read its K and V from memory: 88% of DRAM bandwidth,
// half the speed). Within a head the last query tiles come first: under a
// causal mask they see the most keys, and the longest work starts first.
//
// `tile`: the expression of the block's tile (blockIdx.x, or a persistent
// kernel's loop variable).
// (`sq`: the query rows, q_tiles = ceil(sq / bq) of them.)
static std::string flash_block_coordinates(SizeText& sizes, int64_t sq, int64_t heads, int64_t kv_heads, int bq,
                                           const std::string& tile = "blockIdx.x") {
  const std::string q_tiles = ceil_text(sizes, sq, bq, "LL");
  std::string out = fmt::format("const kiln::i64 pair = {} / {};\n", tile, q_tiles);
  out += fmt::format("const int q0 = (int)({} - 1 - {} % {}) * {};\n", q_tiles, tile, q_tiles, bq);
  out += fmt::format("const kiln::i64 bi = pair / {0}, hi = pair % {0}, kvh = hi / {1}LL;\n", sizes(heads), heads / kv_heads);
  return out;
}

// Key tiles a block visits: a causal mask hides keys past q0 + BQ - 1 + skv - sq.
static std::string flash_kv_tiles(SizeText& sizes, const ir::Op& op, int64_t sq, int64_t skv, int bq, int bkv) {
  if (op.attrs.causal)
    return fmt::format("const int kv_tiles = max(0, min({0}, (int)((q0 + {1} + {2} + {3} - 1) / {3})));\n",
                       ceil_text(sizes, skv, bkv, ""), bq, sizes.difference(skv, sq), bkv);
  return fmt::format("const int kv_tiles = {};\n", ceil_text(sizes, skv, bkv, ""));
}

void AttentionGenerator::flash_attention(const ir::Op& op) {
  const Shape& qs = g_.operand(op, 0).shape;
  const Shape& ks = g_.operand(op, 1).shape;
  const ExternalTensor q = *strided_in_memory(op.inputs[0]);
  const AttentionOperand ka = *attention_operand(op.inputs[1]), va = *attention_operand(op.inputs[2]);
  const ExternalTensor &k = ka.memory, &v = va.memory;
  const int64_t batches = qs[0], heads = qs[1], sq = qs[2], d = qs[3], kv_heads = ka.heads, skv = ks[2];
  // Rounded scores (why_not_flash: a row in one key tile): the probabilities
  // formed whole, the tile the row's keys rounded up to 16 (at least 64).
  const bool whole_rows = ir::rounds_scores(op.attrs);
  const int bq = 64, threads = bq / 16 * 32;
  const int bkv = whole_rows && skv > 64 ? static_cast<int>((skv + 15) / 16 * 16) : d <= 128 ? 64 : 32;
  const int shared_bytes = (bq * static_cast<int>(d + 8) + (whole_rows ? 2 : 4) * bkv * static_cast<int>(d + 8)) * 2;
  KILN_INTERNAL_CHECK(!whole_rows || (!sizes_.symbolic(skv) && skv <= bkv && skv <= whole_row_keys(d)));
  decided(fmt::format("flash attention (mma.sync): {} query rows x {} keys a tile, {} threads{}", bq, bkv, threads,
                      whole_rows ? fmt::format(", scores rounded to {} and each row's probabilities formed whole",
                                               to_string(op.attrs.scores_rounded_to))
                                 : ""));
  const int64_t q_tiles = (sq + bq - 1) / bq;
  std::string body;
  body += fmt::format("typedef kiln::tc::FlashAttention<{}, {}, {}, kiln::tc::{}{}> A;\n", d, bq, bkv,
                      q.storage == DType::bf16 ? "kBf16" : "kF16", whole_rows ? ", true" : "");
  body += fmt::format("static_assert(A::kSharedBytes == {}, \"shared memory size as launched\");\n", shared_bytes);
  body += "extern __shared__ __align__(16) unsigned char kiln_shared[];\n";
  body += flash_block_coordinates(sizes_, sq, heads, kv_heads, bq);
  body += fmt::format("const kiln::u16* q = {};\n", head_base(sizes_, q, "hi"));
  body += fmt::format("const kiln::u16* k = {};\n", head_base(sizes_, k, "kvh"));
  body += fmt::format("const kiln::u16* v = {};\n", head_base(sizes_, v, "kvh"));
  body += fmt::format("const bool aligned = kiln::aligned16({}) && kiln::aligned16({}) && kiln::aligned16({});\n", q.pointer,
                      k.pointer, v.pointer);
  body += flash_kv_tiles(sizes_, op, sq, skv, bq, bkv);
  body += score_hook(op, true, "const kiln::i64 qi = q0 + row, kj = key;\n");
  body += "A fa;\n";
  body += fmt::format("fa.run(reinterpret_cast<kiln::u16*>(kiln_shared), q, {}, q0, {}, k, {}, v, {}, {}, kv_tiles, aligned, score);\n",
                      sizes_(q.strides[2]), sizes_(sq, ""), sizes_(k.strides[2]), sizes_(v.strides[2]), sizes_(skv, ""));
  body += flash_outputs(op, d, false);
  finish(body, threads, "", "#include \"kiln/attention.cuh\"\n");
  out_.shared_bytes = static_cast<uint32_t>(shared_bytes);
  // A block per query tile of each batch and head (a symbolic B or S: a grid rule).
  if (((largest(sq) + bq - 1) / bq) * largest(batches) * heads >= (int64_t{1} << 31)) {
    if (sizes_.symbolic(sq) || sizes_.symbolic(batches))
      throw RangeLimit(fmt::format("{}: 2^31 query tiles or more at the largest sizes", g_.describe(k_.anchor)));
    KILN_USER_CHECK(false, "{}: {} query tiles exceed this attention kernel's grid limit of 2^31 - 1", g_.describe(k_.anchor),
                    q_tiles * batches * heads);
  }
  out_.grid = {static_cast<uint32_t>(std::min<int64_t>(q_tiles * batches * heads, (int64_t{1} << 31) - 1)), 1, 1};
  if (sizes_.symbolic(sq) || sizes_.symbolic(batches))
    out_.grid_rule = GridRule{sizes_.dim(sq).expr(), 1, bq, 1, sizes_.dim(batches * heads).expr()};
}

// ---- flash decoding (templates/kiln/attention_decode.cuh) ------------------------------

// Few query rows per kv head (every query of every head that shares it: at
// most 16) against at least 512 keys: an LLM's decode step. The flash kernels'
// tiles of 64 or 128 query rows would multiply mostly empty rows there.
std::optional<std::string> AttentionGenerator::why_not_decode(const ir::Op& op) const {
  if (std::optional<std::string> why = why_not_flash(op)) return why;
  if (ir::rounds_scores(op.attrs)) return "its scores are rounded (as the graph rounds them): the flash kernel holds their rows whole";
  const Shape& qs = g_.operand(op, 0).shape;
  const int64_t group = qs[1] / attention_operand(op.inputs[1])->heads, keys = g_.operand(op, 1).shape[2];
  if (group * qs[2] > 16) return fmt::format("{} query rows a key head ({} heads x {} queries), over 16", group * qs[2], group, qs[2]);
  if (keys < kDecodeFewestKeys) return fmt::format("{} keys, under {}", keys, kDecodeFewestKeys);
  if (wanted_.tile_m == kFlashQueryRows)
    return fmt::format("a size bucket of fewer than {} keys, which the flash kernels' tiles of query rows take", kDecodeFewestKeys);
  return std::nullopt;
}

void AttentionGenerator::decode_attention(const ir::Op& op) {
  const Shape& qs = g_.operand(op, 0).shape;
  const ExternalTensor q = *strided_in_memory(op.inputs[0]);
  const AttentionOperand ka = *attention_operand(op.inputs[1]), va = *attention_operand(op.inputs[2]);
  const ExternalTensor &k = ka.memory, &v = va.memory;
  const int64_t batches = qs[0], heads = qs[1], sq = qs[2], d = qs[3], kv_heads = ka.heads, skv = g_.operand(op, 1).shape[2];
  const int64_t group = heads / kv_heads, rows = group * sq, chunk = 1024;
  const int64_t units = batches * kv_heads;
  // A symbolic cache length (a decode step over a static cache of any size): the chunks are
  // counted at launch, the partials' workspace holds the most the range has.
  const bool symbolic_keys = sizes_.symbolic(skv);
  const int64_t chunks = (largest(skv) + chunk - 1) / chunk;
  const int groups = static_cast<int>(256 / (d / 4));
  int64_t lanes = 32;  // kiln::decode::lanes_per_key: the scores' lanes a key
  while (lanes > 1 && (d % lanes != 0 || (d / lanes) % 8 != 0 || d / lanes < 16)) lanes /= 2;
  // K and V tiles in flight (3 slots of passes of 256 / lanes keys, at most 16 KiB a slot unless one pass is
  // more), then the key groups' sums in their place.
  const int64_t pass_keys = 256 / lanes, passes = std::max<int64_t>(1, 16384 / (pass_keys * d * 2));
  const int64_t ring_or_sums = std::max<int64_t>(3 * passes * pass_keys * d / 2, groups * rows * d);
  const int shared_bytes = static_cast<int>((ring_or_sums + rows * d + rows * chunk + 2 * rows) * 4);
  decided(fmt::format("flash decoding: {} query rows ({} heads x {} queries) a block, {}{} chunks of {} keys{}", rows, group, sq,
                      symbolic_keys ? "up to " : "", chunks, chunk, chunks > 1 ? " merged by the last block" : ""));
  if (largest(units) * chunks >= (int64_t{1} << 31)) {
    if (sizes_.symbolic(units) || symbolic_keys)
      throw RangeLimit(fmt::format("{}: 2^31 blocks or more at the largest sizes", g_.describe(k_.anchor)));
    KILN_INTERNAL_CHECK(false);
  }
  std::string body;
  body += fmt::format("typedef kiln::decode::DecodeAttention<{}, {}, {}, {}> A;\n", d, rows, chunk, q.storage == DType::bf16 ? 1 : 0);
  body += fmt::format("static_assert(A::kSharedBytes == {}, \"shared memory size as launched\");\n", shared_bytes);
  body += "extern __shared__ __align__(16) float kiln_shared_f32[];\n";
  if (symbolic_keys) body += fmt::format("const int chunks = (int)(({} + {}LL) / {}LL);\n", sizes_(skv), chunk - 1, chunk);
  const std::string chunks_text = symbolic_keys ? "chunks" : std::to_string(chunks);  // (merge_chunks' count)
  const std::string per_unit = symbolic_keys ? chunks_text : chunks_text + "LL";       // (blockIdx.x's divisor)
  body += fmt::format("const kiln::i64 unit = blockIdx.x / {0};\nconst int chunk = (int)(blockIdx.x % {0});\n", per_unit);
  body += fmt::format("const kiln::i64 bi = unit / {0}LL, kvh = unit % {0}LL;\n", kv_heads);
  body += fmt::format("const kiln::u16* k = {};\n", head_base(sizes_, k, "kvh"));
  body += fmt::format("const kiln::u16* v = {};\n", head_base(sizes_, v, "kvh"));
  body += fmt::format("const bool aligned = kiln::aligned16(k) && kiln::aligned16(v);\n");
  // Row r of the block: query r % sq of head kvh * group + r / sq.
  const std::string coordinates = fmt::format("const kiln::i64 hi = kvh * {}LL + row / {}, qi = row % {}, kj = key;\n", group, sq, sq);
  body += "auto q_row = [&](int row) -> const kiln::u16* {\n";
  body += fmt::format("const kiln::i64 hi = kvh * {}LL + row / {}, qi = row % {};\n", group, sq, sq);
  body += fmt::format("return {} + qi * {};\n}};\n", head_base(sizes_, q, "hi"), sizes_(q.strides[2]));
  body += score_hook(op, true, coordinates);
  body += "A a(kiln_shared_f32);\n";
  body += fmt::format("a.run(q_row, k, {}, v, {}, chunk * {}, {}, aligned, score);\n", sizes_(k.strides[2]),
                      sizes_(v.strides[2]), chunk, sizes_(skv, ""));
  if (chunks > 1) {
    const std::string result = g_.result(op).name;
    const std::string partials = workspace_param(result + ".decode_partials", units * chunks * (rows * d + 2 * rows), 0, false);
    const std::string arrived = workspace_param(result + ".decode_chunks_arrived", units, 0, true);
    body += fmt::format("if ({}!a.merge_chunks(static_cast<float*>({}), static_cast<unsigned int*>({}), unit, chunk, {})) return;\n",
                        symbolic_keys ? "chunks > 1 && " : "", partials, arrived, chunks_text);
  }
  std::string open = fmt::format("for (int i = threadIdx.x; i < {}; i += 256) {{\n", rows * d);
  open += fmt::format("const int row = i / {};\n", d);
  open += fmt::format("const kiln::i64 d = i % {0}, hi = kvh * {1}LL + row / {2}, qi = row % {2};\n", d, group, sq);
  body += attention_outputs(op, open, "a.out(row, (int)d)");
  finish(body, 256, "", "#include \"kiln/attention_decode.cuh\"\n");
  out_.shared_bytes = static_cast<uint32_t>(shared_bytes);
  out_.grid = {static_cast<uint32_t>(std::min<int64_t>(units * ((skv + chunk - 1) / chunk), (int64_t{1} << 31) - 1)), 1, 1};
  // A block per chunk of each unit (a symbolic cache length or batch: a grid rule).
  if (symbolic_keys || sizes_.symbolic(units))
    out_.grid_rule = GridRule{sizes_.dim(skv).expr(), 1, chunk, 1, sizes_.dim(units).expr()};
  // A cache length whose range reaches below kDecodeFewestKeys: there the integer graph takes a
  // flash kernel (tiles of query rows), built as a size bucket's variant (H200, 32 query heads over
  // 8 key heads, d128, B1 L300: flash wgmma 0.015 ms, flash decoding 0.035).
  if (symbolic_keys && sizes_.lower(skv) < kDecodeFewestKeys) {
    Tuning flash;
    flash.tile_m = kFlashQueryRows;
    const ir::Dim keys = sizes_.dim(skv);
    out_.other_sizes.push_back({flash, SizeCondition{keys.expr(), {{std::max<int64_t>(keys.lower(), 1), kDecodeFewestKeys - 1}}}});
  }
}

// ---- the Hopper kernel (templates/kiln/attention_wgmma.cuh) ---------------------------

namespace {
constexpr int kHopperSharedLimit = 227 * 1024;  // sm_90's dynamic shared memory per block
}

std::string AttentionGenerator::HopperAttention::to_string() const {
  return fmt::format("flash attention (TMA + wgmma): 128 query rows x {} keys a tile, {} stages, head dim {} as {}, "
                     "2 consumer warpgroups{}, registers 40/232{}",
                     bkv, stages, head_dim, padded_dim, causal ? ", causal tiles skipped, mask on the diagonal only" : "",
                     causal ? ", a block per query tile" : ", persistent");
}

// An operand the copy engine can load: offset a 16-byte multiple, d contiguous, every
// other stride a positive multiple of 16 bytes (or a dimension of 1),
// sizes that fit its 32-bit coordinates. Its map: (d, row, head, batch).
std::optional<AttentionGenerator::HopperAttention::Operand> AttentionGenerator::hopper_operand(const ExternalTensor& e,
                                                                                             const Shape& shape) const {
  // A view that slices (q, k and v of one fused projection) starts its map
  // past the bound pointer, at a 16-byte boundary.
  if (e.offset < 0 || e.offset % 8 != 0 || e.strides[3] != 1) return std::nullopt;
  const std::optional<ir::TensorId> tensor = tensor_behind(e.pointer);
  if (!tensor) return std::nullopt;
  HopperAttention::Operand op{e, *tensor, {}};
  op.map.dtype = e.storage;
  op.map.offset_bytes = static_cast<uint64_t>(e.offset) * 2;
  op.map.rank = 4;
  int64_t packed = shape[3];  // a stride for dimensions of 1 (never stepped along)
  for (int dim = 3; dim >= 0; --dim) {
    if (largest(shape[static_cast<size_t>(dim)]) >= (int64_t{1} << 31)) return std::nullopt;
    op.map.dims[static_cast<size_t>(3 - dim)] = static_cast<uint64_t>(shape[static_cast<size_t>(dim)]);
    if (dim == 3) continue;
    const int64_t stride = shape[static_cast<size_t>(dim)] == 1 ? packed : e.strides[static_cast<size_t>(dim)];
    if (stride <= 0 || stride % 8 != 0 || largest(stride) >= (int64_t{1} << 38)) return std::nullopt;
    op.map.strides[static_cast<size_t>(2 - dim)] = static_cast<uint64_t>(stride * 2);
    packed *= shape[static_cast<size_t>(dim)];
  }
  return op;
}

// The Hopper kernel takes an sdpa the flash kernel takes on sm_90 whose
// operands the copy engine loads (hopper_operand).
std::optional<std::string> AttentionGenerator::why_not_hopper(const ir::Op& op) const {
  if (sm_ != 90) return fmt::format("the Hopper kernel needs sm_90, the target is sm_{}", sm_);
  if (std::optional<std::string> why = why_not_flash(op)) return why;
  if (ir::rounds_scores(op.attrs))
    return "its scores are rounded (as the graph rounds them): the mma.sync flash kernel holds their rows whole, this "
           "kernel streams them";
  const AttentionOperand ka = *attention_operand(op.inputs[1]), va = *attention_operand(op.inputs[2]);
  const Shape& qs = g_.operand(op, 0).shape;
  const Shape kv_shape{qs[0], ka.heads, g_.operand(op, 1).shape[2], qs[3]};
  const ExternalTensor memory[3] = {*strided_in_memory(op.inputs[0]), ka.memory, va.memory};
  for (size_t slot = 0; slot < 3; ++slot)
    if (!hopper_operand(memory[slot], slot == 0 ? qs : kv_shape))
      return fmt::format("{} ('{}') is not a tensor the copy engine loads (offset and strides multiples of 16 bytes)",
                         "qkv"[slot], g_.operand(op, slot).name);
  return std::nullopt;
}

// The Hopper kernel's description for an sdpa it takes (why_not_hopper).
auto AttentionGenerator::hopper_attention(const ir::Op& op) -> HopperAttention {
  const AttentionOperand ka = *attention_operand(op.inputs[1]), va = *attention_operand(op.inputs[2]);
  const Shape& qs = g_.operand(op, 0).shape;
  const Shape& ks = g_.operand(op, 1).shape;
  HopperAttention a;
  a.batches = qs[0], a.heads = qs[1], a.sq = qs[2], a.head_dim = static_cast<int>(qs[3]);
  a.kv_heads = ka.heads, a.skv = ks[2];
  a.causal = op.attrs.causal;
  const Shape kv_shape{a.batches, a.kv_heads, a.skv, a.head_dim};
  std::optional<HopperAttention::Operand> q = hopper_operand(*strided_in_memory(op.inputs[0]), qs);
  std::optional<HopperAttention::Operand> k = hopper_operand(ka.memory, kv_shape), v = hopper_operand(va.memory, kv_shape);
  KILN_INTERNAL_CHECK(q && k && v);
  a.q = *q, a.k = *k, a.v = *v;
  a.type = a.q.memory.storage;
  a.padded_dim = a.head_dim <= 64 ? 64 : a.head_dim <= 128 ? 128 : 256;
  // Key tiles (H100, bf16, --autotune's timings, each against the next best):
  //   head dim 128 without a causal or other mask, at least 2048 keys: 176, two
  //     stages (FlashAttention-3's choice; B4 H32 S4096: 1.844 ms against
  //     1.901 and 1.953 for 128's three stages; at 512 keys, B128 H32 S512:
  //     1.354 against 1.332 for 128);
  //   head dim 256: 80, two stages (B4 H16 S4096: 1.650 ms against 1.793 for 64);
  //   otherwise 128 (causal B4 H32 S4096: 176 measured 1% slower).
  // The widths that fit each padded head dimension, the heuristic's first:
  // the rest are --autotune's alternatives.
  std::vector<int> widths = a.padded_dim == 256 ? std::vector<int>{80, 64}
                            : a.padded_dim == 128 ? std::vector<int>{128, 176, 64}
                                                  : std::vector<int>{128, 64};
  // Not with a mask: its addresses beside 176 keys' S and P spill (ptxas,
  // f16 with an additive mask: 204 bytes; 128 keys: none).
  const bool many_keys = a.padded_dim == 128 && !a.causal && a.skv >= 2048 && op.inputs.size() == 3;
  if (many_keys) std::swap(widths[0], widths[1]);  // 176 first
  std::vector<Tuning> space;
  for (int bkv : widths) space.push_back({bkv, 0, 0, 0, 0});
  a.bkv = choose_tuning(space).tile_n;
  const int q_bytes = 128 * a.padded_dim * 2, kv_bytes = a.bkv * a.padded_dim * 2;
  a.stages = std::min(4, (kHopperSharedLimit - 1024 - q_bytes - 8 * 18) / (2 * kv_bytes));
  KILN_INTERNAL_CHECK(a.stages >= 2);
  a.shared_bytes = 1024 + q_bytes + 2 * a.stages * kv_bytes + (2 + 4 * a.stages) * 8;
  return a;
}

void AttentionGenerator::flash_attention_wgmma(const ir::Op& op, const HopperAttention& a) {
  decided(a.to_string());
  min_blocks_per_sm_ = 1;  // setmaxnreg needs the register cap at entry
  auto map_of = [&](HopperAttention::Operand operand, size_t slot, int rows) {
    operand.map.box = {64, static_cast<uint32_t>(rows), 1, 1, 0};
    return tensor_map_param(operand.tensor, operand.map, g_.operand(op, slot).name);
  };
  const std::string map_q = map_of(a.q, 0, 128), map_k = map_of(a.k, 1, a.bkv), map_v = map_of(a.v, 2, a.bkv);
  const int64_t q_tiles = (a.sq + 127) / 128, tiles = q_tiles * a.batches * a.heads;
  // (A symbolic B or S: the tiles as the kernel computes them, and a grid rule.)
  const bool symbolic = sizes_.symbolic(a.sq) || sizes_.symbolic(a.batches);
  if (((largest(a.sq) + 127) / 128) * largest(a.batches) * a.heads >= (int64_t{1} << 31))
    throw RangeLimit(fmt::format("{}: 2^31 query tiles or more at the largest sizes", g_.describe(k_.anchor)));
  const std::string tiles_text = symbolic ? fmt::format("({} * {})", ceil_text(sizes_, a.sq, 128, "LL"), sizes_(a.batches * a.heads))
                                          : fmt::format("{}LL", tiles);
  // A persistent grid (without a causal mask): each block loops over query
  // tiles (its n-th in `n`), its producer loading the next tile's Q, K and
  // V while the consumers finish this one's output, the ring of K and V
  // slots carried along.
  const std::string tile_loop = fmt::format("for (kiln::i64 tile = blockIdx.x; tile < {}; tile += gridDim.x, ++n) {{\n", tiles_text);
  const std::string tile_coordinates = flash_block_coordinates(sizes_, a.sq, a.heads, a.kv_heads, 128, "tile") +
                                       flash_kv_tiles(sizes_, op, a.sq, a.skv, 128, a.bkv);
  std::string body;
  body += fmt::format("typedef kiln::wg::FlashAttention<{}, {}, {}, kiln::tc::{}, {}> A;\n", a.head_dim, a.bkv, a.stages,
                      a.type == DType::bf16 ? "kBf16" : "kF16", a.causal ? "true" : "false");
  body += fmt::format("static_assert(A::kSharedBytes == {}, \"shared memory size as launched\");\n", a.shared_bytes);
  body += "extern __shared__ __align__(16) unsigned char kiln_shared[];\n";
  body += "unsigned char* smem = A::base(kiln_shared);\n";
  body += "A::init_barriers(smem);\n";
  body += "A::Slots ring;\nint n = 0;\n";
  body += "if (threadIdx.x < 128) {\n";
  body += "kiln::wg::registers_down<40>();\n";
  body += tile_loop + tile_coordinates;
  auto source = [&](const HopperAttention::Operand& o, const std::string& map, const std::string& head, int64_t rows) {
    return fmt::format("{{&{}, {}, {}, (int){}, (int)bi, {}}}", map, head_base(sizes_, o.memory, head), sizes_(o.memory.strides[2]),
                       head, sizes_(rows, ""));
  };
  body += fmt::format("const kiln::wg::AttentionSource q = {};\n", source(a.q, map_q, "hi", a.sq));
  body += fmt::format("const kiln::wg::AttentionSource k = {};\n", source(a.k, map_k, "kvh", a.skv));
  body += fmt::format("const kiln::wg::AttentionSource v = {};\n", source(a.v, map_v, "kvh", a.skv));
  // The maps of pointers that are not 16-byte aligned are all zero: those load element by element.
  body += fmt::format("if (kiln::aligned16({}) && kiln::aligned16({}) && kiln::aligned16({})) "
                      "A::produce_by_copies(smem, ring, n, q, k, v, q0, kv_tiles);\n",
                      a.q.memory.pointer, a.k.memory.pointer, a.v.memory.pointer);
  body += "else A::produce_by_elements(smem, ring, n, q, k, v, q0, kv_tiles);\n";
  body += "}\n} else {\n";
  body += "kiln::wg::registers_up<232>();\n";
  body += "A fa;\n";
  body += tile_loop + tile_coordinates;
  // A positive scale without an additive mask moves into the softmax's
  // exponent (one multiply-add an element instead of a multiply and a
  // multiply-add): the row maxima of the raw dot products are the maxima
  // of the scaled scores, and a masked score stays -inf.
  const bool additive_mask = op.inputs.size() > 3 && g_.operand(op, 3).dtype != DType::boolean;
  const bool scale_in_softmax = op.attrs.scale > 0 && !additive_mask;
  body += score_hook(op, false, "const kiln::i64 qi = q0 + row, kj = key;\n", scale_in_softmax);
  body += fmt::format("fa.consume(smem, ring, n, q0, {}, {}, kv_tiles, {}, {}, score);\n", sizes_(a.sq, ""), sizes_(a.skv, ""),
                      sizes_.difference(a.skv, a.sq, ""),
                      Emitter::float_literal(scale_in_softmax ? op.attrs.scale : 1.0f));
  body += flash_outputs(op, a.head_dim, a.padded_dim != a.head_dim);
  body += "}\n}\n";
  finish(body, 384, "", "#include \"kiln/attention_wgmma.cuh\"\n");
  out_.shared_bytes = static_cast<uint32_t>(a.shared_bytes);
  out_.grid = {static_cast<uint32_t>(std::min<int64_t>(tiles, (int64_t{1} << 31) - 1)), 1, 1};
  if (symbolic)
    out_.grid_rule = GridRule{sizes_.dim(a.sq).expr(), 1, 128, 1, sizes_.dim(a.batches * a.heads).expr()};
  // Under a causal mask tiles differ in work: a block per tile, and the
  // hardware starts each as one ends (blocks striding over the tiles, B4
  // H32 S4096 on H100: 1.21 ms against 1.14).
  out_.persistent_group = a.causal ? 0 : 1;
}

// The exact two-pass kernel's view of its sdpa: the sizes it loops over.
auto AttentionGenerator::exact_attention_shape() const -> ExactAttention {
  ExactAttention a;
  a.last = &g_.ops[static_cast<size_t>(k_.anchor)];
  KILN_INTERNAL_CHECK(a.last->kind == OpKind::Sdpa);
  const Shape& out_shape = g_.result(*a.last).shape;
  a.sq = out_shape[out_shape.size() - 2], a.dv = out_shape.back();
  a.batch_shape = Shape(out_shape.begin(), out_shape.end() - 2);
  a.batches = element_count(a.batch_shape);
  a.skv = g_.operand(*a.last, 1).shape[2];
  a.dq = g_.operand(*a.last, 0).shape[3];
  a.heads_per_kv = g_.operand(*a.last, 0).shape[1] / g_.operand(*a.last, 1).shape[1];
  a.per_thread = static_cast<int>((a.dv + 127) / 128);
  return a;
}

// Emits the score of key `j` for the query row in q_row (batch coordinates
// `bc`); returns the float that holds it.
std::string AttentionGenerator::exact_attention_score(const ExactAttention& a, const Coords& bc, const std::string& j) {
  const ir::Op& last = *a.last;
  em_.emit("float dot = 0.0f;");
  em_.emit(fmt::format("const kiln::i64 kvh = {} / {}LL;", bc[1], a.heads_per_kv));
  em_.emit(fmt::format("for (kiln::i64 e = 0; e < {}LL; ++e) {{", a.dq));
  em_.begin_block();
  em_.emit(fmt::format("dot += q_row[e] * {};", em_.value(last.inputs[1], Coords{bc[0], "kvh", j, "e"})));
  em_.emit("}");
  em_.begin_block();
  const bool bool_mask = last.inputs.size() > 3 && g_.operand(last, 3).dtype == DType::boolean;
  std::string s = score_of(last, "dot", mask_values(last, {bc[0], bc[1], "qi", j}), bool_mask, false);
  if (last.attrs.causal) s = fmt::format("({} > qi + {} ? -kiln::inf() : {})", j, sizes_.difference(a.skv, a.sq), s);
  const std::string v = em_.fresh("s");
  em_.emit(fmt::format("const float {} = {};", v, s));
  return v;
}

// Pass 2: each probability formed as sdpa defines it (rounded to v's type
// where v holds f16/bf16 values), 128 keys at a time through shared
// memory, and p * v.
std::string AttentionGenerator::exact_attention_pass2(const ExactAttention& a, const Coords& bc) {
  const ir::Op& last = *a.last;
  std::string body = fmt::format("float acc[{}] = {{}};\n", a.per_thread);
  body += fmt::format("for (kiln::i64 j0 = 0; j0 < {}; j0 += 128) {{\n", sizes_(a.skv));
  body += "const kiln::i64 j = j0 + threadIdx.x;\nfloat p = 0.0f;\n";
  body += fmt::format("if (j < {}) {{\n", sizes_(a.skv));
  em_.begin_block();
  const std::string s = exact_attention_score(a, bc, "j");
  const std::string p = fmt::format("expf({} - row_max) / row_sum", s);
  em_.emit(fmt::format("p = {};", Emitter::round_as(g_.operand(last, 2).value_dtype(), p)));
  body += em_.take() + "}\n__syncthreads();\np_chunk[threadIdx.x] = p;\n__syncthreads();\n";
  body += fmt::format("for (int jj = 0; jj < 128 && j0 + jj < {}; ++jj) {{\n", sizes_(a.skv));
  body += "const kiln::i64 jk = j0 + jj;\n";
  body += fmt::format("#pragma unroll\nfor (int t = 0; t < {}; ++t) {{\n", a.per_thread);
  body += fmt::format("const kiln::i64 d = threadIdx.x + t * 128;\nif (d >= {}LL) break;\n", a.dv);
  em_.begin_block();
  em_.emit(fmt::format("const kiln::i64 kvh2 = {} / {}LL;", bc[1], a.heads_per_kv));
  em_.emit(fmt::format("acc[t] += p_chunk[jj] * {};", em_.value(last.inputs[2], Coords{bc[0], "kvh2", "jk", "d"})));
  return body + em_.take() + "}\n}\n}\n";
}

// Pass 1 finds the row's max and sum, pass 2 forms each probability as sdpa
// defines it (rounded to v's type) and accumulates p * v.
void AttentionGenerator::exact_attention() {
  const ir::Op& last = g_.ops[static_cast<size_t>(k_.anchor)];
  const ExactAttention a = exact_attention_shape();
  decided(fmt::format("exact two-pass attention: a block per query row, {} output columns a thread", a.per_thread));
  if (sizes_.symbolic(a.dq) || sizes_.symbolic(a.dv))
    throw NotSymbolic(fmt::format("{}: a symbolic head dimension (the exact kernel holds a query row in shared memory)",
                                  g_.describe(k_.anchor)));
  const ir::Tensor& result = g_.result(last);
  KILN_USER_CHECK(a.dq <= 1024, "{}: head dimension {} exceeds this attention kernel's limit of 1024", g_.describe(k_.anchor),
                  a.dq);
  std::string body = fmt::format("__shared__ float q_row[{}];\n__shared__ float p_chunk[128];\n__shared__ float kiln_scratch[32];\n",
                                 a.dq);
  body += fmt::format("for (kiln::i64 line = blockIdx.x; line < {}; line += gridDim.x) {{\n", sizes_(a.batches * a.sq));
  // (An integer S keeps the text it always had, so integer graphs' kernels keep their cache keys.)
  body += sizes_.symbolic(a.sq) ? fmt::format("const kiln::i64 batch = {}, qi = {};\n", sizes_.quotient("line", a.sq),
                                              sizes_.remainder("line", a.sq))
                                : fmt::format("const kiln::i64 batch = line / {0}LL, qi = line % {0}LL;\n", a.sq);
  em_.begin_block();
  const Coords bc = em_.delinearize("batch", a.batch_shape);
  body += em_.take();
  // q row into shared memory.
  body += fmt::format("for (kiln::i64 e = threadIdx.x; e < {}LL; e += blockDim.x) {{\n", a.dq);
  em_.begin_block();
  em_.emit(fmt::format("q_row[e] = {};", em_.value(last.inputs[0], Coords{bc[0], bc[1], "qi", "e"})));
  body += em_.take() + "}\n__syncthreads();\n";
  // Pass 1.
  const std::string neg_inf = "(-kiln::inf())";
  body += "float row_max = " + neg_inf + ";\n";
  body += fmt::format("for (kiln::i64 j = threadIdx.x; j < {}; j += blockDim.x) {{\n", sizes_(a.skv));
  em_.begin_block();
  em_.emit(fmt::format("row_max = kiln::MaxOp::combine(row_max, {});", exact_attention_score(a, bc, "j")));
  body += em_.take() + "}\nrow_max = kiln::block_reduce<kiln::MaxOp>(row_max, kiln_scratch);\n";
  body += "float row_sum = 0.0f;\n";
  body += fmt::format("for (kiln::i64 j = threadIdx.x; j < {}; j += blockDim.x) {{\n", sizes_(a.skv));
  em_.begin_block();
  em_.emit(fmt::format("row_sum += expf({} - row_max);", exact_attention_score(a, bc, "j")));
  body += em_.take() + "}\nrow_sum = kiln::block_reduce<kiln::SumOp>(row_sum, kiln_scratch);\n";
  body += exact_attention_pass2(a, bc);
  // Output and epilogue.
  body += fmt::format("#pragma unroll\nfor (int t = 0; t < {}; ++t) {{\n", a.per_thread);
  body += fmt::format("const kiln::i64 d = threadIdx.x + t * 128;\nif (d >= {}LL) break;\n", a.dv);
  em_.begin_block();
  // A row whose keys are all masked gives zeros (graph-format.md rule 6).
  const std::string o = "(row_max == -kiln::inf() ? 0.0f : acc[t])";
  em_.emit(fmt::format("const float out = {};  // {}", em_.rounded(result, o), result.name));
  em_.set_leaf(last.output, "out");
  Coords oc = bc;
  oc.push_back("qi");
  oc.push_back("d");
  for (ir::TensorId t : k_.writes) {
    const Coords tc = write_coords(last.output, oc, t);
    em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + g_.tensor(t).name);
  }
  body += em_.take() + "}\n__syncthreads();\n}\n";
  finish(body, 128);
  grid_over(a.batches * a.sq, 1, 1);
}

}  // namespace kiln::codegen
