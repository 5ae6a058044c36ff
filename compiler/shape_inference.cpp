#include "compiler/shape_inference.h"

#include <algorithm>
#include <cmath>

#include "compiler/error.h"
#include "compiler/symbolic_dims.h"

namespace kiln::ir {
namespace {

bool given_attr(AttrSet given, AttrKey key) { return (given & attr_bit(key)) != 0; }

// Rule 3: the widest floating dtype of the tensor inputs, ignoring scalar
// constants (and the caller leaves out where's condition); f32 wins, f16 with
// bf16 gives f32, no tensor inputs gives f32.
DType widest_floating(const std::vector<const Tensor*>& operands) {
  bool any = false, f16 = false, bf16 = false, f32 = false;
  for (const Tensor* t : operands) {
    if (t->kind == TensorKind::Constant || !is_floating(t->dtype)) continue;
    any = true;
    f16 |= t->dtype == DType::f16;
    bf16 |= t->dtype == DType::bf16;
    f32 |= t->dtype == DType::f32;
  }
  if (!any || f32 || (f16 && bf16)) return DType::f32;
  return f16 ? DType::f16 : DType::bf16;
}

int64_t checked_count(const Shape& shape, const std::string& where) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d > kMaxElements / count)
      throw_user_error(fmt::format("{}: result shape {} has more than 2^62 elements", where,
                                   to_string(shape)));
    count *= d;
  }
  return count;
}

// Normalises an axis of a rank-`rank` tensor; `what` names it in messages.
int64_t normalize_axis(int64_t axis, int rank, const std::string& where, std::string_view what) {
  KILN_USER_CHECK(axis >= -rank && axis < rank,
                  "{}: {} {} is out of range for a rank-{} input (valid: {} to {})", where, what,
                  axis, rank, -rank, rank - 1);
  return axis < 0 ? axis + rank : axis;
}


void expect_rank(const Tensor& t, int rank, const std::string& where, std::string_view role) {
  KILN_USER_CHECK(t.rank() == rank, "{}: {} {} must have rank {}", where, role,
                  describe_tensor(t), rank);
}

void expect_shape(const Tensor& t, const Shape& shape, const std::string& where,
                  std::string_view role) {
  KILN_USER_CHECK(t.shape == shape, "{}: {} {} must have shape {}", where, role,
                  describe_tensor(t), to_string(shape));
}

// Pooling and convolution window parameters must stay small enough that the
// output-size arithmetic cannot overflow.
void expect_window_param(int64_t value, int64_t minimum, const std::string& where,
                         std::string_view what) {
  KILN_USER_CHECK(value >= minimum && value <= (int64_t{1} << 31),
                  "{}: {} value {} must be between {} and 2^31", where, what, value, minimum);
}

InferredResult infer_pointwise(OpKind kind, const std::vector<const Tensor*>& in,
                               const std::string& where) {
  Shape shape;
  for (size_t i = 0; i < in.size(); ++i) {
    std::optional<Shape> next = broadcast_shapes(shape, in[i]->shape);
    if (!next) {
      std::string shapes;
      for (size_t j = 0; j <= i; ++j)
        shapes += fmt::format("{}{}", j ? " and " : "", to_string(in[j]->shape));
      throw_user_error(fmt::format("{}: shapes {} do not broadcast", where, shapes));
    }
    shape = *next;
  }
  const OpFamily family = op_info(kind).family;
  if (family == OpFamily::Compare) return {shape, DType::boolean};
  if (family == OpFamily::Select) return {shape, widest_floating({in[1], in[2]})};
  return {shape, widest_floating(in)};
}

