#include "compiler/json_graph.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include "compiler/error.h"
#include "compiler/graph_construction.h"
#include "compiler/symbolic_dims.h"

namespace kiln::ir {
namespace {

using json = nlohmann::ordered_json;
constexpr int kMaxNesting = 64;

std::string_view type_name(const json& j) {
  if (j.is_number_integer()) return "an integer";
  if (j.is_number_float()) return "a number";
  return j.type_name();
}

// A SAX handler that builds the document with nlohmann's own DOM builder and
// adds the checks nlohmann does not make: duplicate keys (which it would
// silently merge) and runaway nesting. (nlohmann's callback parser would do
// the same but rescans each array on every element: quadratic in the ops.)
class CheckedSax {
 public:
  CheckedSax(json& root, std::string source) : dom_(root, true), source_(std::move(source)) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) { return dom_.number_float(v, s); }
  bool string(json::string_t& v) { return dom_.string(v); }
  bool binary(json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    enter();
    keys_.emplace_back();
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    KILN_USER_CHECK(keys_.back().insert(k).second, "{}: key {} appears twice in one object", source_,
                    detail::quoted(k));
    return dom_.key(k);
  }
  bool end_object() {
    keys_.pop_back();
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    enter();
    return dom_.start_array(n);
  }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& e) {
    return dom_.parse_error(position, token, e);  // throws
  }

 private:
  void enter() {
    KILN_USER_CHECK(++depth_ <= kMaxNesting, "{}: JSON nesting is deeper than {} levels", source_, kMaxNesting);
  }
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::string source_;
  std::vector<std::set<std::string>> keys_;
  int depth_ = 0;
};

json parse_document(std::string_view text, std::string_view source) {
  json root;
  CheckedSax sax(root, std::string(source));
  try {
    json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const json::exception& e) {
    std::string message = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix.
    if (auto end = message.find("] "); message.rfind("[json.exception", 0) == 0 && end != std::string::npos)
      message = message.substr(end + 2);
    throw_user_error(fmt::format("{}: invalid JSON: {}", source, message));
  }
  return root;
}

int64_t get_int(const json& j, const std::string& where, std::string_view what) {
  KILN_USER_CHECK(j.is_number_integer(), "{}: {} must be an integer, got {}", where, what, type_name(j));
  if (j.is_number_unsigned()) {
    KILN_USER_CHECK(j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), "{}: {} {} is too large",
                    where, what, j.get<uint64_t>());
  }
  return j.get<int64_t>();
}

std::vector<int64_t> get_int_list(const json& j, const std::string& where, std::string_view what) {
  KILN_USER_CHECK(j.is_array(), "{}: {} must be a list of integers, got {}", where, what, type_name(j));
  std::vector<int64_t> values;
  for (const json& e : j) values.push_back(get_int(e, where, fmt::format("an entry of {}", what)));
  return values;
}

const std::string& get_string(const json& j, const std::string& where, std::string_view what) {
  KILN_USER_CHECK(j.is_string(), "{}: {} must be a string, got {}", where, what, type_name(j));
  return j.get_ref<const std::string&>();
}

// A list of dimensions, each an integer or a dim expression written as a string.
std::vector<DeclaredDim> get_dim_list(const json& j, const std::string& where, std::string_view what) {
  KILN_USER_CHECK(j.is_array(), "{}: {} must be a list of integers, got {}", where, what, type_name(j));
  std::vector<DeclaredDim> dims;
  for (const json& e : j) {
    if (e.is_string()) dims.emplace_back(e.get<std::string>());
    else dims.emplace_back(get_int(e, where, fmt::format("an entry of {}", what)));
  }
  return dims;
}

bool holds_string(const json& j) {
  if (j.is_string()) return true;
  return j.is_array() && std::any_of(j.begin(), j.end(), [](const json& e) { return e.is_string(); });
}

AttrValue get_attr_value(const json& j, const std::string& where, const std::string& key) {
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return get_int(j, where, fmt::format("attribute '{}'", key));
  if (j.is_number_float()) return j.get<double>();
  if (j.is_string()) return j.get<std::string>();
  if (j.is_array() && holds_string(j)) return get_dim_list(j, where, fmt::format("attribute '{}'", key));
  if (j.is_array()) return get_int_list(j, where, fmt::format("attribute '{}'", key));
  throw_user_error(fmt::format("{}: attribute {} has a value of type {}, which no attribute takes",
                               where, detail::quoted(key), type_name(j)));
}

