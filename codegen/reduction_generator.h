// The generator of reduction kernels (reduction_codegen.cpp,
// held_rows_codegen.cpp): a block per kept element, split rows, columns of
// an inner block, reductions that hold their rows, pools, and the row
// statistics of a normalisation applied in a matmul's prologue.
#pragma once

#include "codegen/kernel_builder.h"

namespace kiln::codegen {

class ReductionGenerator : public KernelBuilder {
 public:
  using KernelBuilder::KernelBuilder;

  void reduction();

  // One element of the reduced domain: accumulators combined, pre-reduction writes stored.
  void reduction_step(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post, const Coords& full,
                      const Shape& domain, const std::string& acc_format);

  // The finished reductions (accumulator `acc_format` of reduction j, the
  // kept element's linear index in `k`) and every write after them: means
  // divided, results rounded as the graph says, post-reduction ops at the
  // matching elements.
  std::string reduction_results(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post,
                                int64_t reduced, const std::string& acc_format);

  // ---- reductions (block per kept element) ----------------------------------------

  // ---- reductions that hold their rows (held_rows_codegen.cpp) ----------------
  void held_rows();
  struct HeldRowLayout {
    int64_t n = 0;                                // row length
    std::vector<const ir::Op*> reduces;           // in graph order: one pass each
    std::set<ir::TensorId> after;                 // domain values computed from a finished reduction
    std::vector<ir::TensorId> held;               // row tensors read once into registers xs<i>
    std::vector<std::pair<ir::TensorId, std::string>> kept;  // pass values kept for later passes
    Chunking ch;
    bool in_registers = false;  // else every pass re-reads the row
    int threads = 0;
    int64_t per = 0;            // chunks per thread
    std::string loop;           // the head of a loop over this thread's chunks of the row
    std::string load_loop;      // ... for the load into registers: a chunk past the row holds zeros
    std::string slot(const std::string& array) const;
  };
  HeldRowLayout held_row_layout() const;
  void use_held_row(const HeldRowLayout& h, const Coords& c);
  std::string held_row_pass(HeldRowLayout& h, const ir::Op& r, size_t k);
  std::string held_row_writes(const HeldRowLayout& h);
  std::vector<ir::TensorId> held_row_tensors(const std::set<ir::TensorId>& after) const;
  std::string held_row_chunk(const Chunking& ch, const std::function<void(const Coords&)>& element,
                             std::set<ir::TensorId>* chunked = nullptr);

  std::string row_reduction_body(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post, const Shape& d,
                                 const Coords& kc, const Shape& reduced_shape, const Chunking& ch);
  std::string row_reduction_combine(const std::vector<const ir::Op*>& reduces, const std::vector<std::string>& partials,
                                    const std::string& counter, int64_t kept, int64_t splits);

  // Reductions over axes outside a contiguous inner block of >= 32
  // elements ([outer, reduced, inner], e.g. per-channel statistics of NHWC):
  // threads own V adjacent inner columns (16-byte loads where the inner
  // block is the last axis and the pointers are aligned), several row lanes
  // per block, the reduced axis split over gridDim.y when the columns alone
  // would not fill the GPU. Split partials are combined atomically; the last
  // block of each column block finishes its columns (post-reduction ops
  // included).
  void column_reduction(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post, const Shape& d,
                        const Shape& kept_shape, const Shape& reduced_shape, int64_t inner);
  struct ColumnLayout {
    int64_t inner = 0, kept = 0, reduced = 0;
    std::vector<ir::TensorId> vector_reads;  // read at the reduction's index, contiguous: 16-byte loads
    int vec = 1, cols = 8, lanes = 32;       // columns per thread; column threads and row lanes per block
    int64_t per_outer = 0, col_blocks = 0, splits = 1, slice = 0;
  };
  ColumnLayout column_layout(const ir::Op& first, const Shape& d, const Shape& kept_shape, const Shape& reduced_shape,
                             int64_t inner) const;
  std::string column_row_loop(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post, const Shape& d,
                              const Shape& kept_shape, const Shape& reduced_shape, const ColumnLayout& c, bool vectors);
  std::string column_finish(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post,
                            const ColumnLayout& c, const std::vector<std::string>& partials, const std::string& counter);

  void pooling(const ir::Op& pool);
  std::string pooling_vectors(const ir::Op& pool, std::string& aligned);

  // The row statistics of a layer_norm/rms_norm whose application is the
  // prologue of a matmul: [rows][2] floats (mean, rstd) in a workspace.
  void norm_statistics(const ir::Op& norm);

  // A block-wide sum over a last-axis row of x: `update` accumulates into
  // `sum` from `x`; `assign` uses the total.
  std::string row_pass(ir::TensorId x, const Shape& shape, int64_t n, const std::string& update,
                       const std::string& assign);

};

}  // namespace kiln::codegen
