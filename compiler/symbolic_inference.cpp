#include "compiler/symbolic_inference.h"

#include <algorithm>

#include "compiler/error.h"
#include "compiler/shape_inference.h"

namespace kiln::ir {
namespace {

using Result = std::optional<SymbolicOpResult>;

bool given_attr(AttrSet given, AttrKey key) { return (given & attr_bit(key)) != 0; }

std::optional<int64_t> normalized_axis(int64_t axis, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) return std::nullopt;
  return axis < 0 ? axis + r : axis;
}

// What a message says of an expression that must be a given kind of size.
std::string what_is(const DimExpr& e) {
  return e.is_constant() ? fmt::format("the integer {}", e.factor) : fmt::format("the symbol expression {}", to_string(e));
}

// NumPy broadcasting of expressions: equal products, or a 1 against anything.
// On failure, the pair of dimensions that disagree.
struct Broadcast {
  SymDims shape;
  std::optional<std::pair<DimExpr, DimExpr>> conflict;
};

Broadcast broadcast(const SymDims& a, const SymDims& b) {
  const size_t rank = std::max(a.size(), b.size());
  Broadcast out;
  for (size_t i = 0; i < rank; ++i) {
    const DimExpr da = i < rank - a.size() ? DimExpr::constant(1) : a[i - (rank - a.size())];
    const DimExpr db = i < rank - b.size() ? DimExpr::constant(1) : b[i - (rank - b.size())];
    if (da == db || db == DimExpr::constant(1)) out.shape.push_back(da);
    else if (da == DimExpr::constant(1)) out.shape.push_back(db);
    else {
      out.conflict = {da, db};
      return out;
    }
  }
  return out;
}

// Why two dimensions that disagree fail for some sizes (empty for two integers).
std::string why_not(const std::pair<DimExpr, DimExpr>& c) {
  if (c.first.is_constant() && c.second.is_constant()) return "";
  return fmt::format(": {} against {} (a symbolic dimension broadcasts only against 1 or the same product)",
                     to_string(c.first), to_string(c.second));
}

Result pointwise(const std::vector<const Tensor*>& in, const std::string& where) {
  SymDims shape;
  for (size_t i = 0; i < in.size(); ++i) {
    Broadcast next = broadcast(shape, symbolic_dims(*in[i]));
    if (next.conflict) {
      std::string shapes;
      for (size_t j = 0; j <= i; ++j) shapes += fmt::format("{}{}", j ? " and " : "", shape_text(*in[j]));
      throw_user_error(fmt::format("{}: shapes {} do not broadcast{}", where, shapes, why_not(*next.conflict)));
    }
    shape = std::move(next.shape);
  }
  return SymbolicOpResult{shape, nullptr};
}

Result reduce(const Tensor& x, const Attributes& a, AttrSet given) {
  const SymDims xs = symbolic_dims(x);
  std::vector<bool> reduced(xs.size(), !given_attr(given, AttrKey::axes));
  for (int64_t axis : given_attr(given, AttrKey::axes) ? a.axes : std::vector<int64_t>{}) {
    std::optional<int64_t> n = normalized_axis(axis, xs.size());
    if (!n) return std::nullopt;
    reduced[static_cast<size_t>(*n)] = true;
  }
  SymDims shape;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!reduced[i]) shape.push_back(xs[i]);
    else if (a.keepdims) shape.push_back(DimExpr::constant(1));
  }
  return SymbolicOpResult{shape, nullptr};
}

void expect_dims(const Tensor& t, const SymDims& expected, const std::string& where, std::string_view role) {
  KILN_USER_CHECK(symbolic_dims(t) == expected, "{}: {} {} must have shape {}", where, role, describe_tensor(t),
                  to_string(expected));
}

