// KernelBuilder: the CUDA C++ of one planned kernel, shared by the
// generators of each kernel kind (codegen's internal header; the public
// entry point is kernel_codegen.h).
//
// One file per kind of kernel: pointwise_codegen.cpp (vectorised pointwise
// and copies), reduction_codegen.cpp (row, split and column reductions,
// pools, row statistics), norm_codegen.cpp (persistent and multi-pass
// normalisations), gemm_codegen.cpp (matmul and conv on tensor cores or
// SIMT, prologues), epilogue_codegen.cpp (their epilogues: decided, then
// written), wgmma_codegen.cpp (the Hopper kernel), attention_codegen.cpp
// (flash attention and the exact two-pass kernel); kernel_builder.cpp holds
// what they share (parameters, coordinates of writes, the kernel's frame).
// Generators that decide much build a description first (EpiloguePlan,
// WgmmaShape, TileOperand, ExactAttention, ColumnLayout), then write.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "codegen/emitter.h"
#include "codegen/kernel_codegen.h"
#include "compiler/error.h"

namespace kiln::codegen {

using ir::OpKind;

inline constexpr int kThreads = 256;

inline uint32_t float_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

// A reduction's combine op on the device (the op table's `device` column).
inline std::string reduce_functor(OpKind kind) {
  KILN_INTERNAL_CHECK(ir::op_info(kind).family == ir::OpFamily::Reduce);
  return std::string(ir::op_info(kind).device);
}

inline uint32_t reduce_identity_bits(OpKind kind) {
  if (kind == OpKind::ReduceMax) return float_bits(-INFINITY);
  if (kind == OpKind::ReduceMin) return float_bits(INFINITY);
  return 0;
}

inline uint32_t blocks_for(int64_t work, int64_t per_block) {
  return static_cast<uint32_t>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, int64_t{1} << 20));
}

inline std::string drop_comment_lines(const std::string& source) {
  std::istringstream in(source);
  std::string line, out;
  while (std::getline(in, line)) {
    const size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, 2, "//") == 0) continue;
    // Trailing comments name tensors: drop them too.
    if (const size_t c = line.find("  // "); c != std::string::npos) line.resize(c);
    out += line + "\n";
  }
  return out;
}

// `text` with every line indented by `spaces`.
inline std::string indented(const std::string& text, int spaces) {
  std::string out;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    out += std::string(static_cast<size_t>(spaces), ' ') + text.substr(at, end - at) + "\n";
    at = end + 1;
  }
  return out;
}

// State shared by the kernels of one program (workspaces by name).
struct ProgramState {
  GeneratedProgram program;
  std::map<std::string, int> workspace_index;

  int workspace(const std::string& name, int64_t words, uint32_t fill) {
    auto it = workspace_index.find(name);
    if (it != workspace_index.end()) return it->second;
    const int index = static_cast<int>(program.workspaces.size());
    program.workspaces.push_back({name, words, fill});
    workspace_index[name] = index;
    return index;
  }
};

class KernelBuilder {
 public:
  KernelBuilder(const ir::Graph& g, const ir::PlannedKernel& k, ProgramState& state, int sm, Tuning wanted = {})
      : g_(g), k_(k), state_(state), sm_(sm), wanted_(wanted), em_(g, std::set<int32_t>(k.ops.begin(), k.ops.end()), externals()) {
    out_.plan_kernel = k.id;
  }

  // ---- parameters ---------------------------------------------------------
  std::map<ir::TensorId, ExternalTensor> externals();

  std::string add_param(KernelArg arg, bool read_only, const std::string& what);

  std::string workspace_param(const std::string& name, int64_t words, uint32_t fill, bool reset_here);

  std::string store(ir::TensorId t, const std::string& offset, const std::string& value);

  // ---- the pieces each kind needs ---------------------------------------------
  std::vector<const ir::Op*> ops_of(std::initializer_list<ir::OpFamily> families) const;

  // Tensors computed (in this kernel) from the results of `roots`.
  std::set<ir::TensorId> downstream_of(const std::set<ir::TensorId>& roots) const;

