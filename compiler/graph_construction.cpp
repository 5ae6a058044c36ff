#include <algorithm>
#include "compiler/graph_construction.h"

#include <cfloat>
#include <cmath>
#include <set>

#include "compiler/error.h"
#include "compiler/shape_inference.h"
#include "compiler/symbolic_inference.h"

namespace kiln::ir {
namespace {

// [B,-1,64]: a list of dimensions as a message shows it.
std::string dim_list_text(const std::vector<DimSize>& dims) {
  std::vector<std::string> parts;
  for (const DimSize& d : dims)
    parts.push_back(std::holds_alternative<int64_t>(d) ? std::to_string(std::get<int64_t>(d)) : std::get<std::string>(d));
  return fmt::format("[{}]", fmt::join(parts, ","));
}

std::string describe_value(const AttrValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) return detail::quoted(v);
        else if constexpr (std::is_same_v<V, std::vector<int64_t>>) return fmt::format("[{}]", fmt::join(v, ","));
        else if constexpr (std::is_same_v<V, std::vector<DimSize>>) return dim_list_text(v);
        else return fmt::format("{}", v);
      },
      value);
}

// A value that rounds to a finite f32 (round to nearest: up to half a unit
// in the last place past FLT_MAX, which is how the shortest decimal of
// FLT_MAX, 3.4028235e+38, reads back).
float to_f32_or_throw(double value, const std::string& where, std::string_view what) {
  const double overflow = std::ldexp(1.0, 128) - std::ldexp(1.0, 103);  // FLT_MAX + half its last place
  KILN_USER_CHECK(std::isfinite(value) && std::fabs(value) < overflow, "{}: {} {} is not finite in f32", where, what, value);
  if (std::fabs(value) > static_cast<double>(FLT_MAX)) return value > 0 ? FLT_MAX : -FLT_MAX;
  return static_cast<float>(value);
}

// Type-checks one attribute value and stores it.
void set_attr(Attributes& a, AttrKey key, const AttrValue& value, const std::string& where) {
  const std::string what = fmt::format("attribute '{}'", attr_name(key));
  auto fail = [&](std::string_view expected) {
    return detail::UserError(ErrorCode::InvalidInput,
                             fmt::format("{}: {} must be {}, got {}", where, what, expected,
                                         describe_value(value)));
  };
  auto as_float = [&]() -> float {
    if (auto* i = std::get_if<int64_t>(&value)) return to_f32_or_throw(static_cast<double>(*i), where, what);
    if (auto* d = std::get_if<double>(&value)) return to_f32_or_throw(*d, where, what);
    throw fail("a number");
  };
  auto as_int = [&]() -> int64_t {
    if (auto* i = std::get_if<int64_t>(&value)) return *i;
    throw fail("an integer");
  };
  auto as_bool = [&]() -> bool {
    if (auto* b = std::get_if<bool>(&value)) return *b;
    throw fail("true or false");
  };
  auto as_list = [&]() -> const std::vector<int64_t>& {
    if (auto* l = std::get_if<std::vector<int64_t>>(&value)) return *l;
    throw fail("a list of integers");
  };
  auto as_pair = [&]() -> std::array<int64_t, 2> {
    const auto* l = std::get_if<std::vector<int64_t>>(&value);
    if (!l || l->size() != 2) throw fail("a pair of integers [h, w]");
    return {(*l)[0], (*l)[1]};
  };
  auto as_string = [&]() -> const std::string& {
    if (auto* s = std::get_if<std::string>(&value)) return *s;
    throw fail("a string");
  };
  switch (key) {
    case AttrKey::alpha: a.alpha = as_float(); break;
    case AttrKey::min: a.min = as_float(); break;
    case AttrKey::max: a.max = as_float(); break;
    case AttrKey::axes: a.axes = as_list(); break;
    case AttrKey::keepdims: a.keepdims = as_bool(); break;
    case AttrKey::axis: a.axis = as_int(); break;
    case AttrKey::eps: a.eps = as_float(); break;
    case AttrKey::groups: a.groups = as_int(); break;
    case AttrKey::precision: {
      const std::string& s = as_string();
      if (s == "f32") a.precision = Precision::f32;
      else if (s == "tf32") a.precision = Precision::tf32;
      else if (s == "bf16") a.precision = Precision::bf16;
      else if (s == "f16") a.precision = Precision::f16;
      else throw fail("one of \"f32\", \"tf32\", \"bf16\", \"f16\"");
      break;
    }
    case AttrKey::layout: {
      const std::string& s = as_string();
      if (s == "NHWC") a.layout = Layout::NHWC;
      else if (s == "NCHW") a.layout = Layout::NCHW;
      else throw fail("\"NHWC\" or \"NCHW\"");
      break;
    }
    case AttrKey::stride: a.stride = as_pair(); break;
    case AttrKey::padding: a.padding = as_pair(); break;
    case AttrKey::dilation: a.dilation = as_pair(); break;
    case AttrKey::kernel: a.kernel = as_pair(); break;
    case AttrKey::count_include_pad: a.count_include_pad = as_bool(); break;
    case AttrKey::perm: a.perm = as_list(); break;
    case AttrKey::shape: a.shape = as_list(); break;
    case AttrKey::causal: a.causal = as_bool(); break;
    case AttrKey::scale: a.scale = as_float(); break;
    case AttrKey::start: a.start = as_int(); break;
    case AttrKey::end: a.end = as_int(); break;
    case AttrKey::step: a.step = as_int(); break;
  }
}

