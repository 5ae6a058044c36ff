// Reduction kernels: a block per kept element (split over blocks for few
// long rows), column reductions for outer axes, pools, and the row
// statistics of a normalisation that a matmul applies in its prologue.
#include "codegen/reduction_generator.h"

namespace kiln::codegen {

// One element of the reduced domain at `full`: every accumulator
// (`acc_format` of reduction j) combines its input there, and the tensors
// written before the reductions are stored at the same element.
void ReductionGenerator::reduction_step(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post,
                                   const Coords& full, const Shape& domain, const std::string& acc_format) {
  for (size_t j = 0; j < reduces.size(); ++j) {
    const std::string acc = fmt::format(fmt::runtime(acc_format), j);
    em_.emit(fmt::format("{0} = {1}::combine({0}, {2});", acc, reduce_functor(reduces[j]->kind),
                         em_.value(reduces[j]->inputs[0], full)));
  }
  for (ir::TensorId t : k_.writes) {
    if (post.count(t)) continue;
    const Coords tc = em_.same_element(full, domain, g_.tensor(t).shape);
    em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + g_.tensor(t).name);
  }
}

// The finished reductions (accumulator `acc_format` of reduction j, the
// kept element's linear index in `k`) and every write after them: means
// divided, results rounded as the graph says, post-reduction ops at the
// matching elements.
std::string ReductionGenerator::reduction_results(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post,
                              int64_t reduced, const std::string& acc_format) {
  for (size_t j = 0; j < reduces.size(); ++j) {
    const ir::Tensor& out = g_.result(*reduces[j]);
    std::string v = fmt::format(fmt::runtime(acc_format), j);
    if (reduces[j]->kind == OpKind::ReduceMean) v = fmt::format("({} / {})", v, Emitter::float_literal(static_cast<float>(reduced)));
    const std::string name = em_.fresh("r");
    em_.emit(fmt::format("const float {} = {};  // {}", name, em_.rounded(out, v), out.name));
    em_.set_leaf(reduces[j]->output, name);
  }
  for (ir::TensorId t : k_.writes) {
    if (!post.count(t)) continue;
    std::optional<Coords> tc;
    for (const ir::Op* r : reduces)
      if (!tc) tc = forward(r->output, t, em_.delinearize("k", g_.result(*r).shape));
    KILN_INTERNAL_CHECK(tc.has_value());
    em_.emit(store(t, em_.linearize(*tc, g_.tensor(t).shape), em_.value(t, *tc)) + "  // " + g_.tensor(t).name);
  }
  return em_.take();
}

// The body of a row reduction's loop over the reduced elements r (kept
// coordinates `kc` declared): each element, or with a chunking (`ch.vec` >
// 1) V elements of the last axis from 16-byte loads, into the accumulators.
std::string ReductionGenerator::row_reduction_body(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post,
                                              const Shape& d, const Coords& kc, const Shape& reduced_shape, const Chunking& ch) {
  const auto& axes = reduces.front()->attrs.axes;
  em_.begin_block();
  const Coords rc = em_.delinearize("r", reduced_shape);
  Coords full(d.size());
  for (size_t i = 0, ki = 0, ri = 0; i < d.size(); ++i)
    full[i] = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i)) ? rc[ri++] : kc[ki++];
  if (ch.vec == 1) {
    reduction_step(reduces, post, full, d, "acc{}");
    return em_.take() + "}\n";
  }
  std::string body = em_.take();
  Coords c = full;
  c.back() = "(" + full.back() + " + v)";
  chunk_sources(ch, d, c);
  reduction_step(reduces, post, c, d, "acc{}");
  em_.clear_vector_sources();
  const std::string element = em_.take();
  body += chunk_load_calls(ch, d, full, element);
  return body + fmt::format("#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\n", ch.vec) + element +
         "}\n}\n";
}

