// The epilogue of matmul and conv kernels: what the anchor's consumers and
// epilogue reductions do with each accumulator element.
//
// Expects: a KernelBuilder inside an anchor kernel's generator, the anchor's
// Gemm view and the generator's loops over accumulator elements.
// Guarantees: decide_epilogue() chooses (which tensor is staged through
// shared memory, which residuals ride the tensor copies, which reductions
// keep register partials, whether column blocks loop) without writing a
// line; epilogue() then writes the code from that decision: element code,
// the fragment loops, the column flush and the last block's finalisation.
//
// Fragment loops (tensor cores): each thread's rows (two per MMA tile)
// checked and decomposed (gm.out_row) once, then the row's columns in
// pairs: a written tensor whose last coordinate is the column is stored
// two elements at a time (H100, bf16 8192 x 8192 x 4096: the epilogue's
// 2-byte stores filled the store queue, 28% of the consumers' time), or,
// with loops.stage_map, the result through shared-memory staging buffers
// and bulk tensor stores, one 128-byte column block at a time. A
// reduction that keeps only the output column is combined in registers
// and across the warp's rows first, one atomic per column and warp; with
// `carry` (a persistent kernel, registers permitting) the registers carry
// the partials across the block's tiles while their columns stay the same.
// What depends on the column alone (a bias, batch_norm's parameters and
// scale: Emitter::begin_columns) is computed before a block's rows, once
// per column, into register arrays the element code reads.
#include "codegen/gemm_generator.h"

