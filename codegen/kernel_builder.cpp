// What the generators of every kernel kind share: parameters, workspaces,
// where a written tensor's element lies, the kernel's frame.
#include "codegen/kernel_builder.h"

#include "compiler/strides.h"

namespace kiln::codegen {

// The kernel's reads in the order its ops first use them (the rest after, by
// id): parameters numbered by the kernel's structure, not by the tensors'
// ids, so that the identical layers of a model are one kernel text (in one
// layer the residual stream is a graph input, in the next an intermediate).
std::vector<ir::TensorId> KernelBuilder::reads_in_order_of_use() const {
  std::vector<ir::TensorId> order;
  auto take = [&](ir::TensorId t) {
    if (std::find(k_.reads.begin(), k_.reads.end(), t) != k_.reads.end() &&
        std::find(order.begin(), order.end(), t) == order.end())
      order.push_back(t);
  };
  for (int32_t oi : k_.ops)
    for (ir::TensorId t : g_.ops[static_cast<size_t>(oi)].inputs) take(t);
  for (ir::TensorId t : k_.reads) take(t);
  return order;
}

std::vector<std::pair<ir::TensorId, ExternalTensor>> KernelBuilder::ordered_externals() const {
  std::vector<std::pair<ir::TensorId, ExternalTensor>> out;
  for (ir::TensorId t : read_order_)
    if (auto it = ext_.find(t); it != ext_.end()) out.emplace_back(t, it->second);
  return out;
}

std::map<ir::TensorId, ExternalTensor> KernelBuilder::externals() {
  std::map<ir::TensorId, ExternalTensor> ext;
  read_order_ = reads_in_order_of_use();
  for (ir::TensorId t : read_order_) {
    const ir::Tensor& tensor = g_.tensor(t);
    const bool input = tensor.kind == ir::TensorKind::Input;
    const std::string p = add_param({input ? KernelArg::Role::Input : KernelArg::Role::Intermediate, t, -1}, true,
                                    tensor.name);
    ext[t] = {p, input ? tensor.dtype : storage_dtype(tensor), tensor.strides};
  }
  for (ir::TensorId t : k_.writes) {
    const ir::Tensor& tensor = g_.tensor(t);
    const std::string p = add_param({tensor.is_output ? KernelArg::Role::Output : KernelArg::Role::Intermediate, t, -1},
                                    false, tensor.name);
    writes_[t] = p;
  }
  ext_ = ext;
  return ext;
}

std::string KernelBuilder::add_param(KernelArg arg, bool read_only, const std::string& what) {
  const std::string name = "p" + std::to_string(out_.args.size());
  params_.push_back(fmt::format("{}void* __restrict__ {}", read_only ? "const " : "", name));
  param_notes_.push_back(what);
  out_.args.push_back(arg);
  return name;
}

std::string KernelBuilder::workspace_param(const std::string& name, int64_t words, uint32_t fill, bool reset_here) {
  const int index = state_.workspace(name, words, fill,
                                     sizes_.symbolic(words) ? std::optional<ir::DimExpr>(sizes_.dim(words).expr()) : std::nullopt);
  if (reset_here) out_.reset_workspaces.push_back(index);
  return add_param({KernelArg::Role::Workspace, -1, index}, false, "workspace " + name);
}

std::string KernelBuilder::store(ir::TensorId t, const std::string& offset, const std::string& value) {
  return Emitter::store_call(storage_dtype(g_.tensor(t)), writes_.at(t), offset, value);
}

std::string KernelBuilder::gather_column_pair(ir::TensorId t, const std::string& value, const std::string& offset,
                                              std::string& decls) {
  const std::string pair = pair_name(t);
  decls += fmt::format("float {0}[2];\nkiln::i64 {0}_at = 0;\n", pair);
  em_.emit(fmt::format("{}[c] = {};  // {}", pair, value, g_.tensor(t).name));
  em_.emit(fmt::format("if (c == 0) {}_at = {};", pair, offset));
  const ir::Tensor& tensor = g_.tensor(t);
  const DType storage = storage_dtype(tensor);
  // Values already rounded to bf16 store their high halves (no conversion).
  const bool exact = storage == DType::bf16 && tensor.rounded && tensor.dtype == DType::bf16;
  return fmt::format("kiln::store_{0}pair_{1}({2}, {3}_at, {3}[0], {3}[1]);  // {4}", exact ? "rounded_" : "", to_string(storage),
                     writes_.at(t), pair, tensor.name);
}

std::vector<const ir::Op*> KernelBuilder::ops_of(std::initializer_list<ir::OpFamily> families) const {
  std::vector<const ir::Op*> out;
  for (int32_t oi : k_.ops) {
    const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
    if (std::find(families.begin(), families.end(), ir::op_info(op.kind).family) != families.end()) out.push_back(&op);
  }
  return out;
}

// Tensors computed (in this kernel) from the results of `roots`.
std::set<ir::TensorId> KernelBuilder::downstream_of(const std::set<ir::TensorId>& roots) const {
  std::set<ir::TensorId> out = roots;
  for (int32_t oi : k_.ops) {
    const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
    for (ir::TensorId in : op.inputs)
      if (out.count(in)) out.insert(op.output);
  }
  return out;
}

// The coordinates of `to` at the element where `from` has `coords`,
// following this kernel's ops forward: views map coordinates, pointwise
// ops keep them. nullopt when `to` is not computed from `from` here.
std::optional<Coords> KernelBuilder::forward(ir::TensorId from, ir::TensorId to, const Coords& coords) {
  if (from == to) return coords;
  const int64_t count = element_count(g_.tensor(from).shape);
  for (int32_t oi : k_.ops) {
    const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
    const Shape& out = g_.result(op).shape;
    if (element_count(out) != count ||
        std::find(op.inputs.begin(), op.inputs.end(), from) == op.inputs.end())
      continue;
    Coords next;
    if (op.kind == OpKind::Transpose) {
      next.resize(coords.size());
      for (size_t d = 0; d < coords.size(); ++d) next[d] = coords[static_cast<size_t>(op.attrs.perm[d])];
    } else if (op.kind == OpKind::Reshape) {
      // Named once per element code (the memo): every tensor downstream then has the same names,
      // which is how the epilogue's residuals know their readers' coordinates.
      const Coords* named = nullptr;
      if (write_coords_memo_)
        if (auto it = write_coords_memo_->find(op.output); it != write_coords_memo_->end()) named = &it->second;
      next = named ? *named : em_.same_element(coords, g_.tensor(from).shape, out);
      if (write_coords_memo_ && !named) (*write_coords_memo_)[op.output] = next;
    } else if (ir::is_pointwise(op.kind) || op.kind == OpKind::BatchNorm) {
      next.assign(out.size() - coords.size(), "0");
      next.insert(next.end(), coords.begin(), coords.end());
    } else {
      continue;
    }
    if (std::optional<Coords> found = forward(op.output, to, next)) return found;
  }
  return std::nullopt;
}

// Where to write `t` in a kernel whose template holds `leaf` at
// `leaf_coords`: downstream of the leaf, at the matching element; else (t
// does not use the leaf) at the element with the same linear index.
Coords KernelBuilder::write_coords(ir::TensorId leaf, const Coords& leaf_coords, ir::TensorId t) {
  if (write_coords_memo_)
    if (auto it = write_coords_memo_->find(t); it != write_coords_memo_->end()) return it->second;
  std::optional<Coords> c = forward(leaf, t, leaf_coords);
  if (!c) c = em_.same_element(leaf_coords, g_.tensor(leaf).shape, g_.tensor(t).shape);
  if (write_coords_memo_) (*write_coords_memo_)[t] = *c;
  return *c;
}

bool KernelBuilder::same_linear_order(ir::TensorId from, ir::TensorId to) const {
  if (from == to) return true;
  const int64_t count = element_count(g_.tensor(from).shape);
  for (int32_t oi : k_.ops) {
    const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
    if (element_count(g_.result(op).shape) != count || std::find(op.inputs.begin(), op.inputs.end(), from) == op.inputs.end())
      continue;
    if ((op.kind == OpKind::Reshape || ir::is_pointwise(op.kind) || op.kind == OpKind::BatchNorm) &&
        same_linear_order(op.output, to))
      return true;
  }
  return false;
}

auto KernelBuilder::chunking(const Shape& domain, int64_t lane_extent, bool concats) const -> Chunking {
  Chunking ch;
  if (domain.empty() || domain.back() == 1) return ch;
  int narrowest = 4;
  std::vector<ir::TensorId> loads;
  for (const auto& [t, e] : ordered_externals()) {
    const Shape& shape = g_.tensor(t).shape;
    if (e.storage == DType::boolean || shape.empty() || shape.size() > domain.size() || shape.back() != domain.back() ||
        e.strides.back() != 1)
      continue;
    loads.push_back(t);
    narrowest = std::min(narrowest, byte_size(e.storage));
  }
  for (ir::TensorId t : k_.writes) {
    const ir::Tensor& tensor = g_.tensor(t);
    if (tensor.shape != domain || storage_dtype(tensor) == DType::boolean) continue;
    ch.stores.push_back(t);
    narrowest = std::min(narrowest, byte_size(storage_dtype(tensor)));
  }
  const int vec = 16 / narrowest;
  if ((loads.empty() && ch.stores.empty()) || lane_extent % vec != 0 || domain.back() % vec != 0) return {};
  for (ir::TensorId t : loads) {
    const Strides& strides = ext_.at(t).strides;
    if (std::all_of(strides.begin(), strides.end() - 1, [&](int64_t s) { return s % vec == 0; })) ch.loads.push_back(t);
  }
  ch.vec = vec;
  if (concats) ch.concats = chunked_concats(domain, vec);
  std::vector<std::string> pointers;
  for (ir::TensorId t : ch.loads) pointers.push_back(fmt::format("kiln::aligned16({})", ext_.at(t).pointer));
  for (const ConcatChunk& cc : ch.concats)
    for (const Piece& piece : cc.pieces) pointers.push_back(fmt::format("kiln::aligned16({})", ext_.at(piece.tensor).pointer));
  for (ir::TensorId t : ch.stores) pointers.push_back(fmt::format("kiln::aligned16({})", writes_.at(t)));
  ch.aligned = pointers.empty() ? "true" : fmt::format("{}", fmt::join(pointers, " && "));
  return ch;
}

auto KernelBuilder::chunked_concats(const Shape& domain, int vec) const -> std::vector<ConcatChunk> {
  std::vector<ConcatChunk> concats;
  const size_t axis = domain.size() - 1;
  for (int32_t oi : k_.ops) {
    const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
    const ir::Tensor& result = g_.result(op);
    if (ir::op_info(op.kind).family != ir::OpFamily::Concat || static_cast<size_t>(op.attrs.axis) != axis ||
        result.shape != domain)
      continue;
    ConcatChunk cc{op.output, {}};
    int64_t offset = 0;
    for (ir::TensorId t : op.inputs) {
      const Shape& shape = g_.tensor(t).shape;
      const int64_t width = shape[axis];
      const auto e = ext_.find(t);
      const bool chunked = e != ext_.end() && !sizes_.symbolic(width) && offset % vec == 0 && width % vec == 0 &&
                           e->second.storage == storage_dtype(result) && e->second.strides.back() == 1 &&
                           std::equal(shape.begin(), shape.end() - 1, domain.begin()) &&
                           std::all_of(e->second.strides.begin(), e->second.strides.end() - 1,
                                       [&](int64_t stride) { return stride % vec == 0; });
      if (!chunked) break;
      cc.pieces.push_back({t, offset, width});
      offset += width;
    }
    if (cc.pieces.size() == op.inputs.size()) concats.push_back(std::move(cc));
  }
  return concats;
}

static std::string storage_tag(DType storage) { return "kiln::Storage::" + std::string(to_string(storage)); }

void KernelBuilder::chunk_sources(const Chunking& ch, const Shape& domain, const Coords& c) {
  for (ir::TensorId t : ch.loads)
    em_.set_vector_source(t, Emitter::broadcast(g_.tensor(t).shape, domain, c), chunk_in(t), "v");
  for (const ConcatChunk& cc : ch.concats) em_.set_vector_source(cc.result, c, chunk_in_concat(cc.result), "v");
}

std::string KernelBuilder::chunk_load_calls(const Chunking& ch, const Shape& domain, const Coords& base,
                                            const std::string& element) {
  std::string out;
  for (ir::TensorId t : ch.loads) {
    if (element.find(chunk_in(t) + "[v]") == std::string::npos) continue;
    const ExternalTensor& e = ext_.at(t);
    const Shape& shape = g_.tensor(t).shape;
    out += fmt::format("float {}[{}];  // {}\n", chunk_in(t), ch.vec, g_.tensor(t).name);
    out += fmt::format("kiln::load_chunk<{}, {}>({}, {}, {}, kiln_vec);\n", storage_tag(e.storage), ch.vec, e.pointer,
                       em_.offset_of(e, shape, Emitter::broadcast(shape, domain, base)), chunk_in(t));
  }
  for (const ConcatChunk& cc : ch.concats) {  // (the chunk lies in one piece: its pointer and offset, one load)
    const std::string in = chunk_in_concat(cc.result);
    if (element.find(in + "[v]") == std::string::npos) continue;
    out += fmt::format("float {}[{}];  // {}\n{{\nconst void* piece;\nkiln::i64 at;\n", in, ch.vec, g_.tensor(cc.result).name);
    std::vector<std::string> branches;  // (the last piece takes what the others leave)
    for (const Piece& piece : cc.pieces) {
      const ExternalTensor& e = ext_.at(piece.tensor);
      Coords pc = base;
      pc.back() = em_.piece_coordinate(base.back(), piece.offset);
      const bool last = &piece == &cc.pieces.back();
      branches.push_back((last ? "" : fmt::format("if ({} < {}) ", base.back(), piece.offset + piece.width)) +
                         fmt::format("{{ piece = {}; at = {}; }}", e.pointer, em_.offset_of(e, g_.tensor(piece.tensor).shape, pc)));
    }
    out += fmt::format("{}\n", fmt::join(branches, " else "));
    out += fmt::format("kiln::load_chunk<{}, {}>(piece, at, {}, kiln_vec);\n}}\n", storage_tag(storage_dtype(g_.tensor(cc.result))),
                       ch.vec, in);
  }
  return out;
}

void KernelBuilder::element_writes(ir::TensorId leaf, const Coords& c, const Chunking& ch, std::set<ir::TensorId>& chunked,
                                   const std::set<ir::TensorId>& skip) {
  for (ir::TensorId t : k_.writes) {
    if (skip.count(t)) continue;
    const Coords tc = write_coords(leaf, c, t);
    const std::string& name = g_.tensor(t).name;
    if (tc == c && std::find(ch.stores.begin(), ch.stores.end(), t) != ch.stores.end()) {
      em_.emit(fmt::format("{}[v] = {};  // {}", chunk_out(t), em_.value(t, tc), name));
      chunked.insert(t);
    } else {
      em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + name);
    }
  }
}