  // Coordinates of a tensor that has `count` elements in the same linear
  // order as `shape` at `coords`.
  Coords same_element(const Coords& coords, const Shape& shape, const Shape& target);

  // The coordinates of `to` at the element where `from` has `coords`,
  // following this kernel's ops forward: views map coordinates, pointwise
  // ops keep them. nullopt when `to` is not computed from `from` here.
  std::optional<Coords> forward(ir::TensorId from, ir::TensorId to, const Coords& coords);

  // Where to write `t` in a kernel whose template holds `leaf` at
  // `leaf_coords`: downstream of the leaf, at the matching element; else (t
  // does not use the leaf) at the element with the same linear index.
  Coords write_coords(ir::TensorId leaf, const Coords& leaf_coords, ir::TensorId t);

  std::string finish(const std::string& body, int threads, const std::string& shared = "",
                     const std::string& includes = "");

  GeneratedKernel take() { return std::move(out_); }

  // The choice to build with: the requested one where `space` (the
  // heuristic's choice first) holds it, else the heuristic's. Records both
  // in the generated kernel.
  Tuning choose_tuning(const std::vector<Tuning>& space);
  // Once the generator knows a choice does not exist for this kernel:
  // `erase` clears it in the choice made and in every alternative
  // (duplicates merged; the heuristic's stays first).
  void restrict_tuning(const std::function<void(Tuning&)>& erase);

  // ---- chunks: V consecutive elements along the last axis of a domain --------------
  // Which tensors move V elements at a time in a kernel that walks `domain`
  // a chunk at a time (chunks start at multiples of V of the last axis):
  // loads of tensors read at the domain's coordinates as pointwise ops
  // broadcast them, whose last axis is the domain's, stride 1, other strides
  // multiples of V; stores of written tensors of the domain's shape. V is 16
  // bytes of the narrowest of them; 1 (no chunks) when nothing qualifies or
  // V does not divide `lane_extent` (the run of the last axis the kernel
  // keeps together) and the last axis.
  struct Chunking {
    int vec = 1;
    std::vector<ir::TensorId> loads, stores;
    std::string aligned = "true";  // a condition: every chunked pointer is 16-byte aligned
  };
  Chunking chunking(const Shape& domain, int64_t lane_extent) const;

  // Makes in<t>[v] the value of each chunked tensor at `c` (a chunk's first
  // element with the last coordinate advanced by the lane `v`).
  void chunk_sources(const Chunking& ch, const Shape& domain, const Coords& c);
  // The loads into in<t>[V] at `base` (the chunk's first element) of the
  // chunked tensors that `element` (the lane loop's code) uses.
  std::string chunk_load_calls(const Chunking& ch, const Shape& domain, const Coords& base, const std::string& element);

  // The writes of one element at `c` (coordinates of `leaf`): chunked
  // stores go to out<t>[v] (and into `chunked`), the rest are stored here.
  void element_writes(ir::TensorId leaf, const Coords& c, const Chunking& ch, std::set<ir::TensorId>& chunked,
                      const std::set<ir::TensorId>& skip = {});

  // Declarations before, and stores after, the lane loop of the chunked stores.
  std::string chunk_store_arrays(const Chunking& ch, const std::set<ir::TensorId>& chunked) const;
  std::string chunk_store_calls(const Chunking& ch, const std::set<ir::TensorId>& chunked, const std::string& offset) const;

  // ---- pointwise and copy ---------------------------------------------------------
  void pointwise();

  // Elements per thread of the vectorised path (1: no vector path): 16 bytes
  // of the narrowest vectorised tensor (8 when any is 16-bit, so that every
  // vectorised tensor moves whole 16-byte words), when every written tensor
  // has the domain's shape and a floating storage type, and the domain has
  // some whole chunks.
  int vector_width(const Shape& domain);

  std::string vector_loop(const Shape& domain, int vec);

  std::string pointer_of(ir::TensorId t) const;