namespace kiln::codegen {
namespace {

// A fragment row's partial (red[mi][half]) combined over the quad of lanes
// that holds the row's columns, then one atomic from the quad's first lane.
std::string quad_row_atomic(const std::string& red, const std::string& functor, const std::string& workspace,
                            const std::string& offset) {
  return fmt::format("{{\nfloat v = {0}[mi][half];\n"
                     "v = {1}::combine(v, __shfl_xor_sync(0xffffffffu, v, 1));\n"
                     "v = {1}::combine(v, __shfl_xor_sync(0xffffffffu, v, 2));\n"
                     "if ((threadIdx.x & 3) == 0 && in_rows) kiln::atomic_combine({1}(), static_cast<float*>({2}) + {3}, v);\n}}\n",
                     red, functor, workspace, offset);
}

}  // namespace

std::vector<const ir::Op*> GemmGenerator::epilogue_reductions() const {
  std::vector<const ir::Op*> reduces;
  for (const ir::Op* r : ops_of({ir::OpFamily::Reduce}))
    if (writes_.count(r->output)) reduces.push_back(r);
  return reduces;
}

// Whether every reader of `t` in this kernel reads it at its own
// coordinates on the result's path: a pointwise op of t's shape in the
// result's order, or a reshape that keeps t's rows whose readers do the same.
bool GemmGenerator::read_in_place(ir::TensorId t, const std::map<ir::TensorId, std::vector<ir::TensorId>>& readers,
                                  const std::function<bool(ir::TensorId)>& in_result_order) const {
  const auto r = readers.find(t);
  if (r == readers.end()) return false;
  const Shape& shape = g_.tensor(t).shape;
  return std::all_of(r->second.begin(), r->second.end(), [&](ir::TensorId out) {
    const ir::Op& op = g_.ops[static_cast<size_t>(g_.tensor(out).producer)];
    const Shape& out_shape = g_.tensor(out).shape;
    if (op.kind == OpKind::Reshape)  // the same rows (its readers then place them in the result's order)
      return !out_shape.empty() && out_shape.back() == shape.back() && read_in_place(out, readers, in_result_order);
    return ir::is_pointwise(op.kind) && out_shape == shape && in_result_order(out);
  });
}

// The coordinates at which the epilogue reads residual `r` (read_in_place):
// its first reader's, back through the reshapes between.
Coords GemmGenerator::residual_coords(const ir::Op& anchor, const Coords& oc, ir::TensorId r) {
  for (int32_t oi : k_.ops) {
    const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
    if (oi == k_.anchor || !std::count(op.inputs.begin(), op.inputs.end(), r)) continue;
    if (op.kind != OpKind::Reshape) return write_coords(anchor.output, oc, op.output);
    return em_.same_element(residual_coords(anchor, oc, op.output), g_.result(op).shape, g_.tensor(r).shape);
  }
  KILN_INTERNAL_CHECK(false);  // a residual has readers
  return {};
}

auto GemmGenerator::decide_epilogue(const ir::Op& anchor, const Gemm& gm, const EpilogueLoops& loops, const Coords& oc,
                                    const std::vector<const ir::Op*>& reduces) -> EpiloguePlan {
  EpiloguePlan plan;
  const bool tensor_core = loops.fragments;
  const Shape& result_shape = g_.result(anchor).shape;
  std::set<ir::TensorId> reduce_outs;
  for (const ir::Op* r : reduces) {
    plan.reductions.push_back({.op = r});
    reduce_outs.insert(r->output);
  }
  // The tensor stored through shared memory (loops.stage_map): the result (rows of N of
  // [batch..., M, N]) or a tensor computed from it by pointwise ops and reshapes that keep its
  // rows of N ([B*S, N] -> [B, S, N]): each element at the result's linear index. In a 16-bit or
  // f32 type with 16-byte rows, stored in column pairs. And residuals: inputs of that tensor's
  // type, dense, the result's elements in the result's order, read by pointwise ops on that
  // path at their own coordinates, in column pairs; the first of them comes in through the same
  // buffers.
  // (A pooled conv's rows run window by window, not in the result's order.)
  if (tensor_core && loops.stage_map && gm.column_last && largest(gm.m) < (int64_t{1} << 31) && gm.n < (int64_t{1} << 31) &&
      largest(gm.batches) < (int64_t{1} << 31) && !epilogue_pool()) {
    // Rows of N at the result's linear index.
    auto in_result_order = [&](ir::TensorId t) {
      const Shape& shape = g_.tensor(t).shape;
      return !shape.empty() && shape.back() == gm.n && element_count(shape) == element_count(result_shape) &&
             same_linear_order(anchor.output, t);
    };
    // Rows that are not 16-byte multiples (a vocabulary of 50257) cannot be the copy engine's:
    // the threads copy each staged block out, a warp's stores along one row.
    for (ir::TensorId t : k_.writes) {
      const DType storage = storage_dtype(g_.tensor(t));
      if (!reduce_outs.count(t) && storage != DType::boolean && in_result_order(t) &&
          write_coords(anchor.output, oc, t).back() == oc.back()) {
        plan.staged = t;
        plan.copied_out = (gm.n * byte_size(storage)) % 16 != 0;
        break;
      }
    }
    // Read where every reader is a pointwise op on the result's path, of the residual's shape.
    // (The anchor's own operands are read by the main loop, not here.)
    std::map<ir::TensorId, std::vector<ir::TensorId>> readers;
    for (int32_t oi : k_.ops) {
      const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
      if (oi != k_.anchor)
        for (ir::TensorId in : op.inputs) readers[in].push_back(op.output);
    }
    for (const auto& [tensor, e] : ordered_externals()) {
      const ir::TensorId id = tensor;  // (a lambda below names it)
      const Shape& shape = g_.tensor(id).shape;
      const auto r = readers.find(id);
      if (plan.staged < 0 || plan.copied_out || r == readers.end() || writes_.count(id) || shape.empty() ||
          e.strides != contiguous_strides(shape) || e.storage != storage_dtype(g_.tensor(plan.staged)) || shape.back() != gm.n ||
          element_count(shape) != element_count(result_shape))
        continue;
      if (read_in_place(id, readers, in_result_order)) plan.residuals.push_back(id);
    }
  }
  // Each reduction's input coordinates, kept coordinates, and whether it keeps only the output column.
  for (EpilogueReduction& k : plan.reductions) {
    const Shape& in_shape = g_.operand(*k.op, 0).shape;
    k.input = write_coords(anchor.output, oc, k.op->inputs[0]);
    for (size_t d = 0; d < in_shape.size(); ++d)
      if (!std::binary_search(k.op->attrs.axes.begin(), k.op->attrs.axes.end(), static_cast<int64_t>(d)))
        k.kept.push_back(k.input[d]), k.kept_shape.push_back(in_shape[d]);
    k.column = tensor_core && gm.column_last && k.kept.size() == 1 && k.kept[0] == oc.back();
    // Reduced along the output row alone (RMSNorm's mean of squares after a
    // matmul): the fragments' quads hold whole rows of the tile, a SIMT
    // tile's 16 neighbouring lanes (a matmul's, its batches regrouped as
    // the reduction's input has them: flush_thread_rows).
    // (An unbatched matmul's row is m; a conv's, the pixel out_row declares.)
    const bool along_row = k.op->attrs.axes.size() == 1 && k.op->attrs.axes[0] == static_cast<int64_t>(in_shape.size()) - 1;
    if (tensor_core) {
      k.row = gm.column_last && (gm.batches == 1 || gm.out_row) && k.input == oc && along_row;
      // Its input a reshape of the result that keeps the columns last (a B*S x H product read as
      // B x S x H): each row of the tile is still one kept element. Without this, an atomic for
      // every element: 4M of them into 4096 rows made Llama's o_proj + residual + RMSNorm's mean
      // of squares 0.075 ms on an H200 (0.034 with the row partials, on an H100: bench/NOTES.md v0.38).
      k.row_renamed = !k.row && gm.column_last && gm.batches == 1 && !gm.out_row && along_row &&
                      k.input.back() == oc.back() && in_shape.back() == gm.n;
      k.row = k.row || k.row_renamed;
    } else {
      k.row = gm.column_last && !gm.out_row && loops.thread_rows > 0 && along_row && k.input.back() == oc.back() &&
              in_shape.back() == gm.n;
    }
  }
  // Staged column blocks in a loop that is not unrolled where an element
  // takes a library function (erf, exp, tanh, ...): unrolled over a 128 x
  // 256 tile that is thousands of instructions each, more than the
  // instruction cache holds (H100, erf GELU: 60% of the epilogue's stalls
  // waited for instructions; matmul + GELU 1.06 -> 0.85 ms rolled, one
  // run). Cheap epilogues stay unrolled, which lets loads of later blocks
  // start early (bias + residual: 0.93 unrolled, 0.94 rolled). The
  // autotuner tries both (Tuning::epilogue). Each block's accumulators are first copied out
  // with static indices (they stay in registers); column partials indexed
  // by the column keep the loop unrolled.
  plan.rollable = plan.staged >= 0 &&
                  std::none_of(plan.reductions.begin(), plan.reductions.end(), [](const auto& k) { return k.column; });
  for (int32_t id : k_.ops) {
    const ir::Op& op = g_.ops[static_cast<size_t>(id)];
    if (ir::is_pointwise(op.kind) && ir::op_info(op.kind).cost == ir::OpCost::Heavy) plan.heavy = true;
  }
  // So is a symbolic kernel's store of a tensor in another order than the product's (a
  // transpose into a KV cache's layout): its indices divide by sizes known at launch, 64-bit
  // multiply-highs for each element. Unrolled, Llama's v projection (writing v transposed beside
  // v) was 3x the integer kernel's SASS and 2.4x its time (H100, B4 S300 and S1000).
  if (sizes_.probe() && sizes_.symbolic(gm.m))
    for (ir::TensorId t : k_.writes)
      if (t != plan.staged && !reduce_outs.count(t) && !same_linear_order(anchor.output, t)) plan.heavy = true;
  plan.rolled = plan.rollable && (loops.block_loop == 0 ? plan.heavy : loops.block_loop == Tuning::kRolled);
  return plan;
}

std::string GemmGenerator::EpiloguePlan::to_string(const ir::Graph& g) const {
  std::string s = staged < 0 ? "stores direct" : fmt::format("staged {}{}", g.tensor(staged).name, copied_out ? ", copied out" : "");
  for (ir::TensorId r : residuals) s += fmt::format(", residual {}", g.tensor(r).name);
  for (const EpilogueReduction& r : reductions)
    s += fmt::format(", {} {}", r.column ? "column partials for" : r.row ? "row partials for" : "atomics for",
                     g.result(*r.op).name);
  if (rollable) s += rolled ? ", column blocks rolled" : ", column blocks unrolled";
  return s;
}

// The element code's reductions: column reductions into register partials
// (declared in text.decls), the rest atomically into their workspaces.
void GemmGenerator::emit_epilogue_reductions(const EpiloguePlan& plan, const std::vector<std::string>& ws, EpilogueText& text) {
  for (size_t r = 0; r < plan.reductions.size(); ++r) {
    const EpilogueReduction& k = plan.reductions[r];
    if (k.row && text.thread_rows > 0) {  // a SIMT thread's rows (flush_thread_rows)
      const std::string functor = reduce_functor(k.op->kind), red = fmt::format("rowred{}", r);
      text.row_decls += fmt::format("float {0}[{1}];\n#pragma unroll\nfor (int i = 0; i < {1}; ++i) {0}[i] = {2}::identity();\n",
                                    red, text.thread_rows, functor);
      em_.emit(fmt::format("{0}[i] = {1}::combine({0}[i], {2});", red, functor, em_.value(k.op->inputs[0], k.input)));
      text.thread_row_reduces.emplace_back(r, red);
      continue;
    }
    if (k.column) {
      const std::string functor = reduce_functor(k.op->kind), red = fmt::format("red{}", r);
      text.decls += fmt::format("float {0}[G::kNI][2];\n#pragma unroll\nfor (int ni = 0; ni < G::kNI; ++ni) {0}[ni][0] = {0}[ni][1] = "
                                "{1}::identity();\n", red, functor);
      em_.emit(fmt::format("{0}[ni][e & 1] = {1}::combine({0}[ni][e & 1], {2});", red, functor, em_.value(k.op->inputs[0], k.input)));
      text.column_reduces.emplace_back(r, red);
      continue;
    }
    if (k.row) {
      const std::string functor = reduce_functor(k.op->kind), red = fmt::format("rowred{}", r);
      text.row_decls += fmt::format("float {0}[G::kMI][2];\n#pragma unroll\nfor (int mi = 0; mi < G::kMI; ++mi) {0}[mi][0] = {0}[mi][1] = "
                                    "{1}::identity();\n", red, functor);
      em_.emit(fmt::format("{0}[mi][half] = {1}::combine({0}[mi][half], {2});", red, functor, em_.value(k.op->inputs[0], k.input)));
      if (k.row_renamed) {
        text.renamed_row_reduces.emplace_back(r, red);
        continue;
      }
      text.row_flush += quad_row_atomic(red, functor, ws[r], em_.linearize(k.kept, k.kept_shape));
      continue;
    }
    em_.emit(fmt::format("kiln::atomic_combine({}(), static_cast<float*>({}) + {}, {});", reduce_functor(k.op->kind), ws[r],
                         em_.linearize(k.kept, k.kept_shape), em_.value(k.op->inputs[0], k.input)));
  }
}

// The element code's writes: direct stores, column pairs (stored after the
// pair's second column), and the staged tensor's pairs into shared memory.
void GemmGenerator::emit_epilogue_writes(const ir::Op& anchor, const Gemm& gm, const EpilogueLoops& loops, const Coords& oc,
                                         const EpiloguePlan& plan, EpilogueText& text) {
  const bool tensor_core = loops.fragments;
  const ir::Op* pool = epilogue_pool();
  for (ir::TensorId t : k_.writes) {
    if (std::any_of(plan.reductions.begin(), plan.reductions.end(), [&](const auto& r) { return r.op->output == t; }))
      continue;
    if (pool && t == pool->output) continue;  // (emit_epilogue_pool)
    const Coords tc = write_coords(anchor.output, oc, t);
    const std::string offset = em_.linearize(tc, g_.tensor(t).shape), value = em_.value(t, tc);
    const DType storage = storage_dtype(g_.tensor(t));
    // Columns n and n + 1 (n even) are adjacent elements of t, both inside N or both outside
    // (a staged block that is copied out takes the column past an odd N and leaves it there).
    const bool paired = tensor_core && gm.column_last && tc.back() == oc.back() && storage != DType::boolean &&
                        (!loops.check_n || gm.n % 2 == 0 || (t == plan.staged && plan.copied_out));
    if (!paired) {
      em_.emit(store(t, offset, value) + "  // " + g_.tensor(t).name);
      continue;
    }
    const std::string direct = gather_column_pair(t, value, offset, text.pair_decls) + "\n";
    if (t != plan.staged) {
      text.pair_stores += direct;
      continue;
    }
    // Column blocks of 128 bytes through shared memory, always: where the copy engine cannot store
    // them (an unaligned result) the threads copy each block out (staged_column_blocks).
    const std::string put = fmt::format("kiln::put_pair_{0}(staging + G::staging_pair_offset<{1}>(half, nj), {2}[0], {2}[1]);\n",
                                        to_string(storage), byte_size(storage), pair_name(t));
    if (loops.staged) *loops.staged = t;
    if (plan.copied_out) {  // rotated: wgmma.cuh, rotated_offset
      text.pair_stores += fmt::format(
          "kiln::wg::put_rotated_pair_{}(staging, G::acc_row(mi, 2 * half) & 63, G::acc_col(ni, 2 * half) - blk * {}, {}, {}[0], "
          "{}[1]);\n",
          to_string(storage), 128 / byte_size(storage), copied_out_past(gm, byte_size(storage), "m"), pair_name(t), pair_name(t));
      text.tma_out = "false";
      continue;
    }
    const int64_t row_bytes = gm.n * byte_size(storage);
    TensorMapSpec map;
    map.dtype = storage;
    map.rank = gm.batches > 1 ? 3 : 2;
    map.dims = {static_cast<uint64_t>(gm.n), static_cast<uint64_t>(gm.m), static_cast<uint64_t>(gm.batches)};
    map.strides = {static_cast<uint64_t>(row_bytes), static_cast<uint64_t>(row_bytes * gm.m)};
    map.box = {static_cast<uint32_t>(128 / byte_size(storage)), 64, 1};
    text.staged_map = loops.stage_map(t, map);
    text.staged_map_spec = map;
    text.pair_stores += put;
    text.tma_out = fmt::format("kiln::aligned16({})", writes_.at(t));
  }
}

std::string GemmGenerator::copied_out_past(const Gemm& gm, int bytes, const std::string& m) const {
  return fmt::format("(int)((unsigned long long)((batch * {} + {}) * {}) % {}u)", sizes_(gm.m), m, sizes_(gm.n), 16 / bytes);
}

const ir::Op* GemmGenerator::epilogue_pool() const {
  if (!k_.params.pool_window) return nullptr;
  const std::vector<const ir::Op*> pools = ops_of({ir::OpFamily::Pool});
  KILN_INTERNAL_CHECK(pools.size() == 1);
  return pools[0];
}

// A conv's epilogue pool of 2 x 2 windows, stride 2 (strategies.cpp): the
// conv's rows run window by window (pooled_pixel, gm.window_rows), so each
// window's four pixels are rows the combine can reach cheaply:
// - interleaved (fragments): an MMA row group of 16 holds windows 4g + r % 4
//   at rows r, r + 4, r + 8, r + 12. A lane holds rows r and r + 8 of a
//   column (half 0 and 1), lane ^ 16 rows r ^ 4 and (r ^ 4) + 8: the element
//   code keeps half 0's value, combines half 1's with it, and one shuffle
//   finishes the window; lanes 0-15 store it.
// - consecutive (fragments, when the windows do not fill whole groups of
//   16 rows): rows 4j..4j+3 of an 8-row group, lanes l, l ^ 4, l ^ 8, l ^ 12:
//   two shuffles; lanes 0-3 and 16-19 store.
// - consecutive (SIMT): one thread's four rows of a column (i = 0..3,
//   gemm_simt's inner loop), combined in `window`.
// A window's rows are all inside M or all past it, and share their columns,
// so the lanes of one window reach the shuffles together or not at all:
// where rows or columns are skipped the shuffles name those lanes alone,
// elsewhere every lane (a mask that varies by lane costs a convergence loop
// around each shuffle: H100, 32 x 56 x 56 x 128, 0.095 -> 0.076 ms).
void GemmGenerator::emit_epilogue_pool(const ir::Op& anchor, const Gemm& gm, const EpilogueLoops& loops, const Coords& oc,
                                       EpilogueText& text) {
  const ir::Op* pool = epilogue_pool();
  if (!pool || !writes_.count(pool->output)) return;
  const ir::Tensor& out = g_.result(*pool);
  const ir::TensorId t = pool->output;
  const bool is_max = pool->kind == OpKind::MaxPool2d;
  auto combine = [&](const std::string& a, const std::string& b) {
    return is_max ? fmt::format("kiln::MaxOp::combine({}, {})", a, b) : fmt::format("{} + {}", a, b);
  };
  const Coords at = write_coords(anchor.output, oc, pool->inputs[0]);
  KILN_INTERNAL_CHECK(at == oc);  // the planner pools values at the conv's own coordinates (at_conv_coordinates)
  const std::string value = em_.value(pool->inputs[0], at);
  const Coords pooled{oc[0], "(" + oc[1] + " >> 1)", "(" + oc[2] + " >> 1)", oc[3]};  // NHWC
  const std::string offset = em_.linearize(pooled, out.shape);
  const std::string result = em_.rounded(out, is_max ? "window" : "(window / 4.0f)");
  if (!loops.fragments) {
    em_.emit(fmt::format("window = i == 0 ? {} : {};", value, combine("window", value)));
    em_.emit(fmt::format("if (i == 3) {}  // {}", store(t, offset, result), out.name));
    return;
  }
  const bool interleaved = gm.window_rows == WindowRows::interleaved, skips = loops.check_m || loops.check_n;
  std::string storing;  // the lanes that store each window
  if (interleaved) {
    text.row_decls += "float window_part[G::kNI][2];  // half 0's value of each window\n";
    em_.emit(fmt::format("if (half == 0) window_part[ni][c] = {};", value));
    em_.emit("else {");
    em_.emit(fmt::format("float window = {};  // {}'s window", combine("window_part[ni][c]", value), out.name));
    em_.emit(skips ? "const unsigned windows = 0x10001u << (threadIdx.x & 15);  // this window's lanes"
                   : "const unsigned windows = 0xffffffffu;");
    em_.emit(fmt::format("window = {};", combine("window", "__shfl_xor_sync(windows, window, 16)")));
    storing = "half == 1 && (threadIdx.x & 16) == 0";
  } else {
    em_.emit(fmt::format("float window = {};  // {}'s window", value, out.name));
    em_.emit(skips ? "const unsigned windows = 0x1111u << ((threadIdx.x & 3) | (threadIdx.x & 16));  // this window's lanes"
                   : "const unsigned windows = 0xffffffffu;");
    em_.emit(fmt::format("window = {};", combine("window", "__shfl_xor_sync(windows, window, 4)")));
    em_.emit(fmt::format("window = {};", combine("window", "__shfl_xor_sync(windows, window, 8)")));
    storing = "(threadIdx.x & 12) == 0";
  }
  const DType storage = storage_dtype(out);
  const bool paired = gm.column_last && storage != DType::boolean && (!loops.check_n || gm.n % 2 == 0);
  if (paired) {
    text.pair_stores += fmt::format("if ({}) {}\n", storing, gather_column_pair(t, result, offset, text.pair_decls));
  } else {
    em_.emit(fmt::format("if ({}) {}  // {}", storing, store(t, offset, result), out.name));
  }
  if (interleaved) em_.emit("}");
}

// Each residual the element code reads, a pair per column pair: the first
// from the staging buffer (filled by the copy engine, or by the threads
// where a pointer is not aligned: staged_column_blocks), the others from
// memory: (batch, m, n) at (batch * M + m) * N + n.
void GemmGenerator::load_epilogue_residuals(const Gemm& gm, const EpilogueLoops& loops, const EpiloguePlan& plan,
                                            EpilogueText& text) {
  for (ir::TensorId r : plan.residuals) {
    if (!em_.vector_source_used(r)) continue;
    const ExternalTensor& e = ext_.at(r);
    text.residual_load += fmt::format("float residual{}[2];  // {}\n", r, g_.tensor(r).name);
    if (text.residual >= 0) {
      text.residual_load += "for (int c = 0; c < 2; ++c) {\nconst kiln::i64 n = n0 + G::acc_col(ni, 2 * half + c);\n";
      text.residual_load += fmt::format("residual{}[c] = {}kiln::load_{}({}, (batch * {} + m) * {} + n);\n}}\n", r,
                                        loops.check_n ? fmt::format("n >= {} ? 0.0f : ", sizes_(gm.n)) : "",
                                        to_string(e.storage), e.pointer, sizes_(gm.m), sizes_(gm.n));
      continue;
    }
    text.residual = r;
    text.residual_map = loops.stage_map(r, text.staged_map_spec);
    const int bytes = byte_size(e.storage);
    text.residual_load += fmt::format("kiln::get_pair_{}(staging + G::staging_pair_offset<{}>(half, nj), residual{});\n",
                                      to_string(e.storage), bytes, r);
  }
}

// The fragment loops around the element code: rows (two per MMA tile),
// column pairs, and with a staged tensor the 128-byte column blocks.
void GemmGenerator::fragment_loops(const Gemm& gm, const EpilogueLoops& loops, const EpiloguePlan& plan,
                                   const EpilogueText& text, std::string& open, std::string& close, TileLoopCarry* carry) {
  const bool blocks = plan.staged >= 0 || !text.column_values.empty();
  // A block's columns (ni = blk * columns + nj); unstaged blocks end at G::kNI.
  const std::string column_tile = fmt::format("#pragma unroll\nfor (int nj = 0; nj < {0}; ++nj) {{\nconst int ni = blk * {0} + nj;\n{1}",
                                              text.columns, plan.staged >= 0 ? "" : "if (ni >= G::kNI) break;\n");
  open.clear();
  if (blocks && plan.staged < 0) open += fmt::format("#pragma unroll\nfor (int blk = 0; blk < (G::kNI + {0}) / {1}; ++blk) {{\n",
                                                     text.columns - 1, text.columns);
  const Emitter::ColumnCode& values = text.column_values;
  auto one_column = [&](const std::string& ni, const std::string& store) {
    std::string code = fmt::format("#pragma unroll\nfor (int c = 0; c < 2; ++c) {{\nconst kiln::i64 n = n0 + G::acc_col({}, c);\n", ni);
    if (loops.check_n) code += fmt::format("if (n >= {}LL) continue;\n", gm.n);
    code += text.column_coords + values.statements;
    for (const auto& [value, array] : values.values) code += fmt::format(fmt::runtime(store), array, value);
    return code + "}\n";
  };
  if (!values.empty() && !values.arithmetic) {
    // Loads: each thread loads its own columns (8 lanes of a warp share each).
    open += values.declarations + column_tile + one_column("ni", "{}[nj][c] = {};\n") + "}\n";
  } else if (!values.empty()) {
    // Computed values: a lane computes two of a block's columns, those of
    // MMA column tile (lane / 4) % columns at its own lane % 4, and the warp
    // exchanges them: acc_col depends on the lane through lane % 4 alone, so
    // lane nj * 4 + lane % 4 holds column pair nj of every lane of its quad.
    // A persistent kernel computes every block's shares once per tile column,
    // at the tile's start, where the main loop hides their loads (H100, conv
    // 3x3 + BN + relu: 0.071 ms computed per block).
    KILN_INTERNAL_CHECK(8 % text.columns == 0);
    const std::string blocks = fmt::format("(G::kNI + {}) / {}", text.columns - 1, text.columns);
    const std::string share_ni = fmt::format("const int share_ni = blk * {0} + (int)((threadIdx.x & 31) >> 2) % {0};\n", text.columns);
    auto shares = [&](const std::string& index) {
      std::string code;
      for (const auto& [value, array] : values.values) code += fmt::format("{0}_share{1}[0] = {0}_share{1}[1] = 0.0f;\n", array, index);
      code += share_ni + (plan.staged < 0 ? "if (share_ni < G::kNI) {\n" : "");
      code += one_column("share_ni", "{}_share" + index + "[c] = {};\n");
      return code + (plan.staged < 0 ? "}\n" : "");
    };
    std::string share_index;
    open += values.declarations;
    if (carry && !plan.rolled) {  // (a rolled block loop would index the shares at run time: local memory)
      share_index = "[blk]";
      for (const auto& [value, array] : values.values) carry->before_loop += fmt::format("float {}_share[{}][2];\n", array, blocks);
      carry->before_loop += "kiln::i64 shared_n0 = -1, shared_batch = -1;  // the tile column the shares are of\n";
      carry->tile_start += "if (shared_n0 != n0 || shared_batch != batch) {\nshared_n0 = n0, shared_batch = batch;\n";
      carry->tile_start += fmt::format("#pragma unroll\nfor (int blk = 0; blk < {}; ++blk) {{\n", blocks) + shares("[blk]") + "}\n}\n";
    } else {
      for (const auto& [value, array] : values.values) open += fmt::format("float {}_share[2];\n", array);
      open += "{\n" + shares("") + "}\n";
    }
    open += column_tile + "#pragma unroll\nfor (int c = 0; c < 2; ++c) {\n";
    for (const auto& [value, array] : values.values)
      open += fmt::format("{0}[nj][c] = __shfl_sync(0xffffffffu, {0}_share{1}[c], nj * 4 + (int)(threadIdx.x & 3));\n", array,
                          share_index);
    open += "}\n}\n";
  }
  open += "#pragma unroll\nfor (int mi = 0; mi < G::kMI; ++mi)\n#pragma unroll\nfor (int half = 0; half < 2; ++half) {\n";
  open += "const kiln::i64 m = m0 + G::acc_row(mi, 2 * half);\n";
  if (loops.check_m) open += fmt::format("if (m >= {}) continue;\n", sizes_(gm.m));
  if (gm.out_row) open += gm.out_row("m") + "\n";
  open += blocks ? column_tile : "#pragma unroll\nfor (int ni = 0; ni < G::kNI; ++ni) {\n";
  // An even N: a pair's two columns lie both inside or both past it, one
  // check a pair (a branch around each element's code was a third of a
  // 128-column tile's epilogue over N = 120).
  const bool pair_check = loops.check_n && gm.n % 2 == 0;
  if (pair_check) open += fmt::format("if (n0 + G::acc_col(ni, 2 * half) >= {}LL) continue;\n", gm.n);
  open += text.pair_decls + text.residual_load;
  open += "#pragma unroll\nfor (int c = 0; c < 2; ++c) {\nconst int e = 2 * half + c;\n";
  open += "const kiln::i64 n = n0 + G::acc_col(ni, e);\n";
  if (loops.check_n && !pair_check) open += fmt::format("if (n >= {}LL) continue;\n", gm.n);
  close = "}\n";
  if (!text.pair_stores.empty() && loops.check_n && !pair_check)
    close += fmt::format("if (n0 + G::acc_col(ni, 2 * half) < {}LL) {{\n", gm.n) + text.pair_stores + "}\n";
  else
    close += text.pair_stores;
  close += "}\n}\n";
  if (blocks && plan.staged < 0) close += "}\n";
}

// The staged tensor's column blocks around the fragment loops. Each consumer
// warpgroup's 64 rows, one 128-byte column block at a time, alternating
// between its two buffers (the previous block's store may still be reading
// the other). With a residual, its block comes into the buffer first
// (loaded one block ahead, the tile's first block before the main loop) and
// the result replaces it in place. The copy engine moves the blocks where
// the pointers are 16-byte aligned (tma_out, residual_tma); elsewhere the
// threads fill the residual's block and copy the result's out, element by
// element, so that the element code has one path.
void GemmGenerator::staged_column_blocks(const Gemm& gm, const EpilogueLoops& loops, const EpiloguePlan& plan,
                                         const EpilogueText& text, std::string& open, std::string& close,
                                         TileLoopCarry& carry) {
  const std::string& warpgroup_m0 = loops.warpgroup_m0;
  const int block_columns = 128 / byte_size(storage_dtype(g_.tensor(plan.staged)));
  auto coords = [&](const std::string& blk) {
    return fmt::format("(int)(n0 + {} * {}), (int)({}){}", blk, block_columns, warpgroup_m0, gm.batches > 1 ? ", (int)batch" : "");
  };
  auto load_residual = [&](const std::string& blk, const std::string& buffer) {
    std::string l = fmt::format("kiln::wg::u64* const loaded = G::staging_loaded(smem, consumer, {});\n", buffer);
    l += "kiln::wg::bar_arrive_expect(loaded, 64 * 128);\n";
    return l + fmt::format("kiln::wg::tma_load(G::staging(smem, consumer, {}), &{}, loaded, {});\n", buffer, text.residual_map,
                           coords(blk));
  };
  const std::string blocks = fmt::format("G::kNI * 8 / {}", block_columns);
  std::string pre = fmt::format("#pragma unroll{}\nfor (int blk = 0; blk < {}; ++blk) {{\n", plan.rolled ? " 1" : "", blocks);
  if (plan.rolled)
    pre += fmt::format("float block_acc[G::kMI][{0}][4];\nkiln::tc::column_block<{0}>(gemm.acc, blk, block_acc);\n",
                       block_columns / 8);
  pre += "const int turn = staging_turn++ & 1;\n";
  pre += "unsigned char* const staging = G::staging(smem, consumer, turn);\n";
  const int bytes = byte_size(storage_dtype(g_.tensor(plan.staged)));
  // A block's elements a thread at a time (the threads' fills and copies where the copy engine
  // cannot move the block), rows and columns inside the result.
  auto each_element = [&](const std::string& body) {
    std::string l = fmt::format("#pragma unroll 4\nfor (int i = threadIdx.x & 127; i < 64 * {0}; i += 128) {{\n", block_columns);
    l += fmt::format("const int row = i / {0}, column = i % {0};\n", block_columns);
    l += fmt::format("const kiln::i64 m = {} + row, n = n0 + blk * {} + column;\n", warpgroup_m0, block_columns);
    l += fmt::format("if (m >= {} || n >= {}) continue;\n", sizes_(gm.m), sizes_(gm.n));
    l += fmt::format("const kiln::i64 at = (batch * {} + m) * {} + n;\n", sizes_(gm.m), sizes_(gm.n));
    return l + body + "}\n";
  };
  if (text.residual >= 0) {
    pre += fmt::format("if (residual_tma) {{\nif ((threadIdx.x & 127) == 0 && blk + 1 < {}) {{\n", blocks);
    pre += "kiln::wg::bulk_wait_read<0>();  // the last block's store has read the other buffer\n";
    pre += load_residual("(blk + 1)", "turn ^ 1") + "}\n";
    pre += "kiln::wg::bar_wait(G::staging_loaded(smem, consumer, turn), (staging_phases >> turn) & 1);\n";
    pre += "staging_phases ^= 1 << turn;\n} else ";
  }
  pre += "{\nif (tma_out && (threadIdx.x & 127) == 0) kiln::wg::bulk_wait_read<1>();\n";
  pre += "kiln::wg::named_sync(2 + consumer, 128);\n";
  if (text.residual >= 0) {  // the residual's block by the threads (a pointer the copy engine cannot take)
    pre += each_element(fmt::format("kiln::fetch_element<{}>(staging + G::staging_offset(row, column * {}), {}, at);\n", bytes,
                                    bytes, ext_.at(text.residual).pointer));
    pre += "kiln::wg::named_sync(2 + consumer, 128);\n";
  }
  pre += "}\n";
  std::string post;
  if (plan.copied_out) {
    // The warpgroup's 64 rows of the block, rotated in their staging rows (wgmma.cuh,
    // rotated_offset). A whole block into a 16-byte aligned result: each row's chunks 1..7 of
    // memory a thread each (eight threads a row, the first idle), then its two partial chunks
    // (columns before the first boundary and after the last) a thread a row. Otherwise (the
    // block past N, an unaligned result) element by element.
    const int per_chunk = 16 / bytes;
    const std::string& out = writes_.at(plan.staged);
    const std::string row_first = fmt::format(
        "const kiln::i64 first = (batch * {} + m) * {} + n0 + blk * {};  // the row's first column\n"
        "const int past = {};  // its distance past a 16-byte boundary of memory\n",
        sizes_(gm.m), sizes_(gm.n), block_columns, copied_out_past(gm, bytes, "m"));
    const std::string row_in_m =
        fmt::format("const kiln::i64 m = {} + row;\nif (m >= {}) continue;\n", warpgroup_m0, sizes_(gm.m));
    post = "kiln::wg::named_sync(2 + consumer, 128);\n";
    post += fmt::format("if (kiln::aligned16({}) && n0 + blk * {} + {} <= {}) {{\n", out, block_columns, block_columns, sizes_(gm.n));
    post += "#pragma unroll 4\nfor (int i = threadIdx.x & 127; i < 64 * 8; i += 128) {\n";
    post += "const int row = i >> 3, unit = i & 7;\nif (unit == 0) continue;\n" + row_in_m + row_first;
    post += fmt::format("kiln::wg::copy_out_unit(static_cast<unsigned char*>({}) + (first - past + unit * {}) * {}, staging, row, unit);\n}}\n",
                        out, per_chunk, bytes);
    post += "for (int row = threadIdx.x & 127; row < 64; row += 128) {\n" + row_in_m + row_first;
    post += fmt::format("kiln::wg::copy_out_ends<{}>(static_cast<unsigned char*>({}) + (first - past) * {}, staging, row, past);\n}}\n",
                        bytes, out, bytes);
    post += "} else {\n";
    post += fmt::format("#pragma unroll 4\nfor (int i = threadIdx.x & 127; i < 64 * {0}; i += 128) {{\n", block_columns);
    post += fmt::format("const int row = i / {0}, column = i % {0};\n", block_columns);
    post += row_in_m + row_first;
    post += fmt::format("if (n0 + blk * {} + column < {}) kiln::copy_element<{}>({}, first + column, "
                        "staging + kiln::wg::rotated_offset(row, column * {}, past * {}));\n}}\n}}\n}}\n",
                        block_columns, sizes_(gm.n), bytes, out, bytes, bytes);
  } else {
    post = "kiln::wg::fence_async_shared();\nkiln::wg::named_sync(2 + consumer, 128);\n";
    post += fmt::format("if (tma_out) {{\nif ((threadIdx.x & 127) == 0) {{\nkiln::wg::tma_store(&{}, staging, {});\n", text.staged_map,
                        coords("blk"));
    post += "kiln::wg::bulk_commit();\n}\n} else {  // an unaligned result: the threads copy the block out\n";
    post += each_element(fmt::format("kiln::copy_element<{}>({}, at, staging + G::staging_offset(row, column * {}));\n", bytes,
                                     writes_.at(plan.staged), bytes));
    post += "}\n}\n";
  }
  open = pre + open;
  close = close + post;
  carry.before_loop += "const int consumer = (threadIdx.x >> 7) - 1;\n";
  carry.before_loop += fmt::format("const bool tma_out = {};\nint staging_turn = 0;\n", text.tma_out);
  if (text.residual >= 0) {
    carry.before_loop += fmt::format("const bool residual_tma = tma_out && kiln::aligned16({});  // {}\n",
                                     ext_.at(text.residual).pointer, g_.tensor(text.residual).name);
    carry.before_loop += "int staging_phases = 0;  // of each buffer's `loaded` barrier\n";
    carry.tile_start += "if (residual_tma && (threadIdx.x & 127) == 0) {  // the first block of the residual\n";
    carry.tile_start += "kiln::wg::bulk_wait_read<0>();  // the last tile's stores have read both buffers\n";
    carry.tile_start += load_residual("0", "staging_turn & 1") + "}\n";
  }
  carry.after_loop += "if (tma_out && (threadIdx.x & 127) == 0) kiln::wg::bulk_wait_all();  // the last stores landed\n";
}

// Column partials: across the warp's rows (lanes with equal lane % 4), then
// one atomic each; `reset`: the registers start again (carried partials).
std::string GemmGenerator::flush_column_partials(const Gemm& gm, const EpiloguePlan& plan, const EpilogueText& text,
                                                 const std::vector<std::string>& ws, bool reset) {
  std::string flush;
  for (const auto& [r, red] : text.column_reduces) {
    const std::string functor = reduce_functor(plan.reductions[r].op->kind);
    flush += "#pragma unroll\nfor (int ni = 0; ni < G::kNI; ++ni)\n#pragma unroll\nfor (int c = 0; c < 2; ++c) {\n";
    flush += fmt::format("float v = {}[ni][c];\n", red);
    if (reset) flush += fmt::format("{}[ni][c] = {}::identity();\n", red, functor);
    flush += fmt::format("for (int lanes = 4; lanes < 32; lanes <<= 1) v = {}::combine(v, __shfl_xor_sync(0xffffffffu, v, lanes));\n",
                         functor);
    flush += fmt::format("const kiln::i64 n = n0 + G::acc_col(ni, c);\nif ((threadIdx.x & 31) >= 4 || n >= {}LL) continue;\n",
                         gm.n);
    em_.begin_block();
    const Coords column = gm.out_coords("m0", "n", "batch");
    em_.emit(fmt::format("kiln::atomic_combine({}(), static_cast<float*>({}) + {}, v);", functor, ws[r], column.back()));
    flush += em_.take() + "}\n";
  }
  return flush;
}

// The last block to finish turns the reductions' partials into the results.
std::string GemmGenerator::finish_epilogue_reductions(const EpiloguePlan& plan, const std::vector<std::string>& ws,
                                                      const std::string& counter) {
  std::string tail = "__threadfence();\n__syncthreads();\n__shared__ bool kiln_last;\n";
  tail += fmt::format("if (threadIdx.x == 0) kiln_last = atomicAdd(static_cast<unsigned int*>({}), 1u) == "
                      "gridDim.x * gridDim.y * gridDim.z - 1;\n", counter);
  tail += "__syncthreads();\nif (kiln_last) {\n__threadfence();\n";
  for (size_t r = 0; r < plan.reductions.size(); ++r) {
    const ir::Op& op = *plan.reductions[r].op;
    const ir::Tensor& out = g_.result(op);
    const int64_t count = element_count(out.shape);
    const int64_t reduced = element_count(g_.operand(op, 0).shape) / count;
    std::string v = fmt::format("static_cast<volatile float*>({})[o]", ws[r]);
    if (op.kind == OpKind::ReduceMean) v = fmt::format("({} / {})", v, Emitter::float_literal(static_cast<float>(reduced)));
    tail += fmt::format("for (kiln::i64 o = threadIdx.x; o < {}; o += blockDim.x) {}  // {}\n", sizes_(count),
                        store(op.output, "o", em_.rounded(out, v)), out.name);
  }
  return tail + "}\n";
}

// Row partials flushed with their kept coordinates named again from the row
// m (the element code's are out of scope; n, where a coordinate names it,
// is any column of the row, on which the kept ones do not depend): the
// naming statements, then `flush(partials, functor, workspace, offset)` for
// each reduction of `reduces`.
std::string GemmGenerator::flush_rows_named_again(
    const ir::Op& anchor, const Gemm& gm, const EpiloguePlan& plan, const std::vector<std::string>& ws,
    const std::vector<std::pair<size_t, std::string>>& reduces,
    const std::function<std::string(const std::string&, const std::string&, const std::string&, const std::string&)>& flush) {
  std::map<ir::TensorId, Coords> coords;
  write_coords_memo_ = &coords;
  em_.begin_block();
  const Coords oc = gm.out_coords("m", "n", "batch");
  std::string flushes;
  for (const auto& [r, red] : reduces) {
    const EpilogueReduction& k = plan.reductions[r];
    const Coords input = write_coords(anchor.output, oc, k.op->inputs[0]);
    Coords kept;
    for (size_t d = 0; d + 1 < input.size(); ++d) kept.push_back(input[d]);  // (all but the row's columns)
    flushes += flush(red, reduce_functor(k.op->kind), ws[r], em_.linearize(kept, k.kept_shape));
  }
  const std::string named = em_.take();
  write_coords_memo_ = nullptr;
  return named + flushes;
}

// A SIMT tile's row partials, once its elements are done: each of a
// thread's rows combined over the 16 lanes that hold its columns (four
// shuffles), then one atomic a row from the first of them.
std::string GemmGenerator::flush_thread_rows(const ir::Op& anchor, const Gemm& gm, const EpilogueLoops& loops,
                                             const EpiloguePlan& plan, const std::vector<std::string>& ws,
                                             const EpilogueText& text) {
  if (text.thread_row_reduces.empty()) return "";
  auto over_16_lanes = [](const std::string& red, const std::string& functor, const std::string& workspace,
                          const std::string& offset) {
    std::string code = fmt::format("{{\nfloat v = {0}[i];\n", red);
    for (int lanes = 1; lanes < 16; lanes *= 2)
      code += fmt::format("v = {}::combine(v, __shfl_xor_sync(0xffffffffu, v, {}));\n", functor, lanes);
    return code + fmt::format("if (tx == 0 && in_rows) kiln::atomic_combine({}(), static_cast<float*>({}) + {}, v);\n}}\n",
                              functor, workspace, offset);
  };
  return fmt::format("#pragma unroll\nfor (int i = 0; i < {}; ++i) {{\nconst kiln::i64 m = {};\nconst bool in_rows = m < {};\n",
                     loops.thread_rows, loops.thread_row, sizes_(gm.m)) +
         flush_rows_named_again(anchor, gm, plan, ws, text.thread_row_reduces, over_16_lanes) + "}\n";
}

// A wgmma tile's partials of rows whose kept coordinates are a reshape of
// the row (EpilogueReduction::row_renamed): the quad's lanes combined, then
// one atomic a row. Inside the flush's loop over mi and half.
std::string GemmGenerator::flush_renamed_rows(const ir::Op& anchor, const Gemm& gm, const EpiloguePlan& plan,
                                              const std::vector<std::string>& ws, const EpilogueText& text) {
  if (text.renamed_row_reduces.empty()) return "";
  return "{\nconst kiln::i64 n = n0;\n(void)n;\n" +
         flush_rows_named_again(anchor, gm, plan, ws, text.renamed_row_reduces, quad_row_atomic) + "}\n";
}

// finish_out: where the last block's finalisation of reductions goes (a
// kernel that loops over tiles runs it once, after the loop); null: after
// the loops.
std::string GemmGenerator::epilogue(const ir::Op& anchor, const Gemm& gm, const EpilogueLoops& loops, const std::string& acc,
                                   std::string* finish_out, TileLoopCarry* carry) {
  const bool tensor_core = loops.fragments;
  const ir::Tensor& result = g_.result(anchor);
  const std::vector<const ir::Op*> reduces = epilogue_reductions();
  std::vector<std::string> ws;
  for (const ir::Op* r : reduces)
    ws.push_back(workspace_param(g_.result(*r).name + ".partial", element_count(g_.result(*r).shape),
                                 reduce_identity_bits(r->kind), true));
  const std::string counter = reduces.empty() ? "" : workspace_param(g_.result(anchor).name + ".tiles_done", 1, 0, true);
  em_.begin_block();
  std::map<ir::TensorId, Coords> element_coords;  // each tensor's coordinates in the element code, named once
  write_coords_memo_ = &element_coords;
  if (gm.out_row && !tensor_core) em_.emit(gm.out_row("m"));  // (the fragment loops declare it per row)
  const Coords oc = gm.out_coords("m", "n", "batch");  // (a conv's emits the output channel)
  const EpiloguePlan plan = decide_epilogue(anchor, gm, loops, oc, reduces);
  epilogue_decision_ = "epilogue: " + plan.to_string(g_);
  if (loops.heuristic_loop) *loops.heuristic_loop = plan.rollable ? (plan.heavy ? Tuning::kRolled : Tuning::kUnrolled) : 0;

  EpilogueText text;
  // Over fragments, the columns come in blocks (staged: the 128-byte column
  // block; otherwise 8 column tiles at a time), each block's column values
  // first.
  if (tensor_core) {
    text.columns = plan.staged >= 0 ? 128 / byte_size(storage_dtype(g_.tensor(plan.staged))) / 8 : 8;
    std::set<std::string> column_vars = gm.column_vars;
    column_vars.insert({"n", "batch"});
    em_.begin_columns(column_vars, fmt::format("[{}][2]", text.columns), "[nj][c]");
  }
  em_.emit(fmt::format("const float out = {};  // {}", em_.rounded(result, plan.rolled ? "block_acc[mi][nj][e]" : acc), result.name));
  em_.set_leaf(anchor.output, "out");
  // A residual's elements as its readers name them (write_coords_memo_: the same names).
  for (ir::TensorId r : plan.residuals)
    em_.set_vector_source(r, residual_coords(anchor, oc, r), fmt::format("residual{}", r), "c");
  text.thread_rows = loops.thread_rows;
  emit_epilogue_reductions(plan, ws, text);
  emit_epilogue_pool(anchor, gm, loops, oc, text);
  emit_epilogue_writes(anchor, gm, loops, oc, plan, text);
  load_epilogue_residuals(gm, loops, plan, text);
  const std::string elements = em_.take();
  write_coords_memo_ = nullptr;
  em_.clear_vector_sources();
  if (tensor_core) {
    text.column_values = em_.end_columns();
    gm.out_coords("m", "n", "batch");
    text.column_coords = em_.take();
  }

  std::string open = loops.open, close = loops.close;
  if (tensor_core) {
    fragment_loops(gm, loops, plan, text, open, close, carry);
    if (plan.staged >= 0) {
      KILN_INTERNAL_CHECK(carry != nullptr);  // the staging state lives across the tile loop
      staged_column_blocks(gm, loops, plan, text, open, close, *carry);
    }
  }
  // Row partials: per tile, flushed once its fragments are done (a quad's
  // lanes hold the row's columns: two shuffles, then one atomic a row).
  std::string row_flush = flush_thread_rows(anchor, gm, loops, plan, ws, text);
  text.row_flush += flush_renamed_rows(anchor, gm, plan, ws, text);
  if (!text.row_flush.empty())
    row_flush = "#pragma unroll\nfor (int mi = 0; mi < G::kMI; ++mi)\n#pragma unroll\nfor (int half = 0; half < 2; ++half) {\n"
                "const kiln::i64 m = m0 + G::acc_row(mi, 2 * half);\n" +
                fmt::format("const bool in_rows = {};\n", loops.check_m ? fmt::format("m < {}", sizes_(gm.m)) : "true") +
                (gm.out_row ? gm.out_row("m") + "\n" : "") + text.row_flush + "}\n";
  const bool carrying = carry && !text.column_reduces.empty() &&
                        static_cast<int>(text.column_reduces.size()) * carry->partials_per_reduction <= carry->registers;
  const std::string flush = flush_column_partials(gm, plan, text, ws, carrying);
  std::string body;
  if (carrying) {
    // Partials of the columns [n0, n0 + BN) of one batch, until a tile of other columns comes.
    carry->before_loop += text.decls + "kiln::i64 carried_n0 = -1, carried_batch = -1;\n";
    carry->before_loop += "auto flush_columns = [&](kiln::i64 n0, kiln::i64 batch) {\n" + flush + "};\n";
    body += "if (carried_n0 != n0 || carried_batch != batch) {\n";
    body += "if (carried_n0 >= 0) flush_columns(carried_n0, carried_batch);\n";
    body += "carried_n0 = n0, carried_batch = batch;\n}\n";
    body += text.row_decls + open + elements + close + row_flush;
    carry->after_loop += "if (carried_n0 >= 0) flush_columns(carried_n0, carried_batch);\n";
  } else {
    body += text.decls + text.row_decls + open + elements + close + row_flush + flush;
  }
  if (!plan.reductions.empty()) (finish_out ? *finish_out : body) += finish_epilogue_reductions(plan, ws, counter);
  return body;
}

}  // namespace kiln::codegen