// The block's accumulators combined; split (`splits` > 1), each block's
// partials combined atomically and the last block reading them back. Opens
// the block in which the results are finished.
std::string ReductionGenerator::row_reduction_combine(const std::vector<const ir::Op*>& reduces, const std::vector<std::string>& partials,
                                                 const std::string& counter, int64_t kept, int64_t splits) {
  std::string body;
  for (size_t j = 0; j < reduces.size(); ++j)
    body += fmt::format("acc{0} = kiln::block_reduce<{1}>(acc{0}, kiln_scratch);\n", j, reduce_functor(reduces[j]->kind));
  if (splits == 1) return body + "if (threadIdx.x == 0) {\n";
  body += "if (threadIdx.x == 0) {\n";
  for (size_t j = 0; j < reduces.size(); ++j)
    body += fmt::format("kiln::atomic_combine({}(), static_cast<float*>({}) + k, acc{});\n",
                        reduce_functor(reduces[j]->kind), partials[j], j);
  body += "}\n}\n";
  body += "__threadfence();\n__syncthreads();\n__shared__ bool kiln_last;\n";
  body += fmt::format("if (threadIdx.x == 0) kiln_last = atomicAdd(static_cast<unsigned int*>({}), 1u) == "
                      "gridDim.x * gridDim.y - 1;\n", counter);
  body += "__syncthreads();\nif (!kiln_last) return;\n__threadfence();\n";
  body += fmt::format("for (kiln::i64 k = threadIdx.x; k < {}LL; k += blockDim.x) {{\n", kept);
  for (size_t j = 0; j < reduces.size(); ++j)
    body += fmt::format("const float acc{} = static_cast<volatile float*>({})[k];\n", j, partials[j]);
  return body + "{\n";
}

void ReductionGenerator::reduction() {
  const auto reduces = ops_of({ir::OpFamily::Reduce});
  const auto pools = ops_of({ir::OpFamily::Pool});
  if (!pools.empty()) return pooling(*pools.front());
  if (k_.params.holds_rows) return held_rows();
  for (int32_t oi : k_.ops)  // the row statistics of a split normalisation
    if (const ir::Op& op = g_.ops[static_cast<size_t>(oi)]; op.kind == OpKind::LayerNorm || op.kind == OpKind::RmsNorm)
      return norm_statistics(op);
  KILN_INTERNAL_CHECK(!reduces.empty());
  const ir::Op& first = *reduces.front();
  const Shape& d = g_.operand(first, 0).shape;
  const auto& axes = first.attrs.axes;
  Shape kept_shape, reduced_shape;
  for (size_t i = 0; i < d.size(); ++i)
    (std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i)) ? reduced_shape : kept_shape).push_back(d[i]);
  const int64_t kept = element_count(kept_shape), reduced = element_count(reduced_shape);
  if (sizes_.symbolic(reduced)) throw NotSymbolic("a reduction over a symbolic extent (reduced extents are integers so far)");
  std::set<ir::TensorId> reduce_outs;
  for (const ir::Op* r : reduces) reduce_outs.insert(r->output);
  const std::set<ir::TensorId> post = downstream_of(reduce_outs);
  const bool contiguous_axes = axes.back() - axes.front() + 1 == static_cast<int64_t>(axes.size());
  int64_t inner = 1;
  for (size_t i = static_cast<size_t>(axes.back()) + 1; i < d.size(); ++i) inner *= d[i];
  if (contiguous_axes && inner >= 32) {
    return column_reduction(reduces, post, d, kept_shape, reduced_shape, inner);
  }

  // Few kept elements over a long axis: split the axis over gridDim.y
  // blocks, combine their partials atomically, and let the last block
  // finish (post-reduction ops included). A symbolic number of rows is not
  // split (a block per row is right at every size).
  const int64_t splits = !sizes_.symbolic(kept) && kept < 256 && reduced >= 65536
                             ? std::min<int64_t>((512 + kept - 1) / kept, reduced / 16384)
                             : 1;
  // Reduced axes that end the shape are read a chunk at a time.
  const Chunking ch = contiguous_axes && inner == 1 ? chunking(d, d.back()) : Chunking{};
  const int64_t vec = ch.vec;
  decided(fmt::format("rows: a block per kept element, {}-element chunks, {} splits", vec, splits));
  const int64_t slice = (reduced + splits * vec - 1) / (splits * vec) * vec;
  std::vector<std::string> partials;
  std::string counter;
  if (splits > 1) {
    for (const ir::Op* r : reduces)
      partials.push_back(workspace_param(g_.result(*r).name + ".partial", kept, reduce_identity_bits(r->kind), true));
    counter = workspace_param(g_.result(first).name + ".splits_done", 1, 0, true);
  }
  std::string body = "__shared__ float kiln_scratch[32];\n";
  if (vec > 1) body += fmt::format("const bool kiln_vec = {};\n", ch.aligned);
  body += fmt::format("for (kiln::i64 k = blockIdx.x; k < {}; k += gridDim.x) {{\n", sizes_(kept));
  const Coords kc = em_.delinearize("k", kept_shape);
  for (size_t j = 0; j < reduces.size(); ++j)
    em_.emit(fmt::format("float acc{} = {}::identity();  // {}", j, reduce_functor(reduces[j]->kind),
                         g_.result(*reduces[j]).name));
  body += em_.take();
  body += vec > 1 ? "#pragma unroll 4\n" : "";
  if (splits > 1)
    body += fmt::format("for (kiln::i64 r = blockIdx.y * {0}LL + threadIdx.x * {2}; r < min((kiln::i64)(blockIdx.y + 1) * {0}LL, {1}LL); "
                        "r += blockDim.x * {2}) {{\n", slice, reduced, vec);
  else
    body += fmt::format("for (kiln::i64 r = threadIdx.x * {1}; r < {0}LL; r += blockDim.x * {1}) {{\n", reduced, vec);
  body += row_reduction_body(reduces, post, d, kc, reduced_shape, ch);
  body += row_reduction_combine(reduces, partials, counter, kept, splits);
  em_.begin_block();
  body += reduction_results(reduces, post, reduced, "acc{}") + "}\n}\n";
  finish(body, kThreads);
  grid_over(kept, 1, 1);
  out_.grid[1] = static_cast<uint32_t>(splits);
}

