// Codegen: CUDA C++ for every kernel of a plan.
//
// Expects: a verified plan of a constructed graph.
// Guarantees: one self-contained CUDA translation unit per planned kernel
// (it includes only kiln/common.cuh), deterministic for a given kernel, with
// one entry point `kiln_kernel` whose parameters are device pointers (and,
// for TMA kernels, tensor maps of them; for a symbolic graph, its sizes) in the order of `args`. Shapes, strides and
// dtypes are compile-time constants in the source, except a symbolic graph's symbols (size_text.h). User-provided text appears only as validated tensor names in
// `//` comments; `canonical` drops comment lines, so two graphs that differ
// only in names share compiled kernels.
//
// Storage (numerics rule 4): graph inputs as declared; every materialised
// result as its value dtype (rounded results in their dtype, everything else
// f32, bool as one byte), contiguous.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir.h"
#include "compiler/plan.h"
#include "compiler/plan_printer.h"
#include "compiler/size_probe.h"
#include "codegen/tuning.h"

namespace kiln::codegen {

// A tile-copy descriptor (CUtensorMap) of a tensor in memory, encoded by the
// runtime from the bound pointer: 16-bit elements, 128-byte swizzle, rank 2
// to 5, dims innermost first (that dim contiguous), byte strides of the
// outer dims, the box one copy moves, and where the tensor's first element
// lies past the bound pointer (a view that slices: a multiple of 16 bytes).
// A pointer that is not 16-byte aligned gets an all-zero map: the kernel
// checks the pointer and does not use it.
struct TensorMapSpec {
  DType dtype = DType::bf16;
  int rank = 2;
  static constexpr int kMaxRank = 5;
  std::array<uint64_t, kMaxRank> dims{};
  std::array<uint64_t, kMaxRank - 1> strides{};
  std::array<uint32_t, kMaxRank> box{};
  uint64_t offset_bytes = 0;
  // A symbolic graph's map: each dimension's extent and each byte stride as
  // a product of the graph's sizes, evaluated at launch (dims and strides
  // above hold their probe values); empty for an integer graph's map.
  std::vector<ir::DimExpr> dim_exprs, stride_exprs;
};

struct KernelArg {
  // Size: a symbolic graph's size parameter (`const kiln::i64 kiln_size<symbol>`), bound at launch.
  enum class Role : uint8_t { Input, Output, Intermediate, Workspace, TensorMap, Size };
  Role role;
  ir::TensorId tensor = -1;  // Input, Output, Intermediate, TensorMap (the tensor it describes)
  int workspace = -1;        // Workspace
  TensorMapSpec map{};       // TensorMap
  int symbol = -1;           // Size: the symbol's index in the graph's `dims` table
};

// A symbolic graph's kernel: how many blocks a launch takes at the bound
// sizes (launch_geometry.h): clamp(ceil((work / per_item) / per_block), 1,
// 2^20) * multiplier * times, `work` and `times` products of the graph's
// sizes (an attention kernel's query tiles of every batch and head:
// ceil(S / 128) * B*H).
// The most blocks a grid-stride kernel is launched with (blocks_for), and a
// grid rule at any size (launch_geometry): a kernel whose blocks each take one
// item by blockIdx.x alone needs its items below it (KernelBuilder::exact_grid).
inline constexpr int64_t kMaxGridBlocks = int64_t{1} << 20;

struct GridRule {
  ir::DimExpr work;
  int64_t per_item = 1, per_block = 1;
  uint32_t multiplier = 1;
  ir::DimExpr times = ir::DimExpr::constant(1);
  bool operator==(const GridRule&) const = default;
};

// Scratch memory kiln owns: `words` 32-bit words set to `fill` before the
// kernels that use it run. A symbolic graph's count of words may be a
// product of its sizes (`words` its probe value): the runtime allocates it
// for the largest sizes and fills it at the bound ones.
struct WorkspaceSpec {
  std::string name;
  int64_t words = 0;
  uint32_t fill = 0;
  std::optional<ir::DimExpr> words_expr;
  // At bound sizes (an integer graph's: words).
  int64_t words_at(const ir::DimValues& values) const { return words_expr ? ir::evaluate(*words_expr, values) : words; }
};

// The tactics a kernel's generator tried (codegen/tactic.h), in order: the
// one that built the kernel and those before it that did not fit, with why.
// Empty (no chosen tactic) for kernel kinds built one way.
struct TacticRecord {
  struct Rejected {
    std::string tactic, reason;
  };
  std::string chosen;
  std::vector<Rejected> rejected;
  bool empty() const { return chosen.empty(); }
};

// A matmul run by cuBLASLt instead of generated source (the "cublasLt"
// tactic, gemm_tactics.cpp; launched by runtime/vendor_gemm.h). In kiln's
// row-major terms: D[batch][m][n] = A[batch][m][k] x B[batch][k][n],
// accumulated in f32 and rounded once to D's type. Each matrix is read
// where it lies: element (i, j) of batch b at offset + b * batch_stride +
// i * row_stride + j * column_stride from its argument's pointer (one of
// the two inner strides 1; a batch stride of 0 broadcasts).
struct VendorGemm {
  struct Matrix {
    int arg = -1;  // its pointer: the kernel argument at this index
    DType dtype = DType::f32;
    int64_t row_stride = 0, column_stride = 0, batch_stride = 0, offset = 0;
    bool operator==(const Matrix&) const = default;
    // Rows contiguous (column stride 1), and the stride between them (its
    // leading dimension); else the stride between columns.
    bool row_major() const { return column_stride == 1; }
    int64_t leading() const { return row_major() ? row_stride : column_stride; }
  };
  int64_t m = 0, n = 0, k = 0, batches = 1;
  // A symbolic graph's M (rows of one batch): a product of its sizes, evaluated at launch (m then
  // holds its probe value); empty at integer sizes. Nothing else of the call is symbolic: N, K,
  // the batches (one), strides and offsets are integers.
  std::optional<ir::DimExpr> m_expr;
  int64_t m_at(const ir::DimValues& values) const { return m_expr ? ir::evaluate(*m_expr, values) : m; }
  Matrix a, b, d;
  bool tf32 = false;       // f32 operands multiplied in TF32 (the matmul's precision says so)
  int workspace_arg = -1;  // cuBLASLt's scratch: the kernel argument at this index
  int64_t workspace_bytes = 0;
  bool operator==(const VendorGemm&) const = default;
  // "cublasLt 4096x50257x768 x1: a bf16 [m][k] (row 768), b bf16 [n][k] (row 768), d bf16 [m][n] (row 50257)"
  // (a symbolic M as its product: "cublasLt B*S x32000x1024 x1: ...").
  std::string to_string() const;
  // Why a description (from a recipe) cannot be launched safely against
  // `args` kernel arguments, or "" when it can.
  std::string problem(size_t args) const;
};

// Where a symbolic graph's kernel variant runs (a size bucket): the sizes at which `extent` (a
// product of the graph's sizes: a matmul's M) lies in one of `ranges` (inclusive, ascending).
struct SizeCondition {
  ir::DimExpr extent;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  bool holds(const ir::DimValues& values) const;
  // "s27*s79 in 3969..4096, 8065..8192".
  std::string to_string() const;
  bool operator==(const SizeCondition&) const = default;
};

struct GeneratedKernel {
  int plan_kernel = 0;
  // A symbolic graph's plan kernel may be built more than once, each variant with the tiles its
  // heuristic chooses at some sizes (generate_program): a variant with `when` runs at the sizes
  // it names; the plan kernel's last variant, without `when`, at every other size. At most one
  // variant of a plan kernel runs at a launch (the first whose condition holds).
  std::optional<SizeCondition> when;
  // Set by a generator on a symbolic kernel whose heuristic would choose other tiles at some
  // sizes of the range: each such choice, and where (generate_program builds each as a variant,
  // launched before this build where its condition holds; the conditions are disjoint).
  std::vector<std::pair<Tuning, SizeCondition>> other_sizes;
  std::string source;     // what NVRTC compiles (annotated)
  std::string canonical;  // the source without comment lines: the cache key's text
  std::vector<KernelArg> args;
  std::array<uint32_t, 3> grid{1, 1, 1};  // a symbolic graph's: at its probe sizes; grid_rule gives grid[0] at launch
  std::optional<GridRule> grid_rule;
  std::array<uint32_t, 3> block{1, 1, 1};
  uint32_t shared_bytes = 0;  // dynamic shared memory per block
  // Persistent kernels (> 0): blocks loop over their work (grid[0] blocks'
  // worth), so the runtime launches only as many as run at once, a multiple
  // of this group (the kernel's cluster size).
  uint32_t persistent_group = 0;
  std::vector<int> reset_workspaces;  // filled before this kernel launches
  // The heuristic choices it was built with, and the alternatives its
  // generator accepts (tuning.h); both empty for kernels with none.
  Tuning tuning;
  std::vector<Tuning> tuning_space;
  // What its generator decided beyond the tuning, in words (not part of the
  // source): "epilogue: staged y, residual r, column blocks rolled".
  std::string decisions;
  // Which tactic built it, and why those before it did not (for `kiln plan --arch`).
  TacticRecord tactics;
  // Set where a vendor library runs it: `source` is then only a comment
  // describing the call (nothing for NVRTC), and `args` its pointers.
  std::optional<VendorGemm> library;
};

// Which of a program's kernels run at `values` (a symbolic graph's bound sizes): for each plan
// kernel, the first variant whose condition holds, or its last, without one.
std::vector<uint8_t> kernels_run_at(const std::vector<GeneratedKernel>& kernels, const ir::DimValues& values);

// Which vendor libraries the GEMM tactics may call (the pipeline's answer
// to Options::vendor: loaded here, or asked for regardless).
struct VendorLibraries {
  bool cublaslt = false;
  bool always = false;  // cuBLASLt for every matmul it can take, whatever the rule says (KILN_VENDOR=always)
  // Why there is none, for the rejected tactic's reason ("KILN_VENDOR=off",
  // "libcublasLt.so.13 is not installed on this machine").
  std::string why_not = "no vendor library was offered to this compile";
};

struct GeneratedProgram {
  std::vector<GeneratedKernel> kernels;
  std::vector<WorkspaceSpec> workspaces;
  std::vector<ir::TensorId> intermediates;  // materialised results that are not graph outputs
};

// `sm`: the target's compute capability (80 for sm_80): tensor-core kernels
// from 80 on, SIMT before. `tuning`: choices to use instead of the
// heuristic's, by plan kernel (those outside a kernel's space are ignored).
// `probe`: for a symbolic graph, `g` is its probe graph and this the probe
// (compiler/size_probe.h): sizes are kernel parameters (size_text.h), and a
// kernel this slice of symbolic codegen does not cover throws NotSymbolic.
// `vendors`: the libraries a kernel may call instead (VendorLibraries).
GeneratedProgram generate_program(const ir::Graph& g, const ir::Plan& plan, int sm, const ProgramTuning& tuning = {},
                                  const ir::SizeProbe* probe = nullptr, const VendorLibraries& vendors = {});

// Each generated kernel's tactics on `arch` (its generator's TacticRecord),
// for the plan's printers; kernels built one way have none.
ir::PlanTactics plan_tactics(const GeneratedProgram& program, const std::string& arch);

// The compute capability of an arch name: sm_90a -> 90.
int sm_of(const std::string& arch);

// How a materialised tensor is stored.
DType storage_dtype(const ir::Tensor& t);

}  // namespace kiln::codegen
