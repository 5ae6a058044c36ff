// The generator of matmul and conv kernels: gemm_codegen.cpp (the GEMM view
// of an anchor, SIMT, mma.sync tensor cores, prologues), gemm_tactics.cpp
// (which of those kernels builds it: the ordered list of tactics),
// wgmma_codegen.cpp (the Hopper kernel: TMA, mbarriers, wgmma),
// epilogue_codegen.cpp (their epilogues: decided, then written).
#pragma once

#include "codegen/kernel_builder.h"
#include "codegen/tactic.h"

namespace kiln::codegen {

class GemmGenerator : public KernelBuilder {
 public:
  using KernelBuilder::KernelBuilder;

  // The GEMM view of an anchor and how to reach its operands. load_a/load_b
  // emit statements that set `v` to one operand element (any prologue);
  // chunk_a/chunk_b, where set, emit statements for a 16-byte chunk of a
  // plain tensor (`chunk` consecutive elements along the tile's contiguous
  // dimension) and return {in bounds, element offset from pointer_a/b}.
  using ChunkFn = std::function<std::pair<std::string, std::string>(const std::string&, const std::string&,
                                                                    const std::string&)>;
  // A chunked operand's addresses in two parts. `keep` emits statements for
  // the chunk at GEMM coordinates (mn, kk) of the first slice (k0 = 0) and
  // returns whether its row lies inside the operand and the values to keep
  // for the slices (each chunk's, in registers). `slice` emits statements
  // for the chunk at k = k0 + kk, reading kept values through `kept`, and
  // returns its bounds beyond row and K ("" where none) and its address.
  struct ChunkRows {
    struct Kept {
      std::string type, name, value;
    };
    std::function<std::pair<std::string, std::vector<Kept>>(const std::string& mn, const std::string& kk,
                                                             const std::string& batch)>
        keep;
    std::function<std::pair<std::string, std::string>(const std::string& k, const std::string& batch,
                                                      const std::function<std::string(const std::string&)>& kept)>
        slice;
    explicit operator bool() const { return static_cast<bool>(keep); }
  };
  // A pooled conv's rows (pooled_pixel): in pixel order, or window by window.
  enum class WindowRows { none, consecutive, interleaved };
  struct Gemm {
    int64_t m, n, k, batches;
    WindowRows window_rows = WindowRows::none;
    std::function<void(const std::string& m, const std::string& k, const std::string& batch)> load_a;  // sets `v`
    std::function<void(const std::string& k, const std::string& n, const std::string& batch)> load_b;
    // The result's coordinates of GEMM (m, n); with out_row (conv), those
    // of the row are the variables out_row(m) declares, in scope.
    std::function<Coords(const std::string& m, const std::string& n, const std::string& batch)> out_coords;
    std::function<std::string(const std::string& m)> out_row;
    // The variables out_coords declares from the column and batch alone (a
    // conv's output channel): with n and batch, what column values read.
    std::set<std::string> column_vars;
    bool column_last = true;  // the result's last coordinate is the GEMM column (not in an NCHW conv)
    ChunkFn chunk_a, chunk_b;
    std::string pointer_a, pointer_b;
    // Where set, how chunk_a/chunk_b splits into what the chunk's place in
    // the tile fixes (computed once a tile) and what each K slice adds.
    ChunkRows rows_a, rows_b;
    bool b_k_major = false;  // B's tile is [n][k] (conv weights, B transposed) rather than [k][n]
    bool a_m_major = false;  // A is stored [k][m] (m contiguous): SIMT tiles walk it along m
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
  // Why mma_kind is nullopt: "needs sm_80 ..." or which operand is f32 at precision f32.
  std::string no_mma_reason(const ir::Op& anchor) const;