InferredResult infer_reduce(const Tensor& x, Attributes& a, AttrSet given,
                            const std::string& where) {
  if (!given_attr(given, AttrKey::axes)) {
    a.axes.clear();
    for (int i = 0; i < x.rank(); ++i) a.axes.push_back(i);
  } else {
    KILN_USER_CHECK(!a.axes.empty(), "{}: axes must not be empty (leave it out to reduce over all axes)", where);
    std::vector<int64_t> sorted;
    for (int64_t axis : a.axes) sorted.push_back(normalize_axis(axis, x.rank(), where, "axis"));
    std::sort(sorted.begin(), sorted.end());
    KILN_USER_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
                    "{}: axes [{}] name the same axis twice", where, fmt::join(a.axes, ","));
    a.axes = sorted;
  }
  Shape shape;
  for (int i = 0; i < x.rank(); ++i) {
    bool reduced = std::binary_search(a.axes.begin(), a.axes.end(), i);
    if (!reduced) shape.push_back(x.shape[static_cast<size_t>(i)]);
    else if (a.keepdims) shape.push_back(1);
  }
  return {shape, x.dtype};
}

InferredResult infer_norm(OpKind kind, const std::vector<const Tensor*>& in, Attributes& a,
                          AttrSet given, const std::string& where) {
  const Tensor& x = *in[0];
  KILN_USER_CHECK(x.rank() >= 1, "{}: input {} must have rank at least 1", where, describe_tensor(x));
  a.axis = normalize_axis(given_attr(given, AttrKey::axis) ? a.axis : -1, x.rank(), where, "axis");
  if (!given_attr(given, AttrKey::eps)) a.eps = kind == OpKind::RmsNorm ? 1e-6f : 1e-5f;
  KILN_USER_CHECK(a.eps >= 0.0f, "{}: eps {} must not be negative", where, a.eps);
  const auto axis = static_cast<size_t>(a.axis);
  switch (kind) {
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
      break;
    case OpKind::LayerNorm:
    case OpKind::RmsNorm: {
      Shape normalized(x.shape.begin() + static_cast<ptrdiff_t>(axis), x.shape.end());
      const char* roles[] = {"", "weight", "bias"};
      for (size_t i = 1; i < in.size(); ++i) expect_shape(*in[i], normalized, where, roles[i]);
      break;
    }
    case OpKind::BatchNorm: {
      const Shape channels{x.shape[axis]};
      const char* roles[] = {"", "mean", "var", "weight", "bias"};
      for (size_t i = 1; i < in.size(); ++i) expect_shape(*in[i], channels, where, roles[i]);
      break;
    }
    case OpKind::GroupNorm: {
      KILN_USER_CHECK(x.rank() >= 2, "{}: input {} must have rank at least 2 (samples, channels)",
                      where, describe_tensor(x));
      KILN_USER_CHECK(a.axis != 0, "{}: axis 0 is the sample dimension; the channel axis must be another",
                      where);
      KILN_USER_CHECK(given_attr(given, AttrKey::groups), "{}: attribute 'groups' is required", where);
      const int64_t channels = x.shape[axis];
      KILN_USER_CHECK(a.groups >= 1 && channels % a.groups == 0,
                      "{}: groups {} must be at least 1 and divide the {} channels of {}", where,
                      a.groups, channels, describe_tensor(x));
      const char* roles[] = {"", "weight", "bias"};
      for (size_t i = 1; i < in.size(); ++i) expect_shape(*in[i], Shape{channels}, where, roles[i]);
      break;
    }
#define KILN_OP(kind, name, family, ...) KILN_CASE_UNLESS(family, Norm, kind)
#include "compiler/ops.def"
#undef KILN_OP
      KILN_UNREACHABLE("not a normalisation");
  }
  return {x.shape, widest_floating(in)};
}

InferredResult infer_matmul(const std::vector<const Tensor*>& in, const std::string& where) {
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  KILN_USER_CHECK(a.rank() >= 2 && b.rank() >= 2,
                  "{}: operands {} and {} must have rank at least 2 ([..., M, K] and [..., K, N])",
                  where, describe_tensor(a), describe_tensor(b));
  const int64_t k_a = a.shape[a.shape.size() - 1];
  const int64_t k_b = b.shape[b.shape.size() - 2];
  KILN_USER_CHECK(k_a == k_b, "{}: inner dimensions differ: {} is [..., M, {}] but {} is [..., {}, N]",
                  where, describe_tensor(a), k_a, describe_tensor(b), k_b);
  Shape batch_a(a.shape.begin(), a.shape.end() - 2), batch_b(b.shape.begin(), b.shape.end() - 2);
  std::optional<Shape> batch = broadcast_shapes(batch_a, batch_b);
  KILN_USER_CHECK(batch.has_value(), "{}: batch dimensions {} of {} and {} of {} do not broadcast",
                  where, to_string(batch_a), describe_tensor(a), to_string(batch_b),
                  describe_tensor(b));
  Shape shape = *batch;
  shape.push_back(a.shape[a.shape.size() - 2]);
  shape.push_back(b.shape[b.shape.size() - 1]);
  KILN_USER_CHECK(shape.size() <= kMaxRank, "{}: result rank {} exceeds 8", where, shape.size());
  return {shape, widest_floating(in)};
}