Result norm(OpKind kind, const std::vector<const Tensor*>& in, const Attributes& a, AttrSet given,
            const std::string& where) {
  const Tensor& x = *in[0];
  const SymDims xs = symbolic_dims(x);
  std::optional<int64_t> axis = normalized_axis(given_attr(given, AttrKey::axis) ? a.axis : -1, xs.size());
  if (xs.empty() || !axis) return std::nullopt;
  const auto ax = static_cast<size_t>(*axis);
  if (kind == OpKind::LayerNorm || kind == OpKind::RmsNorm) {
    const SymDims normalized(xs.begin() + static_cast<ptrdiff_t>(ax), xs.end());
    const char* roles[] = {"", "weight", "bias"};
    for (size_t i = 1; i < in.size(); ++i) expect_dims(*in[i], normalized, where, roles[i]);
  } else if (kind == OpKind::BatchNorm) {
    const char* roles[] = {"", "mean", "var", "weight", "bias"};
    for (size_t i = 1; i < in.size(); ++i) expect_dims(*in[i], {xs[ax]}, where, roles[i]);
  } else if (kind == OpKind::GroupNorm) {
    if (xs.size() < 2 || ax == 0 || !given_attr(given, AttrKey::groups) || a.groups < 1) return std::nullopt;
    KILN_USER_CHECK(xs[ax].is_constant() || divide_exactly(xs[ax], DimExpr::constant(a.groups)),
                    "{}: groups {} must divide the {} channels of {} for every size (a quotient of a symbol is "
                    "not a dimension)",
                    where, a.groups, to_string(xs[ax]), describe_tensor(x));
    const char* roles[] = {"", "weight", "bias"};
    for (size_t i = 1; i < in.size(); ++i) expect_dims(*in[i], {xs[ax]}, where, roles[i]);
  }
  return SymbolicOpResult{xs, nullptr};
}

Result matmul(const std::vector<const Tensor*>& in, const std::string& where) {
  const SymDims as = symbolic_dims(*in[0]), bs = symbolic_dims(*in[1]);
  if (as.size() < 2 || bs.size() < 2) return std::nullopt;
  const DimExpr& ka = as[as.size() - 1];
  const DimExpr& kb = bs[bs.size() - 2];
  KILN_USER_CHECK(ka == kb, "{}: inner dimensions differ: {} is [..., M, {}] but {} is [..., {}, N]", where,
                  describe_tensor(*in[0]), to_string(ka), describe_tensor(*in[1]), to_string(kb));
  const SymDims batch_a(as.begin(), as.end() - 2), batch_b(bs.begin(), bs.end() - 2);
  Broadcast batch = broadcast(batch_a, batch_b);
  KILN_USER_CHECK(!batch.conflict, "{}: batch dimensions {} of {} and {} of {} do not broadcast{}", where,
                  to_string(batch_a), describe_tensor(*in[0]), to_string(batch_b), describe_tensor(*in[1]),
                  batch.conflict ? why_not(*batch.conflict) : "");
  SymDims shape = batch.shape;
  shape.push_back(as[as.size() - 2]);
  shape.push_back(bs[bs.size() - 1]);
  return SymbolicOpResult{shape, nullptr};
}

// A spatial dimension of conv2d or pooling must be an integer.
void expect_integer_spatial(const Tensor& t, const SymDims& dims, size_t index, std::string_view dim,
                            std::string_view role, const std::string& where, std::string_view op) {
  KILN_USER_CHECK(dims[index].is_constant(),
                  "{}: the spatial dimension {} of {} {} is {}; {}'s spatial sizes must be integers (only its "
                  "batch dimension and channels may be symbolic)",
                  where, dim, role, describe_tensor(t), what_is(dims[index]), op);
}

// (size + 2*pad - dil*(window-1) - 1) / stride + 1, or nullopt where empty
// (the integer inference reports it).
std::optional<int64_t> window_output(int64_t size, int64_t window, int64_t stride, int64_t pad, int64_t dilation) {
  if (stride < 1 || dilation < 1 || pad < 0 || window < 1 || stride > (int64_t{1} << 31) ||
      dilation > (int64_t{1} << 31) || pad > (int64_t{1} << 31) || window > (int64_t{1} << 31))
    return std::nullopt;
  const int64_t span = dilation * (window - 1) + 1, padded = size + 2 * pad;
  if (padded < span) return std::nullopt;
  return (padded - span) / stride + 1;
}