std::string accepted_attrs(const OpInfo& info) {
  std::vector<std::string_view> names;
  for (int k = 0; k < kAttrKeyCount; ++k)
    if (info.attrs & attr_bit(static_cast<AttrKey>(k))) names.push_back(attr_name(static_cast<AttrKey>(k)));
  if (names.empty()) return fmt::format("{} takes no attributes", info.name);
  return fmt::format("{} takes: {}", info.name, fmt::join(names, ", "));
}

}  // namespace

bool is_valid_name(std::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(name[0])) return false;
  for (char c : name)
    if (!alpha(c) && !(c >= '0' && c <= '9') && c != '.') return false;
  return true;
}

DType parse_dtype_or_throw(std::string_view text, const std::string& where) {
  if (text == "f8e4m3" || text == "f8e5m2")
    throw_user_error(fmt::format("{}: dtype '{}' is reserved for a later version of the format "
                                 "(supported: f32, f16, bf16, bool)",
                                 where, text));
  std::optional<DType> dtype = parse_dtype(text);
  KILN_USER_CHECK(dtype.has_value(), "{}: unknown dtype {} (supported: f32, f16, bf16, bool)",
                  where, detail::quoted(text));
  return *dtype;
}

GraphConstructor::GraphConstructor(std::string graph_name) { graph_.name = std::move(graph_name); }

TensorId GraphConstructor::add_tensor(Tensor tensor) {
  graph_.tensors.push_back(std::move(tensor));
  return static_cast<TensorId>(graph_.tensors.size() - 1);
}

void GraphConstructor::declare_dim(const std::string& name, int64_t min, int64_t max, int64_t multiple_of) {
  const std::string where = fmt::format("dims {}", detail::quoted(name));
  KILN_USER_CHECK(graph_.inputs.empty(), "{}: symbols are declared before the inputs", where);
  KILN_USER_CHECK(is_valid_name(name),
                  "{}: not a valid symbol name (names match [A-Za-z_][A-Za-z0-9_.]* and have at most 128 "
                  "characters)",
                  where);
  if (!dims_) dims_ = std::make_shared<DimTable>();
  KILN_USER_CHECK(!dims_->find(name), "{}: the symbol is declared twice", where);
  KILN_USER_CHECK(min >= 1, "{}: min {} must be at least 1", where, min);
  KILN_USER_CHECK(max >= min, "{}: max {} is less than min {}", where, max, min);
  KILN_USER_CHECK(max <= kMaxElements, "{}: max {} is more than 2^62", where, max);
  KILN_USER_CHECK(multiple_of >= 1, "{}: multiple_of {} must be at least 1", where, multiple_of);
  DimSymbol symbol{name, min, max, multiple_of};
  KILN_USER_CHECK(symbol.smallest() <= max, "{}: no multiple of {} lies in [{}, {}]", where, multiple_of, min, max);
  dims_->symbols.push_back(symbol);
}

