// Normalisation kernels: a row (or group) per block, held in registers when
// it fits (one read, one write), else re-read once per pass.
#include "codegen/norm_generator.h"

namespace kiln::codegen {

// Element j of line `line` of a normalisation -> coordinates of its input.
Coords NormGenerator::norm_element(const ir::Op& norm, const std::string& j) {
  const ir::Tensor& x = g_.operand(norm, 0);
  const ir::KernelParams& p = k_.params;
  const auto axis = static_cast<size_t>(norm.attrs.axis);
  const std::string e = em_.fresh("e");
  if (norm.kind == OpKind::Softmax || norm.kind == OpKind::LogSoftmax) {
    const std::string inner = sizes_(p.inner);
    em_.emit(fmt::format("const kiln::i64 {1} = ((line / {0}) * {2}LL + {3}) * {0} + (line % {0});", inner, e,
                         p.reduced, j));
    return em_.delinearize(e, x.shape);
  }
  if (norm.kind == OpKind::GroupNorm) {
    const int64_t channels = x.shape[axis], per_group = channels / norm.attrs.groups;
    Shape rest;
    for (size_t d = 1; d < x.shape.size(); ++d)
      if (d != axis) rest.push_back(x.shape[d]);
    em_.emit(fmt::format("const kiln::i64 {} = {} / {}LL;", e, j, per_group));
    const Coords rc = em_.delinearize(e, rest);
    Coords c(x.shape.size());
    c[0] = em_.fresh("c");
    em_.emit(fmt::format("const kiln::i64 {} = line / {}LL;", c[0], norm.attrs.groups));
    c[axis] = em_.fresh("c");
    em_.emit(fmt::format("const kiln::i64 {} = (line % {}LL) * {}LL + {} % {}LL;", c[axis], norm.attrs.groups, per_group,
                         j, per_group));
    for (size_t d = 1, r = 0; d < x.shape.size(); ++d)
      if (d != axis) c[d] = rc[r++];
    return c;
  }
  em_.emit(fmt::format("const kiln::i64 {} = line * {}LL + {};", e, p.reduced, j));
  return em_.delinearize(e, x.shape);
}

// The normalised value of `x` with its parameters, named "y", and the
// stores of everything the kernel writes at this element.
std::string NormGenerator::norm_output(const ir::Op& norm, const Coords& c, const std::string& finale, const Chunking* ch,
                                       std::set<ir::TensorId>* chunked) {
  const auto axis = static_cast<size_t>(norm.attrs.axis);
  std::string e = "(" + finale + ")";
  if (norm.kind == OpKind::LayerNorm || norm.kind == OpKind::RmsNorm) {
    const Coords wc(c.begin() + static_cast<ptrdiff_t>(axis), c.end());
    if (norm.inputs.size() > 1) e = fmt::format("({} * {})", e, em_.value(norm.inputs[1], wc));
    if (norm.inputs.size() > 2) e = fmt::format("({} + {})", e, em_.value(norm.inputs[2], wc));
  } else if (norm.kind == OpKind::GroupNorm) {
    const Coords cc{c[axis]};
    if (norm.inputs.size() > 1) e = fmt::format("({} * {})", e, em_.value(norm.inputs[1], cc));
    if (norm.inputs.size() > 2) e = fmt::format("({} + {})", e, em_.value(norm.inputs[2], cc));
  }
  const ir::Tensor& y = g_.result(norm);
  em_.emit(fmt::format("const float y = {};  // {}", em_.rounded(y, e), y.name));
  em_.set_leaf(norm.output, "y");
  std::set<ir::TensorId> none;
  element_writes(norm.output, c, ch ? *ch : Chunking{}, chunked ? *chunked : none);
  return em_.take();
}

auto NormGenerator::norm_recipe(const ir::Op& norm) -> NormRecipe {
  const std::string count = Emitter::float_literal(static_cast<float>(k_.params.reduced));
  const std::string eps = Emitter::float_literal(norm.attrs.eps);
  switch (norm.kind) {
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
      return {{{"kiln::MaxOp::identity()", "kiln::MaxOp", "acc = kiln::MaxOp::combine(acc, x);", "stat0 = acc;"},
               {"0.0f", "kiln::SumOp", "acc += expf(x - stat0);", "stat1 = acc;"}},
              norm.kind == OpKind::Softmax ? "expf(x - stat0) / stat1" : "x - stat0 - logf(stat1)"};
    case OpKind::LayerNorm:
    case OpKind::GroupNorm:
      return {{{"0.0f", "kiln::SumOp", "acc += x;", fmt::format("stat0 = acc / {};", count)},
               {"0.0f", "kiln::SumOp", "acc += (x - stat0) * (x - stat0);",
                fmt::format("stat1 = 1.0f / sqrtf(acc / {} + {});", count, eps)}},
              "(x - stat0) * stat1"};
    case OpKind::RmsNorm:
      return {{{"0.0f", "kiln::SumOp", "acc += x * x;", fmt::format("stat1 = 1.0f / sqrtf(acc / {} + {});", count, eps)}},
              "x * stat1"};
    case OpKind::BatchNorm:  // a per-channel affine map, not a row normalisation
#define KILN_OP(kind, name, family, ...) KILN_CASE_UNLESS(family, Norm, kind)
#include "compiler/ops.def"
#undef KILN_OP
      break;
  }
  KILN_UNREACHABLE("not a normalisation kernel");
}

void NormGenerator::norm() {
  const ir::Op* norm = nullptr;
  for (int32_t oi : k_.ops)
    if (const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
        ir::op_info(op.kind).family == ir::OpFamily::Norm && op.kind != OpKind::BatchNorm)
      norm = &op;
  KILN_INTERNAL_CHECK(norm != nullptr);
  const ir::KernelParams& p = k_.params;
  const int64_t lines = p.outer * p.inner, n = p.reduced;
  if (sizes_.symbolic(n))
    throw NotSymbolic("a normalisation whose row length is symbolic (row lengths are integers in this slice)");
  const NormRecipe recipe = norm_recipe(*norm);
  const bool fits = (p.row == ir::RowStrategy::Warp || p.row == ir::RowStrategy::Block) && n <= 16384;
  if (fits) {
    if (const Chunking ch = row_chunking(*norm); ch.vec > 1) return norm_chunked(*norm, ch);
  } else if (const int cluster = row_cluster(n); cluster > 0) {
    return norm_cluster(*norm, row_chunking(*norm), cluster);
  }
  // Registers bound it: at most 512 threads (128 registers each) holding at
  // most 32 values each (the planner's Block bound, 16384).
  const bool persistent = fits;
  // Rows a warp holds (at most 512 values: 16 a lane) go kRowsOfABlock to a block, a warp each,
  // reduced by shuffles alone: a block of one warp reduced through shared memory and two
  // barriers held at most 32 warps on an SM, each waiting on its row's loads (H200, Swin-T B32's
  // softmax over rows of 49: 0.184 ms, 320 GB/s).
  const bool warp_rows = persistent && n <= 512;
  decided(!persistent ? "two passes over each row"
          : warp_rows ? fmt::format("rows in registers, element by element, {} rows a block (a warp each)", kRowsOfABlock)
                      : "rows in registers, element by element");
  const std::string lane = warp_rows ? "lane" : "threadIdx.x";
  std::string body = warp_rows ? "const int lane = threadIdx.x & 31;\n" : "__shared__ float kiln_scratch[32];\n";
  if (warp_rows)
    body += fmt::format("for (kiln::i64 line = (kiln::i64)blockIdx.x * {0} + (threadIdx.x >> 5); line < {1}; line += (kiln::i64)gridDim.x * {0}) {{\n",
                        kRowsOfABlock, sizes_(lines));
  else
    body += fmt::format("for (kiln::i64 line = blockIdx.x; line < {}; line += gridDim.x) {{\n", sizes_(lines));
  body += "float stat0 = 0.0f, stat1 = 0.0f;\n";
  int threads = kThreads;
  if (persistent) {
    // The row lives in registers: one read, statistics from registers, one write.
    threads = static_cast<int>(std::clamp<int64_t>(std::bit_ceil(static_cast<uint64_t>((n + 15) / 16)), 32, 512));
    const int64_t per = (n + threads - 1) / threads;
    body += fmt::format("float xs[{}];\n#pragma unroll\nfor (int t = 0; t < {}; ++t) {{\n", per, per);
    body += fmt::format("const kiln::i64 j = {} + t * {}LL;\nxs[t] = 0.0f;\nif (j < {}LL) {{\n", lane, threads, n);
    em_.begin_block();
    const Coords c = norm_element(*norm, "j");
    em_.emit(fmt::format("xs[t] = {};", em_.value(norm->inputs[0], c)));
    body += em_.take() + "}\n}\n";
    for (const auto& [init, functor, update, finish] : recipe.passes) {
      body += fmt::format("{{\nfloat acc = {};\n#pragma unroll\nfor (int t = 0; t < {}; ++t) {{\n", init, per);
      body += fmt::format("if ({} + t * {}LL >= {}LL) continue;\nconst float x = xs[t];\n{}\n}}\n",
                          lane, threads, n, update);
      body += warp_rows ? fmt::format("acc = kiln::warp_reduce<{}>(acc);\n{}\n}}\n", functor, finish)
                        : fmt::format("acc = kiln::block_reduce<{}>(acc, kiln_scratch);\n{}\n}}\n", functor, finish);
    }
    body += fmt::format("#pragma unroll\nfor (int t = 0; t < {}; ++t) {{\n", per);
    body += fmt::format("const kiln::i64 j = {} + t * {}LL;\nif (j >= {}LL) continue;\n", lane, threads, n);
    em_.begin_block();
    const Coords c2 = norm_element(*norm, "j");
    em_.emit("const float x = xs[t];");
    em_.set_leaf(norm->inputs[0], "x", c2);
    body += em_.take();
    std::string out = norm_output(*norm, c2, recipe.finale);
    em_.clear_leaf(norm->inputs[0]);
    body += out;
    body += warp_rows ? "}\n}\n" : "}\n__syncthreads();\n}\n";
  } else {
    // Too long to keep on chip: every pass re-reads the row.
    for (const auto& [init, functor, update, finish] : recipe.passes) {
      body += fmt::format("{{\nfloat acc = {};\n", init);
      body += fmt::format("for (kiln::i64 j = threadIdx.x; j < {}LL; j += blockDim.x) {{\n", n);
      em_.begin_block();
      const Coords c = norm_element(*norm, "j");
      em_.emit(fmt::format("const float x = {};", em_.value(norm->inputs[0], c)));
      em_.emit(update);
      body += em_.take() + "}\n";
      body += fmt::format("acc = kiln::block_reduce<{}>(acc, kiln_scratch);\n{}\n}}\n", functor, finish);
    }
    body += fmt::format("for (kiln::i64 j = threadIdx.x; j < {}LL; j += blockDim.x) {{\n", n);
    em_.begin_block();
    const Coords c = norm_element(*norm, "j");
    em_.emit(fmt::format("const float x = {};", em_.value(norm->inputs[0], c)));
    body += em_.take();
    const std::string out = norm_output(*norm, c, recipe.finale);
    body += out;
    body += "}\n}\n";
  }
  if (warp_rows) {
    finish(body, 32 * kRowsOfABlock);
    grid_over(lines, 1, kRowsOfABlock);
    return;
  }
  finish(body, threads);
  grid_over(lines, 1, 1);
}

// Chunks run along the last axis: softmax and layer/rms norms over it,
// group norms of channels-last tensors whose groups are whole chunks.
auto NormGenerator::row_chunking(const ir::Op& norm) -> Chunking {
  const Shape& xs = g_.operand(norm, 0).shape;
  const bool last_axis = static_cast<size_t>(norm.attrs.axis) + 1 == xs.size();
  const bool softmax = norm.kind == OpKind::Softmax || norm.kind == OpKind::LogSoftmax;
  if (!last_axis || (softmax && k_.params.inner != 1)) return {};
  return chunking(xs, norm.kind == OpKind::GroupNorm ? xs.back() / norm.attrs.groups : k_.params.reduced);
}

auto NormGenerator::norm_recipe_in_place(const ir::Op& norm, bool& in_place) -> NormRecipe {
  NormRecipe recipe = norm_recipe(norm);
  in_place = norm.kind == OpKind::Softmax &&
             std::find(k_.writes.begin(), k_.writes.end(), norm.inputs[0]) == k_.writes.end();
  for (int32_t oi : k_.ops) {
    const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
    if (&op != &norm && std::find(op.inputs.begin(), op.inputs.end(), norm.inputs[0]) != op.inputs.end()) in_place = false;
  }
  if (in_place) {
    std::get<2>(recipe.passes[1]) = "x = expf(x - stat0); acc += x;";
    recipe.finale = "x / stat1";
  }
  return recipe;
}

// The chunk of the row starting at element j0 (coordinates once), the
// chunked tensors' loads, and the lane loop; `lane` is the coordinates'
// last entry advanced by v (as is where chunks are single elements).
Coords NormGenerator::norm_chunk_coords(const ir::Op& norm, const Chunking& ch, Coords& base) {
  base = norm_element(norm, "j0");
  Coords c = base;
  if (ch.vec > 1) c.back() = "(" + base.back() + " + v)";
  return c;
}

std::string NormGenerator::norm_chunk_input(const ir::Op& norm, const Chunking& ch, const std::string& slot) {
  const Shape& shape = g_.operand(norm, 0).shape;
  em_.begin_block();
  Coords base;
  const Coords c = norm_chunk_coords(norm, ch, base);
  std::string out = em_.take();
  chunk_sources(ch, shape, c);
  em_.emit(fmt::format("{} = {};", slot, em_.value(norm.inputs[0], c)));
  em_.clear_vector_sources();
  const std::string element = em_.take();
  out += chunk_load_calls(ch, shape, base, element);
  return out + fmt::format("#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\n", ch.vec) + element + "}\n";
}

std::string NormGenerator::norm_chunk_output(const ir::Op& norm, const Chunking& ch, const std::string& slot,
                                             const std::string& finale, bool slot_holds_input) {
  const Shape& shape = g_.operand(norm, 0).shape;
  em_.begin_block();
  Coords base;
  const Coords c = norm_chunk_coords(norm, ch, base);
  const std::string offset = em_.linearize(base, shape);
  std::string out = em_.take();
  chunk_sources(ch, shape, c);
  em_.emit(fmt::format("const float x = {};", slot));
  if (slot_holds_input) em_.set_leaf(norm.inputs[0], "x", c);
  std::set<ir::TensorId> chunked;
  const std::string element = em_.take() + norm_output(norm, c, finale, &ch, &chunked);
  em_.clear_leaf(norm.inputs[0]);
  em_.clear_vector_sources();
  out += chunk_load_calls(ch, shape, base, element) + chunk_store_arrays(ch, chunked);
  out += fmt::format("#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\n", ch.vec) + element + "}\n";
  return out + chunk_store_calls(ch, chunked, offset);
}

int NormGenerator::row_cluster(int64_t n) const {
  constexpr int64_t kTarget = 64 * 1024, kMost = 160 * 1024;  // bytes of a row slice per block
  const int64_t bytes = n * 4;
  if (sm_ < 90) return bytes <= (sm_ == 80 || sm_ == 87 ? kMost : 96 * 1024) ? 1 : 0;  // no clusters: one block
  int cluster = 1;
  while (cluster < 8 && bytes > kTarget * cluster) cluster *= 2;
  return bytes <= kMost * cluster ? cluster : 0;
}

void NormGenerator::norm_cluster(const ir::Op& norm, const Chunking& ch, int cluster) {
  const ir::KernelParams& p = k_.params;
  const int64_t lines = p.outer * p.inner, n = p.reduced, vec = ch.vec, chunks = n / vec;
  const int64_t per_block = (chunks + cluster - 1) / cluster;
  decided(fmt::format("rows in the shared memory of a {}-block cluster, {}-element chunks", cluster, vec));
  bool reuse_exp = false;
  const NormRecipe recipe = norm_recipe_in_place(norm, reuse_exp);
  const int threads = static_cast<int>(std::clamp<int64_t>(std::bit_ceil(static_cast<uint64_t>((per_block + 3) / 4)), 32, 512));
  if (cluster > 1) kernel_attributes_ = fmt::format("__cluster_dims__({}, 1, 1) ", cluster);
  std::string body = "extern __shared__ __align__(16) float kiln_row[];\n__shared__ float kiln_scratch[32];\n";
  body += fmt::format("const bool kiln_vec = {};\n", ch.aligned);
  if (cluster > 1) {
    body += "__shared__ float kiln_partial[2];\nconst unsigned rank = kiln::cluster_rank();\n";
    body += fmt::format("const int first = rank * {}, count = min({}, {} - first);  // this block's chunks\n", per_block,
                        per_block, chunks);
  } else {
    body += fmt::format("const int first = 0, count = {};\n", chunks);
  }
  body += fmt::format("for (kiln::i64 line = blockIdx.x / {0}; line < {1}; line += gridDim.x / {0}) {{\n", cluster,
                      sizes_(lines));
  body += "float stat0 = 0.0f, stat1 = 0.0f;\n";
  // Each thread's chunks: a loop with a trip count known here, unrolled so
  // that its loads are in flight together.
  const int64_t iterations = (per_block + threads - 1) / threads;
  const std::string loop_head = fmt::format("{}\nfor (int it = 0; it < {}; ++it) {{\n"
                                            "const int q = threadIdx.x + it * {};\nif (q >= count) continue;\n",
                                            iterations <= 4 ? "#pragma unroll" : "#pragma unroll 4", iterations, threads);
  const std::string chunk_loop = loop_head + fmt::format("const int j0 = (first + q) * {};\n", vec);
  // Load: this block's slice of the row into shared memory.
  body += chunk_loop;
  body += norm_chunk_input(norm, ch, fmt::format("kiln_row[q * {} + v]", vec)) + "}\n";
  // Statistics: the block's part, then the cluster's.
  for (size_t pass = 0; pass < recipe.passes.size(); ++pass) {
    const auto& [init, functor, update, finish] = recipe.passes[pass];
    body += fmt::format("{{\nfloat acc = {};\n", init) + loop_head;
    body += fmt::format("#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\nfloat& x = kiln_row[q * {} + v];\n"
                        "{}\n}}\n}}\n", vec, vec, update);
    body += fmt::format("acc = kiln::block_reduce<{}>(acc, kiln_scratch);\n", functor);
    if (cluster > 1) {
      body += fmt::format("if (threadIdx.x == 0) kiln_partial[{}] = acc;\nkiln::cluster_sync();\n", pass);
      body += fmt::format("acc = kiln::cluster_load(&kiln_partial[{}], 0);\n", pass);
      body += fmt::format("for (unsigned r = 1; r < {}; ++r) acc = {}::combine(acc, kiln::cluster_load(&kiln_partial[{}], r));\n",
                          cluster, functor, pass);
    }
    body += fmt::format("{}\n}}\n", finish);
  }
  // Output.
  body += chunk_loop;
  body += norm_chunk_output(norm, ch, fmt::format("kiln_row[q * {} + v]", vec), recipe.finale, !reuse_exp) + "}\n";
  // The partials of this line are read by every block before the next line overwrites them.
  body += cluster > 1 ? "kiln::cluster_sync();\n}\n" : "}\n";
  finish(body, threads);
  out_.shared_bytes = static_cast<uint32_t>(per_block * vec * 4);
  grid_over(lines, 1, 1, static_cast<uint32_t>(cluster));
}

// The row in registers, V elements per chunk: each thread holds `per`
// chunks (chunk t of a thread starts at element (threadIdx.x + t * threads) * V
// of the row); loads and stores of 16 bytes; coordinates once per chunk.
void NormGenerator::norm_chunked(const ir::Op& norm, const Chunking& ch) {
  const ir::KernelParams& p = k_.params;
  const int64_t lines = p.outer * p.inner, n = p.reduced, vec = ch.vec, chunks = n / vec;
  bool reuse_exp = false;
  const NormRecipe recipe = norm_recipe_in_place(norm, reuse_exp);
  // A row one warp holds (at most kWarpRowChunks chunks a lane: 768 and 1024 wide rows of
  // 16-bit values, 3 and 4 chunks): kRowsOfABlock rows a block, a warp each (norm()), reduced
  // by shuffles alone. Longer rows: a block each, about two chunks per thread (measured on H100
  // against one and four: 16-byte loads of two chunks in flight per thread, at most 512
  // threads), reduced through shared memory. (H200, `kiln bench`, 4096 rows: LayerNorm over 768
  // 0.0101 -> 0.0079 ms, 1024 0.0104 -> 0.0092, RMSNorm over 896 0.0090 -> 0.0081, against a
  // block of 64 threads a row (two chunks each, the second half idle, a barrier a statistic);
  // softmax over 1024 0.0101 -> 0.0104.)
  const bool warp_rows = chunks <= 32 * kWarpRowChunks;
  const int threads =
      warp_rows ? 32 : static_cast<int>(std::clamp<int64_t>(std::bit_ceil(static_cast<uint64_t>((chunks + 1) / 2)), 32, 512));
  const int64_t per = (chunks + threads - 1) / threads;
  decided(warp_rows ? fmt::format("rows in registers, {}-element chunks, {} rows a block (a warp each)", vec, kRowsOfABlock)
                    : fmt::format("rows in registers, {}-element chunks", vec));
  const std::string lane = warp_rows ? "lane" : "threadIdx.x";
  const std::string chunk_start = fmt::format("const int j0 = ({} + t * {}) * {};", lane, threads, vec);
  std::string body = warp_rows ? "const int lane = threadIdx.x & 31;\n" : "__shared__ float kiln_scratch[32];\n";
  body += fmt::format("const bool kiln_vec = {};\n", ch.aligned);
  if (warp_rows)
    body += fmt::format("for (kiln::i64 line = (kiln::i64)blockIdx.x * {0} + (threadIdx.x >> 5); line < {1}; line += (kiln::i64)gridDim.x * {0}) {{\n",
                        kRowsOfABlock, sizes_(lines));
  else
    body += fmt::format("for (kiln::i64 line = blockIdx.x; line < {}; line += gridDim.x) {{\n", sizes_(lines));
  body += "float stat0 = 0.0f, stat1 = 0.0f;\n";
  body += fmt::format("float xs[{}];\n", per * vec);
  // Load: one chunk of every chunked input, then x at each of its elements.
  body += fmt::format("#pragma unroll\nfor (int t = 0; t < {}; ++t) {{\n{}\n", per, chunk_start);
  body += fmt::format("if (j0 >= {}) {{\n#pragma unroll\nfor (int v = 0; v < {}; ++v) xs[t * {} + v] = 0.0f;\n"
                      "continue;\n}}\n", n, vec, vec);
  body += norm_chunk_input(norm, ch, fmt::format("xs[t * {} + v]", vec)) + "}\n";
  // Statistics from registers.
  for (const auto& [init, functor, update, finish] : recipe.passes) {
    body += fmt::format("{{\nfloat acc = {};\n#pragma unroll\nfor (int t = 0; t < {}; ++t) {{\n", init, per);
    body += fmt::format("if (({} + t * {}) * {} >= {}) continue;\n", lane, threads, vec, n);
    body += fmt::format("#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\nfloat& x = xs[t * {} + v];\n"
                        "{}\n}}\n}}\n", vec, vec, update);
    body += warp_rows ? fmt::format("acc = kiln::warp_reduce<{}>(acc);\n{}\n}}\n", functor, finish)
                      : fmt::format("acc = kiln::block_reduce<{}>(acc, kiln_scratch);\n{}\n}}\n", functor, finish);
  }
  // Output: parameters a chunk at a time, every write of the element.
  body += fmt::format("#pragma unroll\nfor (int t = 0; t < {}; ++t) {{\n{}\nif (j0 >= {}) continue;\n", per,
                      chunk_start, n);
  body += norm_chunk_output(norm, ch, fmt::format("xs[t * {} + v]", vec), recipe.finale, !reuse_exp);
  if (warp_rows) {
    body += "}\n}\n";
    finish(body, 32 * kRowsOfABlock);
    grid_over(lines, 1, kRowsOfABlock);
    return;
  }
  body += "}\n__syncthreads();\n}\n";
  finish(body, threads);
  grid_over(lines, 1, 1);
}

}  // namespace kiln::codegen
