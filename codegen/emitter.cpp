#include "codegen/emitter.h"

#include <fmt/format.h>

#include <cctype>

#include "compiler/error.h"

namespace kiln::codegen {

Emitter::Emitter(const ir::Graph& g, std::set<int32_t> ops, std::map<ir::TensorId, ExternalTensor> externals)
    : g_(g), ops_(std::move(ops)), externals_(std::move(externals)) {}

std::string Emitter::take() {
  std::string out;
  for (const std::string& line : lines_) out += line + "\n";
  lines_.clear();
  return out;
}

std::string Emitter::number_fresh_names(const std::string& source) {
  std::map<std::string, std::string> numbered;  // marked name -> final name
  std::set<std::string> final_names;
  std::string out;
  std::string unmarked;  // the source without its marked names (a space in their place)
  size_t at = 0;
  while (at < source.size()) {
    const size_t open = source.find(kFreshMark, at);
    if (open == std::string::npos) break;
    const size_t close = source.find(kFreshMark, open + 1);
    KILN_INTERNAL_CHECK(close != std::string::npos);
    out.append(source, at, open - at);
    unmarked.append(source, at, open - at) += ' ';
    const std::string marked = source.substr(open + 1, close - open - 1);
    auto [it, added] = numbered.try_emplace(marked);
    if (added) {
      const size_t digits = marked.find_first_of("0123456789");
      it->second = marked.substr(0, digits) + std::to_string(numbered.size() - 1);
      final_names.insert(it->second);
    }
    out += it->second;
    at = close + 1;
  }
  out.append(source, at);
  unmarked.append(source, at);
  // The names the source spells itself (identifiers outside the marks and
  // outside comments, which hold the graph's own tensor names) must not be
  // any of them.
  for (size_t i = 0; i < unmarked.size();) {
    if (unmarked.compare(i, 2, "//") == 0) {
      i = unmarked.find('\n', i);
      if (i == std::string::npos) break;
      continue;
    }
    if (!(std::isalpha(static_cast<unsigned char>(unmarked[i])) || unmarked[i] == '_')) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < unmarked.size() && (std::isalnum(static_cast<unsigned char>(unmarked[j])) || unmarked[j] == '_')) ++j;
    KILN_INTERNAL_CHECK(!final_names.count(unmarked.substr(i, j - i)));
    i = j;
  }
  return out;
}

std::string Emitter::float_literal(float v) {
  std::string s = fmt::format("{:.9g}", v);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s + "f";
}

std::string Emitter::load_call(DType storage, const std::string& pointer, const std::string& offset) {
  return fmt::format("kiln::load_{}({}, {})", storage == DType::boolean ? "bool" : std::string(to_string(storage)),
                     pointer, offset);
}

std::string Emitter::store_call(DType storage, const std::string& pointer, const std::string& offset,
                                const std::string& value) {
  return fmt::format("kiln::store_{}({}, {}, {});", storage == DType::boolean ? "bool" : std::string(to_string(storage)),
                     pointer, offset, value);
}

// `linear` must lie in [0, element_count(shape)).
Coords Emitter::delinearize(const std::string& linear, const Shape& shape) {
  Coords c(shape.size());
  const Strides strides = contiguous_strides(shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) {
      c[d] = "0";
      continue;
    }
    // Indices below 2^31 divide in 32 bits (a multiply-high and a shift;
    // 64-bit division is a long emulated sequence).
    std::string e;
    if (element_count(shape) < (int64_t{1} << 31)) {
      e = strides[d] == 1 ? fmt::format("(kiln::u32){}", linear) : fmt::format("((kiln::u32){} / {}u)", linear, strides[d]);
      if (d > 0) e = fmt::format("({} % {}u)", e, shape[d]);
      e = "(kiln::i64)" + e;
    } else {
      e = strides[d] == 1 ? linear : fmt::format("({} / {}LL)", linear, strides[d]);
      if (d > 0) e = fmt::format("({} % {}LL)", e, shape[d]);
    }
    const std::string name = fresh("c");
    lines_.push_back(fmt::format("const kiln::i64 {} = {};", name, e));
    c[d] = name;
  }
  return c;
}

std::string Emitter::linearize(const Coords& coords, const Shape& shape) {
  const Strides strides = contiguous_strides(shape);
  std::string e;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (coords[d] == "0") continue;
    e += (e.empty() ? "" : " + ") + (strides[d] == 1 ? coords[d] : fmt::format("{} * {}LL", coords[d], strides[d]));
  }
  return e.empty() ? "0" : e;
}

std::string Emitter::offset_of(const ExternalTensor& e, const Shape& shape, const Coords& coords) {
  std::string out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (coords[d] == "0" || e.strides[d] == 0) continue;
    out += (out.empty() ? "" : " + ") + (e.strides[d] == 1 ? coords[d] : fmt::format("{} * {}LL", coords[d], e.strides[d]));
  }
  return out.empty() ? "0" : out;
}

