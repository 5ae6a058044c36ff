#include "compiler/ir_printer.h"

#include <fmt/format.h>

#include "compiler/error.h"
#include "compiler/graph_hash.h"
#include "compiler/symbolic_dims.h"

namespace kiln::ir {
namespace {

std::string value_string(const AttrValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) return fmt::format("\"{}\"", v);
        else if constexpr (std::is_same_v<V, std::vector<int64_t>>) return fmt::format("[{}]", fmt::join(v, ","));
        else if constexpr (std::is_same_v<V, std::vector<DimSize>>) return std::string("?");  // never resolved
        else return fmt::format("{}", v);
      },
      value);
}

std::string operand_string(const Graph& g, TensorId id) {
  const Tensor& t = g.tensor(id);
  if (t.kind == TensorKind::Constant) return fmt::format("{}", t.constant);
  return "%" + t.name;
}

// A size attribute holding a symbol, as its expressions.
std::optional<std::string> symbolic_attr(const Graph& g, const Op& op, AttrKey key) {
  if (!op.symbolic) return std::nullopt;
  if (key == AttrKey::shape && (op.kind == OpKind::Reshape || op.kind == OpKind::Expand))
    return to_string(op.symbolic->shape);
  if (op.kind != OpKind::Slice || (key != AttrKey::start && key != AttrKey::end)) return std::nullopt;
  const std::optional<SlicePosition>& p = key == AttrKey::start ? op.symbolic->start : op.symbolic->end;
  if (!p) return std::nullopt;
  return to_string(*p, symbolic_dims(g.operand(op, 0))[static_cast<size_t>(op.attrs.axis)]);
}

}  // namespace

std::string type_string(const Tensor& t) { return fmt::format("{}{}", to_string(t.dtype), shape_text(t)); }

std::string print_ir(const Graph& g) {
  std::string out = fmt::format("graph {}: {} ops, {} inputs, {} outputs, hash {}\n",
                                detail::quoted(g.name), g.ops.size(), g.inputs.size(),
                                g.outputs.size(), graph_hash(g).hex());
  if (g.dims) {
    std::vector<std::string> ranges;
    for (const DimSymbol& s : g.dims->symbols) ranges.push_back(s.range_text());
    out += fmt::format("dims {}\n", fmt::join(ranges, "; "));
  }
  for (TensorId id : g.inputs) {
    const Tensor& t = g.tensor(id);
    out += fmt::format("input %{} : {}", t.name, type_string(t));
    if (t.symbolic ? t.symbolic->strides_declared : t.strides != contiguous_strides(t.shape))
      out += fmt::format(" strides [{}]", fmt::join(t.strides, ","));
    out += "\n";
  }
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    std::vector<std::string> operands;
    for (TensorId id : op.inputs) operands.push_back(operand_string(g, id));
    std::vector<std::string> attrs;
    for (int k = 0; k < kAttrKeyCount; ++k) {
      const auto key = static_cast<AttrKey>(k);
      if (!(op_info(op.kind).attrs & attr_bit(key))) continue;
      if (std::optional<std::string> v = symbolic_attr(g, op, key)) attrs.push_back(fmt::format("{}={}", attr_name(key), *v));
      else if (std::optional<AttrValue> v = attr_value(op.attrs, key))
        attrs.push_back(fmt::format("{}={}", attr_name(key), value_string(*v)));
    }
    const Tensor& result = g.tensor(op.output);
    out += fmt::format("op {} %{} = {}({})", i, result.name, op_name(op.kind), fmt::join(operands, ", "));
    if (rounds_scores(op.attrs))  // (not a JSON key)
      attrs.push_back("scores rounded to " + score_rounding_text(op.attrs.scores_rounded_to, op.attrs.score_roundings));
    if (!attrs.empty()) out += fmt::format(" {{{}}}", fmt::join(attrs, ", "));
    out += fmt::format(" : {}", type_string(result));
    if (result.dtype == DType::f16 || result.dtype == DType::bf16)
      out += result.rounded ? " rounded" : " f32-values";
    out += "\n";
  }
  std::vector<std::string> outputs;
  for (TensorId id : g.outputs) outputs.push_back("%" + g.tensor(id).name);
  out += fmt::format("outputs {}\n", fmt::join(outputs, ", "));
  return out;
}

}  // namespace kiln::ir