// Reductions over axes outside a contiguous inner block of >= 32
// elements ([outer, reduced, inner], e.g. per-channel statistics of NHWC):
// threads own V adjacent inner columns (16-byte loads where the inner
// block is the last axis and the pointers are aligned), several row lanes
// per block, the reduced axis split over gridDim.y when the columns alone
// would not fill the GPU. Split partials are combined atomically; the last
// block of each column block finishes its columns (post-reduction ops
// included).
// How the column reduction lays its work out: 16-byte loads of the tensors
// read at the reduction's own index where the inner block is the last axis
// and its width allows, columns per block a power of two from 8 to 256 so
// that row lanes x columns is exactly the block, and splits of the reduced
// axis over gridDim.y until about 1024 blocks run.
auto ReductionGenerator::column_layout(const ir::Op& first, const Shape& d, const Shape& kept_shape, const Shape& reduced_shape,
                                  int64_t inner) const -> ColumnLayout {
  ColumnLayout c;
  c.inner = inner, c.kept = element_count(kept_shape), c.reduced = element_count(reduced_shape);
  int narrowest = 4;
  for (const auto& [id, e] : ordered_externals()) {
    const ir::Tensor& t = g_.tensor(id);
    if (t.shape == d && e.strides == contiguous_strides(d) && e.storage != DType::boolean) {
      c.vector_reads.push_back(id);
      narrowest = std::min(narrowest, byte_size(e.storage));
    }
  }
  const bool inner_is_last = first.attrs.axes.back() + 2 == static_cast<int64_t>(d.size());
  c.vec = !c.vector_reads.empty() && inner_is_last && inner % (16 / narrowest) == 0 ? 16 / narrowest : 1;
  const int64_t vec_cols = inner / c.vec;  // threads' column groups per outer index
  c.cols = static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(vec_cols))), 8, 256));
  c.lanes = 256 / c.cols;
  c.per_outer = (vec_cols + c.cols - 1) / c.cols, c.col_blocks = c.kept / inner * c.per_outer;
  // (A symbolic number of columns is not split: no workspace, one source for every size.)
  c.splits = sizes_.symbolic(c.col_blocks)
                 ? 1
                 : std::clamp<int64_t>((1024 + c.col_blocks - 1) / c.col_blocks, 1, std::max<int64_t>(1, c.reduced / (16 * c.lanes)));
  c.slice = (c.reduced + c.splits - 1) / c.splits;
  return c;
}

