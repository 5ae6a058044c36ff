#include "compiler/planner/strategies.h"

#include <fmt/format.h>

#include <algorithm>

#include "compiler/error.h"

namespace kiln::ir::planner {
namespace {

std::string name_of(const Graph& g, const Op& op) { return fmt::format("'{}'", g.result(op).name); }

// Pointwise ops (and views' consumers) on a stage: one value per element of
// that stage, so the element counts must agree.
Verdict take_pointwise(const Graph& g, const Group& group, const Op& op, int stage) {
  const int64_t count = element_count(g.result(op).shape);
  if (stage == 1 && count == group.count[0] && count != group.count[1])
    return Verdict::no(fmt::format("{} combines a finished reduction with the domain it reduces; that needs a "
                                   "second pass over the domain",
                                   name_of(g, op)));
  if (count != group.count[stage])
    return Verdict::no(fmt::format("iteration spaces differ: {} has {} elements, the {} kernel's domain has {}",
                                   name_of(g, op), count, to_string(group.kind), group.count[stage]));
  return Verdict::yes(stage);
}

// Whether an epilogue reduction combines its partials in registers first:
// it keeps one value per output column (a conv's channel statistics: the
// other axes reduced) or reduces each output row (RMSNorm's mean of
// squares after a matmul). By sizes: the anchor's columns are N, the
// extent of its result's channel axis. Anything else takes one atomic per
// element (H100, ResNet-50's average pool in its last conv's epilogue, 49
// atomics on each address: 127 us for a conv of 15).
bool partials_per_column_or_row(const Graph& g, const Group& group, const Op& reduce) {
  const Op& anchor = g.ops[static_cast<size_t>(group.anchor)];
  const Shape& out = g.result(anchor).shape;
  const int64_t columns = anchor.kind == OpKind::Conv2d && anchor.attrs.layout == Layout::NCHW ? out[1] : out.back();
  const Shape& in = g.operand(reduce, 0).shape;
  const std::vector<int64_t>& axes = reduce.attrs.axes;
  int64_t kept = 1, reduced = 1;
  for (size_t d = 0; d < in.size(); ++d)
    (std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(d)) ? reduced : kept) *= in[d];
  const bool per_column = kept == columns;
  const bool per_row = axes.size() == 1 && axes[0] == static_cast<int64_t>(in.size()) - 1 && reduced == columns;
  return per_column || per_row;
}

// Whether the group computes `t` at the conv's own output coordinates: the
// conv's result, or pointwise ops of its shape over such values and over
// tensors from memory (through views of their own). A view of a value the
// group computes moves its elements: not at the conv's coordinates.
bool at_conv_coordinates(const Graph& g, const Group& group, TensorId t) {
  auto computed_here = [&](const Tensor& x) { return x.kind == TensorKind::OpResult && group.ops.count(x.producer); };
  const Tensor& x = g.tensor(t);
  if (x.kind != TensorKind::OpResult || x.producer == group.anchor) return true;
  const Op& op = g.ops[static_cast<size_t>(x.producer)];
  if (op_info(op.kind).family == OpFamily::View) {  // (views join a group with their readers: not a member yet)
    const Tensor* s = &x;
    while (s->kind == TensorKind::OpResult && op_info(g.ops[static_cast<size_t>(s->producer)].kind).family == OpFamily::View)
      s = &g.operand(g.ops[static_cast<size_t>(s->producer)], 0);
    return !computed_here(*s);  // from memory, else computed here and moved
  }
  if (!computed_here(x)) return true;
  if (!pointwise_like(op.kind) || x.shape != g.result(g.ops[static_cast<size_t>(group.anchor)]).shape) return false;
  return std::all_of(op.inputs.begin(), op.inputs.end(), [&](TensorId in) { return at_conv_coordinates(g, group, in); });
}

// A pool in a conv's epilogue: 2 x 2 windows, stride 2, no padding, over
// values at the conv's output coordinates, both NHWC, the output's height
// and width even. The conv's GEMM rows then run window by window (codegen
// orders each window's four pixels; every pixel still once: a permutation),
// so a tile holds whole windows and the conv's output never reaches memory.
// Overlapping or padded windows (ResNet's 3 x 3 stride-2 stem pool) read
// the conv's output once from a pooling kernel instead.
Verdict take_pool_into_conv(const Graph& g, const Group& group, const Op& pool) {
  const Op& conv = g.ops[static_cast<size_t>(group.anchor)];
  const Attributes& a = pool.attrs;
  const std::string what = fmt::format("{} ({}x{}, stride {}x{}, padding {}x{})", name_of(g, pool), a.kernel[0], a.kernel[1],
                                       a.stride[0], a.stride[1], a.padding[0], a.padding[1]);
  if (a.kernel != std::array<int64_t, 2>{2, 2} || a.stride != std::array<int64_t, 2>{2, 2} ||
      a.padding != std::array<int64_t, 2>{0, 0})
    return Verdict::no(fmt::format("{}: a conv kernel pools in its epilogue only 2x2 windows with stride 2 and no padding, "
                                   "which its tiles hold whole; the pool reads the conv's output once instead",
                                   what));
  const Shape& out = g.result(conv).shape;
  if (conv.attrs.layout != Layout::NHWC || a.layout != Layout::NHWC)
    return Verdict::no(fmt::format("{}: a conv kernel pools in its epilogue only where conv and pool are both NHWC", what));
  if (g.operand(pool, 0).shape != out || !at_conv_coordinates(g, group, pool.inputs[0]))
    return Verdict::no(fmt::format("{} pools values that are not at the conv's output coordinates (another shape, or "
                                   "moved by a view)",
                                   what));
  if (out[1] % 2 != 0 || out[2] % 2 != 0)
    return Verdict::no(fmt::format("{}: the conv's output is {}x{} pixels; its epilogue pools only an even height and "
                                   "width (each pixel in one window)",
                                   what, out[1], out[2]));
  if (group.epilogue_pool || group.epilogue_reductions > 0)
    return Verdict::no(fmt::format("{} would be a second reduction of the conv's output in its epilogue", what));
  return Verdict::yes(1);
}

Verdict take_into_anchor(const Graph& g, const Group& group, const Op& op, int stage) {
  const OpFamily family = op_info(op.kind).family;
  if (stage == 1 && group.epilogue_pool)
    return Verdict::no(fmt::format("{} reads the pooled output of the conv kernel's epilogue, the last value it computes",
                                   name_of(g, op)));
  if (stage == 1)
    return Verdict::no(fmt::format("{} reads the result of a reduction across the {} kernel's tiles, which is "
                                   "complete only when the kernel ends",
                                   name_of(g, op), to_string(group.kind)));
  if (pointwise_like(op.kind)) return take_pointwise(g, group, op, 0);
  if (family == OpFamily::Pool && group.kind == KernelKind::Conv) return take_pool_into_conv(g, group, op);
  if (family == OpFamily::Reduce) {
    if (group.epilogue_pool)
      return Verdict::no(fmt::format("{}: the conv kernel already pools its output in its epilogue", name_of(g, op)));
    if (group.kind == KernelKind::Attention)
      return Verdict::no(fmt::format("an attention kernel does not reduce its output ({})", name_of(g, op)));
    if (element_count(g.operand(op, 0).shape) != group.count[0])
      return Verdict::no(fmt::format("{} reduces a tensor that is not the anchor's output", name_of(g, op)));
    if (!partials_per_column_or_row(g, group, op))
      return Verdict::no(fmt::format("{} keeps neither the anchor's columns alone nor its rows: in the epilogue each "
                                     "element would take an atomic (a reduction kernel reads the result once instead)",
                                     name_of(g, op)));
    return Verdict::yes(1);  // an epilogue reduction: per-tile partials combined with atomics
  }
  return Verdict::no(fmt::format("a {} cannot be the epilogue of a {} kernel: it needs whole rows of the anchor's "
                                 "output, which a tile does not hold",
                                 op_name(op.kind), to_string(group.kind)));
}

Verdict take_into_pointwise(const Graph& g, const Group& group, const Op& op, int stage) {
  const OpFamily family = op_info(op.kind).family;
  if (pointwise_like(op.kind)) return take_pointwise(g, group, op, stage);
  const int64_t input_count = element_count(g.operand(op, 0).shape);
  if (input_count != group.count[0])
    return Verdict::no(fmt::format("iteration spaces differ: {} reads {} elements, the pointwise kernel's domain has {}",
                                   name_of(g, op), input_count, group.count[0]));
  switch (family) {
    case OpFamily::Reduce:
      return Verdict::yes(1);  // becomes a reduction with a pointwise prologue
    case OpFamily::Pool:
      return Verdict::yes(1);
    case OpFamily::Norm:
      return Verdict::yes(0);  // becomes a normalisation with a pointwise prologue
    case OpFamily::Unary:
    case OpFamily::Binary:
    case OpFamily::Compare:
    case OpFamily::Select:
    case OpFamily::Matmul:
    case OpFamily::Conv:
    case OpFamily::View:
    case OpFamily::Attention:
    case OpFamily::Concat:
      break;
  }
  return Verdict::no(fmt::format("{} starts a kernel of its own", name_of(g, op)));
}

Verdict take_into_reduction(const Graph& g, const Group& group, const Op& op, int stage) {
  const OpFamily family = op_info(op.kind).family;
  if (pointwise_like(op.kind)) return take_pointwise(g, group, op, stage);
  if (family == OpFamily::Reduce && stage == 0 && !group.pooling) {
    const Tensor& input = g.operand(op, 0);
    if (input.shape != group.domain || op.attrs.axes != group.reduce_axes)
      return Verdict::no(fmt::format("{} reduces {} over axes [{}] but the kernel reduces {} over axes [{}]",
                                     name_of(g, op), to_string(input.shape), fmt::join(op.attrs.axes, ","),
                                     to_string(group.domain), fmt::join(group.reduce_axes, ",")));
    return Verdict::yes(1);  // a sibling reduction: one pass, several results
  }
  if (stage == 1)
    return Verdict::no(fmt::format("{} would reduce an already reduced value; the first reduction must finish first",
                                   name_of(g, op)));
  return Verdict::no(fmt::format("a {} cannot join a reduction kernel", op_name(op.kind)));
}

// A depthwise conv's epilogue: pointwise ops (batch_norm among them) on
// its output's elements. A block holds a tile of pixels of a few channels:
// no whole rows to reduce, and no pooling windows are ordered in it.
Verdict take_into_depthwise(const Graph& g, const Group& group, const Op& op, int stage) {
  if (pointwise_like(op.kind)) return take_pointwise(g, group, op, stage);
  return Verdict::no(fmt::format("a {} cannot be the epilogue of a depthwise_conv kernel: a block holds a tile of "
                                 "pixels of a few channels, not whole rows or pooling windows",
                                 op_name(op.kind)));
}

Verdict take_into_norm(const Graph& g, const Group& group, const Op& op, int stage) {
  if (pointwise_like(op.kind)) return take_pointwise(g, group, op, stage);
  return Verdict::no(fmt::format("a {} cannot join the normalisation kernel of '{}'", op_name(op.kind),
                                 g.result(g.ops[static_cast<size_t>(group.norm_op)]).name));
}

}  // namespace

