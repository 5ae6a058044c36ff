#include "compiler/plan.h"

#include <fmt/format.h>

namespace kiln::ir {

std::string_view to_string(KernelKind kind) {
  switch (kind) {
#define KILN_KERNEL_KIND(e, name) \
  case KernelKind::e:               \
    return name;
#include "compiler/kernel_kinds.def"
#undef KILN_KERNEL_KIND
  }
  return "?";
}

int64_t materialised_bytes(const Tensor& t) { return element_count(t.shape) * byte_size(t.value_dtype()); }

int64_t bytes_through_memory(const Graph& g, const Plan& plan) {
  int64_t moved = 0;
  for (const PlannedKernel& k : plan.kernels) {
    for (TensorId t : k.reads) moved += materialised_bytes(g.tensor(t));
    for (TensorId t : k.writes) moved += materialised_bytes(g.tensor(t));
  }
  return moved;
}

std::string_view to_string(RowStrategy s) {
  switch (s) {
    case RowStrategy::Warp: return "warp";
    case RowStrategy::Block: return "block";
    case RowStrategy::Cluster: return "cluster";
    case RowStrategy::TwoPass: return "two-pass";
  }
  return "?";
}

std::string KernelParams::to_string(KernelKind kind) const {
  switch (kind) {
    case KernelKind::Matmul:
    case KernelKind::Conv:
    case KernelKind::Attention: {
      std::string s = fmt::format("batch={} m={} n={} k={}", batch, m, n, k);
      if (epilogue_reductions) s += fmt::format(" epilogue_reductions={}", epilogue_reductions);
      if (pool_window) s += fmt::format(" pooled={}x{}", pool_window, pool_window);
      return s;
    }
    case KernelKind::Reduction:
    case KernelKind::Norm:
      if (reduced > 1 || kind == KernelKind::Norm)
        return fmt::format("domain={} outer={} reduced={} inner={} row={}{}", kiln::to_string(domain), outer, reduced,
                           inner, ir::to_string(row), holds_rows ? " rows held" : "");
      return fmt::format("domain={}", kiln::to_string(domain));
    case KernelKind::Pointwise:
    case KernelKind::Copy:
      return fmt::format("domain={}", kiln::to_string(domain));
    case KernelKind::DepthwiseConv:  // (the GEMM view's batch is the groups, n a group's outputs, k its taps x inputs)
      return fmt::format("domain={} groups={} multiplier={} pixels={} k={}", kiln::to_string(domain), batch, n, m, k);
  }
  return "";
}

}  // namespace kiln::ir