// P = (H + 2*pad - dil*(R-1) - 1) / stride + 1, which must be >= 1.
int64_t window_output_size(int64_t size, int64_t window, int64_t stride, int64_t pad,
                           int64_t dilation, const std::string& where, std::string_view dim) {
  const int64_t span = dilation * (window - 1) + 1;
  const int64_t padded = size + 2 * pad;
  KILN_USER_CHECK(padded >= span,
                  "{}: the window spans {} along {} but the padded input has only {} (size {} + 2 x "
                  "padding {}); the output would be empty",
                  where, span, dim, padded, size, pad);
  return (padded - span) / stride + 1;
}

InferredResult infer_conv(const std::vector<const Tensor*>& in, Attributes& a,
                          const std::string& where) {
  const Tensor& x = *in[0];
  const Tensor& w = *in[1];
  const bool nhwc = a.layout == Layout::NHWC;
  expect_rank(x, 4, where, nhwc ? "input [N,H,W,C]" : "input [N,C,H,W]");
  expect_rank(w, 4, where, nhwc ? "weight [K,R,S,C/groups]" : "weight [K,C/groups,R,S]");
  for (int i = 0; i < 2; ++i) {
    expect_window_param(a.stride[i], 1, where, "stride");
    expect_window_param(a.dilation[i], 1, where, "dilation");
    expect_window_param(a.padding[i], 0, where, "padding");
  }
  const Shape& xs = x.shape;
  const Shape& ws = w.shape;
  const int64_t n = xs[0], c = nhwc ? xs[3] : xs[1], h = nhwc ? xs[1] : xs[2],
                wd = nhwc ? xs[2] : xs[3];
  const int64_t k = ws[0], cg = nhwc ? ws[3] : ws[1], r = nhwc ? ws[1] : ws[2],
                s = nhwc ? ws[2] : ws[3];
  KILN_USER_CHECK(a.groups >= 1 && c % a.groups == 0 && k % a.groups == 0,
                  "{}: groups {} must divide both the {} input channels of {} and the {} output "
                  "channels of {}",
                  where, a.groups, c, describe_tensor(x), k, describe_tensor(w));
  KILN_USER_CHECK(cg == c / a.groups,
                  "{}: weight {} has {} channels per group but input {} has {} channels in {} "
                  "group(s), i.e. {} per group",
                  where, describe_tensor(w), cg, describe_tensor(x), c, a.groups, c / a.groups);
  const int64_t p = window_output_size(h, r, a.stride[0], a.padding[0], a.dilation[0], where, "H");
  const int64_t q = window_output_size(wd, s, a.stride[1], a.padding[1], a.dilation[1], where, "W");
  Shape shape = nhwc ? Shape{n, p, q, k} : Shape{n, k, p, q};
  return {shape, widest_floating(in)};
}