TensorId GraphConstructor::add_input(const std::string& name, const std::vector<DeclaredDim>& declared, DType dtype,
                                     const std::optional<Strides>& strides) {
  const std::string where = fmt::format("input {}", detail::quoted(name));
  SymDims dims;
  for (const DeclaredDim& d : declared) {
    if (const int64_t* v = std::get_if<int64_t>(&d)) dims.push_back(DimExpr::constant(*v));
    else dims.push_back(parse_dim_expr(std::get<std::string>(d), dims_.get(), where));
  }
  const bool symbolic = std::any_of(dims.begin(), dims.end(), [](const DimExpr& e) { return !e.is_constant(); });
  if (!symbolic) {
    Shape shape;
    for (const DimExpr& e : dims) shape.push_back(e.factor);
    return add_input(name, shape, dtype, strides);
  }
  // The integer shape at the smallest sizes; the element count and the
  // strides' span checked at the largest.
  std::optional<DimExpr> count = product(dims);
  KILN_USER_CHECK(count && largest_value(*count, *dims_) <= kMaxElements,
                  "{}: shape {} has more than 2^62 elements at the largest sizes", where, to_string(dims));
  if (strides && strides->size() == dims.size()) {
    int64_t span = 0;
    for (size_t i = 0; i < dims.size(); ++i) {
      const int64_t s = (*strides)[i], extent = largest_value(dims[i], *dims_) - 1;
      KILN_USER_CHECK(s <= 0 || extent <= (kMaxElements - span) / s,
                      "{}: strides [{}] address more than 2^62 elements at the largest sizes", where,
                      fmt::join(*strides, ","));
      if (s > 0) span += extent * s;
    }
  }
  Shape shape;
  for (const DimExpr& e : dims) shape.push_back(evaluate(e, smallest_values(*dims_)));
  const TensorId id = add_input(name, shape, dtype, strides);
  graph_.tensors[static_cast<size_t>(id)].symbolic =
      std::make_shared<const SymbolicShape>(SymbolicShape{dims, strides.has_value()});
  return id;
}

TensorId GraphConstructor::add_input(const std::string& name, const Shape& shape, DType dtype,
                                     const std::optional<Strides>& strides) {
  const std::string where = fmt::format("input {}", detail::quoted(name));
  KILN_USER_CHECK(is_valid_name(name),
                  "{}: not a valid name (names match [A-Za-z_][A-Za-z0-9_.]* and have at most 128 "
                  "characters)",
                  where);
  KILN_USER_CHECK(!names_.count(name), "{}: the name is declared twice", where);
  KILN_USER_CHECK(shape.size() <= kMaxRank, "{}: shape {} has rank {} (at most 8)", where,
                  to_string(shape), shape.size());
  int64_t count = 1;
  for (int64_t d : shape) {
    KILN_USER_CHECK(d >= 1, "{}: shape {} has dimension {} (dimensions are >= 1)", where,
                    to_string(shape), d);
    KILN_USER_CHECK(d <= kMaxElements / count, "{}: shape {} has more than 2^62 elements", where,
                    to_string(shape));
    count *= d;
  }
  Tensor t;
  t.kind = TensorKind::Input;
  t.name = name;
  t.shape = shape;
  t.dtype = dtype;
  t.rounded = true;
  t.producer = static_cast<int32_t>(graph_.inputs.size());
  if (strides) {
    KILN_USER_CHECK(strides->size() == shape.size(),
                    "{}: strides [{}] have {} entries but shape {} has rank {}", where,
                    fmt::join(*strides, ","), strides->size(), to_string(shape), shape.size());
    int64_t span = 0;
    for (size_t i = 0; i < shape.size(); ++i) {
      const int64_t s = (*strides)[i];
      KILN_USER_CHECK(s >= 0, "{}: stride {} of dimension {} is negative", where, s, i);
      KILN_USER_CHECK(s == 0 || (shape[i] - 1) <= (kMaxElements - span) / s,
                      "{}: strides [{}] address more than 2^62 elements", where,
                      fmt::join(*strides, ","));
      span += (shape[i] - 1) * s;
    }
    t.strides = *strides;
  } else {
    t.strides = contiguous_strides(shape);
  }
  TensorId id = add_tensor(std::move(t));
  graph_.inputs.push_back(id);
  names_.emplace(name, id);
  return id;
}