  // The tensor in device memory that `t` is, seen through this kernel's
  // transposes (x @ w^T reads w in place): its pointer, storage and strides
  // in t's dimension order.
  std::optional<ExternalTensor> in_memory(ir::TensorId t) const;
  // Whether `t` is in memory with stride 1 along its dimension rank - from_last (1 or 2), the other of its last two not.
  bool stored_along(ir::TensorId t, size_t from_last) const;
  std::optional<int64_t> memory_stride(ir::TensorId t, size_t d) const;
  // An operand read as 16-byte chunks along dimension `inner`: a tensor in
  // memory (not computed here) stored as the MMA's element type, stride 1
  // along `inner`, every chunk 16-byte aligned given an aligned base
  // pointer (checked at run time). `views`: also through slices and expands
  // (a matmul's operands; the view's `offset` is added to each chunk's).
  std::optional<ExternalTensor> chunkable(ir::TensorId t, Mma kind, size_t inner, int64_t chunk, bool views = false) const;

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
    // The first row of a consumer warpgroup's 64 (a staged block's rows).
    std::string warpgroup_m0 = "m0 + consumer * 64";
    // A SIMT tile's (not fragments): a thread's rows i = 0 .. thread_rows - 1,
    // row i at m = thread_row; a row's columns lie in 16 neighbouring lanes.
    int thread_rows = 0;
    std::string thread_row;
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
    bool row = false;     // keeps only the output row: register partials, one atomic per row, warp and tile
    bool row_renamed = false;  // ... its input a reshape of the result's rows (B x S x H of a B*S x H product):
                               // the row's kept coordinates named again where the partials are flushed
  };
  struct EpiloguePlan {
    std::vector<EpilogueReduction> reductions;
    ir::TensorId staged = -1;             // stored through shared memory in 128-byte column blocks; -1: none
    bool copied_out = false;              // ... its rows not 16-byte multiples: the threads copy blocks out, not the copy engine
    std::vector<ir::TensorId> residuals;  // inputs read at the result's coordinates, in column pairs
    bool heavy = false;                   // an element takes a library function (erf, exp, ...)
    bool rollable = false;                // column blocks may run in a loop (something staged, no column partials)
    bool rolled = false;                  // ... and do
    // "staged y, residual r, atomics for s, column blocks rolled"
    std::string to_string(const ir::Graph& g) const;
  };
  bool read_in_place(ir::TensorId t, const std::map<ir::TensorId, std::vector<ir::TensorId>>& readers,
                     const std::function<bool(ir::TensorId)>& in_result_order) const;
  Coords residual_coords(const ir::Op& anchor, const Coords& oc, ir::TensorId r);
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
    std::string row_decls, row_flush;  // register partials of row reductions: before a tile's fragments, after
    std::vector<std::pair<size_t, std::string>> thread_row_reduces;  // SIMT: reduction, its partials' variable ([i])
    std::vector<std::pair<size_t, std::string>> renamed_row_reduces;  // fragments: row_renamed reductions, their partials
    int thread_rows = 0;                                             // SIMT: EpilogueLoops::thread_rows
    std::string pair_decls, pair_stores;  // column pairs of written tensors
    std::string staged_map, tma_out;   // the staged tensor's map parameter; whether the copy engine stores it
    TensorMapSpec staged_map_spec;
    ir::TensorId residual = -1;  // the residual loaded through the staging buffers
    std::string residual_map, residual_load;
    // Column values (Emitter::begin_columns): the column loop before a
    // block's rows; `columns` is how many column tiles (ni) a block has.
    Emitter::ColumnCode column_values;
    std::string column_coords;  // the statements declaring gm.column_vars from n and batch
    int columns = 0;
  };
  void emit_epilogue_reductions(const EpiloguePlan& plan, const std::vector<std::string>& ws, EpilogueText& text);
  std::string flush_rows_named_again(
      const ir::Op& anchor, const Gemm& gm, const EpiloguePlan& plan, const std::vector<std::string>& ws,
      const std::vector<std::pair<size_t, std::string>>& reduces,
      const std::function<std::string(const std::string&, const std::string&, const std::string&, const std::string&)>& flush);
  std::string flush_thread_rows(const ir::Op& anchor, const Gemm& gm, const EpilogueLoops& loops, const EpiloguePlan& plan,
                                const std::vector<std::string>& ws, const EpilogueText& text);
  std::string flush_renamed_rows(const ir::Op& anchor, const Gemm& gm, const EpiloguePlan& plan,
                                 const std::vector<std::string>& ws, const EpilogueText& text);
  void emit_epilogue_writes(const ir::Op& anchor, const Gemm& gm, const EpilogueLoops& loops, const Coords& oc,
                            const EpiloguePlan& plan, EpilogueText& text);
  // The pool of a conv's epilogue (KernelParams::pool_window), or nullptr.
  const ir::Op* epilogue_pool() const;
  // A copied-out row's first column's distance past a 16-byte boundary of memory, in elements
  // (the same for each of its blocks: tiles and blocks start at multiples of a chunk's columns).
  std::string copied_out_past(const Gemm& gm, int bytes, const std::string& m) const;
  void emit_epilogue_pool(const ir::Op& anchor, const Gemm& gm, const EpilogueLoops& loops, const Coords& oc,
                          EpilogueText& text);
  void load_epilogue_residuals(const Gemm& gm, const EpilogueLoops& loops, const EpiloguePlan& plan, EpilogueText& text);
  void fragment_loops(const Gemm& gm, const EpilogueLoops& loops, const EpiloguePlan& plan, const EpilogueText& text,
                      std::string& open, std::string& close, TileLoopCarry* carry);
  void staged_column_blocks(const Gemm& gm, const EpilogueLoops& loops, const EpiloguePlan& plan, const EpilogueText& text,
                            std::string& open, std::string& close, TileLoopCarry& carry);
  std::string flush_column_partials(const Gemm& gm, const EpiloguePlan& plan, const EpilogueText& text,
                                    const std::vector<std::string>& ws, bool reset);
  std::string finish_epilogue_reductions(const EpiloguePlan& plan, const std::vector<std::string>& ws,
                                         const std::string& counter);

