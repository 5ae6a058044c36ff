// KernelBuilder: what the generators of every kernel kind share: the
// kernel's parameters and workspaces, the expression emitter, where a
// written tensor's element lies, chunked loads and stores, operands of
// anchors, tuning choices, and the kernel's frame (kernel_builder.cpp).
// Codegen's internal header; the public entry point is kernel_codegen.h.
//
// Each kernel kind has a generator of its own, derived from KernelBuilder
// and listed in generator_registry.cpp: pointwise_generator.h (pointwise and
// copies), reduction_generator.h (row, split and column reductions, held
// rows, pools, row statistics), norm_generator.h (normalisations),
// gemm_generator.h (matmul and conv: SIMT, mma.sync, the Hopper kernel,
// their epilogues), attention_generator.h (flash attention and the exact
// two-pass kernel), depthwise_generator.h (depthwise convolutions). Generators that decide much build a description first
// (EpiloguePlan, WgmmaShape, TileOperand, ExactAttention, ColumnLayout,
// HeldRowLayout), then write.
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

#include "codegen/code_writer.h"
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
  return static_cast<uint32_t>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, kMaxGridBlocks));
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

// State shared by the kernels of one program (workspaces by name).
struct ProgramState {
  GeneratedProgram program;
  const ir::SizeProbe* probe = nullptr;  // a symbolic graph's (size_text.h)
  VendorLibraries vendors;               // what the GEMM tactics may call
  std::map<std::string, int> workspace_index;

  int workspace(const std::string& name, int64_t words, uint32_t fill, std::optional<ir::DimExpr> words_expr = {}) {
    auto it = workspace_index.find(name);
    if (it != workspace_index.end()) return it->second;
    const int index = static_cast<int>(program.workspaces.size());
    program.workspaces.push_back({name, words, fill, std::move(words_expr)});
    workspace_index[name] = index;
    return index;
  }
};

class KernelBuilder {
 public:
  KernelBuilder(const ir::Graph& g, const ir::PlannedKernel& k, ProgramState& state, int sm, Tuning wanted = {})
      : g_(g), k_(k), state_(state), sm_(sm), wanted_(wanted), em_(g, std::set<int32_t>(k.ops.begin(), k.ops.end()), externals()),
        sizes_(state.probe) {
    out_.plan_kernel = k.id;
    em_.set_sizes(&sizes_);
  }

  // grid[0] over `work` items taken `per_item` at a time, `per_block` per
  // block (blocks_for), times `multiplier`; for a symbolic `work`, also the
  // rule that gives it at launch (GridRule).
  void grid_over(int64_t work, int64_t per_item, int64_t per_block, uint32_t multiplier = 1);
  // grid[0] of exactly `blocks` blocks, each taking its item by blockIdx.x
  // alone (no grid-stride loop); for a symbolic `blocks`, the grid rule, which
  // launches at most kMaxGridBlocks: past that at the range's largest sizes,
  // NotSymbolic ("<too_many> at the largest sizes").
  void exact_grid(int64_t blocks, const std::string& too_many);

  // ---- parameters ---------------------------------------------------------
  std::map<ir::TensorId, ExternalTensor> externals();

  std::string add_param(KernelArg arg, bool read_only, const std::string& what);

  std::string workspace_param(const std::string& name, int64_t words, uint32_t fill, bool reset_here);

  // A kernel parameter holding the copy engine's map of `tensor` (encoded by
  // the runtime from the pointer bound to it); its name.
  std::string tensor_map_param(ir::TensorId tensor, const TensorMapSpec& map, const std::string& what);
  // The tensor whose parameter is `pointer`.
  std::optional<ir::TensorId> tensor_behind(const std::string& pointer) const;