// The loop over a row lane's rows; `vectors`: with 16-byte loads.
std::string ReductionGenerator::column_row_loop(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post,
                                           const Shape& d, const Shape& kept_shape, const Shape& reduced_shape,
                                           const ColumnLayout& c, bool vectors) {
  const auto& axes = reduces.front()->attrs.axes;
  std::string out = fmt::format("#pragma unroll 4\nfor (kiln::i64 r = blockIdx.y * {}LL + lane; r < r_end; r += {}) {{\n",
                                c.slice, c.lanes);
  em_.begin_block();
  const Coords rc = em_.delinearize("r", reduced_shape);
  auto full_at = [&](const std::string& k) {
    const Coords kc = em_.delinearize(k, kept_shape);
    Coords full(d.size());
    for (size_t i = 0, ki = 0, ri = 0; i < d.size(); ++i)
      full[i] = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i)) ? rc[ri++] : kc[ki++];
    return full;
  };
  if (vectors) {
    const Coords base = full_at("k0");
    for (ir::TensorId t : c.vector_reads) {
      const ExternalTensor& e = ext_.at(t);
      em_.emit(fmt::format("float {}[{}];  // {}", chunk_in(t), c.vec, g_.tensor(t).name));
      em_.emit(fmt::format("kiln::load_vec_{}<{}>({}, {}, {});", to_string(e.storage), c.vec, e.pointer, em_.linearize(base, d), chunk_in(t)));
    }
    out += em_.take();
  }
  out += fmt::format("#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\nconst kiln::i64 k = k0 + v;\n", c.vec);
  em_.begin_block();
  const Coords full = full_at("k");
  if (vectors)
    for (ir::TensorId t : c.vector_reads) em_.set_vector_source(t, full, chunk_in(t), "v");
  reduction_step(reduces, post, full, d, "acc{}[v]");
  em_.clear_vector_sources();
  return out + em_.take() + "}\n}\n";
}

// After the rows: row lanes combined into lane 0, then the columns finished
// (post-reduction ops included), by every block or, split, by the last of
// each column block's splits after combining their partials atomically.
std::string ReductionGenerator::column_finish(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post,
                                         const ColumnLayout& c, const std::vector<std::string>& partials,
                                         const std::string& counter) {
  std::string body = fmt::format("#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\n", c.vec);
  for (size_t j = 0; j < reduces.size(); ++j) body += fmt::format("kiln_lanes[{} + v][lane][col] = acc{}[v];\n", j * c.vec, j);
  body += "}\n__syncthreads();\n";
  body += fmt::format("if (lane == 0 && c < {}LL) {{\n#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\n", c.inner, c.vec);
  for (size_t j = 0; j < reduces.size(); ++j)
    body += fmt::format("for (int l = 1; l < {}; ++l) acc{}[v] = {}::combine(acc{}[v], kiln_lanes[{} + v][l][col]);\n", c.lanes,
                        j, reduce_functor(reduces[j]->kind), j, j * c.vec);
  auto finish_columns = [&] {
    em_.begin_block();
    em_.emit("const kiln::i64 k = k0 + v;");
    return reduction_results(reduces, post, c.reduced, "acc{}[v]");
  };
  if (c.splits == 1) return body + finish_columns() + "}\n}\n";
  for (size_t j = 0; j < reduces.size(); ++j)
    body += fmt::format("kiln::atomic_combine({}(), static_cast<float*>({}) + k0 + v, acc{}[v]);\n",
                        reduce_functor(reduces[j]->kind), partials[j], j);
  body += "}\n}\n__threadfence();\n__syncthreads();\n__shared__ bool kiln_last;\n";
  body += fmt::format("if (threadIdx.x == 0) kiln_last = atomicAdd(static_cast<unsigned int*>({}) + blockIdx.x, 1u) == gridDim.y - 1;\n",
                      counter);
  body += "__syncthreads();\nif (!kiln_last) return;\n__threadfence();\n";
  body += fmt::format("if (lane == 0 && c < {}LL) {{\n#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\n", c.inner, c.vec);
  for (size_t j = 0; j < reduces.size(); ++j)
    body += fmt::format("acc{0}[v] = static_cast<volatile float*>({1})[k0 + v];\n", j, partials[j]);
  return body + finish_columns() + "}\n}\n";
}