bool pointwise_like(OpKind kind) { return is_pointwise(kind) || kind == OpKind::BatchNorm; }

Verdict can_take(const Graph& g, const Group& group, const Op& op, int stage) {
  switch (group.kind) {
    case KernelKind::Matmul:
    case KernelKind::Conv:
    case KernelKind::Attention:
      return take_into_anchor(g, group, op, stage);
    case KernelKind::Pointwise:
    case KernelKind::Copy:
      return take_into_pointwise(g, group, op, stage);
    case KernelKind::Reduction:
      return take_into_reduction(g, group, op, stage);
    case KernelKind::Norm:
      return take_into_norm(g, group, op, stage);
    case KernelKind::DepthwiseConv:
      return take_into_depthwise(g, group, op, stage);
  }
  KILN_UNREACHABLE("unknown kernel kind");
}

KernelKind kind_for(OpKind kind) {
  switch (op_info(kind).family) {
    case OpFamily::Matmul: return KernelKind::Matmul;
    case OpFamily::Conv: return KernelKind::Conv;
    case OpFamily::Attention: return KernelKind::Attention;
    case OpFamily::Reduce:
    case OpFamily::Pool: return KernelKind::Reduction;
    case OpFamily::Norm: return kind == OpKind::BatchNorm ? KernelKind::Pointwise : KernelKind::Norm;
    case OpFamily::View: return KernelKind::Copy;
    case OpFamily::Unary:
    case OpFamily::Binary:
    case OpFamily::Compare:
    case OpFamily::Select:
    case OpFamily::Concat: return KernelKind::Pointwise;  // over its result, each element from its input
  }
  KILN_UNREACHABLE("unknown op family");
}