std::string Emitter::rounded(const ir::Tensor& t, const std::string& value) {
  return t.rounded ? round_as(t.dtype, value) : value;
}

std::string Emitter::round_as(DType dtype, const std::string& value) {
  switch (dtype) {
    case DType::bf16: return fmt::format("kiln::round_bf16({})", value);
    case DType::f16: return fmt::format("kiln::round_f16({})", value);
    case DType::boolean: return fmt::format("kiln::op_to_bool({})", value);
    case DType::f32: return value;
  }
  return value;
}

Coords Emitter::broadcast(const Shape& operand, const Shape& result, const Coords& coords) {
  Coords c(operand.size());
  const size_t lead = result.size() - operand.size();
  for (size_t d = 0; d < operand.size(); ++d) c[d] = operand[d] == 1 ? "0" : coords[lead + d];
  return c;
}

std::string Emitter::value(ir::TensorId t, const Coords& coords) {
  if (auto leaf = leaves_.find(t); leaf != leaves_.end() && (leaf->second.first.empty() || leaf->second.first == coords))
    return leaf->second.second;
  const ir::Tensor& tensor = g_.tensor(t);
  if (tensor.kind == ir::TensorKind::Constant) return float_literal(tensor.constant);
  std::string key = std::to_string(t);
  for (const std::string& c : coords) key += "," + c;
  if (auto it = memo_.find(key); it != memo_.end()) return it->second;
  const std::string result = compute(t, coords);
  memo_[key] = result;
  return result;
}

std::string Emitter::compute(ir::TensorId t, const Coords& coords) {
  const ir::Tensor& tensor = g_.tensor(t);
  const bool computed_here = tensor.kind == ir::TensorKind::OpResult && ops_.count(tensor.producer);
  if (!computed_here) {
    if (auto v = vector_sources_.find(t); v != vector_sources_.end() && v->second.first == coords) {
      const std::string name = fresh("v");
      used_vector_sources_.insert(t);
      lines_.push_back(fmt::format("const float {} = {};  // {}", name, v->second.second, tensor.name));
      return name;
    }
    auto it = externals_.find(t);
    KILN_INTERNAL_CHECK(it != externals_.end());
    const std::string v = fresh("v");
    lines_.push_back(fmt::format("const float {} = {};  // {}", v,
                                 load_call(it->second.storage, it->second.pointer, offset_of(it->second, tensor.shape, coords)),
                                 tensor.name));
    return v;
  }
  const ir::Op& op = g_.ops[static_cast<size_t>(tensor.producer)];
  const ir::OpFamily family = ir::op_info(op.kind).family;
  if (family == ir::OpFamily::View) return view(op, coords);
  if (family == ir::OpFamily::Concat) return concat(op, coords);
  if (ir::is_pointwise(op.kind) || op.kind == ir::OpKind::BatchNorm) return pointwise(op, coords);
  if (norm_stats_.count(t)) return norm_from_stats(op, coords);
  KILN_UNREACHABLE(fmt::format("codegen cannot compute {} inside this kernel", g_.describe(tensor.producer)));
}

std::string Emitter::view(const ir::Op& op, const Coords& coords) {
  const ir::Tensor& in = g_.operand(op, 0);
  if (op.kind == ir::OpKind::Transpose) {
    Coords c(coords.size());
    for (size_t d = 0; d < coords.size(); ++d) c[static_cast<size_t>(op.attrs.perm[d])] = coords[d];
    return value(op.inputs[0], c);
  }
  if (op.kind == ir::OpKind::Expand) return value(op.inputs[0], broadcast(in.shape, g_.result(op).shape, coords));
  if (op.kind == ir::OpKind::Slice) {
    Coords c = coords;
    std::string& at = c[static_cast<size_t>(op.attrs.axis)];
    if (op.attrs.step != 1) at = fmt::format("({} * {})", at, op.attrs.step);
    if (op.attrs.start != 0) at = fmt::format("({} + {})", at, op.attrs.start);
    return value(op.inputs[0], c);
  }
  const std::string linear = fresh("l");
  lines_.push_back(fmt::format("const kiln::i64 {} = {};", linear, linearize(coords, g_.result(op).shape)));
  return value(op.inputs[0], delinearize(linear, in.shape));
}