void ReductionGenerator::column_reduction(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post, const Shape& d,
                      const Shape& kept_shape, const Shape& reduced_shape, int64_t inner) {
  const ir::Op& first = *reduces.front();
  const ColumnLayout c = column_layout(first, d, kept_shape, reduced_shape, inner);
  decided(fmt::format("columns: a block of {} column threads ({}-element vectors) x {} row lanes, {} splits", c.cols, c.vec,
                      c.lanes, c.splits));
  KILN_USER_CHECK(c.col_blocks < (int64_t{1} << 31) && c.splits <= 65535, "{}: too many column blocks for this reduction kernel",
                  g_.describe(static_cast<int32_t>(k_.ops.front())));
  std::vector<std::string> partials;
  std::string counter;
  if (c.splits > 1) {
    for (const ir::Op* r : reduces)
      partials.push_back(workspace_param(g_.result(*r).name + ".partial", c.kept, reduce_identity_bits(r->kind), true));
    counter = workspace_param(g_.result(first).name + ".splits_done", c.col_blocks, 0, true);
  }
  std::string body = fmt::format("__shared__ float kiln_lanes[{}][{}][{}];\n", reduces.size() * c.vec, c.lanes, c.cols);
  body += fmt::format("const int col = threadIdx.x % {}, lane = threadIdx.x / {};\n", c.cols, c.cols);
  body += fmt::format("const kiln::i64 a = blockIdx.x / {0}LL, c = ((blockIdx.x % {0}LL) * {1} + col) * {2};\n", c.per_outer,
                      c.cols, c.vec);
  body += fmt::format("const kiln::i64 k0 = a * {}LL + c;\n", inner);
  for (size_t j = 0; j < reduces.size(); ++j)
    body += fmt::format("float acc{}[{}];  // {}\n#pragma unroll\nfor (int v = 0; v < {}; ++v) acc{}[v] = {}::identity();\n", j,
                        c.vec, g_.result(*reduces[j]).name, c.vec, j, reduce_functor(reduces[j]->kind));
  body += fmt::format("if (c < {}LL) {{\n", inner);
  body += fmt::format("const kiln::i64 r_end = min((kiln::i64)(blockIdx.y + 1) * {0}LL, {1}LL);\n", c.slice, c.reduced);
  if (c.vec > 1) {
    std::string aligned;
    for (ir::TensorId t : c.vector_reads)
      aligned += (aligned.empty() ? "" : " && ") + fmt::format("kiln::aligned16({})", ext_.at(t).pointer);
    const std::string vectors = column_row_loop(reduces, post, d, kept_shape, reduced_shape, c, true);
    const std::string scalars = column_row_loop(reduces, post, d, kept_shape, reduced_shape, c, false);
    body += fmt::format("if ({}) {{\n", aligned) + vectors + "} else {\n" + scalars + "}\n}\n";
  } else {
    body += column_row_loop(reduces, post, d, kept_shape, reduced_shape, c, false) + "}\n";
  }
  body += column_finish(reduces, post, c, partials, counter);
  finish(body, 256);
  out_.grid = {1, static_cast<uint32_t>(c.splits), 1};
  exact_grid(c.col_blocks, fmt::format("{}: a column reduction of more than 2^20 column blocks",
                                       g_.describe(static_cast<int32_t>(k_.ops.front()))));
}