InferredResult infer_pool(OpKind kind, const Tensor& x, Attributes& a, AttrSet given,
                          const std::string& where) {
  const bool nhwc = a.layout == Layout::NHWC;
  expect_rank(x, 4, where, nhwc ? "input [N,H,W,C]" : "input [N,C,H,W]");
  KILN_USER_CHECK(given_attr(given, AttrKey::kernel), "{}: attribute 'kernel' [kh, kw] is required",
                  where);
  if (!given_attr(given, AttrKey::stride)) a.stride = a.kernel;
  for (int i = 0; i < 2; ++i) {
    expect_window_param(a.kernel[i], 1, where, "kernel");
    expect_window_param(a.stride[i], 1, where, "stride");
    expect_window_param(a.padding[i], 0, where, "padding");
    KILN_USER_CHECK(a.padding[i] <= a.kernel[i] / 2,
                    "{}: padding {} exceeds half the kernel size {} (at most {})", where,
                    a.padding[i], a.kernel[i], a.kernel[i] / 2);
  }
  if (kind == OpKind::MaxPool2d) a.count_include_pad = true;  // not an attribute of max
  const Shape& xs = x.shape;
  const int64_t n = xs[0], c = nhwc ? xs[3] : xs[1], h = nhwc ? xs[1] : xs[2],
                w = nhwc ? xs[2] : xs[3];
  const int64_t p = window_output_size(h, a.kernel[0], a.stride[0], a.padding[0], 1, where, "H");
  const int64_t q = window_output_size(w, a.kernel[1], a.stride[1], a.padding[1], 1, where, "W");
  return {nhwc ? Shape{n, p, q, c} : Shape{n, c, p, q}, x.dtype};
}

InferredResult infer_view(OpKind kind, const Tensor& x, Attributes& a, AttrSet given,
                          const std::string& where) {
  if (kind == OpKind::Transpose) {
    if (!given_attr(given, AttrKey::perm)) {  // NumPy's default: reverse the axes
      a.perm.clear();
      for (int i = x.rank() - 1; i >= 0; --i) a.perm.push_back(i);
    }
    KILN_USER_CHECK(static_cast<int>(a.perm.size()) == x.rank(),
                    "{}: perm [{}] has {} entries but input {} has rank {}", where,
                    fmt::join(a.perm, ","), a.perm.size(), describe_tensor(x), x.rank());
    std::vector<bool> seen(a.perm.size(), false);
    Shape shape;
    for (int64_t& p : a.perm) {
      p = normalize_axis(p, x.rank(), where, "perm entry");
      KILN_USER_CHECK(!seen[static_cast<size_t>(p)], "{}: perm names axis {} twice", where, p);
      seen[static_cast<size_t>(p)] = true;
      shape.push_back(x.shape[static_cast<size_t>(p)]);
    }
    return {shape, x.dtype};
  }
  KILN_USER_CHECK(given_attr(given, AttrKey::shape), "{}: attribute 'shape' is required", where);
  KILN_USER_CHECK(a.shape.size() <= kMaxRank, "{}: target shape has rank {} (at most 8)", where,
                  a.shape.size());
  int inferred = -1;
  int64_t known = 1;
  for (size_t i = 0; i < a.shape.size(); ++i) {
    if (a.shape[i] == -1) {
      KILN_USER_CHECK(inferred < 0, "{}: shape [{}] has more than one -1", where,
                      fmt::join(a.shape, ","));
      inferred = static_cast<int>(i);
      continue;
    }
    KILN_USER_CHECK(a.shape[i] >= 1, "{}: shape [{}] has entry {}; entries are >= 1 or a single -1",
                    where, fmt::join(a.shape, ","), a.shape[i]);
    KILN_USER_CHECK(a.shape[i] <= kMaxElements / known, "{}: shape [{}] has more than 2^62 elements",
                    where, fmt::join(a.shape, ","));
    known *= a.shape[i];
  }
  const int64_t count = element_count(x.shape);
  if (inferred >= 0) {
    KILN_USER_CHECK(count % known == 0, "{}: cannot reshape {} ({} elements) to [{}]", where,
                    describe_tensor(x), count, fmt::join(a.shape, ","));
    a.shape[static_cast<size_t>(inferred)] = count / known;
  } else {
    KILN_USER_CHECK(count == known, "{}: cannot reshape {} ({} elements) to [{}] ({} elements)",
                    where, describe_tensor(x), count, fmt::join(a.shape, ","), known);
  }
  return {a.shape, x.dtype};
}