KernelKind kind_for(const Graph& g, const Op& op) {
  return depthwise_conv(g, op) ? KernelKind::DepthwiseConv : kind_for(op.kind);
}

bool depthwise_conv(const Graph& g, const Op& op) {
  if (op.kind != OpKind::Conv2d || op.attrs.layout != Layout::NHWC) return false;
  const Shape& x = g.operand(op, 0).shape;  // [N, H, W, C]
  const Shape& w = g.operand(op, 1).shape;  // [K, R, S, C / groups]
  const Shape& y = g.result(op).shape;      // [N, P, Q, K]
  const Attributes& a = op.attrs;
  const auto span = [](int64_t taps, int64_t dilation) { return (taps - 1) * dilation + 1; };
  // (The kernel indexes rows, columns and channels, and a tile's first input pixel, in 32-bit ints.)
  const int64_t most = int64_t{1} << 30;
  const bool small = std::max({x[1], x[2], x[3], a.padding[0], a.padding[1]}) < most && y[1] < most / a.stride[0] &&
                     y[2] < most / a.stride[1];
  // Groups of one input channel, or of a few whose values one 16-byte load holds.
  const int64_t group_in = w[3];
  const Tensor& input = g.operand(op, 0);
  const bool few = group_in == 1 || ((group_in == 2 || group_in == 4 || group_in == 8) &&
                                     group_in * byte_size(input.value_dtype()) <= 16);
  return a.groups > 1 && a.groups * group_in == x[3] && few && w[0] / a.groups <= kMaxDepthwiseMultiplier &&
         w[1] <= kMaxDepthwiseTaps &&
         w[2] <= kMaxDepthwiseTaps && span(w[1], a.dilation[0]) <= kMaxDepthwiseSpan &&
         span(w[2], a.dilation[1]) <= kMaxDepthwiseSpan && small;
}