Result conv(const std::vector<const Tensor*>& in, const Attributes& a, const std::string& where) {
  const Tensor &x = *in[0], &w = *in[1];
  const SymDims xs = symbolic_dims(x), ws = symbolic_dims(w);
  if (xs.size() != 4 || ws.size() != 4) return std::nullopt;
  const bool nhwc = a.layout == Layout::NHWC;
  const size_t h = nhwc ? 1 : 2, wd = nhwc ? 2 : 3, c = nhwc ? 3 : 1;
  expect_integer_spatial(x, xs, h, "H", "input", where, "conv2d");
  expect_integer_spatial(x, xs, wd, "W", "input", where, "conv2d");
  expect_integer_spatial(w, ws, h, "R", "weight", where, "conv2d");
  expect_integer_spatial(w, ws, wd, "S", "weight", where, "conv2d");
  if (a.groups < 1) return std::nullopt;
  const DimExpr groups = DimExpr::constant(a.groups);
  std::optional<DimExpr> per_group = divide_exactly(xs[c], groups);
  KILN_USER_CHECK(per_group && divide_exactly(ws[0], groups),
                  "{}: groups {} must divide both the {} input channels of {} and the {} output channels of {} "
                  "for every size",
                  where, a.groups, to_string(xs[c]), describe_tensor(x), to_string(ws[0]), describe_tensor(w));
  KILN_USER_CHECK(ws[c] == *per_group,
                  "{}: weight {} has {} channels per group but input {} has {} channels in {} group(s), i.e. {} "
                  "per group",
                  where, describe_tensor(w), to_string(ws[c]), describe_tensor(x), to_string(xs[c]), a.groups,
                  to_string(*per_group));
  std::optional<int64_t> p = window_output(xs[h].factor, ws[h].factor, a.stride[0], a.padding[0], a.dilation[0]);
  std::optional<int64_t> q = window_output(xs[wd].factor, ws[wd].factor, a.stride[1], a.padding[1], a.dilation[1]);
  if (!p || !q) return std::nullopt;
  const DimExpr P = DimExpr::constant(*p), Q = DimExpr::constant(*q);
  return SymbolicOpResult{nhwc ? SymDims{xs[0], P, Q, ws[0]} : SymDims{xs[0], ws[0], P, Q}, nullptr};
}

Result pool(OpKind kind, const Tensor& x, const Attributes& a, AttrSet given, const std::string& where) {
  const SymDims xs = symbolic_dims(x);
  if (xs.size() != 4 || !given_attr(given, AttrKey::kernel)) return std::nullopt;
  const bool nhwc = a.layout == Layout::NHWC;
  const size_t h = nhwc ? 1 : 2, wd = nhwc ? 2 : 3;
  const std::string_view op = kind == OpKind::MaxPool2d ? "max_pool2d" : "avg_pool2d";
  expect_integer_spatial(x, xs, h, "H", "input", where, op);
  expect_integer_spatial(x, xs, wd, "W", "input", where, op);
  const std::array<int64_t, 2> stride = given_attr(given, AttrKey::stride) ? a.stride : a.kernel;
  std::optional<int64_t> p = window_output(xs[h].factor, a.kernel[0], stride[0], a.padding[0], 1);
  std::optional<int64_t> q = window_output(xs[wd].factor, a.kernel[1], stride[1], a.padding[1], 1);
  if (!p || !q) return std::nullopt;
  SymDims shape = xs;
  shape[h] = DimExpr::constant(*p);
  shape[wd] = DimExpr::constant(*q);
  return SymbolicOpResult{shape, nullptr};
}