  // One element of the reduced domain: accumulators combined, pre-reduction writes stored.
  void reduction_step(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post, const Coords& full,
                      const Shape& domain, const std::string& acc_format);

  // The finished reductions (accumulator `acc_format` of reduction j, the
  // kept element's linear index in `k`) and every write after them: means
  // divided, results rounded as the graph says, post-reduction ops at the
  // matching elements.
  std::string reduction_results(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post,
                                int64_t reduced, const std::string& acc_format, int indent);

  // ---- reductions (block per kept element) ----------------------------------------
  void reduction();

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
    std::string slot(const std::string& array) const;
  };
  HeldRowLayout held_row_layout() const;
  void use_held_row(const HeldRowLayout& h, const Coords& c);
  std::string held_row_pass(HeldRowLayout& h, const ir::Op& r, size_t k);
  std::string held_row_writes(const HeldRowLayout& h);
  bool computed_here(ir::TensorId t) const {
    const ir::Tensor& tensor = g_.tensor(t);
    return tensor.kind == ir::TensorKind::OpResult &&
           std::find(k_.ops.begin(), k_.ops.end(), tensor.producer) != k_.ops.end();
  }
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
    int vec = 1, cols = 8, lanes = 32;       // columns per thread, per block; row lanes per block
    int64_t per_outer = 0, col_blocks = 0, splits = 1, slice = 0;
  };
  ColumnLayout column_layout(const ir::Op& first, const Shape& d, const Shape& kept_shape, const Shape& reduced_shape,
                             int64_t inner) const;
  std::string column_row_loop(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post, const Shape& d,
                              const Shape& kept_shape, const Shape& reduced_shape, const ColumnLayout& c, bool vectors);
  std::string column_finish(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post,
                            const ColumnLayout& c, const std::vector<std::string>& partials, const std::string& counter);

  void pooling(const ir::Op& pool);

  // The row statistics of a layer_norm/rms_norm whose application is the
  // prologue of a matmul: [rows][2] floats (mean, rstd) in a workspace.
  void norm_statistics(const ir::Op& norm);

  // A block-wide sum over a last-axis row of x: `update` accumulates into
  // `sum` from `x`; `assign` uses the total.
  std::string row_pass(ir::TensorId x, const Shape& shape, int64_t n, const std::string& update,
                       const std::string& assign);

  // ---- normalisations: a block per row (or group) ------------------------------
  // Element j of line `line` of a normalisation -> coordinates of its input.
  Coords norm_element(const ir::Op& norm, const std::string& j);

  // The normalised value of `x` with its parameters, named "y", and the
  // stores of everything the kernel writes at this element.
  // With `ch`, chunked stores go to out<t>[v] (see element_writes).
  std::string norm_output(const ir::Op& norm, const Coords& c, const std::string& finale, const Chunking* ch = nullptr,
                          std::set<ir::TensorId>* chunked = nullptr);

  // The statistics: what to accumulate from `x` in which pass, how to
  // finish each pass into stat0/stat1, and the output from x and the stats.
  struct NormRecipe {
    std::vector<std::tuple<std::string, std::string, std::string, std::string>> passes;  // init, functor, update, finish
    std::string finale;
  };
  NormRecipe norm_recipe(const ir::Op& norm);

  void norm();

  // Rows that fit in registers, read and written a chunk at a time.
  void norm_chunked(const ir::Op& norm, const Chunking& ch);

  // Rows that fit in the shared memory of `cluster` blocks (a thread-block
  // cluster on sm_90, one block before): each block holds a slice of the
  // row; block statistics are combined across the cluster through
  // distributed shared memory, in rank order (every block gets the same
  // value). One read, one write.
  void norm_cluster(const ir::Op& norm, const Chunking& ch, int cluster);

  // How many blocks hold one row of `n` f32 values in shared memory (0: it
  // does not fit).
  int row_cluster(int64_t n) const;

  // The chunk of the row at element `j0`: its coordinates (`base`, the
  // first element) and those of lane `v`.
  Coords norm_chunk_coords(const ir::Op& norm, const Chunking& ch, Coords& base);
  // Loads a chunk of the norm's input into `slot` (an lvalue of lane v).
  std::string norm_chunk_input(const ir::Op& norm, const Chunking& ch, const std::string& slot);
  // The outputs of a chunk from x in `slot` (also the input's value there
  // when `slot_holds_input`).
  std::string norm_chunk_output(const ir::Op& norm, const Chunking& ch, const std::string& slot, const std::string& finale,
                                bool slot_holds_input);

  // How a normalisation's row is chunked (vec 1: element by element).
  Chunking row_chunking(const ir::Op& norm);

  // Softmax can keep exp(x - max) in place of x when nothing else in the
  // kernel reads x: the recipe then computes exp once per element.
  NormRecipe norm_recipe_in_place(const ir::Op& norm, bool& in_place);

  // ---- matmul and conv: tiled, f32 accumulation ---------------------------------
  // A BM x BN tile per block, 256 threads with 4x4 results each; operands go
  // through the emitter (prologues, views, strides, precision rounding).
  static constexpr int kBM = 64, kBN = 64, kBK = 16;

  std::string operand_value(const ir::Op& anchor, size_t slot, const Coords& coords);

  Coords broadcast_batch(const Coords& batch, const Shape& operand);

  // The GEMM view of an anchor and how to reach its operands. load_a/load_b
  // emit statements that set `v` to one operand element (any prologue);
  // chunk_a/chunk_b, where set, emit statements for a 16-byte chunk of a
  // plain tensor (`chunk` consecutive elements along the tile's contiguous
  // dimension) and return {in bounds, element offset from pointer_a/b}.
  using ChunkFn = std::function<std::pair<std::string, std::string>(const std::string&, const std::string&,
                                                                    const std::string&)>;
  struct Gemm {
    int64_t m, n, k, batches;
    std::function<void(const std::string& m, const std::string& k, const std::string& batch)> load_a;  // sets `v`
    std::function<void(const std::string& k, const std::string& n, const std::string& batch)> load_b;
    // The result's coordinates of GEMM (m, n); with out_row (conv), those
    // of the row are the variables out_row(m) declares, in scope.
    std::function<Coords(const std::string& m, const std::string& n, const std::string& batch)> out_coords;
    std::function<std::string(const std::string& m)> out_row;
    bool column_last = true;  // the result's last coordinate is the GEMM column (not in an NCHW conv)
    ChunkFn chunk_a, chunk_b;
    std::string pointer_a, pointer_b;
    bool b_k_major = false;  // B's tile is [n][k] (conv weights, B transposed) rather than [k][n]
    // An NHWC conv (one group) whose input is read in 16-byte chunks
    // (pointer_a): the Hopper kernel gathers A's rows itself.
    struct ConvGeometry {
      int64_t h, w, c, p, q, s;  // input rows, columns, channels; output rows, columns; filter columns
      int64_t x_strides[3];  // the input's element strides along n, h, w
      int64_t stride[2], padding[2], dilation[2];
    };
    std::optional<ConvGeometry> conv;
    // Computed operands: emit statements; return the operand's coordinates
    // at GEMM (m, k) / (k, n) and when they lie inside it (else the value
    // is 0). *_runs_last: the tile's contiguous dimension runs along the
    // operand's last dimension in whole runs of 8, so the operand's inputs
    // can be loaded 8 at a time.
    std::function<std::pair<Coords, std::string>(const std::string&, const std::string&, const std::string&)> at_a, at_b;
    bool a_runs_last = false, b_runs_last = false;
  };

  // Which tensor-core MMA computes this anchor exactly (numerics rule 5), or
  // nullopt for the f32 SIMT path: bf16 or f16 when both operands are (or
  // the precision rounds f32 operands to it); tf32 when every operand is
  // exact in tf32 (16-bit values, or f32 under precision tf32).
  enum class Mma { bf16, f16, tf32 };
  std::optional<Mma> mma_kind(const ir::Op& anchor) const;
  static DType mma_storage(Mma kind);

  // The tensor in device memory that `t` is, seen through this kernel's
  // transposes (x @ w^T reads w in place): its pointer, storage and strides
  // in t's dimension order.
  std::optional<ExternalTensor> in_memory(ir::TensorId t) const;
  // The tensor in memory that `t` is through any chain of this kernel's
  // views that strides express (transpose, slice, expand, and reshapes that
  // split or merge dimensions laid out contiguously): strides in t's
  // dimension order and the offset of its first element. For kernels that
  // address operands by base pointer and strides (flash attention).
  std::optional<ExternalTensor> strided_in_memory(ir::TensorId t, bool transposes_and_reshapes_only = false) const;

  // An operand read as 16-byte chunks along dimension `inner`: a tensor in
  // memory (not computed here) stored as the MMA's element type, stride 1
  // along `inner`, every chunk 16-byte aligned given an aligned base
  // pointer (checked at run time).
  std::optional<ExternalTensor> chunkable(ir::TensorId t, Mma kind, size_t inner, int64_t chunk) const;

  // Where the epilogue runs: per element of a SIMT tile (`open` declares
  // m and n, in range, and ends inside the loops that `close` closes), or
  // over a tensor-core kernel's accumulator fragments (`fragments`; rows
  // and columns checked only where a tile can pass M or N: without
  // branches per element the compiler issues the epilogue's loads together;
  // H100, conv 3x3 bias relu: the bias loads waited one by one, half the
  // kernel's time).
  struct EpilogueLoops {
    std::string open, close;
    bool fragments = false, check_m = true, check_n = true;
    // A persistent wgmma kernel's fragments (needs a TileLoopCarry): the
    // result, where it is written as laid out ([batch..., M, N], 16-bit or
    // f32, 16-byte rows), goes to shared memory in 128-byte column blocks
    // and out with bulk tensor stores (runtime fallback: direct stores); a
    // residual read the same way (an input of the result's shape and type,
    // dense) comes in by bulk tensor loads into those buffers, one block
    // ahead. stage_map makes a tensor map parameter, `staged` learns which
    // tensor is stored.
    std::function<std::string(ir::TensorId, const TensorMapSpec&)> stage_map;
    ir::TensorId* staged = nullptr;
    // Staged column blocks in a loop or unrolled (Tuning::epilogue; 0: by
    // the element code's cost); `heuristic_loop` learns what that cost
    // chooses, 0 where there is no choice (nothing staged, or column
    // partials indexed by the column).
    int block_loop = 0;
    int* heuristic_loop = nullptr;
  };
  // What a persistent kernel's epilogue keeps across its tile loop: column
  // partials in registers (at most `registers` floats per thread; a
  // reduction takes `partials_per_reduction`) and the staging buffers'
  // state; declarations for before the loop, code for the start of each
  // tile (before its main loop), the last flush for after the loop.
  struct TileLoopCarry {
    int registers = 0, partials_per_reduction = 0;
    std::string before_loop, tile_start, after_loop;
  };
  // The epilogue over every accumulator element `acc`: writes the anchor's
  // consumers and epilogue reductions (atomics into workspaces, finalised
  // by the last block, in `finish_out` where given: after a persistent
  // kernel's tile loop). See epilogue_codegen.cpp for the fragment loops.
  std::string epilogue(const ir::Op& anchor, const Gemm& gm, const EpilogueLoops& loops, const std::string& acc,
                       std::string* finish_out = nullptr, TileLoopCarry* carry = nullptr);

  // What an epilogue does, decided before a line of it is written.
  struct EpilogueReduction {
    const ir::Op* op = nullptr;
    Coords input;      // its input's coordinates at the accumulator element
    Coords kept;       // the coordinates it keeps, and their extents
    Shape kept_shape;
    bool column = false;  // keeps only the output column: register partials, one atomic per column and warp
  };
  struct EpiloguePlan {
    std::vector<EpilogueReduction> reductions;
    ir::TensorId staged = -1;             // stored through shared memory in 128-byte column blocks; -1: none
    std::vector<ir::TensorId> residuals;  // inputs read at the result's coordinates, in column pairs
    bool heavy = false;                   // an element takes a library function (erf, exp, ...)
    bool rollable = false;                // column blocks may run in a loop (something staged, no column partials)
    bool rolled = false;                  // ... and do
    // "staged y, residual r, atomics for s, column blocks rolled"
    std::string to_string(const ir::Graph& g) const;
  };
  // The reductions an epilogue finishes (those whose results are needed).
  std::vector<const ir::Op*> epilogue_reductions() const;
  // `oc`: the result's coordinates at the accumulator element.
  EpiloguePlan decide_epilogue(const ir::Op& anchor, const Gemm& gm, const EpilogueLoops& loops, const Coords& oc,
                               const std::vector<const ir::Op*>& reduces);

 private:
  // The epilogue's text as its pieces are written (epilogue_codegen.cpp).
  struct EpilogueText {
    std::string decls;  // register partials of column reductions
    std::vector<std::pair<size_t, std::string>> column_reduces;  // reduction, its partials' variable
    std::string pair_decls, pair_stores;  // column pairs of written tensors
    std::string staged_map, staged_put;   // the staged tensor's map parameter and alignment check
    TensorMapSpec staged_map_spec;
    ir::TensorId residual = -1;  // the residual loaded through the staging buffers
    std::string residual_map, residual_load;
  };
  void emit_epilogue_reductions(const EpiloguePlan& plan, const std::vector<std::string>& ws, EpilogueText& text);
  void emit_epilogue_writes(const ir::Op& anchor, const Gemm& gm, const EpilogueLoops& loops, const Coords& oc,
                            const EpiloguePlan& plan, EpilogueText& text);
  void load_epilogue_residuals(const Gemm& gm, const EpilogueLoops& loops, const EpiloguePlan& plan, EpilogueText& text);
  void fragment_loops(const Gemm& gm, const EpilogueLoops& loops, const EpiloguePlan& plan, const EpilogueText& text,
                      std::string& open, std::string& close);
  void staged_column_blocks(const Gemm& gm, const EpiloguePlan& plan, const EpilogueText& text, std::string& open,
                            std::string& close, TileLoopCarry& carry);
  std::string flush_column_partials(const Gemm& gm, const EpiloguePlan& plan, const EpilogueText& text,
                                    const std::vector<std::string>& ws, bool reset);
  std::string finish_epilogue_reductions(const EpiloguePlan& plan, const std::vector<std::string>& ws,
                                         const std::string& counter);

 public:

  void gemm(const ir::Op& anchor, const Gemm& gm);

  // f32 operands in full f32 (and GPUs before sm_80): a BM x BN tile per
  // block, 256 threads with 4x4 results each.
  void gemm_simt(const ir::Op& anchor, const Gemm& gm);

  // Tensor cores (templates/kiln/mma.cuh): the template's pipelined main
  // loop, with this kernel's operand loaders as its hooks.
  struct MmaTile {
    int bm, bn, bk, warps_m, warps_n, stages;
  };
  MmaTile mma_tile(const Gemm& gm, Mma kind) const;
  // How many blocks share each tile's K (the few-rows tile when its tiles
  // alone leave SMs idle; 1: no split).
  int split_k(const Gemm& gm, const MmaTile& t) const;
  // The number of splits, none empty, when `k_tiles` slices are shared out about `splits` ways.
  static int even_splits(int64_t k_tiles, int splits);
  // The K slices of `bk` a matmul kernel walks: its loops count them in 32-bit ints.
  int64_t k_slices(const Gemm& gm, int bk) const;
  std::string split_k_main_loop(const Gemm& gm, const MmaTile& t, int splits, int64_t k_tiles);

  void gemm_tensor_core(const ir::Op& anchor, const Gemm& gm, Mma kind);
  std::vector<Tuning> tensor_core_tuning_space(const Gemm& gm, const MmaTile& t, int64_t k_tiles) const;
  // An operand's tile as the tensor-core kernel's loaders see it.
  struct TileOperand {
    bool is_a = true;
    std::string x;                    // "a" or "b"
    int rows = 0, cols = 0;           // the tile in shared memory, cols contiguous
    std::string row_base, col_base;   // GEMM coordinates of the tile's origin
    std::string row_name, col_name;   // and of (row, col)
    std::string index;                // the element's index in shared memory
    int64_t row_limit = 0, col_limit = 0;
    std::string gemm_coords;          // declares row_name and col_name
  };
  struct TileLoader {
    std::string decls, load, stash;
  };
  TileOperand tensor_core_operand(const Gemm& gm, const MmaTile& t, bool is_a) const;
  std::string chunk_loader(const TileOperand& o, const ChunkFn& chunk_fn, const std::string& pointer, int threads, int chunk);
  void run_loader(const ir::Op& anchor, const Gemm& gm, const MmaTile& t, const TileOperand& o, int threads,
                  const char* kind_name, TileLoader& out);
  std::string tensor_core_loader(const ir::Op& anchor, const Gemm& gm, const MmaTile& t, int threads, int chunk,
                                 const char* kind_name, bool is_a);

  // ---- Hopper: templates/kiln/wgmma.cuh ----------------------------------------
  // An operand the copy engine can load: a tensor in memory stored as the
  // MMA's type, contiguous along k (A; B when `k_major`) or n (B), outer
  // strides multiples of 16 bytes, its batch dims one (or none) or the
  // result's, collapsible into one stride. The map's box is filled in by
  // gemm_wgmma.
  struct TmaOperand {
    ir::TensorId tensor;
    std::string pointer;
    TensorMapSpec map;
    bool k_major = true;
  };
  // A tensor in memory stored as the MMA's type, bound to this kernel: its
  // pointer and tensor, the map still to fill in.
  std::optional<TmaOperand> tma_source(const std::optional<ExternalTensor>& e, Mma kind) const;
  std::optional<TmaOperand> tma_operand(const ir::Op& anchor, size_t slot, Mma kind) const;

  // A conv's weights [K, R, S, C] as B, k-major: one group, contiguous.
  std::optional<TmaOperand> conv_weight_operand(const ir::Op& anchor, Mma kind) const;

  // A and B when the Hopper kernel takes this anchor: sm_90, 16-bit
  // operands, a problem that fills the GPU with 128 x 128 tiles, B loaded
  // by the copy engine and A too (a matmul) or gathered from an NHWC input
  // (a conv: A is nullopt); else nullopt.
  struct WgmmaOperands {
    std::optional<TmaOperand> a;
    TmaOperand b;
  };
  std::optional<WgmmaOperands> wgmma_operands(const ir::Op& anchor, const Gemm& gm, Mma kind) const;

  // The persistent warp-specialised kernel of wgmma.cuh: TMA loads of `a`
  // (or, without `a`, gm.conv's implicit im2col gathered by the producer
  // warpgroup) and `b` (element loads when a pointer is not 16-byte
  // aligned), this kernel's epilogue on the accumulators of each tile.
  void gemm_wgmma(const ir::Op& anchor, const Gemm& gm, Mma kind, const WgmmaOperands& operands);
  // What gemm_wgmma decides before it writes: tiles, cluster, tile order,
  // the ring's stages (after the epilogue says whether it stages), the
  // warpgroups' registers, and the persistent grid's units.
  struct WgmmaShape {
    bool gathered = false;  // a conv whose A the producer gathers
    int bm = 128, bn = 0, bk = 64, cluster = 1, raster = 8, stages = 0, shared_bytes = 0, threads = 384;
    int producer_registers = 0, consumer_registers = 0;
    int64_t tiles_n = 0, units_m = 0, units = 0, k_tiles = 0;
    const char* kind_name = "kBf16";
  };
  std::vector<Tuning> wgmma_tuning_space(const Gemm& gm, bool gathered) const;
  std::string wgmma_frame(const Gemm& gm, const WgmmaShape& s, const TmaOperand& a, const TmaOperand& b, bool staged) const;
  std::string wgmma_element_loads(const Gemm& gm, const WgmmaShape& s, bool b_k_major, bool is_a, const std::string& guard);
  std::string wgmma_b_copy(const WgmmaShape& s, const TmaOperand& b, const std::string& map_b) const;
  std::string wgmma_copy_producer(const WgmmaShape& s, const TmaOperand& a, const std::string& map_a, const std::string& map_b,
                                  const std::string& b_copy, const std::string& warm_l2, const std::string& a_elements,
                                  const std::string& b_elements) const;

  // gemm_wgmma's producer warpgroup for a conv: A gathered (implicit
  // im2col) with cp.async, B as `b_copy` (thread 0's copy-engine loads).
  std::string gathered_producer(const Gemm& gm, int stages, const std::string& map_b, const std::string& a_elements,
                                const std::string& b_elements, const std::string& b_copy, const std::string& warm_l2);
  // Code for a producer at the start of a tile (m0, n0, batch declared):
  // the tile's rows of the result-shaped tensors the epilogue reads, into
  // L2; `rows` opens the loop over this thread's rows r (of 128).
  std::string epilogue_prefetch(const ir::Op& anchor, const Gemm& gm, int bn, const std::string& rows,
                                const std::set<std::string>& operands) const;
  std::string tensor_map_param(const TmaOperand& op, const std::string& what);

  void matmul();

  // The matmul applies a split layer_norm/rms_norm from its row statistics
  // (the norm, and any pointwise ops after it, are recomputed in its prologue).
  void setup_norm_prologue();

  void conv();

  // ---- attention on tensor cores: templates/kiln/attention.cuh -------------------
  // sdpa with q, k, v in memory as one 16-bit type (through transposes),
  // d contiguous, head dimension a multiple of 16 up to 256.
  bool flash_attention_fits(const ir::Op& op) const;
  // k or v of an sdpa as the flash kernel reads it: a tensor in memory and
  // its head count; grouped-query heads written as reshape -> expand ->
  // reshape of a [B, Hkv, S, D] tensor (PyTorch's repeat_kv) read in place.
  struct AttentionOperand {
    ExternalTensor memory;
    int64_t heads = 0;
  };
  std::optional<AttentionOperand> attention_operand(ir::TensorId t) const;

  void flash_attention(const ir::Op& op);

  // ---- attention without tensor cores: a block per query row, exact softmax in
  // two passes (f32 or mixed operands, decomposed matmul-softmax-matmul graphs).

  // Pass 1 finds the row's max and sum, pass 2 forms each probability exactly
  // as the graph defines it (rounded where it says) and accumulates p * v.
  void attention();
  // The exact two-pass attention kernel (what flash attention does not take).
  struct ExactAttention {
    const ir::Op* last = nullptr;      // the anchor: sdpa, or the p @ v matmul
    bool sdpa = true;
    const ir::Op* first_mm = nullptr;  // decomposed: q @ k^T
    const ir::Op* softmax = nullptr;   // decomposed: the probabilities
    int64_t sq = 0, skv = 0, dq = 0, dv = 0, batches = 0, heads_per_kv = 1;
    Shape batch_shape;
    int per_thread = 1;                // output columns per thread (128 threads)
  };
  ExactAttention exact_attention_shape() const;
  std::string exact_attention_score(const ExactAttention& a, const Coords& bc, const std::string& j);
  std::string exact_attention_pass2(const ExactAttention& a, const Coords& bc);

 private:
  const ir::Graph& g_;
  const ir::PlannedKernel& k_;
  ProgramState& state_;
  GeneratedKernel out_;
  std::vector<std::string> params_, param_notes_;
  std::string kernel_attributes_;  // e.g. a cluster shape
  int min_blocks_per_sm_ = 0;      // a second __launch_bounds__ argument (0: none)
  std::map<ir::TensorId, std::string> writes_;
  std::map<ir::TensorId, ExternalTensor> ext_;
  int sm_;
  Tuning wanted_;
  Emitter em_;
};

}  // namespace kiln::codegen