TensorId GraphConstructor::resolve_operand(const DeclaredOperand& operand, const std::string& where) {
  if (const auto* value = std::get_if<double>(&operand)) {
    Tensor t;
    t.kind = TensorKind::Constant;
    t.dtype = DType::f32;
    t.rounded = true;
    t.constant = to_f32_or_throw(*value, where, "scalar constant");
    t.strides = {};
    return add_tensor(std::move(t));
  }
  const std::string& name = std::get<std::string>(operand);
  auto it = names_.find(name);
  KILN_USER_CHECK(it != names_.end(),
                  "{}: reads {}, which is not a graph input or the output of an earlier op", where,
                  detail::quoted(name));
  return it->second;
}

// Scalars only in pointwise ops; bool values only where the catalogue reads them.
void GraphConstructor::check_operand_types(OpKind kind, const std::vector<const Tensor*>& operands,
                                           const std::string& where) const {
  const OpInfo& info = op_info(kind);
  for (size_t i = 0; i < operands.size(); ++i) {
    const Tensor& t = *operands[i];
    if (t.kind == TensorKind::Constant)
      KILN_USER_CHECK(is_pointwise(info.family), "{}: input {} is a scalar constant; scalars may "
                      "only be operands of pointwise ops", where, i);
    const bool condition = info.family == OpFamily::Select && i == 0;
    if (condition) {
      KILN_USER_CHECK(t.dtype == DType::boolean, "{}: the condition {} must be bool", where,
                      describe_tensor(t));
    } else if (t.dtype == DType::boolean) {
      // Views and concatenations move bool values as they are; their results are bool.
      KILN_USER_CHECK(kind == OpKind::Cast || (kind == OpKind::Sdpa && i == 3) || info.family == OpFamily::View ||
                          info.family == OpFamily::Concat,
                      "{}: input {} {} is bool; bool values may only be read as where's condition, "
                      "by cast, as sdpa's mask, or through views and concat (cast it first)",
                      where, i, describe_tensor(t));
    }
  }
}

// The op's attributes, each known to its op and given once; the set of those
// given. Size attributes written with dim expressions (a list holding a
// string for reshape's and expand's `shape`, a string for slice's `start` and
// `end`) go to `dim_texts` for infer_symbolic.
AttrSet GraphConstructor::read_attrs(const OpDeclaration& decl, const OpInfo& info, Attributes& attrs,
                                     DimTexts& dim_texts, const std::string& where) const {
  AttrSet given = 0;
  for (const auto& [key_name, value] : decl.attrs) {
    std::optional<AttrKey> key = find_attr(key_name);
    KILN_USER_CHECK(key && (info.attrs & attr_bit(*key)), "{}: unknown attribute {} ({})", where,
                    detail::quoted(key_name), accepted_attrs(info));
    KILN_USER_CHECK(!(given & attr_bit(*key)), "{}: attribute '{}' is given twice", where, key_name);
    given |= attr_bit(*key);
    const auto* list = std::get_if<std::vector<DimSize>>(&value);
    const auto* text = std::get_if<std::string>(&value);
    if (*key == AttrKey::shape && list) dim_texts.emplace_back(*key, *list);
    else if ((*key == AttrKey::start || *key == AttrKey::end) && text) dim_texts.emplace_back(*key, std::vector<DimSize>{*text});
    else set_attr(attrs, *key, value, where);
  }
  return given;
}