Result transpose(const Tensor& x, const Attributes& a, AttrSet given) {
  const SymDims xs = symbolic_dims(x);
  std::vector<int64_t> perm = a.perm;
  if (!given_attr(given, AttrKey::perm))
    for (size_t i = xs.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
  if (perm.size() != xs.size()) return std::nullopt;
  SymDims shape;
  std::vector<bool> seen(xs.size(), false);
  for (int64_t p : perm) {
    std::optional<int64_t> n = normalized_axis(p, xs.size());
    if (!n || seen[static_cast<size_t>(*n)]) return std::nullopt;
    seen[static_cast<size_t>(*n)] = true;
    shape.push_back(xs[static_cast<size_t>(*n)]);
  }
  return SymbolicOpResult{shape, nullptr};
}

// reshape's or expand's target: the document's expressions, or its integers.
std::optional<std::vector<std::optional<DimExpr>>> target_shape(const Attributes& a, AttrSet given,
                                                                const DimAttrs& dim_attrs) {
  if (dim_attrs.shape) return dim_attrs.shape;
  if (!given_attr(given, AttrKey::shape)) return std::nullopt;
  std::vector<std::optional<DimExpr>> target;
  for (int64_t d : a.shape) {
    if (d == -1) target.emplace_back(std::nullopt);
    else if (d >= 1) target.emplace_back(DimExpr::constant(d));
    else return std::nullopt;  // the integer inference names the bad entry
  }
  return target;
}

std::string target_text(const std::vector<std::optional<DimExpr>>& target) {
  std::vector<std::string> parts;
  for (const auto& d : target) parts.push_back(d ? to_string(*d) : "-1");
  return fmt::format("[{}]", fmt::join(parts, ","));
}

Result reshape(const Tensor& x, const Attributes& a, AttrSet given, const DimAttrs& dim_attrs,
               const std::string& where) {
  std::optional<std::vector<std::optional<DimExpr>>> target = target_shape(a, given, dim_attrs);
  if (!target || target->size() > kMaxRank) return std::nullopt;
  if (std::count(target->begin(), target->end(), std::nullopt) > 1) return std::nullopt;
  std::optional<DimExpr> count = product(symbolic_dims(x));
  SymDims known_dims;
  for (const auto& d : *target)
    if (d) known_dims.push_back(*d);
  std::optional<DimExpr> known = product(known_dims);
  if (!count || !known) return std::nullopt;  // past 2^62: the integer inference says so
  SymDims shape;
  for (const auto& d : *target) {
    if (d) {
      shape.push_back(*d);
      continue;
    }
    std::optional<DimExpr> rest = divide_exactly(*count, *known);
    KILN_USER_CHECK(rest.has_value(),
                    "{}: cannot reshape {} ({} elements) to {}: the -1 would be ({}) / ({}), a quotient, not a "
                    "product of symbols and integers",
                    where, describe_tensor(x), to_string(*count), target_text(*target), to_string(*count),
                    to_string(*known));
    shape.push_back(*rest);
  }
  std::optional<DimExpr> total = product(shape);
  KILN_USER_CHECK(total && *total == *count, "{}: cannot reshape {} ({} elements) to {} ({} elements)", where,
                  describe_tensor(x), to_string(*count), target_text(*target), to_string(*known));
  auto attrs = std::make_shared<SymbolicAttrs>();
  attrs->shape = shape;
  return SymbolicOpResult{shape, attrs};
}

Result expand(const Tensor& x, const Attributes& a, AttrSet given, const DimAttrs& dim_attrs,
              const std::string& where) {
  std::optional<std::vector<std::optional<DimExpr>>> target = target_shape(a, given, dim_attrs);
  const SymDims xs = symbolic_dims(x);
  if (!target || target->size() > kMaxRank || target->size() < xs.size()) return std::nullopt;
  const size_t lead = target->size() - xs.size();
  SymDims shape;
  for (size_t i = 0; i < target->size(); ++i) {
    const bool has_input_dim = i >= lead;
    const DimExpr in = has_input_dim ? xs[i - lead] : DimExpr::constant(1);
    if (!(*target)[i] && !has_input_dim) return std::nullopt;
    const DimExpr out = (*target)[i].value_or(in);
    KILN_USER_CHECK(in == out || in == DimExpr::constant(1),
                    "{}: cannot expand {} to {}: axis {} has size {}, which only a size of 1 can be expanded to{}",
                    where, describe_tensor(x), target_text(*target), i, to_string(out),
                    why_not({in, out}));
    shape.push_back(out);
  }
  auto attrs = std::make_shared<SymbolicAttrs>();
  attrs->shape = shape;
  return SymbolicOpResult{shape, attrs};
}

// A slice bound as written (an expression, or an integer that counts from
// the end when negative), resolved against the axis' size and clamped to
// [0, size] the same way for every size in range.
SlicePosition slice_bound(const std::optional<DimExpr>& expr, std::optional<int64_t> integer, const DimExpr& size,
                          bool is_end, const DimTable& table, const std::string& where, std::string_view what) {
  const SlicePosition end_of_axis = size.is_constant() ? SlicePosition{std::nullopt, size.factor} : SlicePosition{size, 0};
  if (expr && expr->is_constant()) return slice_bound(std::nullopt, expr->factor, size, is_end, table, where, what);
  if (!expr && !integer) return is_end ? end_of_axis : SlicePosition{};
  const int64_t size_min = smallest_value(size, table), size_max = largest_value(size, table);
  if (integer) {
    const int64_t k = *integer;
    if (k >= 0) {
      if (k >= size_max) return end_of_axis;  // clamped to the end at every size
      KILN_USER_CHECK(k <= size_min,
                      "{}: {} {} lies within axis size {} for some sizes and past it for others ({} to {}); it "
                      "would clamp differently across the range",
                      where, what, k, to_string(size), size_min, size_max);
      return {std::nullopt, k};
    }
    if (-k >= size_max) return {};  // clamped to 0 at every size
    KILN_USER_CHECK(-k <= size_min,
                    "{}: {} {} counts back past the start of axis size {} for some sizes ({} to {}); it would clamp "
                    "differently across the range",
                    where, what, k, to_string(size), size_min, size_max);
    return size.is_constant() ? SlicePosition{std::nullopt, size.factor + k} : SlicePosition{size, k};
  }
  // An expression: within [0, size] at every size, comparable with the size.
  const bool comparable = size.is_constant() || expr->symbols == size.symbols;
  const int64_t e_max = largest_value(*expr, table);
  KILN_USER_CHECK(comparable ? (size.is_constant() ? e_max <= size.factor : expr->factor <= size.factor)
                             : false,
                  "{}: {} {} may pass the end of axis size {} ({} is up to {}); a slice bound must lie within "
                  "the axis for every size",
                  where, what, to_string(*expr), to_string(size), to_string(*expr), e_max);
  if (*expr == size) return end_of_axis;
  return {expr, 0};
}

Result slice(const Tensor& x, const Attributes& a, AttrSet given, const DimAttrs& dim_attrs, const DimTable& table,
             const std::string& where) {
  const SymDims xs = symbolic_dims(x);
  if (!given_attr(given, AttrKey::axis) || xs.empty()) return std::nullopt;
  std::optional<int64_t> axis = normalized_axis(a.axis, xs.size());
  const int64_t step = given_attr(given, AttrKey::step) ? a.step : 1;
  if (!axis || step < 1) return std::nullopt;
  const DimExpr size = xs[static_cast<size_t>(*axis)];
  auto integer = [&](AttrKey key, int64_t v) { return given_attr(given, key) ? std::optional<int64_t>(v) : std::nullopt; };
  const SlicePosition start = slice_bound(dim_attrs.start, dim_attrs.start ? std::nullopt : integer(AttrKey::start, a.start),
                                          size, false, table, where, "start");
  const SlicePosition end = slice_bound(dim_attrs.end, dim_attrs.end ? std::nullopt : integer(AttrKey::end, a.end), size,
                                        true, table, where, "end");
  // end - start must be a product: the same term on both sides (then an
  // integer count), or the same offset (then a product of the terms' difference).
  const std::string range = fmt::format("[{}:{}:{}] of axis {} (size {}) of {}", to_string(start, size),
                                        to_string(end, size), step, *axis, to_string(size), describe_tensor(x));
  DimExpr count;
  if (start.term == end.term) {
    const int64_t n = end.offset > start.offset ? (end.offset - start.offset + step - 1) / step : 0;
    if (n < 1) return std::nullopt;  // empty: the integer inference says so
    count = DimExpr::constant(n);
  } else {
    const DimExpr zero{0, {}};
    const DimExpr ts = start.term.value_or(zero), te = end.term.value_or(zero);
    const bool same_symbols = ts.factor == 0 || te.factor == 0 || ts.symbols == te.symbols;
    KILN_USER_CHECK(start.offset == end.offset && same_symbols && te.factor > ts.factor,
                    "{}: slice {} has a length that is a sum or difference of dimensions, not a product of symbols "
                    "and integers",
                    where, range);
    DimExpr diff{te.factor - ts.factor, te.factor ? te.symbols : ts.symbols};
    std::optional<DimExpr> n = divide_exactly(diff, DimExpr::constant(step));
    KILN_USER_CHECK(n.has_value(), "{}: slice {} has length {} / {}, a quotient, not a product of symbols and integers",
                    where, range, to_string(diff), step);
    count = *n;
  }
  SymDims shape = xs;
  shape[static_cast<size_t>(*axis)] = count;
  auto attrs = std::make_shared<SymbolicAttrs>();
  attrs->start = start;
  attrs->end = end;
  return SymbolicOpResult{shape, attrs};
}

Result concat(const std::vector<const Tensor*>& in, const Attributes& a, AttrSet given, const std::string& where) {
  const SymDims first = symbolic_dims(*in[0]);
  if (!given_attr(given, AttrKey::axis) || first.empty()) return std::nullopt;
  std::optional<int64_t> axis = normalized_axis(a.axis, first.size());
  if (!axis) return std::nullopt;
  const auto ax = static_cast<size_t>(*axis);
  SymDims shape = first;
  for (size_t i = 1; i < in.size(); ++i) {
    const SymDims ts = symbolic_dims(*in[i]);
    if (ts.size() != first.size()) return std::nullopt;
    for (size_t d = 0; d < ts.size(); ++d)
      KILN_USER_CHECK(d == ax || ts[d] == first[d],
                      "{}: input {} {} differs from input 0 {} at axis {} (only axis {} may differ)", where, i,
                      describe_tensor(*in[i]), describe_tensor(*in[0]), d, ax);
    DimExpr& sum = shape[ax];
    KILN_USER_CHECK(sum.symbols == ts[ax].symbols,
                    "{}: along axis {}, {} and {} add up to a sum, not a product of symbols and integers", where,
                    ax, to_string(sum), to_string(ts[ax]));
    if (sum.factor > kMaxElements - ts[ax].factor) return std::nullopt;
    sum.factor += ts[ax].factor;
  }
  return SymbolicOpResult{shape, nullptr};
}

Result sdpa(const std::vector<const Tensor*>& in, AttrSet given, const std::string& where) {
  const SymDims q = symbolic_dims(*in[0]), k = symbolic_dims(*in[1]), v = symbolic_dims(*in[2]);
  if (q.size() != 4 || k.size() != 4 || v.size() != 4) return std::nullopt;
  KILN_USER_CHECK(k[0] == q[0] && k[3] == q[3], "{}: k {} must be [B={}, Hkv, Skv, D={}] to match q {}", where,
                  describe_tensor(*in[1]), to_string(q[0]), to_string(q[3]), describe_tensor(*in[0]));
  KILN_USER_CHECK(v == k, "{}: v {} must have k's shape {}", where, describe_tensor(*in[2]), to_string(k));
  KILN_USER_CHECK(divide_exactly(q[1], k[1]).has_value(),
                  "{}: q's {} heads are not a multiple of k/v's {} heads for every size", where, to_string(q[1]),
                  to_string(k[1]));
  KILN_USER_CHECK(q[3].is_constant() || given_attr(given, AttrKey::scale),
                  "{}: the head dimension D of q {} is {}; give 'scale' explicitly (its default 1/sqrt(D) is not "
                  "one number for every size)",
                  where, describe_tensor(*in[0]), what_is(q[3]));
  if (in.size() == 4) {
    const SymDims scores{q[0], q[1], q[2], k[2]};
    Broadcast joined = broadcast(symbolic_dims(*in[3]), scores);
    KILN_USER_CHECK(!joined.conflict && joined.shape == scores, "{}: mask {} does not broadcast to the scores' shape {}{}",
                    where, describe_tensor(*in[3]), to_string(scores), joined.conflict ? why_not(*joined.conflict) : "");
  }
  return SymbolicOpResult{q, nullptr};
}

}  // namespace

