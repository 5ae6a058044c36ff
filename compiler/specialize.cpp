#include "compiler/specialize.h"

#include <fmt/format.h>

#include "compiler/error.h"
#include "compiler/graph_construction.h"

namespace kiln::ir {
namespace {

std::vector<int64_t> evaluate_all(const SymDims& dims, const DimValues& values) {
  std::vector<int64_t> out;
  for (const DimExpr& d : dims) out.push_back(evaluate(d, values));
  return out;
}

void check_in_range(const DimSymbol& s, int64_t value, const std::string& what) {
  KILN_USER_CHECK(value >= s.min && value <= s.max && value % s.multiple_of == 0,
                  "{}: {} = {} is outside its range ({})", what, s.name, value, s.range_text());
}

}  // namespace

DimValues check_dim_values(const Graph& graph, const DimValues& values) {
  const std::string where = fmt::format("graph {}", detail::quoted(graph.name));
  if (!graph.dims) {
    KILN_USER_CHECK(values.empty(), "{}: has no symbolic dimensions, but a size was given for {}", where,
                    detail::quoted(values.begin()->first));
    return {};
  }
  for (const auto& [name, value] : values)
    KILN_USER_CHECK(graph.dims->find(name), "{}: a size was given for {}, which is not one of its dims", where,
                    detail::quoted(name));
  DimValues out;
  for (const DimSymbol& s : graph.dims->symbols) {
    auto it = values.find(s.name);
    KILN_USER_CHECK(it != values.end(), "{}: symbol {} has no size (give one, e.g. --dim {}={})", where,
                    detail::quoted(s.name), s.name, s.smallest());
    check_in_range(s, it->second, where);
    out[s.name] = it->second;
  }
  return out;
}

DimValues dim_values_from_shapes(const Graph& graph, const std::vector<Shape>& shapes) {
  KILN_INTERNAL_CHECK(shapes.size() == graph.inputs.size());
  if (!graph.dims) return {};
  DimValues values;
  std::map<std::string, std::string, std::less<>> read_from;  // symbol -> "input 'x' dimension 0"
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const Tensor& t = graph.tensor(graph.inputs[i]);
    if (!t.symbolic) continue;
    KILN_USER_CHECK(shapes[i].size() == t.symbolic->dims.size(), "input '{}': has rank {} but the graph's {} has rank {}",
                    t.name, shapes[i].size(), shape_text(t), t.symbolic->dims.size());
    for (size_t d = 0; d < shapes[i].size(); ++d) {
      const DimExpr& e = t.symbolic->dims[d];
      if (!e.is_single_symbol()) continue;
      const std::string& name = e.symbols[0];
      const std::string here = fmt::format("input '{}' {} (dimension {} of {})", t.name, to_string(shapes[i]), d, shape_text(t));
      auto [it, fresh] = values.emplace(name, shapes[i][d]);
      KILN_USER_CHECK(fresh || it->second == shapes[i][d], "{}: gives {} = {}, but {} gives {} = {}", here, name,
                      shapes[i][d], read_from[name], name, it->second);
      if (fresh) {
        read_from[name] = here;
        check_in_range(*graph.dims->find(name), shapes[i][d], here);
      }
    }
  }
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const Tensor& t = graph.tensor(graph.inputs[i]);
    if (!t.symbolic) continue;
    const Shape expected = evaluate_all(t.symbolic->dims, values);
    KILN_USER_CHECK(shapes[i] == expected, "input '{}': has shape {} but {} with {} is {}", t.name, to_string(shapes[i]),
                    shape_text(t), [&] {
                      std::vector<std::string> parts;
                      for (const auto& [k, v] : values) parts.push_back(fmt::format("{}={}", k, v));
                      return fmt::format("{}", fmt::join(parts, ", "));
                    }(),
                    to_string(expected));
  }
  return check_dim_values(graph, values);
}

Graph specialize(const Graph& graph, const DimValues& given) {
  const DimValues values = check_dim_values(graph, given);
  if (!graph.dims) return graph;
  return specialize_unchecked(graph, values);
}

Graph specialize_unchecked(const Graph& graph, const DimValues& values) {
  KILN_INTERNAL_CHECK(graph.dims != nullptr);
  GraphConstructor out(graph.name);
  for (TensorId id : graph.inputs) {
    const Tensor& t = graph.tensor(id);
    if (!t.symbolic) {
      out.add_input(t.name, t.shape, t.dtype, t.strides == contiguous_strides(t.shape) ? std::nullopt : std::optional(t.strides));
      continue;
    }
    out.add_input(t.name, evaluate_all(t.symbolic->dims, values), t.dtype,
                  t.symbolic->strides_declared ? std::optional(t.strides) : std::nullopt);
  }
  for (const Op& op : graph.ops) {
    OpDeclaration decl;
    decl.op = std::string(op_name(op.kind));
    for (TensorId id : op.inputs) {
      const Tensor& t = graph.tensor(id);
      if (t.kind == TensorKind::Constant) decl.in.emplace_back(static_cast<double>(t.constant));
      else decl.in.emplace_back(t.name);
    }
    decl.out = graph.tensor(op.output).name;
    if (op.explicit_dtype) decl.dtype = graph.tensor(op.output).dtype;
    for (int k = 0; k < kAttrKeyCount; ++k) {
      const auto key = static_cast<AttrKey>(k);
      if (!(op_info(op.kind).attrs & attr_bit(key))) continue;
      std::optional<AttrValue> value = attr_value(op.attrs, key);
      if (op.symbolic && key == AttrKey::shape && !op.symbolic->shape.empty()) value = evaluate_all(op.symbolic->shape, values);
      if (op.symbolic && key == AttrKey::start && op.symbolic->start) value = evaluate(*op.symbolic->start, values);
      if (op.symbolic && key == AttrKey::end && op.symbolic->end) value = evaluate(*op.symbolic->end, values);
      if (value) decl.attrs.emplace_back(std::string(attr_name(key)), *value);
    }
    out.add_op(decl);
  }
  std::vector<std::string> outputs;
  for (TensorId id : graph.outputs) outputs.push_back(graph.tensor(id).name);
  out.set_outputs(outputs);
  return std::move(out).finish();
}

}  // namespace kiln::ir