// A declared result dtype: bool for comparisons, and only for them and cast; cast needs one.
void GraphConstructor::check_declared_dtype(const OpDeclaration& decl, OpKind kind, const std::string& where) const {
  const bool compare = op_info(kind).family == OpFamily::Compare;
  if (decl.dtype) {
    if (compare)
      KILN_USER_CHECK(*decl.dtype == DType::boolean, "{}: a comparison's dtype must be bool, got {}",
                      where, to_string(*decl.dtype));
    else
      KILN_USER_CHECK(*decl.dtype != DType::boolean || kind == OpKind::Cast,
                      "{}: dtype bool is only for comparisons and cast", where);
  }
  KILN_USER_CHECK(kind != OpKind::Cast || decl.dtype, "{}: cast requires a dtype", where);
}

TensorId GraphConstructor::add_op(const OpDeclaration& decl) {
  KILN_USER_CHECK(!outputs_set_, "ops cannot be added after the outputs are set");
  const int32_t index = static_cast<int32_t>(graph_.ops.size());
  std::string where = fmt::format("op {}", index);
  KILN_USER_CHECK(is_valid_name(decl.out),
                  "{}: output name {} is not a valid name (names match [A-Za-z_][A-Za-z0-9_.]* and "
                  "have at most 128 characters)",
                  where, detail::quoted(decl.out));
  where += fmt::format(" '{}'", decl.out);
  std::optional<OpKind> kind = find_op(decl.op);
  KILN_USER_CHECK(kind.has_value(), "{}: unknown op {} (did you mean '{}'?)", where,
                  detail::quoted(decl.op), closest_op_name(decl.op));
  const OpInfo& info = op_info(*kind);
  where += fmt::format(" ({})", info.name);
  KILN_USER_CHECK(!names_.count(decl.out), "{}: the name '{}' is already defined", where, decl.out);

  const int arity = static_cast<int>(decl.in.size());
  if (info.min_inputs == info.max_inputs)
    KILN_USER_CHECK(arity == info.min_inputs, "{}: takes {} input{}, got {}", where,
                    info.min_inputs, info.min_inputs == 1 ? "" : "s", arity);
  else
    KILN_USER_CHECK(arity >= info.min_inputs && arity <= info.max_inputs,
                    "{}: takes {} to {} inputs, got {}", where, info.min_inputs, info.max_inputs,
                    arity);

  Op op;
  op.kind = *kind;
  std::vector<const Tensor*> operands;
  for (const DeclaredOperand& d : decl.in) op.inputs.push_back(resolve_operand(d, where));
  for (TensorId id : op.inputs) operands.push_back(&graph_.tensor(id));

  check_operand_types(*kind, operands, where);

  DimTexts dim_texts;
  AttrSet given = read_attrs(decl, info, op.attrs, dim_texts, where);

  check_declared_dtype(decl, *kind, where);

  std::optional<SymbolicOpResult> symbolic = infer_symbolic(decl, info, dim_texts, operands, op.attrs, given, where);

  InferredResult result = infer_result(*kind, operands, op.attrs, given, where);
  Tensor out;
  out.kind = TensorKind::OpResult;
  out.name = decl.out;
  out.shape = std::move(result.shape);
  out.strides = contiguous_strides(out.shape);
  out.dtype = decl.dtype.value_or(result.dtype);
  out.producer = index;
  op.explicit_dtype = decl.dtype.has_value();
  if (symbolic) {
    const DimValues smallest = smallest_values(*dims_);
    Shape evaluated;
    for (const DimExpr& e : symbolic->shape) evaluated.push_back(evaluate(e, smallest));
    KILN_INTERNAL_CHECK(evaluated == out.shape);
    std::optional<DimExpr> count = product(symbolic->shape);
    KILN_USER_CHECK(count && largest_value(*count, *dims_) <= kMaxElements,
                    "{}: result shape {} has more than 2^62 elements at the largest sizes", where,
                    to_string(symbolic->shape));
    if (std::any_of(symbolic->shape.begin(), symbolic->shape.end(), [](const DimExpr& e) { return !e.is_constant(); }))
      out.symbolic = std::make_shared<const SymbolicShape>(SymbolicShape{symbolic->shape, false});
    op.symbolic = symbolic->attrs;
  }
  op.output = add_tensor(std::move(out));
  names_.emplace(decl.out, op.output);
  graph_.ops.push_back(std::move(op));
  return graph_.ops.back().output;
}