// expand: broadcast x to `shape` (an entry -1 keeps x's size there).
InferredResult infer_expand(const Tensor& x, Attributes& a, AttrSet given, const std::string& where) {
  KILN_USER_CHECK(given_attr(given, AttrKey::shape), "{}: attribute 'shape' is required", where);
  KILN_USER_CHECK(a.shape.size() <= kMaxRank, "{}: target shape has rank {} (at most 8)", where, a.shape.size());
  KILN_USER_CHECK(static_cast<int>(a.shape.size()) >= x.rank(),
                  "{}: cannot expand {} to [{}]: the target has fewer dimensions than the input", where,
                  describe_tensor(x), fmt::join(a.shape, ","));
  const size_t lead = a.shape.size() - static_cast<size_t>(x.rank());
  for (size_t i = 0; i < a.shape.size(); ++i) {
    const bool has_input_dim = i >= lead;
    const int64_t in = has_input_dim ? x.shape[i - lead] : 1;
    if (a.shape[i] == -1) {
      KILN_USER_CHECK(has_input_dim, "{}: shape [{}] has -1 at axis {}, which the input does not have", where,
                      fmt::join(a.shape, ","), i);
      a.shape[i] = in;
    }
    KILN_USER_CHECK(a.shape[i] >= 1, "{}: shape [{}] has entry {}; entries are >= 1 or -1", where,
                    fmt::join(a.shape, ","), a.shape[i]);
    KILN_USER_CHECK(in == a.shape[i] || in == 1,
                    "{}: cannot expand {} to [{}]: axis {} has size {}, which only a size of 1 can be expanded to",
                    where, describe_tensor(x), fmt::join(a.shape, ","), i, a.shape[i]);
  }
  return {a.shape, x.dtype};
}

// slice: Python's x[start:end:step] along `axis`.
InferredResult infer_slice(const Tensor& x, Attributes& a, AttrSet given, const std::string& where) {
  KILN_USER_CHECK(given_attr(given, AttrKey::axis), "{}: attribute 'axis' is required", where);
  KILN_USER_CHECK(x.rank() >= 1, "{}: cannot slice a rank-0 tensor", where);
  a.axis = normalize_axis(a.axis, x.rank(), where, "axis");
  const int64_t size = x.shape[static_cast<size_t>(a.axis)];
  if (!given_attr(given, AttrKey::step)) a.step = 1;
  KILN_USER_CHECK(a.step >= 1, "{}: step {} must be >= 1", where, a.step);
  auto resolve = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + size : v, 0, size); };
  a.start = given_attr(given, AttrKey::start) ? resolve(a.start) : 0;
  a.end = given_attr(given, AttrKey::end) ? resolve(a.end) : size;
  const int64_t count = a.end > a.start ? (a.end - a.start + a.step - 1) / a.step : 0;
  KILN_USER_CHECK(count >= 1, "{}: slice [{}:{}:{}] of axis {} (size {}) of {} is empty", where, a.start, a.end,
                  a.step, a.axis, size, describe_tensor(x));
  Shape shape = x.shape;
  shape[static_cast<size_t>(a.axis)] = count;
  return {shape, x.dtype};
}

// concat: the inputs agree in rank and in every dimension but `axis`.
InferredResult infer_concat(const std::vector<const Tensor*>& in, Attributes& a, AttrSet given,
                            const std::string& where) {
  KILN_USER_CHECK(given_attr(given, AttrKey::axis), "{}: attribute 'axis' is required", where);
  const Tensor& first = *in[0];
  KILN_USER_CHECK(first.rank() >= 1, "{}: cannot concatenate rank-0 tensors", where);
  a.axis = normalize_axis(a.axis, first.rank(), where, "axis");
  Shape shape = first.shape;
  shape[static_cast<size_t>(a.axis)] = 0;
  int bools = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const Tensor& t = *in[i];
    KILN_USER_CHECK(t.rank() == first.rank(), "{}: input {} {} has rank {}, input 0 {} rank {}", where, i,
                    describe_tensor(t), t.rank(), describe_tensor(first), first.rank());
    for (int d = 0; d < t.rank(); ++d)
      KILN_USER_CHECK(d == a.axis || t.shape[static_cast<size_t>(d)] == first.shape[static_cast<size_t>(d)],
                      "{}: input {} {} differs from input 0 {} at axis {} (only axis {} may differ)", where, i,
                      describe_tensor(t), describe_tensor(first), d, a.axis);
    KILN_USER_CHECK(shape[static_cast<size_t>(a.axis)] <= kMaxElements - t.shape[static_cast<size_t>(a.axis)],
                    "{}: the result is too large", where);
    shape[static_cast<size_t>(a.axis)] += t.shape[static_cast<size_t>(a.axis)];
    bools += t.dtype == DType::boolean;
  }
  KILN_USER_CHECK(bools == 0 || bools == static_cast<int>(in.size()),
                  "{}: bool and numeric inputs cannot be concatenated (cast the bool ones first)", where);
  return {shape, bools ? DType::boolean : widest_floating(in)};
}

