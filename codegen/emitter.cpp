#include "codegen/emitter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

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
  if (std::isinf(v)) return v > 0 ? "kiln::inf()" : "(-kiln::inf())";
  if (std::isnan(v)) return "__int_as_float(0x7fc00000)";
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
  // One dimension of more than one element: the linear index itself, where it is a name.
  const bool a_name = std::all_of(linear.begin(), linear.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == kFreshMark;
  });
  if (a_name && std::count_if(shape.begin(), shape.end(), [](int64_t e) { return e > 1; }) == 1) {
    for (size_t d = 0; d < shape.size(); ++d) c[d] = shape[d] == 1 ? "0" : linear;
    linear_of_[{c, shape}] = linear;
    return c;
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) {
      c[d] = "0";
      continue;
    }
    // Indices below 2^31 divide in 32 bits (a multiply-high and a shift;
    // 64-bit division is a long emulated sequence).
    std::string e;
    SizeText& size = *sizes_;
    // (Past 2^31 a symbolic size divides by its kiln::Divisor: SizeText::quotient.)
    if (size.known_below(element_count(shape), int64_t{1} << 31)) {
      e = strides[d] == 1 ? fmt::format("(kiln::u32){}", linear) : fmt::format("((kiln::u32){} / {})", linear, size(strides[d], "u"));
      if (d > 0) e = fmt::format("({} % {})", e, size(shape[d], "u"));
      e = "(kiln::i64)" + e;
    } else {
      e = strides[d] == 1 ? linear : size.quotient(linear, strides[d]);
      if (d > 0) e = size.remainder(e, shape[d]);
    }
    const std::string name = fresh("c");
    define_index(name, fmt::format("const kiln::i64 {} = {};", name, e), is_column_expression(e));
    c[d] = name;
  }
  linear_of_[{c, shape}] = linear;
  return c;
}

std::string Emitter::linearize(const Coords& coords, const Shape& shape) {
  if (auto it = linear_of_.find({coords, shape}); it != linear_of_.end()) return it->second;
  return strided_sum(coords, shape, contiguous_strides(shape));
}

// Sum of coords[d] * strides[d]. A run of coordinates that delinearize()
// split from one linear index over that run of the shape, laid out
// contiguously among themselves, is that index times the run's last stride:
// the quotients and remainders that split it are then dead code (a symbolic
// size divides at run time: Llama's projections read [B, S, D] rows as
// [B*S, D] and divided every row index by S).
std::string Emitter::strided_sum(const Coords& coords, const Shape& shape, const Strides& strides) {
  auto rejoins = [&](size_t d, const Coords& run, const Shape& run_shape) {
    const size_t n = run.size(), last = d + n - 1;
    if (n < 2 || last >= shape.size() || !std::equal(run.begin(), run.end(), coords.begin() + static_cast<std::ptrdiff_t>(d)) ||
        !std::equal(run_shape.begin(), run_shape.end(), shape.begin() + static_cast<std::ptrdiff_t>(d)))
      return false;
    int64_t inner = 1;
    for (size_t j = last + 1; j-- > d;) {
      if (shape[j] != 1 && strides[j] != strides[last] * inner) return false;
      inner *= shape[j];
    }
    return true;
  };
  std::string out;
  auto term = [&](const std::string& index, int64_t stride) {
    if (index == "0" || stride == 0) return;
    out += (out.empty() ? "" : " + ") + (stride == 1 ? index : fmt::format("{} * {}", index, (*sizes_)(stride)));
  };
  for (size_t d = 0; d < shape.size();) {
    size_t run_end = d;
    std::string linear;
    for (const auto& [key, index] : linear_of_)
      if (key.first.size() > run_end - d && rejoins(d, key.first, key.second)) run_end = d + key.first.size(), linear = index;
    if (run_end > d) {
      term(linear.find(' ') == std::string::npos ? linear : "(" + linear + ")", strides[run_end - 1]);
      d = run_end;
    } else {
      term(coords[d], strides[d]);
      ++d;
    }
  }
  return out.empty() ? "0" : out;
}