std::string KernelBuilder::chunk_store_arrays(const Chunking& ch, const std::set<ir::TensorId>& chunked) const {
  std::string out;
  for (ir::TensorId t : chunked) out += fmt::format("float {}[{}];\n", chunk_out(t), ch.vec);
  return out;
}

std::string KernelBuilder::chunk_store_calls(const Chunking& ch, const std::set<ir::TensorId>& chunked,
                                             const std::string& offset) const {
  std::string out;
  for (ir::TensorId t : chunked)
    out += fmt::format("kiln::store_chunk<{}, {}>({}, {}, {}, kiln_vec);  // {}\n", storage_tag(storage_dtype(g_.tensor(t))),
                       ch.vec, writes_.at(t), offset, chunk_out(t), g_.tensor(t).name);
  return out;
}


std::optional<ExternalTensor> KernelBuilder::strided_in_memory(ir::TensorId t, bool transposes_and_reshapes_only) const {
  if (auto it = ext_.find(t); it != ext_.end()) return it->second;
  if (!computed_here(t)) return std::nullopt;
  const ir::Tensor& tensor = g_.tensor(t);
  const ir::Op& op = g_.ops[static_cast<size_t>(tensor.producer)];
  if (ir::op_info(op.kind).family != ir::OpFamily::View) return std::nullopt;
  if (transposes_and_reshapes_only && op.kind != OpKind::Transpose && op.kind != OpKind::Reshape) return std::nullopt;
  std::optional<ExternalTensor> base = strided_in_memory(op.inputs[0], transposes_and_reshapes_only);
  if (!base) return std::nullopt;
  const Shape& from = g_.operand(op, 0).shape;
  ExternalTensor e = *base;
  switch (op.kind) {
    case OpKind::Transpose:
      for (size_t d = 0; d < e.strides.size(); ++d) e.strides[d] = base->strides[static_cast<size_t>(op.attrs.perm[d])];
      return e;
    case OpKind::Slice: {
      const auto axis = static_cast<size_t>(op.attrs.axis);
      e.offset += op.attrs.start * e.strides[axis];
      e.strides[axis] *= op.attrs.step;
      return e;
    }
    case OpKind::Expand: {  // numpy broadcasting: new leading dimensions and size-1 ones repeat (stride 0)
      const size_t lead = tensor.shape.size() - from.size();
      e.strides.assign(tensor.shape.size(), 0);
      for (size_t d = 0; d < from.size(); ++d) e.strides[lead + d] = from[d] == 1 ? 0 : base->strides[d];
      return e;
    }
    case OpKind::Reshape: {
      std::optional<Strides> strides = ir::reshaped_strides(from, base->strides, tensor.shape);
      if (!strides) return std::nullopt;
      e.strides = *strides;
      return e;
    }
#define KILN_OP(kind, name, family, ...) KILN_CASE_UNLESS(family, View, kind)
#include "compiler/ops.def"
#undef KILN_OP
      break;  // not a view (returned above)
  }
  return std::nullopt;
}