// For an op with a symbolic operand or size attribute: the size attributes
// written as expressions parsed, the op checked for every size in range
// (symbolic_inference.h), and `attrs` given the integer values at the
// smallest sizes, which the integer inference then resolves as usual.
std::optional<SymbolicOpResult> GraphConstructor::infer_symbolic(const OpDeclaration& decl, const OpInfo& info,
                                                                 const DimTexts& dim_texts,
                                                                 const std::vector<const Tensor*>& operands,
                                                                 Attributes& attrs, AttrSet& given,
                                                                 const std::string& where) const {
  const bool symbolic_operand =
      std::any_of(operands.begin(), operands.end(), [](const Tensor* t) { return t->symbolic != nullptr; });
  if (dim_texts.empty() && !symbolic_operand) return std::nullopt;
  DimAttrs dim_attrs;
  const DimValues smallest = dims_ ? smallest_values(*dims_) : DimValues{};
  for (const auto& [key, entries] : dim_texts) {
    const std::string what = fmt::format("{}: attribute '{}'", where, attr_name(key));
    std::vector<std::optional<DimExpr>> parsed;
    for (const DeclaredDim& d : entries) {
      if (const int64_t* v = std::get_if<int64_t>(&d)) {
        KILN_USER_CHECK(*v >= 1 || *v == -1, "{}: entry {} must be >= 1 or -1", what, *v);
        parsed.push_back(*v == -1 ? std::nullopt : std::optional<DimExpr>(DimExpr::constant(*v)));
      } else {
        parsed.push_back(parse_dim_expr(std::get<std::string>(d), dims_.get(), what));
      }
    }
    // The values at the smallest sizes, for the integer inference.
    std::vector<int64_t> values;
    for (size_t i = 0; i < parsed.size(); ++i)
      values.push_back(parsed[i] ? evaluate(*parsed[i], smallest) : std::get<int64_t>(entries[i]));
    if (key == AttrKey::shape) {
      dim_attrs.shape = parsed;
      attrs.shape = values;
    } else {
      KILN_INTERNAL_CHECK(parsed.size() == 1);
      (key == AttrKey::start ? dim_attrs.start : dim_attrs.end) = parsed[0];
      (key == AttrKey::start ? attrs.start : attrs.end) = values[0];
    }
  }
  auto holds_symbol = [](const std::optional<DimExpr>& e) { return e && !e->is_constant(); };
  bool symbolic_attr = holds_symbol(dim_attrs.start) || holds_symbol(dim_attrs.end);
  if (dim_attrs.shape) symbolic_attr |= std::any_of(dim_attrs.shape->begin(), dim_attrs.shape->end(), holds_symbol);
  if (!symbolic_operand && !symbolic_attr) return std::nullopt;  // integers written as strings ("64")
  KILN_INTERNAL_CHECK(dims_ != nullptr);  // a symbol needs the table (parse_dim_expr checked)
  std::optional<SymbolicOpResult> result =
      infer_symbolic_result(find_op(decl.op).value(), operands, attrs, given, dim_attrs, *dims_, where);
  if (!result || !result->attrs) return result;
  const SymbolicAttrs& sym = *result->attrs;
  if (!sym.shape.empty() || (info.attrs & attr_bit(AttrKey::shape))) {
    attrs.shape.clear();
    for (const DimExpr& e : sym.shape) attrs.shape.push_back(evaluate(e, smallest));
    given |= attr_bit(AttrKey::shape);
  }
  if (sym.start) attrs.start = evaluate(*sym.start, smallest), given |= attr_bit(AttrKey::start);
  if (sym.end) attrs.end = evaluate(*sym.end, smallest), given |= attr_bit(AttrKey::end);
  // Keep the expressions only where one holds a symbol.
  const bool has_symbol =
      std::any_of(sym.shape.begin(), sym.shape.end(), [](const DimExpr& e) { return !e.is_constant(); }) ||
      (sym.start && sym.start->term) || (sym.end && sym.end->term);
  if (!has_symbol) result->attrs = nullptr;
  return result;
}