 public:

  // ---- tactics: gemm_tactics.cpp ----------------------------------------------
  // What every GEMM tactic sees: the anchor, its GEMM view, and the
  // tensor-core MMA that computes it exactly (nullopt: none does).
  struct TacticInput {
    const ir::Op& anchor;
    const Gemm& gm;
    std::optional<Mma> kind;
    std::optional<VendorGemm> vendor;  // the cuBLASLt call that computes it (vendor_gemm), else
    std::string vendor_why;            // why there is none
  };
  using GemmTactic = Tactic<GemmGenerator, TacticInput>;
  // In order of preference: cuBLASLt (where the rule or the tuning picks
  // it), mma.sync with the whole depth in one slice (tall GEMMs of a small
  // K on sm_90), wgmma (the Hopper kernel), mma.sync, SIMT (the last
  // resort: always fits).
  static std::span<const GemmTactic> tactics();
  // The kernel of the first tactic that fits.
  Emitted gemm(const ir::Op& anchor, const Gemm& gm);

  // ---- a vendor library: vendor_codegen.cpp ------------------------------------
  // The call that computes this kernel in cuBLASLt, exactly as kiln's own
  // kernels would, or nullopt and `why` not.
  std::optional<VendorGemm> vendor_gemm(const ir::Op& anchor, const Gemm& gm, const std::optional<Mma>& kind,
                                        std::string& why) const;
  // The kernel as that call (GeneratedKernel::library), with its workspace.
  void gemm_vendor(VendorGemm call);
  // Tuning::vendor as asked for this kernel (gemm() takes it out of the
  // tuning kiln's own tactics see).
  int vendor_wanted_ = 0;

  // f32 operands in full f32 (and GPUs before sm_80): a BM x BN tile per
  // block of 256 threads, each with TM x TN results, BK-deep slices.
  struct SimtTile {
    int bm, bn, bk, tm, tn;
  };
  SimtTile simt_tile(const Gemm& gm) const;
  void gemm_simt(const ir::Op& anchor, const Gemm& gm);