namespace {

// `space` without repeats, in order.
std::vector<Tuning> without_repeats(const std::vector<Tuning>& space) {
  std::vector<Tuning> unique;
  for (const Tuning& t : space)
    if (std::find(unique.begin(), unique.end(), t) == unique.end()) unique.push_back(t);
  return unique;
}

}  // namespace

std::string KernelBuilder::tensor_map_param(ir::TensorId tensor, const TensorMapSpec& map, const std::string& what) {
  const std::string name = "p" + std::to_string(out_.args.size());
  params_.push_back(fmt::format("const __grid_constant__ kiln::TensorMap {}", name));
  param_notes_.push_back("tensor map of " + what);
  KernelArg arg{KernelArg::Role::TensorMap, tensor, -1};
  arg.map = map;
  if (sizes_.probe()) {  // (a symbolic graph: extents and strides as products of its sizes)
    if (sizes_.symbolic(static_cast<int64_t>(map.offset_bytes)))
      throw NotSymbolic(fmt::format("the tensor map of {} starts at an offset that depends on the sizes", what));
    for (int d = 0; d < map.rank; ++d) {
      arg.map.dim_exprs.push_back(sizes_.dim(static_cast<int64_t>(map.dims[static_cast<size_t>(d)])).expr());
      if (d + 1 < map.rank) arg.map.stride_exprs.push_back(sizes_.dim(static_cast<int64_t>(map.strides[static_cast<size_t>(d)])).expr());
    }
  }
  out_.args.push_back(arg);
  return name;
}