std::optional<SymbolicOpResult> infer_symbolic_result(OpKind kind, const std::vector<const Tensor*>& in,
                                                      const Attributes& attrs, AttrSet given,
                                                      const DimAttrs& dim_attrs, const DimTable& table,
                                                      const std::string& where) {
  switch (op_info(kind).family) {
    case OpFamily::Unary:
    case OpFamily::Binary:
    case OpFamily::Compare:
    case OpFamily::Select:
      return pointwise(in, where);
    case OpFamily::Reduce:
      return reduce(*in[0], attrs, given);
    case OpFamily::Norm:
      return norm(kind, in, attrs, given, where);
    case OpFamily::Matmul:
      return matmul(in, where);
    case OpFamily::Conv:
      return conv(in, attrs, where);
    case OpFamily::Pool:
      return pool(kind, *in[0], attrs, given, where);
    case OpFamily::View:
      if (kind == OpKind::Transpose) return transpose(*in[0], attrs, given);
      if (kind == OpKind::Reshape) return reshape(*in[0], attrs, given, dim_attrs, where);
      if (kind == OpKind::Expand) return expand(*in[0], attrs, given, dim_attrs, where);
      return slice(*in[0], attrs, given, dim_attrs, table, where);
    case OpFamily::Concat:
      return concat(in, attrs, given, where);
    case OpFamily::Attention:
      return sdpa(in, given, where);
  }
  KILN_UNREACHABLE("op family");
}

}  // namespace kiln::ir
