// Reduction kernels that hold their rows (KernelParams::holds_rows):
// softmax, LayerNorm, RMSNorm and their variants written op by op.
//
// Expects: a reduction kernel whose reductions all reduce the last axes of
// one domain [lines, n], and whose other ops are pointwise or views, each
// over the domain or over the rows (the planner's rows-held rule: a value
// computed from a finished reduction is read only within its row).
// Guarantees: a block per row (grid-stride). The row's inputs are read once
// into registers where the row fits (n <= 16384 and at most three row
// tensors to keep), else re-read by every pass; each reduction is one pass
// over the row, in graph order, that may use the reductions before it; a
// last pass computes and writes every value over the domain, and one thread
// the values over the rows. Loads and stores are 16-byte chunks where the
// tensors allow (chunking()).
#include "codegen/kernel_builder.h"

namespace kiln::codegen {
namespace {

constexpr int64_t kMostHeldElements = 16384;  // 512 threads x 32 registers
constexpr size_t kMostHeldTensors = 3;

}  // namespace

// The row tensors worth keeping in registers: what the reductions and the
// ops after them read over the domain, less what is computed cheaply from
// the rest (no read of a domain-sized tensor from memory).
std::vector<ir::TensorId> KernelBuilder::held_row_tensors(const std::set<ir::TensorId>& after) const {
  const Shape& domain = k_.params.domain;
  const int64_t count = element_count(domain);
  std::vector<ir::TensorId> held;
  for (int32_t oi : k_.ops) {
    const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
    const bool reads_row = ir::op_info(op.kind).family == ir::OpFamily::Reduce || after.count(op.output);
    if (!reads_row) continue;
    for (ir::TensorId t : op.inputs) {
      const ir::Tensor& tensor = g_.tensor(t);
      if (after.count(t) || tensor.kind == ir::TensorKind::Constant || tensor.shape != domain) continue;
      if (std::find(held.begin(), held.end(), t) == held.end()) held.push_back(t);
    }
  }
  // Recomputable from the others: drop it (latest first, so that a chain
  // keeps its start).
  auto cheap = [&](auto&& self, ir::TensorId t, const std::vector<ir::TensorId>& kept) -> bool {
    if (std::find(kept.begin(), kept.end(), t) != kept.end()) return true;
    const ir::Tensor& tensor = g_.tensor(t);
    if (tensor.kind == ir::TensorKind::Constant) return true;
    const bool here = computed_here(t);
    if (!here) return element_count(tensor.shape) < count;
    const ir::Op& op = g_.ops[static_cast<size_t>(tensor.producer)];
    return std::all_of(op.inputs.begin(), op.inputs.end(), [&](ir::TensorId in) { return self(self, in, kept); });
  };
  for (size_t i = held.size(); i-- > 0;) {
    std::vector<ir::TensorId> others = held;
    others.erase(others.begin() + static_cast<ptrdiff_t>(i));
    if (!computed_here(held[i])) continue;  // read from memory: keeping it is the point
    const ir::Op& op = g_.ops[static_cast<size_t>(g_.tensor(held[i]).producer)];
    if (std::all_of(op.inputs.begin(), op.inputs.end(), [&](ir::TensorId in) { return cheap(cheap, in, others); }))
      held = others;
  }
  return held;
}

// One loop over the row's chunks: coordinates, chunk loads, and the lane
// loop around the code `element` emits at coordinates c; chunked writes
// (element_writes) gathered and stored a chunk at a time.
std::string KernelBuilder::held_row_chunk(const Chunking& ch, const std::function<void(const Coords&)>& element,
                                          std::set<ir::TensorId>* chunked) {
  const Shape& domain = k_.params.domain;
  em_.begin_block();
  const std::string e = em_.fresh("e");
  em_.emit(fmt::format("const kiln::i64 {} = line * {}LL + j0;", e, k_.params.reduced));
  const Coords base = em_.delinearize(e, domain);
  const std::string offset = em_.linearize(base, domain);
  Coords c = base;
  if (ch.vec > 1) c.back() = "(" + base.back() + " + v)";
  std::string out = em_.take(0);
  chunk_sources(ch, domain, c);
  std::set<ir::TensorId> stores;
  element(c);
  em_.clear_vector_sources();
  const std::string code = em_.take(0);
  if (ch.vec == 1) return out + code;
  if (chunked) stores = *chunked;
  out += chunk_load_calls(ch, domain, base, code) + chunk_store_arrays(ch, stores);
  out += fmt::format("#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\n", ch.vec) + indented(code, 2) + "}\n";
  return out + chunk_store_calls(ch, stores, offset);
}

void KernelBuilder::held_rows() {
  const ir::KernelParams& p = k_.params;
  const Shape& domain = p.domain;
  const int64_t lines = p.outer, n = p.reduced, count = element_count(domain);
  const std::vector<const ir::Op*> reduces = ops_of({ir::OpFamily::Reduce});
  std::set<ir::TensorId> finished;
  for (const ir::Op* r : reduces) finished.insert(r->output);
  std::set<ir::TensorId> after;  // domain values computed from a finished reduction
  for (ir::TensorId t : downstream_of(finished))
    if (element_count(g_.tensor(t).shape) == count) after.insert(t);
  const std::vector<ir::TensorId> held = held_row_tensors(after);
  const Chunking ch = chunking(domain, n);
  const int64_t vec = ch.vec, chunks = n / vec;
  const bool in_registers = n <= kMostHeldElements && held.size() <= kMostHeldTensors;
  const int threads =
      in_registers ? static_cast<int>(std::clamp<int64_t>(std::bit_ceil(static_cast<uint64_t>((chunks + 1) / 2)), 32, 512)) : 512;
  const int64_t per = (chunks + threads - 1) / threads;
  const std::string loop =
      in_registers
          ? fmt::format("#pragma unroll\n    for (int t = 0; t < {0}; ++t) {{\n      const int j0 = (threadIdx.x + t * {1}) * {2};\n"
                        "      if (j0 >= {3}) continue;\n", per, threads, vec, n)
          : fmt::format("    for (int j0 = threadIdx.x * {0}; j0 < {1}; j0 += {2}) {{\n", vec, n, threads * vec);
  auto slot = [&](size_t i) { return fmt::format("xs{}[t * {} + {}]", i, vec, vec > 1 ? "v" : "0"); };
  // Values a pass computes over the row and a later pass reads again (the
  // exp of a softmax: summed, then divided) stay in registers too.
  std::vector<std::pair<ir::TensorId, std::string>> kept;  // tensor, register array
  auto use_held = [&](const Coords& c) {
    if (!in_registers) return;
    for (size_t i = 0; i < held.size(); ++i) em_.set_leaf(held[i], slot(i), c);
    for (const auto& [t, array] : kept) em_.set_leaf(t, fmt::format("{}[t * {} + {}]", array, vec, vec > 1 ? "v" : "0"), c);
  };
  auto read_again = [&](ir::TensorId t, const ir::Op& reduction) {
    if (std::find(k_.writes.begin(), k_.writes.end(), t) != k_.writes.end()) return true;
    for (int32_t oi : k_.ops) {
      const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
      if (&op != &reduction && std::find(op.inputs.begin(), op.inputs.end(), t) != op.inputs.end()) return true;
    }
    return false;
  };

  std::string body = "  __shared__ float kiln_scratch[32];\n";
  if (vec > 1) body += fmt::format("  const bool kiln_vec = {};\n", ch.aligned);
  body += fmt::format("  for (kiln::i64 line = blockIdx.x; line < {}LL; line += gridDim.x) {{\n", lines);
  if (in_registers && !held.empty()) {
    for (size_t i = 0; i < held.size(); ++i)
      body += fmt::format("    float xs{}[{}];  // {}\n", i, per * vec, g_.tensor(held[i]).name);
    body += loop + indented(held_row_chunk(ch, [&](const Coords& c) {
                                 for (size_t i = 0; i < held.size(); ++i)
                                   em_.emit(fmt::format("{} = {};", slot(i), em_.value(held[i], c)));
                               }),
                            6) + "    }\n";
  }
  // A pass per reduction, in graph order; each may read those before it.
  for (size_t k = 0; k < reduces.size(); ++k) {
    const ir::Op& r = *reduces[k];
    const std::string functor = reduce_functor(r.kind);
    const ir::TensorId input = r.inputs[0];
    const bool keep = in_registers && after.count(input) && held.size() + kept.size() < kMostHeldTensors &&
                      read_again(input, r);
    const std::string keep_array = fmt::format("ys{}", k);
    if (keep) body += fmt::format("    float {}[{}];  // {}\n", keep_array, per * vec, g_.tensor(input).name);
    body += fmt::format("    float stat{};  // {}\n    {{\n      float acc = {}::identity();\n", k, g_.result(r).name, functor);
    body += loop + indented(held_row_chunk(ch, [&](const Coords& c) {
                                 use_held(c);
                                 const std::string x = em_.value(input, c);
                                 em_.emit(fmt::format("acc = {}::combine(acc, {});", functor, x));
                                 if (keep) em_.emit(fmt::format("{}[t * {} + {}] = {};", keep_array, vec, vec > 1 ? "v" : "0", x));
                               }),
                            6) + "    }\n";
    if (keep) kept.emplace_back(input, keep_array);
    std::string v = "acc";
    if (r.kind == OpKind::ReduceMean) v = fmt::format("acc / {}", Emitter::float_literal(static_cast<float>(n)));
    body += fmt::format("      acc = kiln::block_reduce<{}>(acc, kiln_scratch);\n      stat{} = {};\n    }}\n", functor, k,
                        em_.rounded(g_.result(r), v));
    em_.set_leaf(r.output, fmt::format("stat{}", k));
  }
  // Values over the rows: one thread writes them.
  em_.begin_block();
  for (ir::TensorId t : k_.writes) {
    const Shape& shape = g_.tensor(t).shape;
    if (element_count(shape) == count) continue;
    const Coords rc = em_.delinearize("line", shape);
    em_.emit(store(t, em_.linearize(rc, shape), em_.value(t, rc)) + "  // " + g_.tensor(t).name);
  }
  if (const std::string rows = em_.take(6); !rows.empty()) body += "    if (threadIdx.x == 0) {\n" + rows + "    }\n";
  // Values over the domain.
  std::set<ir::TensorId> chunked;
  body += loop + indented(held_row_chunk(ch, [&](const Coords& c) {
                               use_held(c);
                               for (ir::TensorId t : k_.writes) {
                                 const ir::Tensor& tensor = g_.tensor(t);
                                 if (element_count(tensor.shape) != count) continue;
                                 const Coords tc = same_element(c, domain, tensor.shape);
                                 if (tc == c && std::find(ch.stores.begin(), ch.stores.end(), t) != ch.stores.end()) {
                                   em_.emit(fmt::format("out{}[v] = {};  // {}", t, em_.value(t, tc), tensor.name));
                                   chunked.insert(t);
                                 } else {
                                   em_.emit(store(t, em_.linearize(tc, tensor.shape), em_.value(t, tc)) + "  // " + tensor.name);
                                 }
                               }
                             }, &chunked),
                          6) + "    }\n";
  body += "    __syncthreads();\n  }\n";
  for (ir::TensorId t : held) em_.clear_leaf(t);
  for (const auto& [t, array] : kept) em_.clear_leaf(t);
  finish(body, threads);
  out_.grid = {blocks_for(lines, 1), 1, 1};
}

}  // namespace kiln::codegen