// Channels-last pooling of a tensor in memory, 16 bytes of channels per
// thread: each window position one vector load, each written tensor of the
// pool's shape one vector store (H100, ResNet-50's 3x3 max pool over 32 x
// 112 x 112 x 64 bf16: a thread per element with 2-byte accesses took 55 us
// for 64 MB). Empty when the kernel does not qualify; the vector path runs
// where the pointers are aligned (`aligned`), the element path otherwise.
std::string ReductionGenerator::pooling_vectors(const ir::Op& pool, std::string& aligned) {
  const ir::Tensor& in = g_.operand(pool, 0);
  const ir::Tensor& out = g_.result(pool);
  const ir::Attributes& a = pool.attrs;
  auto source = ext_.find(pool.inputs[0]);
  if (a.layout != ir::Layout::NHWC || source == ext_.end() || source->second.offset != 0) return "";
  const ExternalTensor& x = source->second;
  const int vector = 16 / byte_size(x.storage);
  const int64_t channels = in.shape[3];
  if (x.storage == DType::boolean || channels % vector != 0 || x.strides[3] != 1) return "";
  for (int d = 0; d < 3; ++d)
    if (x.strides[d] % vector != 0) return "";
  std::vector<ir::TensorId> written;  // after the pool, over its elements: stored as vectors
  const std::set<ir::TensorId> post = downstream_of({pool.output});
  for (ir::TensorId t : k_.writes) {
    if (!post.count(t)) continue;
    const DType storage = storage_dtype(g_.tensor(t));
    if (g_.tensor(t).shape != out.shape || storage == DType::boolean || 16 / byte_size(storage) > vector ||
        vector % (16 / byte_size(storage)) != 0)
      return "";
    written.push_back(t);
  }
  const bool is_max = pool.kind == OpKind::MaxPool2d;
  decided(fmt::format("{} channels per thread, 16-byte loads", vector));
  aligned = "kiln::aligned16(" + x.pointer + ")";
  for (ir::TensorId t : written) aligned += " && kiln::aligned16(" + writes_.at(t) + ")";
  const int64_t vectors = element_count(out.shape) / vector;
  std::string body = fmt::format("for (kiln::i64 i = (kiln::i64)blockIdx.x * blockDim.x + threadIdx.x; i < {}; "
                                 "i += (kiln::i64)gridDim.x * blockDim.x) {{\n", sizes_(vectors));
  em_.begin_block();
  em_.emit(fmt::format("const kiln::i64 first = i * {};", vector));
  const Coords oc = em_.delinearize("first", out.shape);
  em_.emit(fmt::format("float acc[{}];\n#pragma unroll\nfor (int v = 0; v < {}; ++v) acc[v] = {};", vector, vector,
                       is_max ? "kiln::MaxOp::identity()" : "0.0f"));
  em_.emit("int inside = 0;");
  body += em_.take();
  body += fmt::format("for (int dr = 0; dr < {}; ++dr) for (int ds = 0; ds < {}; ++ds) {{\n", a.kernel[0], a.kernel[1]);
  body += fmt::format("const kiln::i64 hi = {} * {}LL - {}LL + dr, wi = {} * {}LL - {}LL + ds;\n", oc[1], a.stride[0],
                      a.padding[0], oc[2], a.stride[1], a.padding[1]);
  body += fmt::format("if (hi < 0 || hi >= {}LL || wi < 0 || wi >= {}LL) continue;\n", in.shape[1], in.shape[2]);
  body += fmt::format("float xv[{}];\nkiln::load_vec_{}<{}>({}, {}, xv);  // {}\n", vector, to_string(x.storage), vector,
                      x.pointer, em_.offset_of(x, in.shape, {oc[0], "hi", "wi", oc[3]}), in.name);
  body += fmt::format("#pragma unroll\nfor (int v = 0; v < {}; ++v) acc[v] = {};\n", vector,
                      is_max ? "kiln::MaxOp::combine(acc[v], xv[v])" : "acc[v] + xv[v]");
  body += "++inside;\n}\n";
  for (ir::TensorId t : written) body += fmt::format("float written{}[{}];\n", t, vector);
  body += fmt::format("#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\nconst kiln::i64 channel = {} + v;\n", vector, oc[3]);
  em_.begin_block();
  const std::string div = a.count_include_pad ? Emitter::float_literal(static_cast<float>(a.kernel[0] * a.kernel[1]))
                                              : "(float)inside";
  em_.emit(fmt::format("const float pooled = {};  // {}", em_.rounded(out, is_max ? "acc[v]" : "(acc[v] / " + div + ")"),
                       out.name));
  em_.set_leaf(pool.output, "pooled");
  const Coords channel_coords{oc[0], oc[1], oc[2], "channel"};
  for (ir::TensorId t : written) em_.emit(fmt::format("written{}[v] = {};  // {}", t, em_.value(t, channel_coords), g_.tensor(t).name));
  em_.clear_leaf(pool.output);
  body += em_.take() + "}\n";
  for (ir::TensorId t : written)
    body += fmt::format("kiln::store_vec_{}<{}>({}, first, written{});  // {}\n", to_string(storage_dtype(g_.tensor(t))), vector,
                        writes_.at(t), t, g_.tensor(t).name);
  return body + "}\n";
}