// Trailing dimensions both shapes have keep their coordinates (a column
// stays the column); the leading ones are re-linearised, and a linear index
// that delinearize() split before is used as it was.
Coords Emitter::same_element(const Coords& coords, const Shape& shape, const Shape& target) {
  if (shape == target) return coords;
  size_t common = 0;
  while (common < shape.size() && common < target.size() &&
         shape[shape.size() - 1 - common] == target[target.size() - 1 - common])
    ++common;
  const auto lead = static_cast<std::ptrdiff_t>(shape.size() - common);
  const Shape shape_lead(shape.begin(), shape.begin() + lead);
  const Shape target_lead(target.begin(), target.end() - static_cast<std::ptrdiff_t>(common));
  Coords c;
  if (element_count(target_lead) == 1) {
    c.assign(target_lead.size(), "0");
  } else {
    std::string linear = linearize(Coords(coords.begin(), coords.begin() + lead), shape_lead);
    if (linear.find(' ') != std::string::npos) {  // an expression: named once
      const std::string name = fresh("l");
      define_index(name, fmt::format("const kiln::i64 {} = {};", name, linear), is_column_expression(linear));
      linear = name;
    }
    c = delinearize(linear, target_lead);
  }
  c.insert(c.end(), coords.begin() + lead, coords.end());
  return c;
}