  std::string store(ir::TensorId t, const std::string& offset, const std::string& value);
  // Element code, run for columns c = 0 and 1 of a pair, that collects
  // `value` of tensor t (`offset`: the pair's first element) into
  // pair<t>[2], declared by what it appends to `decls`; returns the pair's
  // store (one 4-byte store where aligned), for after the pair.
  std::string gather_column_pair(ir::TensorId t, const std::string& value, const std::string& offset, std::string& decls);
  // The registers of a written tensor's column pair (gather_column_pair), of
  // a read tensor's vector of elements, of a written tensor's: named after
  // their pointers, not the tensors' ids, so that identical layers of a
  // model are one kernel text, compiled once.
  std::string pair_name(ir::TensorId t) const { return "pair_" + writes_.at(t); }
  std::vector<ir::TensorId> reads_in_order_of_use() const;
  // The kernel's external reads (ext_) in parameter order: code emitted per
  // read follows the kernel's structure, not the tensors' ids.
  std::vector<std::pair<ir::TensorId, ExternalTensor>> ordered_externals() const;
  std::string chunk_in(ir::TensorId t) const { return "in_" + pointer_of(t); }
  std::string chunk_out(ir::TensorId t) const { return "out_" + writes_.at(t); }

  // ---- the pieces each kind needs ---------------------------------------------
  std::vector<const ir::Op*> ops_of(std::initializer_list<ir::OpFamily> families) const;

  // Tensors computed (in this kernel) from the results of `roots`.
  std::set<ir::TensorId> downstream_of(const std::set<ir::TensorId>& roots) const;

  // Whether `to` is computed from `from` in this kernel through reshapes
  // and pointwise ops alone: each element of `to` sits at the linear index
  // of the element of `from` it is computed from.
  bool same_linear_order(ir::TensorId from, ir::TensorId to) const;

  // The coordinates of `to` at the element where `from` has `coords`,
  // following this kernel's ops forward: views map coordinates, pointwise
  // ops keep them. nullopt when `to` is not computed from `from` here.
  std::optional<Coords> forward(ir::TensorId from, ir::TensorId to, const Coords& coords);

  // Where to write `t` in a kernel whose template holds `leaf` at
  // `leaf_coords`: downstream of the leaf, at the matching element; else (t
  // does not use the leaf) at the element with the same linear index.
  Coords write_coords(ir::TensorId leaf, const Coords& leaf_coords, ir::TensorId t);
  // While set, write_coords answers each tensor once (the coordinates it
  // first emitted), so that every reader of a tensor's element names it
  // the same way: an epilogue's element code, one block.
  std::map<ir::TensorId, Coords>* write_coords_memo_ = nullptr;

  std::string finish(const std::string& body, int threads, const std::string& shared = "",
                     const std::string& includes = "");

  GeneratedKernel take() { return std::move(out_); }

  // The target's compute capability (80 for sm_80).
  int sm() const { return sm_; }
  // The vendor libraries this program's kernels may call.
  const VendorLibraries& vendors() const { return state_.vendors; }

  // Records what the generator decided, in words (GeneratedKernel::decisions,
  // printed by `kiln dump --stage plan --arch`): "mma.sync 128x128x32 ...".
  // The epilogue's decision is kept apart and comes last (finish() adds it):
  // the Hopper kernel sizes its ring after its epilogue is decided.
  void decided(const std::string& what) { out_.decisions += (out_.decisions.empty() ? "" : "; ") + what; }

  // The choice to build with: the requested one where `space` (the
  // heuristic's choice first) holds it, else the heuristic's. Records both
  // in the generated kernel.
  Tuning choose_tuning(const std::vector<Tuning>& space);
  // Once the generator knows a choice does not exist for this kernel:
  // `erase` clears it in the choice made and in every alternative
  // (duplicates merged; the heuristic's stays first).
  void restrict_tuning(const std::function<void(Tuning&)>& erase);

  // The parameter that holds tensor t.
  std::string pointer_of(ir::TensorId t) const;

  // Operand `slot` of a matmul-like anchor at `coords`, rounded as its precision says (numerics rule 5).
  std::string operand_value(const ir::Op& anchor, size_t slot, const Coords& coords);

  // An operand's batch coordinates from the result's (size-1 dims broadcast).
  Coords broadcast_batch(const Coords& batch, const Shape& operand);

  // The tensor in memory that `t` is through any chain of this kernel's
  // views that strides express (transpose, slice, expand, and reshapes that
  // split or merge dimensions laid out contiguously): strides in t's
  // dimension order and the offset of its first element. For kernels that
  // address operands by base pointer and strides (flash attention).
  std::optional<ExternalTensor> strided_in_memory(ir::TensorId t, bool transposes_and_reshapes_only = false) const;

