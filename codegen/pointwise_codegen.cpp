// Pointwise and copy kernels: a grid-stride loop over the written domain,
// 16-byte vector loads and stores where every tensor allows, a scalar tail.
#include "codegen/pointwise_generator.h"

namespace kiln::codegen {

void PointwiseGenerator::pointwise() {
  KILN_INTERNAL_CHECK(!k_.writes.empty());
  const Shape domain = g_.tensor(k_.writes.front()).shape;
  const int64_t n = element_count(domain);
  const int vec = vector_width(domain);
  CodeWriter w;
  w.line("const kiln::i64 n = {};", sizes_(n));
  if (vec > 1) w.lines(vector_loop(domain, vec));
  // The scalar loop: everything when not vectorised, else the tail (and any
  // call whose pointers are not 16-byte aligned).
  if (vec > 1)
    w.line("const kiln::i64 first = kiln_vector_done ? (n / {0}LL) * {0}LL : 0;", vec);
  else
    w.line("const kiln::i64 first = 0;");
  w.block("for (kiln::i64 i = first + (kiln::i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (kiln::i64)gridDim.x * blockDim.x)", [&] {
    em_.begin_block();
    for (ir::TensorId t : k_.writes) {
      const Coords c = em_.delinearize("i", g_.tensor(t).shape);
      em_.emit(store(t, "i", em_.value(t, c)) + "  // " + g_.tensor(t).name);
    }
    w.lines(em_.take());
  });
  decided(vec > 1 ? fmt::format("{}-element vectors, scalar tail", vec) : "scalar elements");
  finish(w.take(), kThreads);
  grid_over(n, vec > 1 ? vec : 1, kThreads);
}

// Elements per thread of the vectorised path (1: no vector path): 16 bytes
// of the narrowest vectorised tensor (8 when any is 16-bit, so that every
// vectorised tensor moves whole 16-byte words), when every written tensor
// has the domain's shape and a floating storage type, and the domain has
// some whole chunks (a symbolic domain: at its largest; the vector loop
// takes none where it has fewer, the scalar loop all).
int PointwiseGenerator::vector_width(const Shape& domain) {
  int narrowest = 4;
  for (ir::TensorId t : k_.writes) {
    const ir::Tensor& tensor = g_.tensor(t);
    if (tensor.shape != domain || storage_dtype(tensor) == DType::boolean) return 1;
    narrowest = std::min(narrowest, byte_size(storage_dtype(tensor)));
  }
  for (ir::TensorId t : k_.reads) {
    const ir::Tensor& tensor = g_.tensor(t);
    const DType st = tensor.kind == ir::TensorKind::Input ? tensor.dtype : storage_dtype(tensor);
    if (tensor.shape == domain && tensor.strides == contiguous_strides(domain) && st != DType::boolean)
      narrowest = std::min(narrowest, byte_size(st));
  }
  const int v = 16 / narrowest;
  if (domain.empty() || sizes_.dim(element_count(domain)).upper() < 4 * v) return 1;
  return v;
}

std::string PointwiseGenerator::vector_loop(const Shape& domain, int vec) {
  // Tensors read at the domain's own index, contiguous: vector loads.
  std::vector<ir::TensorId> vector_reads;
  for (ir::TensorId t : read_order_) {
    const ir::Tensor& tensor = g_.tensor(t);
    const DType st = tensor.kind == ir::TensorKind::Input ? tensor.dtype : storage_dtype(tensor);
    if (tensor.shape == domain && tensor.strides == contiguous_strides(domain) && st != DType::boolean)
      vector_reads.push_back(t);
  }
  // Coordinates once per chunk when the chunk stays within the last axis;
  // then broadcast operands along the last axis (a bias, a scale) are read a
  // chunk at a time too.
  const bool chunk_in_row = domain.back() % vec == 0;
  Chunking broadcasts;
  if (chunk_in_row)
    if (Chunking ch = chunking(domain, vec, /*concats=*/true); ch.vec == vec) {
      for (ir::TensorId t : ch.loads)
        if (std::find(vector_reads.begin(), vector_reads.end(), t) == vector_reads.end()) broadcasts.loads.push_back(t);
      broadcasts.concats = ch.concats;
    }
  broadcasts.vec = vec;
  std::vector<std::string> pointers;
  for (ir::TensorId t : vector_reads) pointers.push_back(pointer_of(t));
  for (ir::TensorId t : broadcasts.loads) pointers.push_back(pointer_of(t));
  for (const ConcatChunk& cc : broadcasts.concats)
    for (const Piece& piece : cc.pieces) pointers.push_back(pointer_of(piece.tensor));
  for (ir::TensorId t : k_.writes) pointers.push_back(writes_.at(t));
  std::string aligned;
  for (const std::string& p : pointers) aligned += (aligned.empty() ? "" : " && ") + fmt::format("kiln::aligned16({})", p);
  CodeWriter w;
  w.line("const bool kiln_vector_done = {};", aligned.empty() ? "true" : aligned);
  w.block("if (kiln_vector_done)", [&] {
    w.block(fmt::format("for (kiln::i64 i0 = ((kiln::i64)blockIdx.x * blockDim.x + threadIdx.x) * {0}LL; i0 + {0}LL <= n; "
                        "i0 += (kiln::i64)gridDim.x * blockDim.x * {0}LL)", vec), [&] {
      if (!broadcasts.loads.empty() || !broadcasts.concats.empty()) w.line("const bool kiln_vec = true;  // aligned: checked above");
      em_.begin_block();
      Coords base;
      if (chunk_in_row) base = em_.delinearize("i0", domain);
      for (ir::TensorId t : vector_reads) {
        const ir::Tensor& tensor = g_.tensor(t);
        const DType st = tensor.kind == ir::TensorKind::Input ? tensor.dtype : storage_dtype(tensor);
        em_.emit(fmt::format("float {}[{}];  // {}", chunk_in(t), vec, tensor.name));
        em_.emit(fmt::format("kiln::load_vec_{}<{}>({}, i0, {});", to_string(st), vec, pointer_of(t), chunk_in(t)));
      }
      for (ir::TensorId t : k_.writes) em_.emit(fmt::format("float {}[{}];", chunk_out(t), vec));
      w.lines(em_.take());
      em_.begin_block();
      Coords c;
      if (chunk_in_row) {
        c = base;
        c.back() = "(" + base.back() + " + v)";
      } else {
        em_.emit("const kiln::i64 i = i0 + v;");
        c = em_.delinearize("i", domain);
      }
      for (ir::TensorId t : vector_reads) em_.set_vector_source(t, c, chunk_in(t), "v");
      chunk_sources(broadcasts, domain, c);
      for (ir::TensorId t : k_.writes) em_.emit(fmt::format("{}[v] = {};  // {}", chunk_out(t), em_.value(t, c), g_.tensor(t).name));
      em_.clear_vector_sources();
      const std::string element = em_.take();
      if (chunk_in_row) w.lines(chunk_load_calls(broadcasts, domain, base, element));
      w.line("#pragma unroll");
      w.block(fmt::format("for (int v = 0; v < {}; ++v)", vec), [&] { w.lines(element); });
      for (ir::TensorId t : k_.writes)
        w.line("kiln::store_vec_{}<{}>({}, i0, {});", to_string(storage_dtype(g_.tensor(t))), vec, writes_.at(t), chunk_out(t));
    });
  });
  return w.take();
}

}  // namespace kiln::codegen