std::string Emitter::offset_of(const ExternalTensor& e, const Shape& shape, const Coords& coords) {
  return strided_sum(coords, shape, e.strides);
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

std::string Emitter::value(ir::TensorId t, const Coords& coords) { return element(operand(t, coords)); }

std::string Emitter::operand(ir::TensorId t, const Coords& coords) {
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

void Emitter::begin_columns(std::set<std::string> column_vars, std::string dims, std::string index) {
  columns_ = Columns{};
  columns_.on = true;
  columns_.vars = std::move(column_vars);
  columns_.dims = std::move(dims);
  columns_.index = std::move(index);
}

Emitter::ColumnCode Emitter::end_columns() {
  ColumnCode code;
  for (const std::string& line : columns_.lines) code.statements += line + "\n";
  for (const std::string& v : columns_.exported) {
    const std::string& array = columns_.arrays.at(v);
    code.declarations += fmt::format("float {}{};\n", array, columns_.dims);
    code.values.emplace_back(v, array);
  }
  code.arithmetic = columns_.arithmetic;
  columns_ = Columns{};
  return code;
}

// A column value read by an element's statement: its register array's element.
std::string Emitter::element(const std::string& value) {
  if (!columns_.values.count(value)) return value;
  auto [it, added] = columns_.arrays.try_emplace(value);
  if (added) {
    it->second = fresh("col");
    columns_.exported.push_back(value);
  }
  return it->second + columns_.index;
}

bool Emitter::is_column_value(const std::string& value) const {
  if (columns_.values.count(value)) return true;
  // A literal (a constant's float_literal).
  return !value.empty() && (std::isdigit(static_cast<unsigned char>(value[0])) || value[0] == '-' || value[0] == '.');
}

// Whether every variable `expression` names is a column variable (the
// emitter's own casts and integer literals aside).
bool Emitter::is_column_expression(const std::string& expression) const {
  if (!columns_.on) return false;
  for (size_t i = 0; i < expression.size();) {
    const unsigned char ch = static_cast<unsigned char>(expression[i]);
    if (std::isdigit(ch)) {  // a number and its suffix
      while (i < expression.size() && std::isalnum(static_cast<unsigned char>(expression[i]))) ++i;
      continue;
    }
    if (!(std::isalpha(ch) || ch == '_')) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < expression.size() && (std::isalnum(static_cast<unsigned char>(expression[j])) || expression[j] == '_')) ++j;
    const std::string name = expression.substr(i, j - i);
    if (name != "kiln" && name != "i64" && name != "u32" && !columns_.vars.count(name)) return false;
    i = j;
  }
  return true;
}

void Emitter::define(const std::string& name, const std::string& line, bool column) {
  if (!column || !columns_.on) {
    lines_.push_back(line);
    return;
  }
  columns_.lines.push_back(line);
  columns_.values.insert(name);
}

// An index of the column alone is defined in both loops: an element's
// coordinates may combine it with the row's.
void Emitter::define_index(const std::string& name, const std::string& line, bool column) {
  lines_.push_back(line);
  if (!column || !columns_.on) return;
  columns_.lines.push_back(line);
  columns_.vars.insert(name.substr(1, name.size() - 2));  // (without the fresh marks)
}

std::string Emitter::compute(ir::TensorId t, const Coords& coords) {
  const ir::Tensor& tensor = g_.tensor(t);
  // A chunk loaded for the lane loop: a tensor read from memory, or a concat
  // whose pieces are (KernelBuilder::Chunking::concats).
  if (auto v = vector_sources_.find(t); v != vector_sources_.end() && v->second.first == coords) {
    const std::string name = fresh("v");
    used_vector_sources_.insert(t);
    lines_.push_back(fmt::format("const float {} = {};  // {}", name, v->second.second, tensor.name));
    return name;
  }
  const bool computed_here = tensor.kind == ir::TensorKind::OpResult && ops_.count(tensor.producer);
  if (!computed_here) {
    auto it = externals_.find(t);
    KILN_INTERNAL_CHECK(it != externals_.end());
    const std::string v = fresh("v"), offset = offset_of(it->second, tensor.shape, coords);
    define(v, fmt::format("const float {} = {};  // {}", v, load_call(it->second.storage, it->second.pointer, offset), tensor.name),
           is_column_expression(offset));
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
    return operand(op.inputs[0], c);
  }
  if (op.kind == ir::OpKind::Expand) return operand(op.inputs[0], broadcast(in.shape, g_.result(op).shape, coords));
  if (op.kind == ir::OpKind::Slice) {
    Coords c = coords;
    std::string& at = c[static_cast<size_t>(op.attrs.axis)];
    if (op.attrs.step != 1) at = fmt::format("({} * {})", at, op.attrs.step);
    if (op.attrs.start != 0) at = fmt::format("({} + {})", at, op.attrs.start);
    return operand(op.inputs[0], c);
  }
  return operand(op.inputs[0], same_element(coords, g_.result(op).shape, in.shape));
}

std::string Emitter::piece_coordinate(const std::string& coordinate, int64_t offset) const {
  return offset == 0 ? coordinate : fmt::format("({} - {})", coordinate, (*sizes_)(offset, ""));
}

// Each element from the input that holds it: one branch per input, the
// others not evaluated (their coordinates would be out of range). Values
// computed inside a branch stay there (the memo is restored after it).
std::string Emitter::concat(const ir::Op& op, const Coords& coords) {
  const ir::Tensor& result = g_.result(op);
  const size_t axis = static_cast<size_t>(op.attrs.axis);
  const std::string v = fresh("v");
  lines_.push_back(fmt::format("float {};  // {} = concat", v, result.name));
  // (Nothing inside a branch moves to the column loop: the other inputs'
  // coordinates would be out of range there.)
  const bool columns_on = columns_.on;
  columns_.on = false;
  int64_t offset = 0;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const int64_t size = g_.tensor(op.inputs[i]).shape[axis];
    const bool last = i + 1 == op.inputs.size();
    const std::string condition = fmt::format("{} < {}", coords[axis], (*sizes_)(offset + size, ""));
    lines_.push_back(i == 0 ? fmt::format("if ({}) {{", condition)
                            : last ? std::string("} else {") : fmt::format("}} else if ({}) {{", condition));
    const std::map<std::string, std::string> memo = memo_;
    Coords c = coords;
    c[axis] = piece_coordinate(coords[axis], offset);
    const std::string in = value(op.inputs[i], c);
    lines_.push_back(fmt::format("{} = {};", v, in));
    memo_ = memo;
    offset += size;
  }
  lines_.push_back("}");
  columns_.on = columns_on;
  if (result.rounded) {
    const std::string r = fresh("v");
    lines_.push_back(fmt::format("const float {} = {};", r, rounded(result, v)));
    return r;
  }
  return v;
}