  // Tensor cores (templates/kiln/mma.cuh): the template's pipelined main
  // loop, with this kernel's operand loaders as its hooks.
  struct MmaTile {
    int bm, bn, bk, warps_m, warps_n, stages;
  };
  // The few-rows tile's most rows (mma_tile: M at most this), a symbolic M's size buckets' too.
  static constexpr int kFewRows = 64;
  // The depth up to which the few-tiles tile runs unsplit (tensor_core_tuning_space).
  static constexpr int64_t kUnsplitDepth = 1152;
  // A symbolic M's few-rows buckets: M up to each of these rows (above the one before) takes a tile
  // of that height, near the integer graph's (M rounded up to 16 rows).
  static constexpr int kFewRowsBuckets[] = {16, 32, kFewRows};
  MmaTile mma_tile(const Gemm& gm, Mma kind) const;
  // The whole depth in one slice: K at most kOneSliceDepth, no pipeline,
  // many blocks an SM (gemm_tactics.cpp says where); nullopt with the
  // reason where it does not fit.
  static constexpr int64_t kOneSliceDepth = 128;
  std::optional<MmaTile> one_slice_tile(const ir::Op& anchor, const Gemm& gm, std::optional<Mma> kind,
                                        std::string* why) const;
  // How many blocks share each tile's K (the few-rows tile when its tiles
  // alone leave SMs idle; 1: no split).
  int split_k(const Gemm& gm, const MmaTile& t) const;
  // The number of splits, none empty, when `k_tiles` slices are shared out about `splits` ways.
  static int even_splits(int64_t k_tiles, int splits);
  // The K slices of `bk` a matmul kernel walks: its loops count them in 32-bit ints.
  int64_t k_slices(const Gemm& gm, int bk) const;
  std::string split_k_main_loop(const Gemm& gm, const MmaTile& t, int splits, int64_t k_tiles);