void GraphConstructor::set_outputs(const std::vector<std::string>& names) {
  KILN_USER_CHECK(!names.empty(), "outputs: the graph must have at least one output");
  std::set<std::string_view> seen;
  for (const std::string& name : names) {
    auto it = names_.find(name);
    KILN_USER_CHECK(it != names_.end(), "outputs: {} is not a graph input or op output",
                    detail::quoted(name));
    KILN_USER_CHECK(seen.insert(name).second, "outputs: '{}' is listed twice", name);
    graph_.outputs.push_back(it->second);
  }
  outputs_set_ = true;
}

// Every symbol stands alone as a dimension of some input, so that a launch
// can read its value.
void GraphConstructor::check_symbols_readable() const {
  if (!dims_) return;
  for (const DimSymbol& symbol : dims_->symbols) {
    bool alone = false;
    for (TensorId id : graph_.inputs) {
      const Tensor& t = graph_.tensor(id);
      if (!t.symbolic) continue;
      for (const DimExpr& e : t.symbolic->dims) alone |= e.is_single_symbol() && e.symbols[0] == symbol.name;
    }
    KILN_USER_CHECK(alone,
                    "dims {}: the symbol never stands alone as a dimension of an input (as in \"shape\": [\"{}\", "
                    "...]), so a launch could not read its value",
                    detail::quoted(symbol.name), symbol.name);
  }
}

Graph GraphConstructor::finish() && {
  KILN_INTERNAL_CHECK(outputs_set_);
  check_symbols_readable();
  if (dims_ && !dims_->symbols.empty()) graph_.dims = dims_;
  for (TensorId id : graph_.outputs) graph_.tensors[static_cast<size_t>(id)].is_output = true;
  // Numerics rule 2: ops round where the graph says so. A view moves no data,
  // so its values are as rounded as its input's.
  for (const Op& op : graph_.ops) {
    Tensor& out = graph_.tensors[static_cast<size_t>(op.output)];
    const bool view_of_rounded = op_info(op.kind).family == OpFamily::View &&
                                 graph_.tensor(op.inputs[0]).rounded &&
                                 graph_.tensor(op.inputs[0]).dtype == out.dtype;
    // (So is a concatenation's, where every input is rounded to its type.)
    const bool concat_of_rounded =
        op_info(op.kind).family == OpFamily::Concat && std::all_of(op.inputs.begin(), op.inputs.end(), [&](TensorId in) {
          return graph_.tensor(in).rounded && graph_.tensor(in).dtype == out.dtype;
        });
    out.rounded = op.explicit_dtype || op.kind == OpKind::Cast || out.is_output || view_of_rounded || concat_of_rounded;
  }
  graph_.index_users();
  return std::move(graph_);
}

void Graph::index_users() {
  users.assign(tensors.size(), {});
  for (size_t i = 0; i < ops.size(); ++i)
    for (TensorId id : ops[i].inputs) {
      auto& readers = users[static_cast<size_t>(id)];
      if (readers.empty() || readers.back() != static_cast<int32_t>(i)) readers.push_back(static_cast<int32_t>(i));
    }
}

std::string Graph::describe(int32_t op_index) const {
  const Op& op = ops[static_cast<size_t>(op_index)];
  return fmt::format("op {} '{}' ({})", op_index, tensor(op.output).name, op_name(op.kind));
}

}  // namespace kiln::ir