void ReductionGenerator::pooling(const ir::Op& pool) {
  std::string aligned;
  const std::string vectors = pooling_vectors(pool, aligned);
  if (vectors.empty()) decided("a thread per pooled element");
  const ir::Tensor& in = g_.operand(pool, 0);
  const ir::Tensor& out = g_.result(pool);
  const ir::Attributes& a = pool.attrs;
  const bool nhwc = a.layout == ir::Layout::NHWC;
  const bool is_max = pool.kind == OpKind::MaxPool2d;
  const int64_t h = nhwc ? in.shape[1] : in.shape[2], w = nhwc ? in.shape[2] : in.shape[3];
  const int64_t count = element_count(out.shape);
  std::string body;
  if (!vectors.empty()) body = "if (" + aligned + ") {\n" + vectors + "} else\n";
  body += fmt::format("for (kiln::i64 i = (kiln::i64)blockIdx.x * blockDim.x + threadIdx.x; i < {}; "
                      "i += (kiln::i64)gridDim.x * blockDim.x) {{\n", sizes_(count));
  const Coords oc = em_.delinearize("i", out.shape);
  const std::string &n = oc[0], &c = nhwc ? oc[3] : oc[1], &p = nhwc ? oc[1] : oc[2], &q = nhwc ? oc[2] : oc[3];
  em_.emit(fmt::format("float acc = {};", is_max ? "kiln::MaxOp::identity()" : "0.0f"));
  em_.emit("int inside = 0;");
  body += em_.take();
  body += fmt::format("for (int dr = 0; dr < {}; ++dr) for (int ds = 0; ds < {}; ++ds) {{\n", a.kernel[0], a.kernel[1]);
  body += fmt::format("const kiln::i64 hi = {} * {}LL - {}LL + dr, wi = {} * {}LL - {}LL + ds;\n", p, a.stride[0],
                      a.padding[0], q, a.stride[1], a.padding[1]);
  body += fmt::format("if (hi < 0 || hi >= {}LL || wi < 0 || wi >= {}LL) continue;\n", h, w);
  em_.begin_block();
  const Coords ic = nhwc ? Coords{n, "hi", "wi", c} : Coords{n, c, "hi", "wi"};
  const std::string v = em_.value(pool.inputs[0], ic);
  em_.emit(is_max ? fmt::format("acc = kiln::MaxOp::combine(acc, {});", v) : fmt::format("acc += {};", v));
  em_.emit("++inside;");
  body += em_.take() + "}\n";
  em_.begin_block();
  const std::string div = a.count_include_pad ? Emitter::float_literal(static_cast<float>(a.kernel[0] * a.kernel[1]))
                                              : "(float)inside";
  em_.emit(fmt::format("const float pooled = {};  // {}", em_.rounded(out, is_max ? "acc" : "(acc / " + div + ")"), out.name));
  em_.set_leaf(pool.output, "pooled");
  const std::set<ir::TensorId> post = downstream_of({pool.output});
  for (ir::TensorId t : k_.writes) {
    if (!post.count(t)) continue;  // values before the pool: written below, over their own elements
    const Coords tc = write_coords(pool.output, oc, t);
    em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + g_.tensor(t).name);
  }
  body += em_.take() + "}\n";
  // Tensors the kernel computes before the pool (its input's space, not
  // the pool's output's): every element, in a loop of their own.
  for (ir::TensorId t : k_.writes) {
    if (post.count(t)) continue;
    const int64_t n = element_count(g_.tensor(t).shape);
    body += fmt::format("for (kiln::i64 i = (kiln::i64)blockIdx.x * blockDim.x + threadIdx.x; i < {}; "
                        "i += (kiln::i64)gridDim.x * blockDim.x) {{\n", sizes_(n));
    em_.begin_block();
    const Coords tc = em_.delinearize("i", g_.tensor(t).shape);
    em_.emit(store(t, "i", em_.value(t, tc)) + "  // " + g_.tensor(t).name);
    body += em_.take() + "}\n";
  }
  finish(body, kThreads);
  // (Every loop strides over the grid: with vectors, a thread per vector;
  // the element path, where it runs instead, takes several elements each.
  // A symbolic batch: the widest loop at the probe sizes sets the grid rule,
  // and any grid is correct, every loop striding over it.)
  const std::set<ir::TensorId> pooled_writes = downstream_of({pool.output});
  int64_t widest = vectors.empty() ? count : count / (16 / byte_size(storage_dtype(in)));
  for (ir::TensorId t : k_.writes)
    if (!pooled_writes.count(t)) widest = std::max(widest, element_count(g_.tensor(t).shape));
  grid_over(widest, 1, kThreads);
}