  void gemm_tensor_core(const ir::Op& anchor, const Gemm& gm, Mma kind, MmaTile t);
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
  void chunk_loader(const TileOperand& o, const ChunkFn& chunk_fn, const ChunkRows& chunk_rows, const std::string& pointer,
                    int threads, int chunk, TileLoader& out);
  // The two parts of a chunk whose offset is linear in k (`k_stride` elements).
  ChunkRows linear_rows(const ChunkFn& chunk_fn, bool is_a, const std::string& pointer, int64_t k_stride);
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
    // A whose rows or columns are two dimensions of its tensor (split_tma_a):
    // the inner one's size, else 0.
    int64_t rows_inner = 0, columns_inner = 0;
  };
  // A tensor in memory stored as the MMA's type, bound to this kernel: its
  // pointer and tensor, the map still to fill in.
  std::optional<TmaOperand> tma_source(const std::optional<ExternalTensor>& e, Mma kind) const;
  // `why`, where given, learns why an operand has no tensor map.
  std::optional<TmaOperand> tma_operand(const ir::Op& anchor, size_t slot, Mma kind, std::string* why = nullptr) const;
  std::optional<TmaOperand> split_tma_a(const ir::Op& anchor, Mma kind) const;

  // A conv's weights [K, R, S, C] as B, k-major: one group, contiguous.
  std::optional<TmaOperand> conv_weight_operand(const ir::Op& anchor, Mma kind) const;

  // A matmul's A read through views that no tensor map describes, seen as
  // the strided tensor behind them: A's rows and columns each a list of
  // that tensor's dimensions (outer first, merged where they can be).
  struct ViewDim {
    int64_t size, stride;
  };
  struct StridedView {
    ExternalTensor memory;
    ir::TensorId tensor;
    std::vector<ViewDim> rows, columns;
  };
  std::optional<StridedView> strided_a(const ir::Op& anchor, Mma kind) const;
  // An A the producer warpgroup gathers in 16-byte runs (gathered_producer):
  // element (m, k) at row_offset(m) + column_offset(k) of `pointer`, the
  // columns' innermost dimension contiguous in runs of 8, every other stride
  // a multiple of 8 (16-byte runs given an aligned pointer, checked at run
  // time: else element loads).
  std::optional<StridedView> gathered_a(const ir::Op& anchor, Mma kind) const;

  // A and B when the Hopper kernel takes this anchor: sm_90, 16-bit
  // operands, a problem that fills the GPU with 128 x 128 tiles, B loaded
  // by the copy engine and A too (a matmul), or gathered by the producer:
  // a matmul's A through views (`gathered`), an NHWC conv's input (gm.conv);
  // A is nullopt where it is gathered. Else nullopt, and on sm_90 `why`
  // (where given) learns why ("B ('wt') has rows 4099 elements apart ...").
  struct WgmmaOperands {
    std::optional<TmaOperand> a;
    TmaOperand b;
    std::optional<StridedView> gathered;
  };
  std::optional<WgmmaOperands> wgmma_operands(const ir::Op& anchor, const Gemm& gm, Mma kind,
                                              std::string* why = nullptr) const;

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
    bool pingpong = false;  // each consumer warpgroup's own 64-row tiles (Tuning::pingpong)
    int bm = 128, bn = 0, bk = 64, cluster = 1, raster = 8, stages = 0, shared_bytes = 0, threads = 384;
    int producer_registers = 0, consumer_registers = 0;
    int64_t tiles_n = 0, units_m = 0, units = 0, k_tiles = 0;
    std::string units_m_text;  // units_m as the kernel computes it (from a symbolic M), or its value
    const char* kind_name = "kBf16";
    // "wgmma 128x128x64, A by TMA, cluster 2, 6 stages, registers 56/224"
    std::string to_string() const;
  };
  std::vector<Tuning> wgmma_tuning_space(const Gemm& gm, bool gathered) const;
  std::string wgmma_consumers(const WgmmaShape& s, const TileLoopCarry& carry, const std::string& tile_epilogue);
  std::string wgmma_frame(const WgmmaShape& s, const std::string& gathered_pointer, const TmaOperand& a, const TmaOperand& b,
                          bool staged) const;
  std::string wgmma_element_loads(const Gemm& gm, const WgmmaShape& s, bool b_k_major, bool is_a, const std::string& guard);
  std::string wgmma_b_copy(const WgmmaShape& s, const TmaOperand& b, const std::string& map_b) const;
  std::string wgmma_copy_producer(const WgmmaShape& s, const TmaOperand& a, const std::string& map_a, const std::string& map_b,
                                  const std::string& b_copy, const std::string& warm_l2, const std::string& a_elements,
                                  const std::string& b_elements) const;

  // gemm_wgmma's producer warpgroup for a gathered A (a conv's implicit
  // im2col, gm.conv, or a matmul's A through views, `view`) with cp.async,
  // B as `b_copy` (thread 0's copy-engine loads).
  std::string gathered_producer(const Gemm& gm, const std::optional<StridedView>& view, int stages, const std::string& map_b,
                                const std::string& a_elements, const std::string& b_elements, const std::string& b_copy,
                                const std::string& warm_l2);
  // Code for a producer at the start of a tile (m0, n0, batch declared):
  // the tile's rows of the result-shaped tensors the epilogue reads, into
  // L2; `rows` opens the loop over this thread's rows r (of 128).
  std::string epilogue_prefetch(const ir::Op& anchor, const Gemm& gm, int bn, const std::string& rows,
                                const std::set<std::string>& operands) const;
  std::string tensor_map_param(const TmaOperand& op, const std::string& what);

  Emitted matmul();
  void matmul_chunks(const ir::Op& mm, Mma kind, const Shape& batch_shape, Gemm& gm);

  // The matmul applies a split layer_norm/rms_norm from its row statistics
  // (the norm, and any pointwise ops after it, are recomputed in its prologue).
  void setup_norm_prologue();

  Emitted conv();
  // A pooled conv's GEMM row `m` (an expression) as its output pixel:
  // declares names[0..2] (n, p, q) of type `type` for a P x Q output.
  static std::string pooled_pixel(const std::string& m, const std::string& type, const std::array<std::string, 3>& names,
                                  int64_t p, int64_t q, WindowRows order);
  // A conv's implicit im2col: declares (ni, hi, wi, ci) of GEMM (m, k) in
  // group g, returns when that input pixel lies inside the image; and
  // declares the filter tap of GEMM (k, n), returning the weight's coordinates.
  using ConvIndex = std::function<std::string(const std::string& m, const std::string& k, const std::string& g)>;
  using ConvTap = std::function<Coords(const std::string& k, const std::string& n, const std::string& g)>;
  void conv_chunks(const ir::Op& cv, Mma kind, const ConvIndex& input_pixel, const ConvTap& filter_tap, Gemm& gm);

};

}  // namespace kiln::codegen