RowStrategy row_strategy(int64_t elements) {
  if (elements <= 1024) return RowStrategy::Warp;
  if (elements <= 16384) return RowStrategy::Block;        // 512 threads x 32 values in registers
  if (elements <= 8 * 40960) return RowStrategy::Cluster;  // up to 8 blocks x 160 KiB of shared memory
  return RowStrategy::TwoPass;
}

namespace {

int64_t product(const Shape& s, size_t begin, size_t end) {
  int64_t v = 1;
  for (size_t i = begin; i < end; ++i) v *= s[i];
  return v;
}

// Anchors: the GEMM view (conv: implicit GEMM per group, a depthwise conv's
// groups its channels, n its multiplier and k its taps; attention: one
// (batch, head) per GEMM batch).
void anchor_params(const Graph& g, const Group& group, KernelParams& p) {
  const Op& op = g.ops[static_cast<size_t>(group.anchor)];
  const Shape& out = g.result(op).shape;
  p.epilogue_reductions = group.kind == KernelKind::Attention ? 0 : group.epilogue_reductions;
  if (group.epilogue_pool) p.pool_window = 2;
  if (group.kind == KernelKind::Matmul) {
    const Shape& a = g.operand(op, 0).shape;
    p.batch = product(out, 0, out.size() - 2);
    p.m = out[out.size() - 2];
    p.n = out[out.size() - 1];
    p.k = a[a.size() - 1];
  } else if (group.kind == KernelKind::Conv || group.kind == KernelKind::DepthwiseConv) {
    const Shape& w = g.operand(op, 1).shape;
    const bool nhwc = op.attrs.layout == Layout::NHWC;
    p.batch = op.attrs.groups;
    p.m = out[0] * (nhwc ? out[1] * out[2] : out[2] * out[3]);
    p.n = (nhwc ? out[3] : out[1]) / op.attrs.groups;
    p.k = w[1] * w[2] * w[3];
  } else {
    KILN_INTERNAL_CHECK(op.kind == OpKind::Sdpa);
    const Shape& q = g.operand(op, 0).shape;
    p.batch = q[0] * q[1];
    p.m = q[2];
    p.n = g.operand(op, 1).shape[2];
    p.k = q[3];
  }
}

void reduction_params(const Graph& g, const Group& group, KernelParams& p) {
  if (group.norm_op >= 0) {  // row statistics of a normalisation
    const Op& op = g.ops[static_cast<size_t>(group.norm_op)];
    const Shape& x = g.operand(op, 0).shape;
    p.domain = x;
    p.outer = product(x, 0, static_cast<size_t>(op.attrs.axis));
    p.reduced = product(x, static_cast<size_t>(op.attrs.axis), x.size());
    p.row = row_strategy(p.reduced);
  } else if (!group.pooling && !group.reduce_axes.empty()) {
    // [outer, reduced, inner] when the reduced axes are contiguous;
    // otherwise reduced = their product and outer the rest.
    const auto& axes = group.reduce_axes;
    const bool contiguous = axes.back() - axes.front() + 1 == static_cast<int64_t>(axes.size());
    p.reduced = 1;
    for (int64_t a : axes) p.reduced *= group.domain[static_cast<size_t>(a)];
    if (contiguous) {
      p.outer = product(group.domain, 0, static_cast<size_t>(axes.front()));
      p.inner = product(group.domain, static_cast<size_t>(axes.back()) + 1, group.domain.size());
    } else {
      p.outer = element_count(group.domain) / p.reduced;
      p.inner = 1;
    }
    p.row = row_strategy(p.reduced);
    p.holds_rows = group.holds_rows;
  }
}

void norm_params(const Graph& g, const Group& group, KernelParams& p) {
  const Op& op = g.ops[static_cast<size_t>(group.norm_op)];
  const Shape& x = g.operand(op, 0).shape;
  p.domain = x;
  const auto axis = static_cast<size_t>(op.attrs.axis);
  if (op.kind == OpKind::Softmax || op.kind == OpKind::LogSoftmax) {
    p.outer = product(x, 0, axis);
    p.reduced = x[axis];
    p.inner = product(x, axis + 1, x.size());
  } else if (op.kind == OpKind::GroupNorm) {
    p.outer = x[0] * op.attrs.groups;
    p.reduced = element_count(x) / p.outer;
  } else {
    p.outer = product(x, 0, axis);
    p.reduced = product(x, axis, x.size());
  }
  p.row = row_strategy(p.reduced);
}

}  // namespace

KernelParams params_for(const Graph& g, const Group& group) {
  KernelParams p;
  p.domain = group.domain;
  switch (group.kind) {
    case KernelKind::Matmul:
    case KernelKind::Conv:
    case KernelKind::Attention:
    case KernelKind::DepthwiseConv: anchor_params(g, group, p); break;
    case KernelKind::Reduction: reduction_params(g, group, p); break;
    case KernelKind::Norm: norm_params(g, group, p); break;
    case KernelKind::Pointwise:
    case KernelKind::Copy: break;
  }
  return p;
}

}  // namespace kiln::ir::planner