std::optional<ir::TensorId> KernelBuilder::tensor_behind(const std::string& pointer) const {
  for (const auto& [id, x] : ordered_externals())
    if (x.pointer == pointer) return id;
  return std::nullopt;
}

Tuning KernelBuilder::choose_tuning(const std::vector<Tuning>& space) {
  KILN_INTERNAL_CHECK(!space.empty());
  out_.tuning_space = without_repeats(space);
  const bool known = std::find(out_.tuning_space.begin(), out_.tuning_space.end(), wanted_) != out_.tuning_space.end();
  out_.tuning = known ? wanted_ : out_.tuning_space.front();
  return out_.tuning;
}

void KernelBuilder::restrict_tuning(const std::function<void(Tuning&)>& erase) {
  erase(out_.tuning);
  for (Tuning& t : out_.tuning_space) erase(t);
  out_.tuning_space = without_repeats(out_.tuning_space);
}

std::string KernelBuilder::finish(const std::string& body, int threads, const std::string& shared,
                   const std::string& includes) {
  if (!epilogue_decision_.empty()) decided(epilogue_decision_);
  std::string src;
  src += fmt::format("// kiln kernel {}: {} over {}\n", k_.id, ir::to_string(k_.kind),
                     state_.probe ? ir::with_symbols(k_.params.to_string(k_.kind), *state_.probe)
                                  : k_.params.to_string(k_.kind));
  // A symbolic graph's sizes, last: those the text reads.
  for (size_t symbol : sizes_.used()) {
    KernelArg arg{KernelArg::Role::Size};
    arg.symbol = static_cast<int>(symbol);
    out_.args.push_back(arg);
    params_.push_back(fmt::format("const kiln::i64 {}", size_param(symbol)));
    param_notes_.push_back("size " + state_.probe->table().symbols[symbol].name);
  }
  std::vector<std::string> names;
  for (int32_t oi : k_.ops) names.push_back(g_.result(g_.ops[static_cast<size_t>(oi)]).name);
  src += fmt::format("// ops: {}\n", fmt::join(names, ", "));
  src += "#include \"kiln/common.cuh\"\n" + includes + "\n";
  const std::string bounds = min_blocks_per_sm_ ? fmt::format("{}, {}", threads, min_blocks_per_sm_) : std::to_string(threads);
  src += fmt::format("extern \"C\" __global__ void {}__launch_bounds__({}) kiln_kernel(", kernel_attributes_, bounds);
  for (size_t i = 0; i < params_.size(); ++i)
    src += fmt::format("\n{}{}  // {}", params_[i], i + 1 < params_.size() ? "," : "", param_notes_[i]);
  // The Divisors of the sizes the kernel divides by (SizeText::quotient), made once.
  std::string divisors;
  for (size_t symbol : sizes_.divisors()) {
    const bool narrow = sizes_.probe()->table().symbols[symbol].max <= (int64_t{1} << 32);  // (every size's, in practice)
    divisors += fmt::format("const kiln::{} {}({});\n", narrow ? "NarrowDivisor" : "Divisor", divisor_name(symbol), size_param(symbol));
  }
  src += "\n) {\n" + divisors + shared + body + "}\n";
  src = Emitter::number_fresh_names(CodeWriter::lay_out(src));
  out_.source = src;
  out_.canonical = drop_comment_lines(src);
  out_.block = {static_cast<uint32_t>(threads), 1, 1};
  return src;
}