InferredResult infer_sdpa(const std::vector<const Tensor*>& in, Attributes& a, AttrSet given,
                          const std::string& where) {
  const Tensor& q = *in[0];
  const Tensor& k = *in[1];
  const Tensor& v = *in[2];
  expect_rank(q, 4, where, "q [B,H,Sq,D]");
  expect_rank(k, 4, where, "k [B,Hkv,Skv,D]");
  expect_rank(v, 4, where, "v [B,Hkv,Skv,D]");
  const int64_t b = q.shape[0], h = q.shape[1], sq = q.shape[2], d = q.shape[3];
  const int64_t hkv = k.shape[1], skv = k.shape[2];
  KILN_USER_CHECK(k.shape[0] == b && k.shape[3] == d,
                  "{}: k {} must be [B={}, Hkv, Skv, D={}] to match q {}", where, describe_tensor(k),
                  b, d, describe_tensor(q));
  KILN_USER_CHECK(v.shape == k.shape, "{}: v {} must have k's shape {}", where, describe_tensor(v),
                  to_string(k.shape));
  KILN_USER_CHECK(h % hkv == 0, "{}: q's {} heads are not a multiple of k/v's {} heads", where, h,
                  hkv);
  // The mask; a fifth input, a second additive mask, only in an sdpa that
  // attention_as_sdpa makes (documents give at most four: the op table).
  for (size_t m = 3; m < in.size(); ++m) {
    const Shape scores{b, h, sq, skv};
    std::optional<Shape> joined = broadcast_shapes(in[m]->shape, scores);
    KILN_USER_CHECK(joined && *joined == scores,
                    "{}: mask {} does not broadcast to the scores' shape {}", where,
                    describe_tensor(*in[m]), to_string(scores));
  }
  if (!given_attr(given, AttrKey::scale))
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  return {q.shape, widest_floating(in)};
}

}  // namespace

std::string describe_tensor(const Tensor& t) {
  if (t.kind == TensorKind::Constant) return fmt::format("scalar {}", t.constant);
  return fmt::format("'{}' {}{}", t.name, to_string(t.dtype), shape_text(t));
}

std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

InferredResult infer_result(OpKind kind, const std::vector<const Tensor*>& in, Attributes& attrs,
                            AttrSet given, const std::string& where) {
  InferredResult result;
  switch (op_info(kind).family) {
    case OpFamily::Unary:
    case OpFamily::Binary:
    case OpFamily::Compare:
    case OpFamily::Select:
      result = infer_pointwise(kind, in, where);
      break;
    case OpFamily::Reduce:
      result = infer_reduce(*in[0], attrs, given, where);
      break;
    case OpFamily::Norm:
      result = infer_norm(kind, in, attrs, given, where);
      break;
    case OpFamily::Matmul:
      result = infer_matmul(in, where);
      break;
    case OpFamily::Conv:
      result = infer_conv(in, attrs, where);
      break;
    case OpFamily::Pool:
      result = infer_pool(kind, *in[0], attrs, given, where);
      break;
    case OpFamily::View:
      result = kind == OpKind::Expand  ? infer_expand(*in[0], attrs, given, where)
               : kind == OpKind::Slice ? infer_slice(*in[0], attrs, given, where)
                                       : infer_view(kind, *in[0], attrs, given, where);
      break;
    case OpFamily::Concat:
      result = infer_concat(in, attrs, given, where);
      break;
    case OpFamily::Attention:
      result = infer_sdpa(in, attrs, given, where);
      break;
  }
  checked_count(result.shape, where);
  return result;
}

}  // namespace kiln::ir