// Each element from the input that holds it: one branch per input, the
// others not evaluated (their coordinates would be out of range). Values
// computed inside a branch stay there (the memo is restored after it).
std::string Emitter::concat(const ir::Op& op, const Coords& coords) {
  const ir::Tensor& result = g_.result(op);
  const size_t axis = static_cast<size_t>(op.attrs.axis);
  const std::string v = fresh("v");
  lines_.push_back(fmt::format("float {};  // {} = concat", v, result.name));
  int64_t offset = 0;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const int64_t size = g_.tensor(op.inputs[i]).shape[axis];
    const bool last = i + 1 == op.inputs.size();
    const std::string condition = fmt::format("{} < {}", coords[axis], offset + size);
    lines_.push_back(i == 0 ? fmt::format("if ({}) {{", condition)
                            : last ? std::string("} else {") : fmt::format("}} else if ({}) {{", condition));
    const std::map<std::string, std::string> memo = memo_;
    Coords c = coords;
    if (offset != 0) c[axis] = fmt::format("({} - {})", coords[axis], offset);
    const std::string in = value(op.inputs[i], c);
    lines_.push_back(fmt::format("{} = {};", v, in));
    memo_ = memo;
    offset += size;
  }
  lines_.push_back("}");
  if (result.rounded) {
    const std::string r = fresh("v");
    lines_.push_back(fmt::format("const float {} = {};", r, rounded(result, v)));
    return r;
  }
  return v;
}

std::string Emitter::pointwise(const ir::Op& op, const Coords& coords) {
  const ir::Tensor& result = g_.result(op);
  std::vector<std::string> args;
  if (op.kind == ir::OpKind::BatchNorm) {  // per-channel affine: parameters at the channel coordinate
    const std::string x = value(op.inputs[0], coords);
    const Coords channel{coords[static_cast<size_t>(op.attrs.axis)]};
    std::vector<std::string> p;
    for (size_t i = 1; i < op.inputs.size(); ++i) p.push_back(value(op.inputs[i], channel));
    // The channel's scale, weight / sqrt(var + eps), is a value of the
    // channel alone: a kernel that walks a channel's elements (a matmul or
    // conv epilogue's column) computes it once, and each element costs a
    // subtract and a multiply-add where a divide was.
    const std::string scale = fresh("v");
    lines_.push_back(fmt::format("const float {} = {} / sqrtf({} + {});  // {}: the channel's scale", scale,
                                 p.size() > 2 ? p[2] : "1.0f", p[1], float_literal(op.attrs.eps), result.name));
    std::string e = fmt::format("(({} - {}) * {})", x, p[0], scale);
    if (p.size() > 3) e = fmt::format("({} + {})", e, p[3]);
    const std::string v = fresh("v");
    lines_.push_back(fmt::format("const float {} = {};  // {} = batch_norm", v, rounded(result, e), result.name));
    return v;
  }
  for (ir::TensorId in : op.inputs) args.push_back(value(in, broadcast(g_.tensor(in).shape, result.shape, coords)));
  std::string e;
  const std::string_view name = ir::op_name(op.kind);
  const std::string_view device = ir::op_info(op.kind).device;  // the op table's functor
  if (op.kind == ir::OpKind::LeakyRelu) {
    e = fmt::format("{}({}, {})", device, args[0], float_literal(op.attrs.alpha));
  } else if (op.kind == ir::OpKind::Clamp) {
    e = args[0];
    if (op.attrs.min) e = fmt::format("kiln::op_clamp_min({}, {})", e, float_literal(*op.attrs.min));
    if (op.attrs.max) e = fmt::format("kiln::op_clamp_max({}, {})", e, float_literal(*op.attrs.max));
  } else if (op.kind == ir::OpKind::Cast) {
    e = args[0];  // rounded below, as every rounded result is
  } else {
    KILN_INTERNAL_CHECK(!device.empty());
    e = fmt::format("{}({})", device, fmt::join(args, ", "));
  }
  const std::string v = fresh("v");
  lines_.push_back(fmt::format("const float {} = {};  // {} = {}", v, rounded(result, e), result.name, name));
  return v;
}

// layer_norm / rms_norm over the last axis, applied from row statistics.
std::string Emitter::norm_from_stats(const ir::Op& op, const Coords& coords) {
  const ir::Tensor& result = g_.result(op);
  const std::string& stats = norm_stats_.at(op.output);
  const std::string x = value(op.inputs[0], coords);
  Coords row_coords(coords.begin(), coords.end() - 1);
  Shape row_shape(result.shape.begin(), result.shape.end() - 1);
  const std::string row = fresh("row");
  lines_.push_back(fmt::format("const kiln::i64 {} = {};", row, linearize(row_coords, row_shape)));
  const Coords last{coords.back()};
  std::string e = op.kind == ir::OpKind::RmsNorm
                      ? fmt::format("({} * {}[2 * {} + 1])", x, stats, row)
                      : fmt::format("(({} - {}[2 * {}]) * {}[2 * {} + 1])", x, stats, row, stats, row);
  if (op.inputs.size() > 1) e = fmt::format("({} * {})", e, value(op.inputs[1], last));
  if (op.inputs.size() > 2) e = fmt::format("({} + {})", e, value(op.inputs[2], last));
  const std::string v = fresh("v");
  lines_.push_back(fmt::format("const float {} = {};  // {} = {} (from row statistics)", v, rounded(result, e),
                               result.name, ir::op_name(op.kind)));
  return v;
}

}  // namespace kiln::codegen
