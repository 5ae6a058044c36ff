// What the generators of every kernel kind share: parameters, workspaces,
// where a written tensor's element lies, the kernel's frame.
#include "codegen/kernel_builder.h"

namespace kiln::codegen {

std::map<ir::TensorId, ExternalTensor> KernelBuilder::externals() {
  std::map<ir::TensorId, ExternalTensor> ext;
  for (ir::TensorId t : k_.reads) {
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
  const int index = state_.workspace(name, words, fill);
  if (reset_here) out_.reset_workspaces.push_back(index);
  return add_param({KernelArg::Role::Workspace, -1, index}, false, "workspace " + name);
}

std::string KernelBuilder::store(ir::TensorId t, const std::string& offset, const std::string& value) {
  return Emitter::store_call(storage_dtype(g_.tensor(t)), writes_.at(t), offset, value);
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

// Coordinates of a tensor that has `count` elements in the same linear
// order as `shape` at `coords`.
Coords KernelBuilder::same_element(const Coords& coords, const Shape& shape, const Shape& target) {
  if (shape == target) return coords;
  const std::string l = em_.fresh("l");
  em_.emit(fmt::format("const kiln::i64 {} = {};", l, em_.linearize(coords, shape)));
  return em_.delinearize(l, target);
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
      next = same_element(coords, g_.tensor(from).shape, out);
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
  if (std::optional<Coords> c = forward(leaf, t, leaf_coords)) return *c;
  return same_element(leaf_coords, g_.tensor(leaf).shape, g_.tensor(t).shape);
}

auto KernelBuilder::chunking(const Shape& domain, int64_t lane_extent) const -> Chunking {
  Chunking ch;
  if (domain.empty() || domain.back() == 1) return ch;
  int narrowest = 4;
  std::vector<ir::TensorId> loads;
  for (const auto& [t, e] : ext_) {
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
  std::vector<std::string> pointers;
  for (ir::TensorId t : ch.loads) pointers.push_back(fmt::format("kiln::aligned16({})", ext_.at(t).pointer));
  for (ir::TensorId t : ch.stores) pointers.push_back(fmt::format("kiln::aligned16({})", writes_.at(t)));
  ch.aligned = pointers.empty() ? "true" : fmt::format("{}", fmt::join(pointers, " && "));
  return ch;
}

static std::string storage_tag(DType storage) { return "kiln::Storage::" + std::string(to_string(storage)); }

void KernelBuilder::chunk_sources(const Chunking& ch, const Shape& domain, const Coords& c) {
  for (ir::TensorId t : ch.loads)
    em_.set_vector_source(t, Emitter::broadcast(g_.tensor(t).shape, domain, c), fmt::format("in{}", t), "v");
}

std::string KernelBuilder::chunk_load_calls(const Chunking& ch, const Shape& domain, const Coords& base,
                                            const std::string& element) {
  std::string out;
  for (ir::TensorId t : ch.loads) {
    if (element.find(fmt::format("in{}[v]", t)) == std::string::npos) continue;
    const ExternalTensor& e = ext_.at(t);
    const Shape& shape = g_.tensor(t).shape;
    out += fmt::format("float in{}[{}];  // {}\n", t, ch.vec, g_.tensor(t).name);
    out += fmt::format("kiln::load_chunk<{}, {}>({}, {}, in{}, kiln_vec);\n", storage_tag(e.storage), ch.vec, e.pointer,
                       em_.offset_of(e, shape, Emitter::broadcast(shape, domain, base)), t);
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
      em_.emit(fmt::format("out{}[v] = {};  // {}", t, em_.value(t, tc), name));
      chunked.insert(t);
    } else {
      em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + name);
    }
  }
}

std::string KernelBuilder::chunk_store_arrays(const Chunking& ch, const std::set<ir::TensorId>& chunked) const {
  std::string out;
  for (ir::TensorId t : chunked) out += fmt::format("float out{}[{}];\n", t, ch.vec);
  return out;
}

std::string KernelBuilder::chunk_store_calls(const Chunking& ch, const std::set<ir::TensorId>& chunked,
                                             const std::string& offset) const {
  std::string out;
  for (ir::TensorId t : chunked)
    out += fmt::format("kiln::store_chunk<{}, {}>({}, {}, out{}, kiln_vec);  // {}\n", storage_tag(storage_dtype(g_.tensor(t))),
                       ch.vec, writes_.at(t), offset, t, g_.tensor(t).name);
  return out;
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
  std::string src;
  src += fmt::format("// kiln kernel {}: {} over {}\n", k_.id, ir::to_string(k_.kind), k_.params.to_string(k_.kind));
  std::vector<std::string> names;
  for (int32_t oi : k_.ops) names.push_back(g_.result(g_.ops[static_cast<size_t>(oi)]).name);
  src += fmt::format("// ops: {}\n", fmt::join(names, ", "));
  src += "#include \"kiln/common.cuh\"\n" + includes + "\n";
  const std::string bounds = min_blocks_per_sm_ ? fmt::format("{}, {}", threads, min_blocks_per_sm_) : std::to_string(threads);
  src += fmt::format("extern \"C\" __global__ void {}__launch_bounds__({}) kiln_kernel(", kernel_attributes_, bounds);
  for (size_t i = 0; i < params_.size(); ++i)
    src += fmt::format("\n    {}{}  // {}", params_[i], i + 1 < params_.size() ? "," : "", param_notes_[i]);
  src += "\n) {\n" + shared + body + "}\n";
  out_.source = src;
  out_.canonical = drop_comment_lines(src);
  out_.block = {static_cast<uint32_t>(threads), 1, 1};
  return src;
}

}  // namespace kiln::codegen