std::string Emitter::pointwise(const ir::Op& op, const Coords& coords) {
  const ir::Tensor& result = g_.result(op);
  // Operands, and whether the result is a column value (then computed in
  // the column loop; otherwise its column operands are read from their arrays).
  auto column_statement = [&](std::vector<std::string>& args) {
    const bool column = std::all_of(args.begin(), args.end(), [&](const std::string& a) { return is_column_value(a); });
    // (a cast rounds at most: a column of casts is still as cheap as its loads)
    if (column && columns_.on && op.kind != ir::OpKind::Cast) columns_.arithmetic = true;
    if (!column)
      for (std::string& a : args) a = element(a);
    return column;
  };
  if (op.kind == ir::OpKind::BatchNorm) {  // per-channel affine: parameters at the channel coordinate
    const Coords channel{coords[static_cast<size_t>(op.attrs.axis)]};
    std::vector<std::string> p;
    for (size_t i = 1; i < op.inputs.size(); ++i) p.push_back(operand(op.inputs[i], channel));
    // The channel's scale, weight / sqrt(var + eps), is a value of the
    // channel alone (a column value in a conv's epilogue): each element
    // costs a subtract and a multiply-add.
    std::vector<std::string> of_scale{p.size() > 2 ? p[2] : "1.0f", p[1]};
    const bool column = column_statement(of_scale);
    const std::string scale = fresh("v");
    define(scale,
           fmt::format("const float {} = {} / sqrtf({} + {});  // {}: the channel's scale", scale, of_scale[0], of_scale[1],
                       float_literal(op.attrs.eps), result.name),
           column);
    std::vector<std::string> args{operand(op.inputs[0], coords), p[0], scale};
    if (p.size() > 3) args.push_back(p[3]);
    const bool column_result = column_statement(args);
    std::string e = fmt::format("(({} - {}) * {})", args[0], args[1], args[2]);
    if (args.size() > 3) e = fmt::format("({} + {})", e, args[3]);
    const std::string v = fresh("v");
    define(v, fmt::format("const float {} = {};  // {} = batch_norm", v, rounded(result, e), result.name), column_result);
    return v;
  }
  std::vector<std::string> args;
  for (ir::TensorId in : op.inputs) args.push_back(operand(in, broadcast(g_.tensor(in).shape, result.shape, coords)));
  const bool column = column_statement(args);
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
  define(v, fmt::format("const float {} = {};  // {} = {}", v, stays_exact(op) ? e : rounded(result, e), result.name, name),
         column);
  return v;
}

// An op that picks or negates an operand (ir::picks_an_operand): where every
// operand holds a value already rounded to the result's 16-bit type,
// rounding the result changes nothing, and is left out (relu after a
// rounded add: one instruction an element).
bool Emitter::stays_exact(const ir::Op& op) const {
  const ir::Tensor& result = g_.result(op);
  if (!result.rounded || (result.dtype != DType::bf16 && result.dtype != DType::f16) || !ir::picks_an_operand(op.kind))
    return false;
  return std::all_of(op.inputs.begin(), op.inputs.end(), [&](ir::TensorId in) {
    const ir::Tensor& t = g_.tensor(in);
    return t.kind != ir::TensorKind::Constant && t.rounded && t.dtype == result.dtype;
  });
}

// layer_norm / rms_norm over the last axis, applied from row statistics.
std::string Emitter::norm_from_stats(const ir::Op& op, const Coords& coords) {
  const ir::Tensor& result = g_.result(op);
  const std::string& stats = norm_stats_.at(op.output);
  const std::string x = element(operand(op.inputs[0], coords));
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
