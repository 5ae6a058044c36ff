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
// over the row, in graph order, that may use the reductions before it (a
// value a pass computes and a later one reads again stays in registers); a
// last pass computes and writes every value over the domain, and one thread
// the values over the rows. Loads and stores are 16-byte chunks where the
// tensors allow (chunking()).
#include "codegen/reduction_generator.h"

namespace kiln::codegen {
namespace {

constexpr int64_t kMostHeldElements = 16384;  // 512 threads x 32 registers
constexpr size_t kMostHeldTensors = 3;

}  // namespace

// The row tensors worth keeping in registers: what the reductions and the
// ops after them read over the domain, less what is computed cheaply from
// the rest (no read of a domain-sized tensor from memory).
std::vector<ir::TensorId> ReductionGenerator::held_row_tensors(const std::set<ir::TensorId>& after) const {
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
std::string ReductionGenerator::held_row_chunk(const Chunking& ch, const std::function<void(const Coords&)>& element,
                                          std::set<ir::TensorId>* chunked) {
  const Shape& domain = k_.params.domain;
  em_.begin_block();
  const std::string e = em_.fresh("e");
  em_.emit(fmt::format("const kiln::i64 {} = line * {} + j0;", e, sizes_(k_.params.reduced)));
  const Coords base = em_.delinearize(e, domain);
  const std::string offset = em_.linearize(base, domain);
  Coords c = base;
  if (ch.vec > 1) c.back() = "(" + base.back() + " + v)";
  std::string out = em_.take();
  chunk_sources(ch, domain, c);
  std::set<ir::TensorId> stores;
  element(c);
  em_.clear_vector_sources();
  const std::string code = em_.take();
  if (ch.vec == 1) return out + code;
  if (chunked) stores = *chunked;
  out += chunk_load_calls(ch, domain, base, code) + chunk_store_arrays(ch, stores);
  out += fmt::format("#pragma unroll\nfor (int v = 0; v < {}; ++v) {{\n", ch.vec) + code + "}\n";
  return out + chunk_store_calls(ch, stores, offset);
}

// The decision, before any text: which tensors stay in registers, the
// chunk width, threads and chunks per thread, and the loop over a row.
auto ReductionGenerator::held_row_layout() const -> HeldRowLayout {
  const ir::KernelParams& p = k_.params;
  HeldRowLayout h;
  h.n = p.reduced;
  const int64_t count = element_count(p.domain);
  h.reduces = ops_of({ir::OpFamily::Reduce});
  std::set<ir::TensorId> finished;
  for (const ir::Op* r : h.reduces) finished.insert(r->output);
  for (ir::TensorId t : downstream_of(finished))
    if (element_count(g_.tensor(t).shape) == count) h.after.insert(t);
  h.held = held_row_tensors(h.after);
  h.ch = chunking(p.domain, h.n);
  const int64_t chunks = h.n / h.ch.vec;
  // (a symbolic row length: each pass re-reads the row, its loop bound a size parameter)
  h.in_registers = !sizes_.symbolic(h.n) && h.n <= kMostHeldElements && h.held.size() <= kMostHeldTensors;
  h.threads = h.in_registers
                  ? static_cast<int>(std::clamp<int64_t>(std::bit_ceil(static_cast<uint64_t>((chunks + 1) / 2)), 32, 512))
                  : 512;
  h.per = (chunks + h.threads - 1) / h.threads;
  // Registers: where the threads' chunks cover the row exactly no chunk is
  // past it (no branch); else a chunk past it is skipped, and in the load
  // holds zeros (a value on every path). With a branch per chunk and no
  // zeros, H100, 16384 rows of 4096: softmax written out took 62 registers
  // (48 without) and 0.115 ms (0.104); RMSNorm as Llama writes it 0.103
  // (0.093, 96% of copy); LayerNorm written out 0.120 (0.106).
  const bool exact = h.per * h.threads * h.ch.vec == h.n;
  const std::string head = fmt::format("#pragma unroll\nfor (int t = 0; t < {0}; ++t) {{\nconst int j0 = (threadIdx.x + t * {1}) * {2};\n",
                                       h.per, h.threads, h.ch.vec);
  std::string zeros;
  for (size_t i = 0; i < h.held.size(); ++i)
    zeros += fmt::format("for (int v = 0; v < {}; ++v) xs{}[t * {} + v] = 0.0f;\n", h.ch.vec, i, h.ch.vec);
  const std::string past = fmt::format("if (j0 >= {}) ", h.n);
  h.loop = !h.in_registers ? fmt::format("for (int j0 = threadIdx.x * {0}; j0 < {1}; j0 += {2}) {{\n", h.ch.vec, sizes_(h.n, ""),
                                         h.threads * h.ch.vec)
           : exact         ? head
                           : head + past + "continue;\n";
  h.load_loop = !h.in_registers || exact ? h.loop : head + past + "{\n#pragma unroll\n" + zeros + "continue;\n}\n";
  return h;
}

std::string ReductionGenerator::HeldRowLayout::slot(const std::string& array) const {
  return fmt::format("{}[t * {} + {}]", array, ch.vec, ch.vec > 1 ? "v" : "0");
}

// The registers' values at coordinates c are leaves of the emitter.
void ReductionGenerator::use_held_row(const HeldRowLayout& h, const Coords& c) {
  if (!h.in_registers) return;
  for (size_t i = 0; i < h.held.size(); ++i) em_.set_leaf(h.held[i], h.slot(fmt::format("xs{}", i)), c);
  for (const auto& [t, array] : h.kept) em_.set_leaf(t, h.slot(array), c);
}

// Pass k: reduction r over the row, from registers where it can; a value
// the pass computes and a later pass reads again (the exp of a softmax:
// summed, then divided) is kept in registers too, within the budget.
std::string ReductionGenerator::held_row_pass(HeldRowLayout& h, const ir::Op& r, size_t k) {
  const std::string functor = reduce_functor(r.kind);
  const ir::TensorId input = r.inputs[0];
  bool read_again = std::find(k_.writes.begin(), k_.writes.end(), input) != k_.writes.end();
  for (int32_t oi : k_.ops)
    if (const ir::Op& op = g_.ops[static_cast<size_t>(oi)]; &op != &r)
      read_again = read_again || std::find(op.inputs.begin(), op.inputs.end(), input) != op.inputs.end();
  const bool keep = h.in_registers && h.after.count(input) && h.held.size() + h.kept.size() < kMostHeldTensors && read_again;
  const std::string keep_array = fmt::format("ys{}", k);
  std::string body;
  if (keep) body += fmt::format("float {}[{}];  // {}\n", keep_array, h.per * h.ch.vec, g_.tensor(input).name);
  body += fmt::format("float stat{};  // {}\n{{\nfloat acc = {}::identity();\n", k, g_.result(r).name, functor);
  body += h.loop + held_row_chunk(h.ch, [&](const Coords& c) {
                              use_held_row(h, c);
                              const std::string x = em_.value(input, c);
                              em_.emit(fmt::format("acc = {}::combine(acc, {});", functor, x));
                              if (keep) em_.emit(fmt::format("{} = {};", h.slot(keep_array), x));
                            }) + "}\n";
  if (keep) h.kept.emplace_back(input, keep_array);
  std::string v = "acc";
  if (r.kind == OpKind::ReduceMean)
    v = sizes_.symbolic(h.n) ? fmt::format("acc / (float){}", sizes_(h.n))
                             : fmt::format("acc / {}", Emitter::float_literal(static_cast<float>(h.n)));
  body += fmt::format("acc = kiln::block_reduce<{}>(acc, kiln_scratch);\nstat{} = {};\n}}\n", functor, k,
                      em_.rounded(g_.result(r), v));
  em_.set_leaf(r.output, fmt::format("stat{}", k));
  return body;
}

// After the passes: the values over the rows (one thread), then those over
// the domain.
std::string ReductionGenerator::held_row_writes(const HeldRowLayout& h) {
  const Shape& domain = k_.params.domain;
  const int64_t count = element_count(domain);
  std::string body;
  em_.begin_block();
  for (ir::TensorId t : k_.writes) {
    const Shape& shape = g_.tensor(t).shape;
    if (element_count(shape) == count) continue;
    const Coords rc = em_.delinearize("line", shape);
    em_.emit(store(t, em_.linearize(rc, shape), em_.value(t, rc)) + "  // " + g_.tensor(t).name);
  }
  if (const std::string rows = em_.take(); !rows.empty()) body += "if (threadIdx.x == 0) {\n" + rows + "}\n";
  std::set<ir::TensorId> chunked;
  const auto element = [&](const Coords& c) {
    use_held_row(h, c);
    for (ir::TensorId t : k_.writes) {
      const ir::Tensor& tensor = g_.tensor(t);
      if (element_count(tensor.shape) != count) continue;
      const Coords tc = em_.same_element(c, domain, tensor.shape);
      if (tc == c && std::find(h.ch.stores.begin(), h.ch.stores.end(), t) != h.ch.stores.end()) {
        em_.emit(fmt::format("{}[v] = {};  // {}", chunk_out(t), em_.value(t, tc), tensor.name));
        chunked.insert(t);
      } else {
        em_.emit(store(t, em_.linearize(tc, tensor.shape), em_.value(t, tc)) + "  // " + tensor.name);
      }
    }
  };
  return body + h.loop + held_row_chunk(h.ch, element, &chunked) + "}\n";
}

void ReductionGenerator::held_rows() {
  HeldRowLayout h = held_row_layout();
  decided(fmt::format("held rows: {} passes, {}, {} threads, {}-element chunks", h.reduces.size(),
                      h.in_registers ? "the row in registers" : "each pass re-reads the row", h.threads, h.ch.vec));
  std::string body = "__shared__ float kiln_scratch[32];\n";
  if (h.ch.vec > 1) body += fmt::format("const bool kiln_vec = {};\n", h.ch.aligned);
  body += fmt::format("for (kiln::i64 line = blockIdx.x; line < {}; line += gridDim.x) {{\n", sizes_(k_.params.outer));
  if (h.in_registers && !h.held.empty()) {  // the row's inputs, read once
    for (size_t i = 0; i < h.held.size(); ++i)
      body += fmt::format("float xs{}[{}];  // {}\n", i, h.per * h.ch.vec, g_.tensor(h.held[i]).name);
    body += h.load_loop + held_row_chunk(h.ch, [&](const Coords& c) {
                                for (size_t i = 0; i < h.held.size(); ++i)
                                  em_.emit(fmt::format("{} = {};", h.slot(fmt::format("xs{}", i)), em_.value(h.held[i], c)));
                              }) + "}\n";
  }
  for (size_t k = 0; k < h.reduces.size(); ++k) body += held_row_pass(h, *h.reduces[k], k);  // in graph order
  body += held_row_writes(h) + "__syncthreads();\n}\n";
  for (ir::TensorId t : h.held) em_.clear_leaf(t);
  for (const auto& [t, array] : h.kept) em_.clear_leaf(t);
  finish(body, h.threads);
  grid_over(k_.params.outer, 1, 1);
}

}  // namespace kiln::codegen
