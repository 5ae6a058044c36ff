// A matmul kernel as a vendor library's call (the "cublasLt" tactic of
// gemm_tactics.cpp): whether cuBLASLt can compute the kernel exactly as
// kiln would, and the call's description (VendorGemm) when it can.
//
// Expects: a matmul kernel's GEMM view; the program's VendorLibraries.
// Guarantees: a description only for a kernel that is the matmul alone (its
// operands read through views from memory, its one written tensor the
// product or a reshape of it, no prologue or epilogue op), at integer
// sizes or with M alone symbolic (VendorGemm::m_expr), whose operands
// cuBLASLt reads as stored: both bf16, both f16, or both f32 (in full f32,
// or TF32 where the matmul's precision says so), each with one of its two
// inner strides 1 and its batches one stride apart (or broadcast). The
// product is accumulated in f32 and rounded once to the result's storage
// type, as kiln's own kernels do (numerics rule 5). Every refusal says why.
#include <fmt/format.h>

#include "codegen/gemm_generator.h"
#include "compiler/strides.h"

namespace kiln::codegen {
namespace {

bool vendor_type(DType t) { return t == DType::bf16 || t == DType::f16 || t == DType::f32; }

}  // namespace

std::string VendorGemm::to_string() const {
  auto matrix = [this](const char* name, const Matrix& x, const char* rows, const char* columns) {
    const bool row_major = x.row_major();
    const std::string batch = batches == 1 ? "" : x.batch_stride ? fmt::format(", batch {}", x.batch_stride) : ", one for every batch";
    return fmt::format("{} {} [{}][{}] ({} {}{}{})", name, kiln::to_string(x.dtype), row_major ? rows : columns,
                       row_major ? columns : rows, row_major ? "row" : "column", x.leading(),
                       batch, x.offset ? fmt::format(", from element {}", x.offset) : std::string());
  };
  const std::string rows = m_expr ? ir::to_string(*m_expr) + " " : std::to_string(m);
  return fmt::format("cublasLt {}x{}x{} x{}{}: {}, {}, {}", rows, n, k, batches, tf32 ? " tf32" : "", matrix("a", a, "m", "k"),
                     matrix("b", b, "k", "n"), matrix("d", d, "m", "n"));
}

std::string VendorGemm::problem(size_t args) const {
  if (m <= 0 || n <= 0 || k <= 0 || batches <= 0) return fmt::format("sizes {}x{}x{} x{}", m, n, k, batches);
  if (workspace_arg < 0 || static_cast<size_t>(workspace_arg) >= args || workspace_bytes <= 0) return "no workspace";
  const std::pair<const Matrix*, std::pair<int64_t, int64_t>> matrices[] = {{&a, {m, k}}, {&b, {k, n}}, {&d, {m, n}}};
  for (const auto& [x, extent] : matrices) {
    if (x->arg < 0 || static_cast<size_t>(x->arg) >= args) return fmt::format("argument {} of {}", x->arg, args);
    if (!vendor_type(x->dtype) || x->offset < 0 || x->batch_stride < 0) return "a matrix's type or offset";
    const bool row_major = x->row_major();
    if ((!row_major && x->row_stride != 1) || x->leading() < (row_major ? extent.second : extent.first))
      return "a matrix's strides";
  }
  if (m_expr && (batches != 1 || !a.row_major())) return "a symbolic M over batches, or of a column-major A";
  if (a.dtype != b.dtype || (tf32 && a.dtype != DType::f32)) return "operand types";
  if (d.column_stride != 1 || d.row_stride != n || (batches > 1 && d.batch_stride != m * n)) return "the result's layout";
  return "";
}

std::optional<VendorGemm> GemmGenerator::vendor_gemm(const ir::Op& anchor, const Gemm& gm, const std::optional<Mma>& kind,
                                                     std::string& why) const {
  if (!state_.vendors.cublaslt) return why = state_.vendors.why_not, std::nullopt;
  if (anchor.kind != OpKind::Matmul) return why = "a conv is not a matmul cuBLASLt takes", std::nullopt;
  if (sm_ < 80) return why = fmt::format("kiln calls cuBLASLt on sm_80 and newer, the target is sm_{}", sm_), std::nullopt;
  // A symbolic graph's matmul: M may be symbolic (its layouts are made at launch, for each M), nothing else.
  if (sizes_.symbolic(gm.n) || sizes_.symbolic(gm.k) || sizes_.symbolic(gm.batches))
    return why = "a symbolic N, K or batch count (cuBLASLt's layouts take M alone from the sizes at launch)", std::nullopt;
  if (sizes_.symbolic(gm.m) && gm.batches != 1)
    return why = "a symbolic M over batches (their stride would be symbolic)", std::nullopt;
  const ir::TensorId product = anchor.output;
  for (int32_t oi : k_.ops) {
    const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
    if (&op != &anchor && ir::op_info(op.kind).family != ir::OpFamily::View)
      return why = fmt::format("the kernel computes {} ({}) beside the matmul: kiln's own kernels fuse it", ir::op_name(op.kind),
                               detail::quoted(g_.result(op).name)),
             std::nullopt;
  }
  // What it writes: the product, or the product reshaped (the same elements in the same order).
  if (k_.writes.size() != 1 || (k_.writes[0] != product && !same_linear_order(product, k_.writes[0])))
    return why = "the kernel writes more than the matmul's product", std::nullopt;
  const ir::TensorId written = k_.writes[0];

  VendorGemm v;
  v.m = gm.m, v.n = gm.n, v.k = gm.k, v.batches = gm.batches;
  const ir::Tensor& result = g_.tensor(product);
  const Shape batch_shape(result.shape.begin(), result.shape.end() - 2);
  // Operand `slot` as a matrix of `rows` x `columns`, its batches broadcast to the result's.
  auto operand = [&](size_t slot, VendorGemm::Matrix& x) -> bool {
    const ir::TensorId t = anchor.inputs[slot];
    const std::optional<ExternalTensor> e = strided_in_memory(t);
    const char* name = slot == 0 ? "A" : "B";
    if (!e) return why = fmt::format("{} ({}) is computed in the kernel, not read from memory", name, detail::quoted(g_.tensor(t).name)), false;
    const Shape& shape = g_.tensor(t).shape;
    const size_t rank = shape.size();
    x.dtype = e->storage;
    x.offset = e->offset;
    const std::optional<ir::BlasMatrix> layout =
        ir::blas_matrix(shape[rank - 2], shape[rank - 1], e->strides[rank - 2], e->strides[rank - 1]);
    if (!layout)
      return why = fmt::format("{} ({}) is laid out with strides {} and {}: neither of its inner dimensions is contiguous", name,
                               detail::quoted(g_.tensor(t).name), e->strides[rank - 2], e->strides[rank - 1]),
             false;
    x.row_stride = layout->row_stride;
    x.column_stride = layout->column_stride;
    Strides strides(batch_shape.size(), 0);  // along the result's batch dims: 0 where the operand broadcasts
    for (size_t d = 0; d + 2 < rank; ++d)     // (its batch dims right-aligned with the result's)
      if (shape[d] != 1) strides[batch_shape.size() - (rank - 2) + d] = e->strides[d];
    const std::optional<int64_t> batch = ir::one_stride(batch_shape, strides);
    if (!batch) return why = fmt::format("{} ({})'s batches are not evenly spaced in memory", name, detail::quoted(g_.tensor(t).name)), false;
    x.batch_stride = *batch;
    return true;
  };
  if (!operand(0, v.a) || !operand(1, v.b)) return std::nullopt;
  for (const auto& [name, x] : {std::pair{"A", &v.a}, std::pair{"B", &v.b}})
    if (sizes_.symbolic(x->row_stride) || sizes_.symbolic(x->column_stride) || sizes_.symbolic(x->batch_stride) ||
        sizes_.symbolic(x->offset))
      return why = fmt::format("{}'s strides or offset depend on the sizes", name), std::nullopt;
  if (sizes_.symbolic(gm.m)) {
    if (!v.a.row_major()) return why = "A is column-major over a symbolic M (its leading dimension would be M)", std::nullopt;
    v.m_expr = sizes_.dim(gm.m).expr();
  }
  if (v.a.dtype != v.b.dtype || !vendor_type(v.a.dtype))
    return why = fmt::format("operands of {} and {}: cuBLASLt takes two of bf16, f16 or f32", to_string(v.a.dtype), to_string(v.b.dtype)),
           std::nullopt;
  if (v.a.dtype == DType::f32) {
    if (kind && *kind != Mma::tf32)
      return why = "the precision rounds f32 operands to 16 bits, which cuBLASLt does not", std::nullopt;
    v.tf32 = kind.has_value();
  } else if (!kind || mma_storage(*kind) != v.a.dtype) {
    return why = "no exact tensor-core product of these operands", std::nullopt;
  }
  v.d = {.arg = -1, .dtype = storage_dtype(g_.tensor(written)), .row_stride = v.n, .column_stride = 1,
         .batch_stride = v.batches > 1 ? v.m * v.n : 0, .offset = 0};
  if (!vendor_type(v.d.dtype) || (v.a.dtype == DType::f32 && v.d.dtype != DType::f32) ||
      (v.a.dtype != DType::f32 && v.d.dtype != v.a.dtype && v.d.dtype != DType::f32))
    return why = fmt::format("a {} product of {} operands", to_string(v.d.dtype), to_string(v.a.dtype)), std::nullopt;
  // The arguments that hold them: KernelBuilder::externals made one per tensor the kernel reads or writes.
  auto arg_of = [&](ir::TensorId t) {
    for (size_t i = 0; i < out_.args.size(); ++i)
      if (out_.args[i].tensor == t && out_.args[i].role != KernelArg::Role::TensorMap) return static_cast<int>(i);
    return -1;
  };
  v.a.arg = arg_of(*tensor_behind(strided_in_memory(anchor.inputs[0])->pointer));
  v.b.arg = arg_of(*tensor_behind(strided_in_memory(anchor.inputs[1])->pointer));
  v.d.arg = arg_of(written);
  KILN_INTERNAL_CHECK(v.a.arg >= 0 && v.b.arg >= 0 && v.d.arg >= 0);
  return v;
}

void GemmGenerator::gemm_vendor(VendorGemm v) {
  // cuBLASLt's scratch, one for every such kernel of the program (they run one after another).
  constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;
  workspace_param("cublasLt.workspace", kWorkspaceBytes / 4, 0, false);
  v.workspace_arg = static_cast<int>(out_.args.size()) - 1;
  v.workspace_bytes = kWorkspaceBytes;
  if (const std::string problem = v.problem(out_.args.size()); !problem.empty())
    KILN_UNREACHABLE("a cuBLASLt call its own checks refuse (" + problem + "): " + v.to_string());
  const std::string call = v.to_string();
  out_.source = fmt::format("// kiln kernel {}: {} over {}\n// run by cuBLASLt, no source: {}\n", k_.id, ir::to_string(k_.kind),
                            k_.params.to_string(k_.kind), call);
  out_.canonical = call + "\n";
  decided(call);
  out_.library = std::move(v);
}

}  // namespace kiln::codegen