void KernelBuilder::grid_over(int64_t work, int64_t per_item, int64_t per_block, uint32_t multiplier) {
  out_.grid = {blocks_for(work / per_item, per_block) * multiplier, 1, 1};
  if (sizes_.symbolic(work)) out_.grid_rule = GridRule{sizes_.dim(work).expr(), per_item, per_block, multiplier};
}

void KernelBuilder::exact_grid(int64_t blocks, const std::string& too_many) {
  out_.grid[0] = static_cast<uint32_t>(blocks);
  if (!sizes_.symbolic(blocks)) return;
  if (!sizes_.known_below(blocks, kMaxGridBlocks + 1)) throw RangeLimit(too_many + " at the largest sizes");
  grid_over(blocks, 1, 1);
}

std::string KernelBuilder::pointer_of(ir::TensorId t) const {
  for (size_t i = 0; i < out_.args.size(); ++i)
    if (out_.args[i].tensor == t && out_.args[i].role != KernelArg::Role::Workspace) return "p" + std::to_string(i);
  KILN_UNREACHABLE("no parameter for a tensor");
}

std::string KernelBuilder::operand_value(const ir::Op& anchor, size_t slot, const Coords& coords) {
  const std::string v = em_.value(anchor.inputs[slot], coords);
  if (g_.operand(anchor, slot).value_dtype() != DType::f32) return v;
  switch (anchor.attrs.precision) {
    case ir::Precision::tf32: return "kiln::round_tf32(" + v + ")";
    case ir::Precision::bf16: return "kiln::round_bf16(" + v + ")";
    case ir::Precision::f16: return "kiln::round_f16(" + v + ")";
    case ir::Precision::f32: return v;
  }
  return v;
}

Coords KernelBuilder::broadcast_batch(const Coords& batch, const Shape& operand) {
  const size_t rank = operand.size() - 2;
  Coords c(rank);
  for (size_t d = 0; d < rank; ++d) c[d] = operand[d] == 1 ? "0" : batch[batch.size() - rank + d];
  return c;
}

}  // namespace kiln::codegen