// The row statistics of a layer_norm/rms_norm whose application is the
// prologue of a matmul: [rows][2] floats (mean, rstd) in a workspace.
void ReductionGenerator::norm_statistics(const ir::Op& norm) {
  if (sizes_.probe()) throw NotSymbolic("row statistics kernels are compiled per size so far");
  decided("row statistics (mean, rstd) for a matmul prologue");
  const ir::Tensor& x = g_.operand(norm, 0);
  const int64_t rows = element_count(x.shape) / x.shape.back(), n = x.shape.back();
  const std::string stats = workspace_param(g_.result(norm).name + ".rowstats", rows * 2, 0, false);
  const bool rms = norm.kind == OpKind::RmsNorm;
  const std::string count = Emitter::float_literal(static_cast<float>(n));
  std::string body = "__shared__ float kiln_scratch[32];\n";
  body += fmt::format("float* stats = static_cast<float*>({});\n", stats);
  body += fmt::format("for (kiln::i64 row = blockIdx.x; row < {}LL; row += gridDim.x) {{\n", rows);
  body += "float mean = 0.0f, var = 0.0f;\n";
  if (rms) {
    body += row_pass(norm.inputs[0], x.shape, n, "sum += x * x;", fmt::format("var = sum / {};", count));
  } else {
    body += row_pass(norm.inputs[0], x.shape, n, "sum += x;", fmt::format("mean = sum / {};", count));
    body += row_pass(norm.inputs[0], x.shape, n, "sum += (x - mean) * (x - mean);", fmt::format("var = sum / {};", count));
  }
  body += fmt::format("if (threadIdx.x == 0) {{ stats[2 * row] = mean; stats[2 * row + 1] = 1.0f / sqrtf(var + {}); }}\n",
                      Emitter::float_literal(norm.attrs.eps));
  body += "}\n";
  finish(body, kThreads);
  out_.grid = {blocks_for(rows, 1), 1, 1};
}

// A block-wide sum over a last-axis row of x: `update` accumulates into
// `sum` from `x`; `assign` uses the total.
std::string ReductionGenerator::row_pass(ir::TensorId x, const Shape& shape, int64_t n, const std::string& update,
                     const std::string& assign) {
  std::string body = "{\nfloat sum = 0.0f;\n";
  body += fmt::format("for (kiln::i64 j = threadIdx.x; j < {}LL; j += blockDim.x) {{\n", n);
  em_.begin_block();
  em_.emit(fmt::format("const kiln::i64 e = row * {}LL + j;", n));
  em_.emit(fmt::format("const float x = {};", em_.value(x, em_.delinearize("e", shape))));
  em_.emit(update);
  body += em_.take() + "}\n";
  body += "sum = kiln::block_reduce<kiln::SumOp>(sum, kiln_scratch);\n" + assign + "\n}\n";
  return body;
}

}  // namespace kiln::codegen