// The `dims` table: symbol -> {"min", "max", "multiple_of"}.
void load_dims(GraphConstructor& graph, const json& dims, const std::string& source) {
  KILN_USER_CHECK(dims.is_object(), "{}: \"dims\" must be an object (symbol -> {{\"min\", \"max\", \"multiple_of\"}}), got {}",
                  source, type_name(dims));
  for (const auto& [name, entry] : dims.items()) {
    const std::string where = fmt::format("dims {}", detail::quoted(name));
    KILN_USER_CHECK(entry.is_object(), "{}: must be an object {{\"min\": ..., \"max\": ...}}, got {}", where,
                    type_name(entry));
    for (const auto& [key, value] : entry.items())
      KILN_USER_CHECK(key == "min" || key == "max" || key == "multiple_of",
                      "{}: unknown key {} (a symbol has min, max and optional multiple_of)", where, detail::quoted(key));
    KILN_USER_CHECK(entry.contains("min"), "{}: missing \"min\"", where);
    KILN_USER_CHECK(entry.contains("max"), "{}: missing \"max\"", where);
    const int64_t multiple_of = entry.contains("multiple_of") ? get_int(entry["multiple_of"], where, "multiple_of") : 1;
    graph.declare_dim(name, get_int(entry["min"], where, "min"), get_int(entry["max"], where, "max"), multiple_of);
  }
}

void load_input(GraphConstructor& graph, const std::string& name, const json& entry) {
  const std::string where = fmt::format("input {}", detail::quoted(name));
  KILN_USER_CHECK(entry.is_object(), "{}: must be an object {{\"shape\": [...], \"dtype\": ...}}, got {}",
                  where, type_name(entry));
  for (const auto& [key, value] : entry.items())
    KILN_USER_CHECK(key == "shape" || key == "dtype" || key == "strides",
                    "{}: unknown key {} (an input has shape, dtype and optional strides)", where,
                    detail::quoted(key));
  KILN_USER_CHECK(entry.contains("shape"), "{}: missing \"shape\"", where);
  KILN_USER_CHECK(entry.contains("dtype"), "{}: missing \"dtype\"", where);
  std::vector<DeclaredDim> shape = get_dim_list(entry["shape"], where, "shape");
  DType dtype = parse_dtype_or_throw(get_string(entry["dtype"], where, "dtype"), where);
  std::optional<Strides> strides;
  if (entry.contains("strides")) strides = get_int_list(entry["strides"], where, "strides");
  graph.add_input(name, shape, dtype, strides);
}

void load_op(GraphConstructor& graph, int index, const json& j) {
  std::string where = fmt::format("op {}", index);
  KILN_USER_CHECK(j.is_object(), "{}: must be an object, got {}", where, type_name(j));
  KILN_USER_CHECK(j.contains("out"), "{}: missing \"out\"", where);
  OpDeclaration decl;
  decl.out = get_string(j["out"], where, "\"out\"");
  if (is_valid_name(decl.out)) where += fmt::format(" '{}'", decl.out);
  KILN_USER_CHECK(j.contains("op"), "{}: missing \"op\"", where);
  decl.op = get_string(j["op"], where, "\"op\"");
  KILN_USER_CHECK(j.contains("in"), "{}: missing \"in\"", where);
  const json& in = j["in"];
  KILN_USER_CHECK(in.is_array(), "{}: \"in\" must be a list, got {}", where, type_name(in));
  for (const json& operand : in) {
    if (operand.is_string()) decl.in.emplace_back(operand.get<std::string>());
    else if (operand.is_number()) decl.in.emplace_back(operand.get<double>());
    else throw_user_error(fmt::format("{}: each entry of \"in\" must be a tensor name or a number, got {}",
                                      where, type_name(operand)));
  }
  for (const auto& [key, value] : j.items()) {
    if (key == "op" || key == "in" || key == "out") continue;
    if (key == "dtype") decl.dtype = parse_dtype_or_throw(get_string(value, where, "dtype"), where);
    else decl.attrs.emplace_back(key, get_attr_value(value, where, key));
  }
  graph.add_op(decl);
}

json attr_to_json(const AttrValue& value) {
  return std::visit(
      [](const auto& v) {
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::vector<DimSize>>) {
          json out = json::array();
          for (const DimSize& d : v) std::visit([&](const auto& e) { out.push_back(e); }, d);
          return out;
        } else {
          return json(v);
        }
      },
      value);
}

json dims_to_json(const SymDims& dims) {
  json out = json::array();
  for (const DimExpr& d : dims) {
    if (d.is_constant()) out.push_back(d.factor);
    else out.push_back(to_string(d));
  }
  return out;
}

// reshape's and expand's shape, slice's start and end, as expressions.
void write_symbolic_attrs(json& entry, const Graph& graph, const Op& op) {
  const SymbolicAttrs& sym = *op.symbolic;
  if (op.kind == OpKind::Reshape || op.kind == OpKind::Expand) entry["shape"] = dims_to_json(sym.shape);
  if (op.kind != OpKind::Slice) return;
  const DimExpr size = symbolic_dims(graph.operand(op, 0))[static_cast<size_t>(op.attrs.axis)];
  auto bound = [&](const SlicePosition& p) -> json {
    if (p.term && p.offset == 0) return to_string(*p.term);
    return std::stoll(to_string(p, size));
  };
  if (sym.start) entry["start"] = bound(*sym.start);
  if (sym.end) entry["end"] = bound(*sym.end);
}

}  // namespace