  // Whether t is the result of one of this kernel's ops.
  bool computed_here(ir::TensorId t) const {
    const ir::Tensor& tensor = g_.tensor(t);
    return tensor.kind == ir::TensorKind::OpResult &&
           std::find(k_.ops.begin(), k_.ops.end(), tensor.producer) != k_.ops.end();
  }

  // ---- chunks: V consecutive elements along the last axis of a domain --------------
  // Which tensors move V elements at a time in a kernel that walks `domain`
  // a chunk at a time (chunks start at multiples of V of the last axis):
  // loads of tensors read at the domain's coordinates as pointwise ops
  // broadcast them, whose last axis is the domain's, stride 1, other strides
  // multiples of V; stores of written tensors of the domain's shape. V is 16
  // bytes of the narrowest of them; 1 (no chunks) when nothing qualifies or
  // V does not divide `lane_extent` (the run of the last axis the kernel
  // keeps together) and the last axis.
  //
  // With `concats`, also each concat along the domain's last axis whose
  // pieces are all in memory with the loads' strides and the same storage as
  // its result, every offset and width a multiple of V: a chunk then lies in
  // one piece, and the concat's value is that chunk, loaded where it lies.
  // (DenseNet's concatenations of 32-channel pieces were loaded 2 bytes at a
  // time: 480-630 GB/s on an H100.)
  struct Piece {
    ir::TensorId tensor;
    int64_t offset, width;  // along the last axis
  };
  struct ConcatChunk {
    ir::TensorId result;
    std::vector<Piece> pieces;
  };
  struct Chunking {
    int vec = 1;
    std::vector<ir::TensorId> loads, stores;
    std::vector<ConcatChunk> concats;
    std::string aligned = "true";  // a condition: every chunked pointer is 16-byte aligned
  };
  Chunking chunking(const Shape& domain, int64_t lane_extent, bool concats = false) const;
  std::vector<ConcatChunk> chunked_concats(const Shape& domain, int vec) const;
  std::string chunk_in_concat(ir::TensorId concat) const { return "in_concat" + std::to_string(concat); }

  // Makes chunk_in(t)[v] the value of each chunked tensor at `c` (a chunk's first
  // element with the last coordinate advanced by the lane `v`).
  void chunk_sources(const Chunking& ch, const Shape& domain, const Coords& c);
  // The loads into chunk_in(t)[V] at `base` (the chunk's first element) of the
  // chunked tensors that `element` (the lane loop's code) uses.
  std::string chunk_load_calls(const Chunking& ch, const Shape& domain, const Coords& base, const std::string& element);

  // The writes of one element at `c` (coordinates of `leaf`): chunked
  // stores go to chunk_out(t)[v] (and into `chunked`), the rest are stored here.
  void element_writes(ir::TensorId leaf, const Coords& c, const Chunking& ch, std::set<ir::TensorId>& chunked,
                      const std::set<ir::TensorId>& skip = {});

  // Declarations before, and stores after, the lane loop of the chunked stores.
  std::string chunk_store_arrays(const Chunking& ch, const std::set<ir::TensorId>& chunked) const;
  std::string chunk_store_calls(const Chunking& ch, const std::set<ir::TensorId>& chunked, const std::string& offset) const;

 protected:
  const ir::Graph& g_;
  const ir::PlannedKernel& k_;
  ProgramState& state_;
  GeneratedKernel out_;
  std::vector<std::string> params_, param_notes_;
  std::string kernel_attributes_;  // e.g. a cluster shape
  int min_blocks_per_sm_ = 0;      // a second __launch_bounds__ argument (0: none)
  std::string epilogue_decision_;  // "epilogue: staged y, ...", after the kernel's own decisions
  std::map<ir::TensorId, std::string> writes_;
  std::map<ir::TensorId, ExternalTensor> ext_;
  std::vector<ir::TensorId> read_order_;  // ext_'s tensors in parameter order
  int sm_;
  Tuning wanted_;
  Emitter em_;
  mutable SizeText sizes_;  // how this kernel spells sizes; em_ spells them through it (it notes the symbols read)
  // A size's largest value over the graph's range (the value itself for an integer graph's).
  int64_t largest(int64_t value) const { return sizes_.symbolic(value) ? sizes_.dim(value).upper() : value; }
};

}  // namespace kiln::codegen