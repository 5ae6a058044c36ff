#include <algorithm>
#include "compiler/graph_construction.h"

#include <cfloat>
#include <cmath>
#include <set>

#include "compiler/error.h"
#include "compiler/shape_inference.h"

namespace kiln::ir {
namespace {

std::string describe_value(const AttrValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) return detail::quoted(v);
        else if constexpr (std::is_same_v<V, std::vector<int64_t>>) return fmt::format("[{}]", fmt::join(v, ","));
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

// The op's attributes, each known to its op and given once; the set of those given.
AttrSet GraphConstructor::read_attrs(const OpDeclaration& decl, const OpInfo& info, Attributes& attrs,
                                     const std::string& where) const {
  AttrSet given = 0;
  for (const auto& [key_name, value] : decl.attrs) {
    std::optional<AttrKey> key = find_attr(key_name);
    KILN_USER_CHECK(key && (info.attrs & attr_bit(*key)), "{}: unknown attribute {} ({})", where,
                    detail::quoted(key_name), accepted_attrs(info));
    KILN_USER_CHECK(!(given & attr_bit(*key)), "{}: attribute '{}' is given twice", where, key_name);
    given |= attr_bit(*key);
    set_attr(attrs, *key, value, where);
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

  const AttrSet given = read_attrs(decl, info, op.attrs, where);

  check_declared_dtype(decl, *kind, where);

  InferredResult result = infer_result(*kind, operands, op.attrs, given, where);
  Tensor out;
  out.kind = TensorKind::OpResult;
  out.name = decl.out;
  out.shape = std::move(result.shape);
  out.strides = contiguous_strides(out.shape);
  out.dtype = decl.dtype.value_or(result.dtype);
  out.producer = index;
  op.explicit_dtype = decl.dtype.has_value();
  op.output = add_tensor(std::move(out));
  names_.emplace(decl.out, op.output);
  graph_.ops.push_back(std::move(op));
  return graph_.ops.back().output;
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

Graph GraphConstructor::finish() && {
  KILN_INTERNAL_CHECK(outputs_set_);
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