Graph graph_from_json(std::string_view text, std::string_view source_view) {
  const std::string source(source_view);
  json doc = parse_document(text, source);
  KILN_USER_CHECK(doc.is_object(), "{}: a graph must be a JSON object, got {}", source, type_name(doc));
  for (const auto& [key, value] : doc.items())
    KILN_USER_CHECK(key == "kiln" || key == "name" || key == "inputs" || key == "ops" || key == "outputs" || key == "dims",
                    "{}: unknown top-level key {} (a graph has kiln, name, dims, inputs, ops, outputs)",
                    source, detail::quoted(key));
  KILN_USER_CHECK(doc.contains("kiln"), "{}: missing \"kiln\" (the format version, 1)", source);
  const json& version = doc["kiln"];
  KILN_USER_CHECK(version.is_number_integer() && version.get<int64_t>() == 1 &&
                      !(version.is_number_unsigned() && version.get<uint64_t>() != 1),
                  "{}: \"kiln\" must be the integer 1 (the format version), got {}", source,
                  version.dump());
  std::string name;
  if (doc.contains("name")) name = get_string(doc["name"], source, "\"name\"");
  GraphConstructor graph(name);
  if (doc.contains("dims")) load_dims(graph, doc["dims"], source);

  KILN_USER_CHECK(doc.contains("inputs"), "{}: missing \"inputs\"", source);
  const json& inputs = doc["inputs"];
  KILN_USER_CHECK(inputs.is_object(), "{}: \"inputs\" must be an object, got {}", source, type_name(inputs));
  for (const auto& [input_name, entry] : inputs.items()) load_input(graph, input_name, entry);

  KILN_USER_CHECK(doc.contains("ops"), "{}: missing \"ops\"", source);
  const json& ops = doc["ops"];
  KILN_USER_CHECK(ops.is_array(), "{}: \"ops\" must be a list, got {}", source, type_name(ops));
  for (size_t i = 0; i < ops.size(); ++i) load_op(graph, static_cast<int>(i), ops[i]);

  KILN_USER_CHECK(doc.contains("outputs"), "{}: missing \"outputs\"", source);
  const json& outputs = doc["outputs"];
  KILN_USER_CHECK(outputs.is_array(), "{}: \"outputs\" must be a list, got {}", source, type_name(outputs));
  std::vector<std::string> output_names;
  for (const json& o : outputs) output_names.push_back(get_string(o, "outputs", "each output"));
  graph.set_outputs(output_names);
  return std::move(graph).finish();
}

std::string graph_to_json(const Graph& graph) {
  std::string out = "{\n  \"kiln\": 1,\n";
  out += fmt::format("  \"name\": {},\n", json(graph.name).dump());
  if (graph.dims) {
    json dims = json::object();
    for (const DimSymbol& s : graph.dims->symbols)
      dims[s.name] = json{{"min", s.min}, {"max", s.max}, {"multiple_of", s.multiple_of}};
    out += fmt::format("  \"dims\": {},\n", dims.dump());
  }
  out += "  \"inputs\": {";
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const Tensor& t = graph.tensor(graph.inputs[i]);
    json entry;
    entry["shape"] = t.shape;
    if (t.symbolic) entry["shape"] = dims_to_json(t.symbolic->dims);
    entry["dtype"] = std::string(to_string(t.dtype));
    if (t.symbolic ? t.symbolic->strides_declared : t.strides != contiguous_strides(t.shape)) entry["strides"] = t.strides;
    out += fmt::format("{}\n    {}: {}", i ? "," : "", json(t.name).dump(), entry.dump());
  }
  out += graph.inputs.empty() ? "},\n" : "\n  },\n";
  out += "  \"ops\": [";
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    const Op& op = graph.ops[i];
    json entry;
    entry["op"] = std::string(op_name(op.kind));
    json in = json::array();
    for (TensorId id : op.inputs) {
      const Tensor& t = graph.tensor(id);
      if (t.kind == TensorKind::Constant) in.push_back(printable(t.constant));
      else in.push_back(t.name);
    }
    entry["in"] = in;
    entry["out"] = graph.tensor(op.output).name;
    if (op.explicit_dtype) entry["dtype"] = std::string(to_string(graph.tensor(op.output).dtype));
    for (int k = 0; k < kAttrKeyCount; ++k) {
      const auto key = static_cast<AttrKey>(k);
      if (!(op_info(op.kind).attrs & attr_bit(key))) continue;
      if (std::optional<AttrValue> value = attr_value(op.attrs, key))
        entry[std::string(attr_name(key))] = attr_to_json(*value);
    }
    if (op.symbolic) write_symbolic_attrs(entry, graph, op);
    out += fmt::format("{}\n    {}", i ? "," : "", entry.dump());
  }
  out += graph.ops.empty() ? "],\n" : "\n  ],\n";
  json outputs = json::array();
  for (TensorId id : graph.outputs) outputs.push_back(graph.tensor(id).name);
  out += fmt::format("  \"outputs\": {}\n}}\n", outputs.dump());
  return out;
}

}  // namespace kiln::ir
