#include "codegen/kernel_codegen.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <tuple>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "codegen/emitter.h"
#include "compiler/error.h"

namespace kiln::codegen {
namespace {

using ir::OpKind;

constexpr int kThreads = 256;

uint32_t float_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

std::string reduce_functor(OpKind kind) {
  switch (kind) {
    case OpKind::ReduceMax: return "kiln::MaxOp";
    case OpKind::ReduceMin: return "kiln::MinOp";
    default: return "kiln::SumOp";
  }
}

uint32_t reduce_identity_bits(OpKind kind) {
  if (kind == OpKind::ReduceMax) return float_bits(-INFINITY);
  if (kind == OpKind::ReduceMin) return float_bits(INFINITY);
  return 0;
}

uint32_t blocks_for(int64_t work, int64_t per_block) {
  return static_cast<uint32_t>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, int64_t{1} << 20));
}

std::string drop_comment_lines(const std::string& source) {
  std::istringstream in(source);
  std::string line, out;
  while (std::getline(in, line)) {
    const size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, 2, "//") == 0) continue;
    // Trailing comments name tensors: drop them too.
    if (const size_t c = line.find("  // "); c != std::string::npos) line.resize(c);
    out += line + "\n";
  }
  return out;
}

// State shared by the kernels of one program (workspaces by name).
struct ProgramState {
  GeneratedProgram program;
  std::map<std::string, int> workspace_index;
  std::set<ir::TensorId> materialised;  // written by some kernel

  int workspace(const std::string& name, int64_t words, uint32_t fill) {
    auto it = workspace_index.find(name);
    if (it != workspace_index.end()) return it->second;
    const int index = static_cast<int>(program.workspaces.size());
    program.workspaces.push_back({name, words, fill});
    workspace_index[name] = index;
    return index;
  }
};

class KernelBuilder {
 public:
  KernelBuilder(const ir::Graph& g, const ir::PlannedKernel& k, ProgramState& state, int sm)
      : g_(g), k_(k), state_(state), sm_(sm), em_(g, std::set<int32_t>(k.ops.begin(), k.ops.end()), externals()) {
    out_.plan_kernel = k.id;
  }

  // ---- parameters ---------------------------------------------------------
  std::map<ir::TensorId, ExternalTensor> externals() {
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

  std::string add_param(KernelArg arg, bool read_only, const std::string& what) {
    const std::string name = "p" + std::to_string(out_.args.size());
    params_.push_back(fmt::format("{}void* __restrict__ {}", read_only ? "const " : "", name));
    param_notes_.push_back(what);
    out_.args.push_back(arg);
    return name;
  }

  std::string workspace_param(const std::string& name, int64_t words, uint32_t fill, bool reset_here) {
    const int index = state_.workspace(name, words, fill);
    if (reset_here) out_.reset_workspaces.push_back(index);
    return add_param({KernelArg::Role::Workspace, -1, index}, false, "workspace " + name);
  }

  std::string store(ir::TensorId t, const std::string& offset, const std::string& value) {
    return Emitter::store_call(storage_dtype(g_.tensor(t)), writes_.at(t), offset, value);
  }

  // ---- the pieces each kind needs ---------------------------------------------
  std::vector<const ir::Op*> ops_of(std::initializer_list<ir::OpFamily> families) const {
    std::vector<const ir::Op*> out;
    for (int32_t oi : k_.ops) {
      const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
      if (std::find(families.begin(), families.end(), ir::op_info(op.kind).family) != families.end()) out.push_back(&op);
    }
    return out;
  }

  // Tensors computed (in this kernel) from the results of `roots`.
  std::set<ir::TensorId> downstream_of(const std::set<ir::TensorId>& roots) const {
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
  Coords same_element(const Coords& coords, const Shape& shape, const Shape& target) {
    if (shape == target) return coords;
    const std::string l = em_.fresh("l");
    em_.emit(fmt::format("const kiln::i64 {} = {};", l, em_.linearize(coords, shape)));
    return em_.delinearize(l, target);
  }

  // The coordinates of `to` at the element where `from` has `coords`,
  // following this kernel's ops forward: views map coordinates, pointwise
  // ops keep them. nullopt when `to` is not computed from `from` here.
  std::optional<Coords> forward(ir::TensorId from, ir::TensorId to, const Coords& coords) {
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
  Coords write_coords(ir::TensorId leaf, const Coords& leaf_coords, ir::TensorId t) {
    if (std::optional<Coords> c = forward(leaf, t, leaf_coords)) return *c;
    return same_element(leaf_coords, g_.tensor(leaf).shape, g_.tensor(t).shape);
  }

  std::string finish(const std::string& body, int threads, const std::string& shared = "",
                     const std::string& includes = "") {
    std::string src;
    src += fmt::format("// kiln kernel {}: {} over {}\n", k_.id, ir::to_string(k_.kind), k_.params.to_string(k_.kind));
    std::vector<std::string> names;
    for (int32_t oi : k_.ops) names.push_back(g_.result(g_.ops[static_cast<size_t>(oi)]).name);
    src += fmt::format("// ops: {}\n", fmt::join(names, ", "));
    src += "#include \"kiln/common.cuh\"\n" + includes + "\n";
    src += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) kiln_kernel(", threads);
    for (size_t i = 0; i < params_.size(); ++i)
      src += fmt::format("\n    {}{}  // {}", params_[i], i + 1 < params_.size() ? "," : "", param_notes_[i]);
    src += "\n) {\n" + shared + body + "}\n";
    out_.source = src;
    out_.canonical = drop_comment_lines(src);
    out_.block = {static_cast<uint32_t>(threads), 1, 1};
    return src;
  }

  GeneratedKernel take() { return std::move(out_); }

  // ---- pointwise and copy ---------------------------------------------------------
  void pointwise() {
    KILN_INTERNAL_CHECK(!k_.writes.empty());
    const Shape domain = g_.tensor(k_.writes.front()).shape;
    const int64_t n = element_count(domain);
    std::string body = fmt::format("  const kiln::i64 n = {}LL;\n", n);
    const int vec = vector_width(domain);
    if (vec > 1) body += vector_loop(domain, vec);
    // The scalar loop: everything when not vectorised, else the tail (and any
    // call whose pointers are not 16-byte aligned).
    body += vec > 1 ? "  const kiln::i64 first = kiln_vector_done ? (n / " + std::to_string(vec) + "LL) * " + std::to_string(vec) + "LL : 0;\n"
                    : "  const kiln::i64 first = 0;\n";
    body += "  for (kiln::i64 i = first + (kiln::i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (kiln::i64)gridDim.x * blockDim.x) {\n";
    em_.begin_block();
    for (ir::TensorId t : k_.writes) {
      const Coords c = em_.delinearize("i", g_.tensor(t).shape);
      em_.emit(store(t, "i", em_.value(t, c)) + "  // " + g_.tensor(t).name);
    }
    body += em_.take(4) + "  }\n";
    finish(body, kThreads);
    out_.grid = {blocks_for(vec > 1 ? n / vec : n, kThreads), 1, 1};
  }

  // Elements per thread of the vectorised path (1: no vector path): 16 bytes
  // of the narrowest vectorised tensor (8 when any is 16-bit, so that every
  // vectorised tensor moves whole 16-byte words), when every written tensor
  // has the domain's shape and a floating storage type, and the domain has
  // some whole chunks.
  int vector_width(const Shape& domain) {
    int narrowest = 4;
    for (ir::TensorId t : k_.writes) {
      const ir::Tensor& tensor = g_.tensor(t);
      if (tensor.shape != domain || storage_dtype(tensor) == DType::boolean) return 1;
      narrowest = std::min(narrowest, byte_size(storage_dtype(tensor)));
    }
    for (ir::TensorId t : k_.reads) {
      const ir::Tensor& tensor = g_.tensor(t);
      const DType st = tensor.kind == ir::TensorKind::Input ? tensor.dtype : storage_dtype(tensor);
      if (tensor.shape == domain && tensor.strides == contiguous_strides(domain) && st != DType::boolean)
        narrowest = std::min(narrowest, byte_size(st));
    }
    const int v = 16 / narrowest;
    if (domain.empty() || element_count(domain) < 4 * v) return 1;
    return v;
  }

  std::string vector_loop(const Shape& domain, int vec) {
    // Tensors read at the domain's own index, contiguous: vector loads.
    std::vector<ir::TensorId> vector_reads;
    for (ir::TensorId t : k_.reads) {
      const ir::Tensor& tensor = g_.tensor(t);
      const DType st = tensor.kind == ir::TensorKind::Input ? tensor.dtype : storage_dtype(tensor);
      if (tensor.shape == domain && tensor.strides == contiguous_strides(domain) && st != DType::boolean)
        vector_reads.push_back(t);
    }
    std::vector<std::string> pointers;
    for (ir::TensorId t : vector_reads) pointers.push_back(pointer_of(t));
    for (ir::TensorId t : k_.writes) pointers.push_back(writes_.at(t));
    std::string aligned;
    for (const std::string& p : pointers) aligned += (aligned.empty() ? "" : " && ") + fmt::format("kiln::aligned16({})", p);
    std::string body = fmt::format("  const bool kiln_vector_done = {};\n  if (kiln_vector_done) {{\n", aligned.empty() ? "true" : aligned);
    body += fmt::format("    for (kiln::i64 i0 = ((kiln::i64)blockIdx.x * blockDim.x + threadIdx.x) * {0}LL; i0 + {0}LL <= n; "
                        "i0 += (kiln::i64)gridDim.x * blockDim.x * {0}LL) {{\n", vec);
    em_.begin_block();
    // Coordinates once per chunk when the chunk stays within the last axis.
    const bool chunk_in_row = domain.back() % vec == 0;
    Coords base;
    if (chunk_in_row) base = em_.delinearize("i0", domain);
    for (ir::TensorId t : vector_reads) {
      const ir::Tensor& tensor = g_.tensor(t);
      const DType st = tensor.kind == ir::TensorKind::Input ? tensor.dtype : storage_dtype(tensor);
      em_.emit(fmt::format("float in{}[{}];  // {}", t, vec, tensor.name));
      em_.emit(fmt::format("kiln::load_vec_{}<{}>({}, i0, in{});", to_string(st), vec, pointer_of(t), t));
    }
    for (ir::TensorId t : k_.writes) em_.emit(fmt::format("float out{}[{}];", t, vec));
    body += em_.take(6);
    body += fmt::format("#pragma unroll\n      for (int j = 0; j < {}; ++j) {{\n", vec);
    em_.begin_block();
    Coords c;
    if (chunk_in_row) {
      c = base;
      c.back() = "(" + base.back() + " + j)";
    } else {
      em_.emit("const kiln::i64 i = i0 + j;");
      c = em_.delinearize("i", domain);
    }
    for (ir::TensorId t : vector_reads) em_.set_vector_source(t, c, fmt::format("in{}", t), "j");
    for (ir::TensorId t : k_.writes) em_.emit(fmt::format("out{}[j] = {};  // {}", t, em_.value(t, c), g_.tensor(t).name));
    em_.clear_vector_sources();
    body += em_.take(8) + "      }\n";
    for (ir::TensorId t : k_.writes)
      body += fmt::format("      kiln::store_vec_{}<{}>({}, i0, out{});\n", to_string(storage_dtype(g_.tensor(t))), vec,
                          writes_.at(t), t);
    body += "    }\n  }\n";
    return body;
  }

  std::string pointer_of(ir::TensorId t) const {
    for (size_t i = 0; i < out_.args.size(); ++i)
      if (out_.args[i].tensor == t && out_.args[i].role != KernelArg::Role::Workspace) return "p" + std::to_string(i);
    KILN_UNREACHABLE("no parameter for a tensor");
  }

  // The finished reductions (accumulator `acc_format` of reduction j, the
  // kept element's linear index in `k`) and every write after them: means
  // divided, results rounded as the graph says, post-reduction ops at the
  // matching elements.
  std::string reduction_results(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post,
                                int64_t reduced, const std::string& acc_format, int indent) {
    for (size_t j = 0; j < reduces.size(); ++j) {
      const ir::Tensor& out = g_.result(*reduces[j]);
      std::string v = fmt::format(fmt::runtime(acc_format), j);
      if (reduces[j]->kind == OpKind::ReduceMean) v = fmt::format("({} / {})", v, Emitter::float_literal(static_cast<float>(reduced)));
      const std::string name = em_.fresh("r");
      em_.emit(fmt::format("const float {} = {};  // {}", name, em_.rounded(out, v), out.name));
      em_.set_leaf(reduces[j]->output, name);
    }
    for (ir::TensorId t : k_.writes) {
      if (!post.count(t)) continue;
      std::optional<Coords> tc;
      for (const ir::Op* r : reduces)
        if (!tc) tc = forward(r->output, t, em_.delinearize("k", g_.result(*r).shape));
      KILN_INTERNAL_CHECK(tc.has_value());
      em_.emit(store(t, em_.linearize(*tc, g_.tensor(t).shape), em_.value(t, *tc)) + "  // " + g_.tensor(t).name);
    }
    return em_.take(indent);
  }

  // ---- reductions (block per kept element) ----------------------------------------
  void reduction() {
    const auto reduces = ops_of({ir::OpFamily::Reduce});
    const auto pools = ops_of({ir::OpFamily::Pool});
    if (!pools.empty()) return pooling(*pools.front());
    for (int32_t oi : k_.ops)  // the row statistics of a split normalisation
      if (const ir::Op& op = g_.ops[static_cast<size_t>(oi)]; op.kind == OpKind::LayerNorm || op.kind == OpKind::RmsNorm)
        return norm_statistics(op);
    KILN_INTERNAL_CHECK(!reduces.empty());
    const ir::Op& first = *reduces.front();
    const Shape& d = g_.operand(first, 0).shape;
    const auto& axes = first.attrs.axes;
    Shape kept_shape, reduced_shape;
    for (size_t i = 0; i < d.size(); ++i)
      (std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i)) ? reduced_shape : kept_shape).push_back(d[i]);
    const int64_t kept = element_count(kept_shape), reduced = element_count(reduced_shape);
    std::set<ir::TensorId> reduce_outs;
    for (const ir::Op* r : reduces) reduce_outs.insert(r->output);
    const std::set<ir::TensorId> post = downstream_of(reduce_outs);
    const bool contiguous_axes = axes.back() - axes.front() + 1 == static_cast<int64_t>(axes.size());
    int64_t inner = 1;
    for (size_t i = static_cast<size_t>(axes.back()) + 1; i < d.size(); ++i) inner *= d[i];
    if (contiguous_axes && inner >= 32) return column_reduction(reduces, post, d, kept_shape, reduced_shape, inner);

    // Few kept elements over a long axis: split the axis over gridDim.y
    // blocks, combine their partials atomically, and let the last block
    // finish (post-reduction ops included).
    const int64_t splits = kept < 256 && reduced >= 65536 ? std::min<int64_t>((512 + kept - 1) / kept, reduced / 16384) : 1;
    const int64_t slice = (reduced + splits - 1) / splits;
    std::vector<std::string> partials;
    std::string counter;
    if (splits > 1) {
      for (const ir::Op* r : reduces)
        partials.push_back(workspace_param(g_.result(*r).name + ".partial", kept, reduce_identity_bits(r->kind), true));
      counter = workspace_param(g_.result(first).name + ".splits_done", 1, 0, true);
    }
    std::string body = "  __shared__ float kiln_scratch[32];\n";
    body += fmt::format("  for (kiln::i64 k = blockIdx.x; k < {}LL; k += gridDim.x) {{\n", kept);
    const Coords kc = em_.delinearize("k", kept_shape);
    for (size_t j = 0; j < reduces.size(); ++j)
      em_.emit(fmt::format("float acc{} = {}::identity();  // {}", j, reduce_functor(reduces[j]->kind),
                           g_.result(*reduces[j]).name));
    body += em_.take(4);
    if (splits > 1)
      body += fmt::format("    for (kiln::i64 r = blockIdx.y * {0}LL + threadIdx.x; r < min((kiln::i64)(blockIdx.y + 1) * {0}LL, {1}LL); "
                          "r += blockDim.x) {{\n", slice, reduced);
    else
      body += fmt::format("    for (kiln::i64 r = threadIdx.x; r < {}LL; r += blockDim.x) {{\n", reduced);
    em_.begin_block();
    const Coords rc = em_.delinearize("r", reduced_shape);
    Coords full(d.size());
    for (size_t i = 0, ki = 0, ri = 0; i < d.size(); ++i)
      full[i] = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i)) ? rc[ri++] : kc[ki++];
    for (size_t j = 0; j < reduces.size(); ++j)
      em_.emit(fmt::format("acc{0} = {1}::combine(acc{0}, {2});", j, reduce_functor(reduces[j]->kind),
                           em_.value(reduces[j]->inputs[0], full)));
    for (ir::TensorId t : k_.writes) {
      if (post.count(t)) continue;
      const Coords tc = same_element(full, d, g_.tensor(t).shape);
      em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + g_.tensor(t).name);
    }
    body += em_.take(6) + "    }\n";
    for (size_t j = 0; j < reduces.size(); ++j)
      body += fmt::format("    acc{0} = kiln::block_reduce<{1}>(acc{0}, kiln_scratch);\n", j, reduce_functor(reduces[j]->kind));
    if (splits > 1) {
      body += "    if (threadIdx.x == 0) {\n";
      for (size_t j = 0; j < reduces.size(); ++j)
        body += fmt::format("      kiln::atomic_combine({}(), static_cast<float*>({}) + k, acc{});\n",
                            reduce_functor(reduces[j]->kind), partials[j], j);
      body += "    }\n  }\n";
      body += "  __threadfence();\n  __syncthreads();\n  __shared__ bool kiln_last;\n";
      body += fmt::format("  if (threadIdx.x == 0) kiln_last = atomicAdd(static_cast<unsigned int*>({}), 1u) == "
                          "gridDim.x * gridDim.y - 1;\n", counter);
      body += "  __syncthreads();\n  if (!kiln_last) return;\n  __threadfence();\n";
      body += fmt::format("  for (kiln::i64 k = threadIdx.x; k < {}LL; k += blockDim.x) {{\n", kept);
      for (size_t j = 0; j < reduces.size(); ++j)
        body += fmt::format("    const float acc{} = static_cast<volatile float*>({})[k];\n", j, partials[j]);
      body += "    {\n";
    } else {
      body += "    if (threadIdx.x == 0) {\n";
    }
    em_.begin_block();
    body += reduction_results(reduces, post, reduced, "acc{}", 6) + "    }\n  }\n";
    finish(body, kThreads);
    out_.grid = {blocks_for(kept, 1), static_cast<uint32_t>(splits), 1};
  }

  // Reductions over axes outside a contiguous inner block of >= 32
  // elements ([outer, reduced, inner], e.g. per-channel statistics of NHWC):
  // threads own V adjacent inner columns (16-byte loads where the inner
  // block is the last axis and the pointers are aligned), several row lanes
  // per block, the reduced axis split over gridDim.y when the columns alone
  // would not fill the GPU. Split partials are combined atomically; the last
  // block of each column block finishes its columns (post-reduction ops
  // included).
  void column_reduction(const std::vector<const ir::Op*>& reduces, const std::set<ir::TensorId>& post, const Shape& d,
                        const Shape& kept_shape, const Shape& reduced_shape, int64_t inner) {
    const ir::Op& first = *reduces.front();
    const auto& axes = first.attrs.axes;
    const int64_t kept = element_count(kept_shape), reduced = element_count(reduced_shape), outer = kept / inner;
    // Vector sources: tensors read at the reduction's own index, contiguous.
    std::vector<ir::TensorId> vector_reads;
    int narrowest = 4;
    for (const auto& [id, e] : ext_) {
      const ir::Tensor& t = g_.tensor(id);
      if (t.shape == d && e.strides == contiguous_strides(d) && e.storage != DType::boolean) {
        vector_reads.push_back(id);
        narrowest = std::min(narrowest, byte_size(e.storage));
      }
    }
    const bool inner_is_last = axes.back() + 2 == static_cast<int64_t>(d.size());
    const int vec = !vector_reads.empty() && inner_is_last && inner % (16 / narrowest) == 0 ? 16 / narrowest : 1;
    const int64_t vec_cols = inner / vec;  // threads' column groups per outer index
    // Columns per block: a power of two from 32 to 256, so that row lanes x columns is exactly the block.
    const int cols = static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(vec_cols))), 32, 256));
    const int lanes = 256 / cols;
    const int64_t per_outer = (vec_cols + cols - 1) / cols, col_blocks = outer * per_outer;
    const int64_t splits = std::clamp<int64_t>((1024 + col_blocks - 1) / col_blocks, 1,
                                               std::max<int64_t>(1, reduced / (16 * lanes)));
    const int64_t slice = (reduced + splits - 1) / splits;
    KILN_USER_CHECK(col_blocks < (int64_t{1} << 31) && splits <= 65535, "{}: too many column blocks for this reduction kernel",
                    g_.describe(static_cast<int32_t>(k_.ops.front())));
    std::vector<std::string> partials;
    std::string counter;
    if (splits > 1) {
      for (const ir::Op* r : reduces)
        partials.push_back(workspace_param(g_.result(*r).name + ".partial", kept, reduce_identity_bits(r->kind), true));
      counter = workspace_param(g_.result(first).name + ".splits_done", col_blocks, 0, true);
    }
    std::string body = fmt::format("  __shared__ float kiln_lanes[{}][{}][{}];\n", reduces.size() * vec, lanes, cols);
    body += fmt::format("  const int col = threadIdx.x % {}, lane = threadIdx.x / {};\n", cols, cols);
    body += fmt::format("  const kiln::i64 a = blockIdx.x / {0}LL, c = ((blockIdx.x % {0}LL) * {1} + col) * {2};\n", per_outer, cols,
                        vec);
    body += fmt::format("  const kiln::i64 k0 = a * {}LL + c;\n", inner);
    for (size_t j = 0; j < reduces.size(); ++j)
      body += fmt::format("  float acc{}[{}];  // {}\n#pragma unroll\n  for (int v = 0; v < {}; ++v) acc{}[v] = {}::identity();\n", j,
                          vec, g_.result(*reduces[j]).name, vec, j, reduce_functor(reduces[j]->kind));
    body += fmt::format("  if (c < {}LL) {{\n", inner);
    body += fmt::format("    const kiln::i64 r_end = min((kiln::i64)(blockIdx.y + 1) * {0}LL, {1}LL);\n", slice, reduced);
    // The loop over rows; `vectors`: with 16-byte loads.
    auto row_loop = [&](bool vectors) {
      std::string out = fmt::format("#pragma unroll 4\n    for (kiln::i64 r = blockIdx.y * {}LL + lane; r < r_end; r += {}) {{\n", slice, lanes);
      em_.begin_block();
      const Coords rc = em_.delinearize("r", reduced_shape);
      auto full_at = [&](const std::string& k) {
        const Coords kc = em_.delinearize(k, kept_shape);
        Coords full(d.size());
        for (size_t i = 0, ki = 0, ri = 0; i < d.size(); ++i)
          full[i] = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(i)) ? rc[ri++] : kc[ki++];
        return full;
      };
      if (vectors) {
        const Coords base = full_at("k0");
        for (ir::TensorId t : vector_reads) {
          const ExternalTensor& e = ext_.at(t);
          em_.emit(fmt::format("float in{}[{}];  // {}", t, vec, g_.tensor(t).name));
          em_.emit(fmt::format("kiln::load_vec_{}<{}>({}, {}, in{});", to_string(e.storage), vec, e.pointer,
                               em_.linearize(base, d), t));
        }
        out += em_.take(6);
      }
      out += fmt::format("#pragma unroll\n      for (int v = 0; v < {}; ++v) {{\n        const kiln::i64 k = k0 + v;\n", vec);
      em_.begin_block();
      const Coords full = full_at("k");
      if (vectors)
        for (ir::TensorId t : vector_reads) em_.set_vector_source(t, full, fmt::format("in{}", t), "v");
      for (size_t j = 0; j < reduces.size(); ++j)
        em_.emit(fmt::format("acc{0}[v] = {1}::combine(acc{0}[v], {2});", j, reduce_functor(reduces[j]->kind),
                             em_.value(reduces[j]->inputs[0], full)));
      for (ir::TensorId t : k_.writes) {
        if (post.count(t)) continue;
        const Coords tc = same_element(full, d, g_.tensor(t).shape);
        em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + g_.tensor(t).name);
      }
      em_.clear_vector_sources();
      out += em_.take(8) + "      }\n    }\n";
      return out;
    };
    if (vec > 1) {
      std::string aligned;
      for (ir::TensorId t : vector_reads) aligned += (aligned.empty() ? "" : " && ") + fmt::format("kiln::aligned16({})", ext_.at(t).pointer);
      body += fmt::format("    if ({}) {{\n", aligned) + row_loop(true) + "    } else {\n" + row_loop(false) + "    }\n  }\n";
    } else {
      body += row_loop(false) + "  }\n";
    }
    // Row lanes -> lane 0.
    body += fmt::format("#pragma unroll\n  for (int v = 0; v < {}; ++v) {{\n", vec);
    for (size_t j = 0; j < reduces.size(); ++j) body += fmt::format("    kiln_lanes[{} + v][lane][col] = acc{}[v];\n", j * vec, j);
    body += "  }\n  __syncthreads();\n";
    body += fmt::format("  if (lane == 0 && c < {}LL) {{\n#pragma unroll\n    for (int v = 0; v < {}; ++v) {{\n", inner, vec);
    for (size_t j = 0; j < reduces.size(); ++j)
      body += fmt::format("      for (int l = 1; l < {}; ++l) acc{}[v] = {}::combine(acc{}[v], kiln_lanes[{} + v][l][col]);\n", lanes, j,
                          reduce_functor(reduces[j]->kind), j, j * vec);
    auto finish_columns = [&](int indent) {
      em_.begin_block();
      em_.emit("const kiln::i64 k = k0 + v;");
      return reduction_results(reduces, post, reduced, "acc{}[v]", indent);
    };
    if (splits == 1) {
      body += finish_columns(6) + "    }\n  }\n";
    } else {
      for (size_t j = 0; j < reduces.size(); ++j)
        body += fmt::format("      kiln::atomic_combine({}(), static_cast<float*>({}) + k0 + v, acc{}[v]);\n",
                            reduce_functor(reduces[j]->kind), partials[j], j);
      body += "    }\n  }\n  __threadfence();\n  __syncthreads();\n  __shared__ bool kiln_last;\n";
      body += fmt::format("  if (threadIdx.x == 0) kiln_last = atomicAdd(static_cast<unsigned int*>({}) + blockIdx.x, 1u) == gridDim.y - 1;\n",
                          counter);
      body += "  __syncthreads();\n  if (!kiln_last) return;\n  __threadfence();\n";
      body += fmt::format("  if (lane == 0 && c < {}LL) {{\n#pragma unroll\n    for (int v = 0; v < {}; ++v) {{\n", inner, vec);
      for (size_t j = 0; j < reduces.size(); ++j)
        body += fmt::format("      acc{0}[v] = static_cast<volatile float*>({1})[k0 + v];\n", j, partials[j]);
      body += finish_columns(6) + "    }\n  }\n";
    }
    finish(body, 256);
    out_.grid = {static_cast<uint32_t>(col_blocks), static_cast<uint32_t>(splits), 1};
  }

  void pooling(const ir::Op& pool) {
    const ir::Tensor& in = g_.operand(pool, 0);
    const ir::Tensor& out = g_.result(pool);
    const ir::Attributes& a = pool.attrs;
    const bool nhwc = a.layout == ir::Layout::NHWC;
    const bool is_max = pool.kind == OpKind::MaxPool2d;
    const int64_t h = nhwc ? in.shape[1] : in.shape[2], w = nhwc ? in.shape[2] : in.shape[3];
    const int64_t count = element_count(out.shape);
    std::string body = fmt::format("  for (kiln::i64 i = (kiln::i64)blockIdx.x * blockDim.x + threadIdx.x; i < {}LL; "
                                   "i += (kiln::i64)gridDim.x * blockDim.x) {{\n", count);
    const Coords oc = em_.delinearize("i", out.shape);
    const std::string &n = oc[0], &c = nhwc ? oc[3] : oc[1], &p = nhwc ? oc[1] : oc[2], &q = nhwc ? oc[2] : oc[3];
    em_.emit(fmt::format("float acc = {};", is_max ? "kiln::MaxOp::identity()" : "0.0f"));
    em_.emit("int inside = 0;");
    body += em_.take(4);
    body += fmt::format("    for (int dr = 0; dr < {}; ++dr) for (int ds = 0; ds < {}; ++ds) {{\n", a.kernel[0], a.kernel[1]);
    body += fmt::format("      const kiln::i64 hi = {} * {}LL - {}LL + dr, wi = {} * {}LL - {}LL + ds;\n", p, a.stride[0],
                        a.padding[0], q, a.stride[1], a.padding[1]);
    body += fmt::format("      if (hi < 0 || hi >= {}LL || wi < 0 || wi >= {}LL) continue;\n", h, w);
    em_.begin_block();
    const Coords ic = nhwc ? Coords{n, "hi", "wi", c} : Coords{n, c, "hi", "wi"};
    const std::string v = em_.value(pool.inputs[0], ic);
    em_.emit(is_max ? fmt::format("acc = kiln::MaxOp::combine(acc, {});", v) : fmt::format("acc += {};", v));
    em_.emit("++inside;");
    body += em_.take(6) + "    }\n";
    em_.begin_block();
    const std::string div = a.count_include_pad ? Emitter::float_literal(static_cast<float>(a.kernel[0] * a.kernel[1]))
                                                : "(float)inside";
    em_.emit(fmt::format("const float pooled = {};  // {}", em_.rounded(out, is_max ? "acc" : "(acc / " + div + ")"), out.name));
    em_.set_leaf(pool.output, "pooled");
    const std::set<ir::TensorId> post = downstream_of({pool.output});
    for (ir::TensorId t : k_.writes) {
      if (!post.count(t)) continue;  // values before the pool: written below, over their own elements
      const Coords tc = write_coords(pool.output, oc, t);
      em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + g_.tensor(t).name);
    }
    body += em_.take(4) + "  }\n";
    // Tensors the kernel computes before the pool (its input's space, not
    // the pool's output's): every element, in a loop of their own.
    for (ir::TensorId t : k_.writes) {
      if (post.count(t)) continue;
      const int64_t n = element_count(g_.tensor(t).shape);
      body += fmt::format("  for (kiln::i64 i = (kiln::i64)blockIdx.x * blockDim.x + threadIdx.x; i < {}LL; "
                          "i += (kiln::i64)gridDim.x * blockDim.x) {{\n", n);
      em_.begin_block();
      const Coords tc = em_.delinearize("i", g_.tensor(t).shape);
      em_.emit(store(t, "i", em_.value(t, tc)) + "  // " + g_.tensor(t).name);
      body += em_.take(4) + "  }\n";
    }
    finish(body, kThreads);
    int64_t widest = count;
    for (ir::TensorId t : k_.writes) widest = std::max(widest, element_count(g_.tensor(t).shape));
    out_.grid = {blocks_for(widest, kThreads), 1, 1};
  }

  // The row statistics of a layer_norm/rms_norm whose application is the
  // prologue of a matmul: [rows][2] floats (mean, rstd) in a workspace.
  void norm_statistics(const ir::Op& norm) {
    const ir::Tensor& x = g_.operand(norm, 0);
    const int64_t rows = element_count(x.shape) / x.shape.back(), n = x.shape.back();
    const std::string stats = workspace_param(g_.result(norm).name + ".rowstats", rows * 2, 0, false);
    const bool rms = norm.kind == OpKind::RmsNorm;
    const std::string count = Emitter::float_literal(static_cast<float>(n));
    std::string body = "  __shared__ float kiln_scratch[32];\n";
    body += fmt::format("  float* stats = static_cast<float*>({});\n", stats);
    body += fmt::format("  for (kiln::i64 row = blockIdx.x; row < {}LL; row += gridDim.x) {{\n", rows);
    body += "    float mean = 0.0f, var = 0.0f;\n";
    if (rms) {
      body += row_pass(norm.inputs[0], x.shape, n, "sum += x * x;", fmt::format("var = sum / {};", count));
    } else {
      body += row_pass(norm.inputs[0], x.shape, n, "sum += x;", fmt::format("mean = sum / {};", count));
      body += row_pass(norm.inputs[0], x.shape, n, "sum += (x - mean) * (x - mean);", fmt::format("var = sum / {};", count));
    }
    body += fmt::format("    if (threadIdx.x == 0) {{ stats[2 * row] = mean; stats[2 * row + 1] = 1.0f / sqrtf(var + {}); }}\n",
                        Emitter::float_literal(norm.attrs.eps));
    body += "  }\n";
    finish(body, kThreads);
    out_.grid = {blocks_for(rows, 1), 1, 1};
  }

  // A block-wide sum over a last-axis row of x: `update` accumulates into
  // `sum` from `x`; `assign` uses the total.
  std::string row_pass(ir::TensorId x, const Shape& shape, int64_t n, const std::string& update,
                       const std::string& assign) {
    std::string body = "    {\n      float sum = 0.0f;\n";
    body += fmt::format("      for (kiln::i64 j = threadIdx.x; j < {}LL; j += blockDim.x) {{\n", n);
    em_.begin_block();
    em_.emit(fmt::format("const kiln::i64 e = row * {}LL + j;", n));
    em_.emit(fmt::format("const float x = {};", em_.value(x, em_.delinearize("e", shape))));
    em_.emit(update);
    body += em_.take(8) + "      }\n";
    body += "      sum = kiln::block_reduce<kiln::SumOp>(sum, kiln_scratch);\n      " + assign + "\n    }\n";
    return body;
  }

  // ---- normalisations: a block per row (or group) ------------------------------
  // Element j of line `line` of a normalisation -> coordinates of its input.
  Coords norm_element(const ir::Op& norm, const std::string& j) {
    const ir::Tensor& x = g_.operand(norm, 0);
    const ir::KernelParams& p = k_.params;
    const auto axis = static_cast<size_t>(norm.attrs.axis);
    const std::string e = em_.fresh("e");
    if (norm.kind == OpKind::Softmax || norm.kind == OpKind::LogSoftmax) {
      em_.emit(fmt::format("const kiln::i64 {1} = ((line / {0}LL) * {2}LL + {3}) * {0}LL + (line % {0}LL);", p.inner, e,
                           p.reduced, j));
      return em_.delinearize(e, x.shape);
    }
    if (norm.kind == OpKind::GroupNorm) {
      const int64_t channels = x.shape[axis], per_group = channels / norm.attrs.groups;
      Shape rest;
      for (size_t d = 1; d < x.shape.size(); ++d)
        if (d != axis) rest.push_back(x.shape[d]);
      em_.emit(fmt::format("const kiln::i64 {} = {} / {}LL;", e, j, per_group));
      const Coords rc = em_.delinearize(e, rest);
      Coords c(x.shape.size());
      c[0] = em_.fresh("c");
      em_.emit(fmt::format("const kiln::i64 {} = line / {}LL;", c[0], norm.attrs.groups));
      c[axis] = em_.fresh("c");
      em_.emit(fmt::format("const kiln::i64 {} = (line % {}LL) * {}LL + {} % {}LL;", c[axis], norm.attrs.groups, per_group,
                           j, per_group));
      for (size_t d = 1, r = 0; d < x.shape.size(); ++d)
        if (d != axis) c[d] = rc[r++];
      return c;
    }
    em_.emit(fmt::format("const kiln::i64 {} = line * {}LL + {};", e, p.reduced, j));
    return em_.delinearize(e, x.shape);
  }

  // The normalised value of `x` with its parameters, named "y", and the
  // stores of everything the kernel writes at this element.
  std::string norm_output(const ir::Op& norm, const Coords& c, const std::string& finale) {
    const auto axis = static_cast<size_t>(norm.attrs.axis);
    std::string e = "(" + finale + ")";
    if (norm.kind == OpKind::LayerNorm || norm.kind == OpKind::RmsNorm) {
      const Coords wc(c.begin() + static_cast<ptrdiff_t>(axis), c.end());
      if (norm.inputs.size() > 1) e = fmt::format("({} * {})", e, em_.value(norm.inputs[1], wc));
      if (norm.inputs.size() > 2) e = fmt::format("({} + {})", e, em_.value(norm.inputs[2], wc));
    } else if (norm.kind == OpKind::GroupNorm) {
      const Coords cc{c[axis]};
      if (norm.inputs.size() > 1) e = fmt::format("({} * {})", e, em_.value(norm.inputs[1], cc));
      if (norm.inputs.size() > 2) e = fmt::format("({} + {})", e, em_.value(norm.inputs[2], cc));
    }
    const ir::Tensor& y = g_.result(norm);
    em_.emit(fmt::format("const float y = {};  // {}", em_.rounded(y, e), y.name));
    em_.set_leaf(norm.output, "y");
    for (ir::TensorId t : k_.writes) {
      const Coords tc = write_coords(norm.output, c, t);
      em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + g_.tensor(t).name);
    }
    return em_.take(0);
  }

  // The statistics: what to accumulate from `x` in which pass, how to
  // finish each pass into stat0/stat1, and the output from x and the stats.
  struct NormRecipe {
    std::vector<std::tuple<std::string, std::string, std::string, std::string>> passes;  // init, functor, update, finish
    std::string finale;
  };
  NormRecipe norm_recipe(const ir::Op& norm) {
    const std::string count = Emitter::float_literal(static_cast<float>(k_.params.reduced));
    const std::string eps = Emitter::float_literal(norm.attrs.eps);
    switch (norm.kind) {
      case OpKind::Softmax:
      case OpKind::LogSoftmax:
        return {{{"kiln::MaxOp::identity()", "kiln::MaxOp", "acc = kiln::MaxOp::combine(acc, x);", "stat0 = acc;"},
                 {"0.0f", "kiln::SumOp", "acc += expf(x - stat0);", "stat1 = acc;"}},
                norm.kind == OpKind::Softmax ? "expf(x - stat0) / stat1" : "x - stat0 - logf(stat1)"};
      case OpKind::LayerNorm:
      case OpKind::GroupNorm:
        return {{{"0.0f", "kiln::SumOp", "acc += x;", fmt::format("stat0 = acc / {};", count)},
                 {"0.0f", "kiln::SumOp", "acc += (x - stat0) * (x - stat0);",
                  fmt::format("stat1 = 1.0f / sqrtf(acc / {} + {});", count, eps)}},
                "(x - stat0) * stat1"};
      case OpKind::RmsNorm:
        return {{{"0.0f", "kiln::SumOp", "acc += x * x;", fmt::format("stat1 = 1.0f / sqrtf(acc / {} + {});", count, eps)}},
                "x * stat1"};
      default:
        KILN_UNREACHABLE("not a normalisation kernel");
    }
  }

  void norm() {
    const ir::Op* norm = nullptr;
    for (int32_t oi : k_.ops)
      if (const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
          ir::op_info(op.kind).family == ir::OpFamily::Norm && op.kind != OpKind::BatchNorm)
        norm = &op;
    KILN_INTERNAL_CHECK(norm != nullptr);
    const ir::KernelParams& p = k_.params;
    const int64_t lines = p.outer * p.inner, n = p.reduced;
    const NormRecipe recipe = norm_recipe(*norm);
    // Registers bound it: at most 512 threads (128 registers each) holding at
    // most 32 values each (the planner's Block bound, 16384).
    const bool persistent = (p.row == ir::RowStrategy::Warp || p.row == ir::RowStrategy::Block) && n <= 16384;
    std::string body = "  __shared__ float kiln_scratch[32];\n";
    body += fmt::format("  for (kiln::i64 line = blockIdx.x; line < {}LL; line += gridDim.x) {{\n", lines);
    body += "    float stat0 = 0.0f, stat1 = 0.0f;\n";
    int threads = kThreads;
    if (persistent) {
      // The row lives in registers: one read, statistics from registers, one write.
      threads = static_cast<int>(std::clamp<int64_t>(std::bit_ceil(static_cast<uint64_t>((n + 15) / 16)), 32, 512));
      const int64_t per = (n + threads - 1) / threads;
      body += fmt::format("    float xs[{}];\n#pragma unroll\n    for (int t = 0; t < {}; ++t) {{\n", per, per);
      body += fmt::format("      const kiln::i64 j = threadIdx.x + t * {}LL;\n      xs[t] = 0.0f;\n      if (j < {}LL) {{\n", threads, n);
      em_.begin_block();
      const Coords c = norm_element(*norm, "j");
      em_.emit(fmt::format("xs[t] = {};", em_.value(norm->inputs[0], c)));
      body += em_.take(8) + "      }\n    }\n";
      for (const auto& [init, functor, update, finish] : recipe.passes) {
        body += fmt::format("    {{\n      float acc = {};\n#pragma unroll\n      for (int t = 0; t < {}; ++t) {{\n", init, per);
        body += fmt::format("        if (threadIdx.x + t * {}LL >= {}LL) continue;\n        const float x = xs[t];\n        {}\n      }}\n",
                            threads, n, update);
        body += fmt::format("      acc = kiln::block_reduce<{}>(acc, kiln_scratch);\n      {}\n    }}\n", functor, finish);
      }
      body += fmt::format("#pragma unroll\n    for (int t = 0; t < {}; ++t) {{\n", per);
      body += fmt::format("      const kiln::i64 j = threadIdx.x + t * {}LL;\n      if (j >= {}LL) continue;\n", threads, n);
      em_.begin_block();
      const Coords c2 = norm_element(*norm, "j");
      em_.emit("const float x = xs[t];");
      em_.set_leaf(norm->inputs[0], "x", c2);
      body += em_.take(6);
      std::string out = norm_output(*norm, c2, recipe.finale);
      em_.clear_leaf(norm->inputs[0]);
      for (size_t at = 0; at < out.size();) {  // indent
        const size_t end = out.find('\n', at);
        body += "      " + out.substr(at, end - at) + "\n";
        at = end + 1;
      }
      body += "    }\n    __syncthreads();\n  }\n";
    } else {
      // Too long to keep on chip: every pass re-reads the row.
      for (const auto& [init, functor, update, finish] : recipe.passes) {
        body += fmt::format("    {{\n      float acc = {};\n", init);
        body += fmt::format("      for (kiln::i64 j = threadIdx.x; j < {}LL; j += blockDim.x) {{\n", n);
        em_.begin_block();
        const Coords c = norm_element(*norm, "j");
        em_.emit(fmt::format("const float x = {};", em_.value(norm->inputs[0], c)));
        em_.emit(update);
        body += em_.take(8) + "      }\n";
        body += fmt::format("      acc = kiln::block_reduce<{}>(acc, kiln_scratch);\n      {}\n    }}\n", functor, finish);
      }
      body += fmt::format("    for (kiln::i64 j = threadIdx.x; j < {}LL; j += blockDim.x) {{\n", n);
      em_.begin_block();
      const Coords c = norm_element(*norm, "j");
      em_.emit(fmt::format("const float x = {};", em_.value(norm->inputs[0], c)));
      body += em_.take(6);
      const std::string out = norm_output(*norm, c, recipe.finale);
      for (size_t at = 0; at < out.size();) {
        const size_t end = out.find('\n', at);
        body += "      " + out.substr(at, end - at) + "\n";
        at = end + 1;
      }
      body += "    }\n  }\n";
    }
    finish(body, threads);
    out_.grid = {blocks_for(lines, 1), 1, 1};
  }

  // ---- matmul and conv: tiled, f32 accumulation ---------------------------------
  // A BM x BN tile per block, 256 threads with 4x4 results each; operands go
  // through the emitter (prologues, views, strides, precision rounding).
  static constexpr int kBM = 64, kBN = 64, kBK = 16;

  std::string operand_value(const ir::Op& anchor, size_t slot, const Coords& coords) {
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

  Coords broadcast_batch(const Coords& batch, const Shape& operand) {
    const size_t rank = operand.size() - 2;
    Coords c(rank);
    for (size_t d = 0; d < rank; ++d) c[d] = operand[d] == 1 ? "0" : batch[batch.size() - rank + d];
    return c;
  }

  // The GEMM view of an anchor and how to reach its operands. load_a/load_b
  // emit statements that set `v` to one operand element (any prologue);
  // chunk_a/chunk_b, where set, emit statements for a 16-byte chunk of a
  // plain tensor (`chunk` consecutive elements along the tile's contiguous
  // dimension) and return {in bounds, element offset from pointer_a/b}.
  using ChunkFn = std::function<std::pair<std::string, std::string>(const std::string&, const std::string&,
                                                                    const std::string&)>;
  struct Gemm {
    int64_t m, n, k, batches;
    std::function<void(const std::string& m, const std::string& k, const std::string& batch)> load_a;  // sets `v`
    std::function<void(const std::string& k, const std::string& n, const std::string& batch)> load_b;
    std::function<Coords(const std::string& m, const std::string& n, const std::string& batch)> out_coords;
    ChunkFn chunk_a, chunk_b;
    std::string pointer_a, pointer_b;
    bool b_k_major = false;  // B's tile is [n][k] (conv weights, B transposed) rather than [k][n]
    // Computed operands: emit statements; return the operand's coordinates
    // at GEMM (m, k) / (k, n) and when they lie inside it (else the value
    // is 0). *_runs_last: the tile's contiguous dimension runs along the
    // operand's last dimension in whole runs of 8, so the operand's inputs
    // can be loaded 8 at a time.
    std::function<std::pair<Coords, std::string>(const std::string&, const std::string&, const std::string&)> at_a, at_b;
    bool a_runs_last = false, b_runs_last = false;
  };

  // Which tensor-core MMA computes this anchor exactly (numerics rule 5), or
  // nullopt for the f32 SIMT path: bf16 or f16 when both operands are (or
  // the precision rounds f32 operands to it); tf32 when every operand is
  // exact in tf32 (16-bit values, or f32 under precision tf32).
  enum class Mma { bf16, f16, tf32 };
  std::optional<Mma> mma_kind(const ir::Op& anchor) const {
    if (sm_ < 80) return std::nullopt;
    auto effective = [&](size_t slot) {
      const DType vt = g_.operand(anchor, slot).value_dtype();
      if (vt != DType::f32) return std::optional<DType>(vt);
      switch (anchor.attrs.precision) {
        case ir::Precision::bf16: return std::optional<DType>(DType::bf16);
        case ir::Precision::f16: return std::optional<DType>(DType::f16);
        case ir::Precision::tf32: return std::optional<DType>(DType::f32);  // rounded to tf32
        case ir::Precision::f32: return std::optional<DType>();
      }
      return std::optional<DType>();
    };
    const std::optional<DType> a = effective(0), b = effective(1);
    if (!a || !b) return std::nullopt;
    if (*a == DType::bf16 && *b == DType::bf16) return Mma::bf16;
    if (*a == DType::f16 && *b == DType::f16) return Mma::f16;
    return Mma::tf32;
  }
  static DType mma_storage(Mma kind) {
    return kind == Mma::bf16 ? DType::bf16 : kind == Mma::f16 ? DType::f16 : DType::f32;
  }

  // The tensor in device memory that `t` is, seen through this kernel's
  // transposes (x @ w^T reads w in place): its pointer, storage and strides
  // in t's dimension order.
  std::optional<ExternalTensor> in_memory(ir::TensorId t) const {
    if (auto it = ext_.find(t); it != ext_.end()) return it->second;
    const ir::Tensor& tensor = g_.tensor(t);
    if (tensor.producer < 0 || std::find(k_.ops.begin(), k_.ops.end(), tensor.producer) == k_.ops.end()) return std::nullopt;
    const ir::Op& op = g_.ops[static_cast<size_t>(tensor.producer)];
    if (op.kind != OpKind::Transpose) return std::nullopt;
    std::optional<ExternalTensor> base = in_memory(op.inputs[0]);
    if (!base) return std::nullopt;
    ExternalTensor e = *base;
    for (size_t d = 0; d < e.strides.size(); ++d) e.strides[d] = base->strides[static_cast<size_t>(op.attrs.perm[d])];
    return e;
  }

  // An operand read as 16-byte chunks along dimension `inner`: a tensor in
  // memory (not computed here) stored as the MMA's element type, stride 1
  // along `inner`, every chunk 16-byte aligned given an aligned base
  // pointer (checked at run time).
  std::optional<ExternalTensor> chunkable(ir::TensorId t, Mma kind, size_t inner, int64_t chunk) const {
    std::optional<ExternalTensor> e = in_memory(t);
    if (!e || e->storage != mma_storage(kind)) return std::nullopt;
    const Shape& shape = g_.tensor(t).shape;
    if (e->strides[inner] != 1 || shape[inner] % chunk != 0) return std::nullopt;
    for (size_t d = 0; d < shape.size(); ++d)
      if (d != inner && shape[d] != 1 && e->strides[d] % chunk != 0) return std::nullopt;
    return e;
  }

  // The epilogue over every accumulator element: `open` declares `m`, `n`
  // (GEMM coordinates, in range) and ends inside the loops that `close`
  // closes; `acc` names the element. Writes the anchor's consumers and
  // epilogue reductions (atomics into workspaces, finalised by the last
  // block).
  // tensor_core: the loops are over the MMA fragments (ni, e): a reduction
  // that keeps only the output column is combined in registers and across
  // the warp's rows first, one atomic per column and warp.
  std::string epilogue(const ir::Op& anchor, const Gemm& gm, const std::string& open, const std::string& close,
                       const std::string& acc, int indent, bool tensor_core = false) {
    const ir::Tensor& result = g_.result(anchor);
    std::vector<const ir::Op*> reduces;  // epilogue reductions whose results are needed
    for (const ir::Op* r : ops_of({ir::OpFamily::Reduce}))
      if (writes_.count(r->output)) reduces.push_back(r);
    std::vector<std::string> ws;
    for (const ir::Op* r : reduces)
      ws.push_back(workspace_param(g_.result(*r).name + ".partial", element_count(g_.result(*r).shape),
                                   reduce_identity_bits(r->kind), true));
    const std::string counter = reduces.empty() ? "" : workspace_param(g_.result(anchor).name + ".tiles_done", 1, 0, true);
    std::string body;
    std::vector<std::pair<size_t, std::string>> column_reduces;  // reduction, register partials
    em_.begin_block();
    const Coords oc = gm.out_coords("m", "n", "batch");
    em_.emit(fmt::format("const float out = {};  // {}", em_.rounded(result, acc), result.name));
    em_.set_leaf(anchor.output, "out");
    std::set<ir::TensorId> reduce_outs;
    for (size_t r = 0; r < reduces.size(); ++r) {
      const ir::Op& op = *reduces[r];
      reduce_outs.insert(op.output);
      const Shape& in_shape = g_.operand(op, 0).shape;
      const Coords ic = write_coords(anchor.output, oc, op.inputs[0]);
      Coords kept;
      Shape kept_shape;
      for (size_t d = 0; d < in_shape.size(); ++d)
        if (!std::binary_search(op.attrs.axes.begin(), op.attrs.axes.end(), static_cast<int64_t>(d)))
          kept.push_back(ic[d]), kept_shape.push_back(in_shape[d]);
      if (tensor_core && kept.size() == 1 && kept[0] == oc.back()) {
        const std::string functor = reduce_functor(op.kind), red = fmt::format("red{}", r);
        body += fmt::format("  float {0}[G::kNI][2];\n#pragma unroll\n  for (int ni = 0; ni < G::kNI; ++ni) {0}[ni][0] = {0}[ni][1] = "
                            "{1}::identity();\n", red, functor);
        em_.emit(fmt::format("{0}[ni][e & 1] = {1}::combine({0}[ni][e & 1], {2});", red, functor, em_.value(op.inputs[0], ic)));
        column_reduces.emplace_back(r, red);
        continue;
      }
      em_.emit(fmt::format("kiln::atomic_combine({}(), static_cast<float*>({}) + {}, {});", reduce_functor(op.kind), ws[r],
                           em_.linearize(kept, kept_shape), em_.value(op.inputs[0], ic)));
    }
    for (ir::TensorId t : k_.writes) {
      if (reduce_outs.count(t)) continue;
      const Coords tc = write_coords(anchor.output, oc, t);
      em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + g_.tensor(t).name);
    }
    body += open + em_.take(indent) + close;
    // Column partials: across the warp's rows (lanes with equal lane % 4), then one atomic each.
    for (const auto& [r, red] : column_reduces) {
      const std::string functor = reduce_functor(reduces[r]->kind);
      body += "#pragma unroll\n  for (int ni = 0; ni < G::kNI; ++ni)\n#pragma unroll\n    for (int c = 0; c < 2; ++c) {\n";
      body += fmt::format("      float v = {}[ni][c];\n", red);
      body += fmt::format("      for (int lanes = 4; lanes < 32; lanes <<= 1) v = {}::combine(v, __shfl_xor_sync(0xffffffffu, v, lanes));\n",
                          functor);
      body += fmt::format("      const kiln::i64 n = n0 + G::acc_col(ni, c);\n      if ((threadIdx.x & 31) >= 4 || n >= {}LL) continue;\n",
                          gm.n);
      em_.begin_block();
      const Coords column = gm.out_coords("m0", "n", "batch");
      em_.emit(fmt::format("kiln::atomic_combine({}(), static_cast<float*>({}) + {}, v);", functor, ws[r], column.back()));
      body += em_.take(6) + "    }\n";
    }
    if (!reduces.empty()) {
      // The last block to finish turns the partials into the results.
      body += "  __threadfence();\n  __syncthreads();\n  __shared__ bool kiln_last;\n";
      body += fmt::format("  if (threadIdx.x == 0) kiln_last = atomicAdd(static_cast<unsigned int*>({}), 1u) == "
                          "gridDim.x * gridDim.y * gridDim.z - 1;\n", counter);
      body += "  __syncthreads();\n  if (kiln_last) {\n    __threadfence();\n";
      for (size_t r = 0; r < reduces.size(); ++r) {
        const ir::Op& op = *reduces[r];
        const ir::Tensor& out = g_.result(op);
        const int64_t count = element_count(out.shape);
        const int64_t reduced = element_count(g_.operand(op, 0).shape) / count;
        std::string v = fmt::format("static_cast<volatile float*>({})[o]", ws[r]);
        if (op.kind == OpKind::ReduceMean) v = fmt::format("({} / {})", v, Emitter::float_literal(static_cast<float>(reduced)));
        body += fmt::format("    for (kiln::i64 o = threadIdx.x; o < {}LL; o += blockDim.x) {}  // {}\n", count,
                            store(op.output, "o", em_.rounded(out, v)), out.name);
      }
      body += "  }\n";
    }
    return body;
  }

  void gemm(const ir::Op& anchor, const Gemm& gm) {
    if (const std::optional<Mma> kind = mma_kind(anchor)) return gemm_tensor_core(anchor, gm, *kind);
    gemm_simt(anchor, gm);
  }

  // f32 operands in full f32 (and GPUs before sm_80): a BM x BN tile per
  // block, 256 threads with 4x4 results each.
  void gemm_simt(const ir::Op& anchor, const Gemm& gm) {
    std::string body = fmt::format("  __shared__ float As[{}][{}];\n  __shared__ float Bs[{}][{}];\n", kBK, kBM + 4, kBK, kBN + 4);
    body += "  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;\n";
    body += fmt::format("  const kiln::i64 m0 = (kiln::i64)blockIdx.y * {}, n0 = (kiln::i64)blockIdx.x * {};\n", kBM, kBN);
    body += "  const kiln::i64 batch = blockIdx.z;\n";
    body += "  float acc[4][4] = {};\n";
    body += fmt::format("  for (kiln::i64 k0 = 0; k0 < {}LL; k0 += {}) {{\n", gm.k, kBK);
    body += fmt::format("    for (int e = tid; e < {}; e += 256) {{\n", kBM * kBK);
    body += fmt::format("      const kiln::i64 m = m0 + e / {0}, k = k0 + e % {0};\n      float v = 0.0f;\n", kBK);
    body += fmt::format("      if (m < {}LL && k < {}LL) {{\n", gm.m, gm.k);
    em_.begin_block();
    gm.load_a("m", "k", "batch");
    body += em_.take(8) + "      }\n";
    body += fmt::format("      As[e % {}][e / {}] = v;\n    }}\n", kBK, kBK);
    body += fmt::format("    for (int e = tid; e < {}; e += 256) {{\n", kBN * kBK);
    body += fmt::format("      const kiln::i64 k = k0 + e / {0}, n = n0 + e % {0};\n      float v = 0.0f;\n", kBN);
    body += fmt::format("      if (k < {}LL && n < {}LL) {{\n", gm.k, gm.n);
    em_.begin_block();
    gm.load_b("k", "n", "batch");
    body += em_.take(8) + "      }\n";
    body += fmt::format("      Bs[e / {}][e % {}] = v;\n    }}\n", kBN, kBN);
    body += "    __syncthreads();\n";
    body += fmt::format("#pragma unroll\n    for (int kk = 0; kk < {}; ++kk) {{\n", kBK);
    body += "      float a[4], b[4];\n#pragma unroll\n      for (int i = 0; i < 4; ++i) a[i] = As[kk][ty * 4 + i], b[i] = Bs[kk][tx * 4 + i];\n";
    body += "#pragma unroll\n      for (int i = 0; i < 4; ++i)\n#pragma unroll\n        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];\n";
    body += "    }\n    __syncthreads();\n  }\n";
    const std::string open = "#pragma unroll\n  for (int i = 0; i < 4; ++i)\n#pragma unroll\n    for (int j = 0; j < 4; ++j) {\n"
                             "      const kiln::i64 m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;\n" +
                             fmt::format("      if (m >= {}LL || n >= {}LL) continue;\n", gm.m, gm.n);
    body += epilogue(anchor, gm, open, "    }\n", "acc[i][j]", 6);
    finish(body, 256);
    out_.grid = {blocks_for(gm.n, kBN), blocks_for(gm.m, kBM), static_cast<uint32_t>(gm.batches)};
  }

  // Tensor cores (templates/kiln/mma.cuh): the template's pipelined main
  // loop, with this kernel's operand loaders as its hooks.
  struct MmaTile {
    int bm, bn, bk, warps_m, warps_n, stages;
  };
  MmaTile mma_tile(const Gemm& gm, Mma kind) const {
    const int bk = kind == Mma::tf32 ? 16 : 32;
    const int64_t big_tiles = ((gm.m + 127) / 128) * ((gm.n + 127) / 128) * gm.batches;
    // 128x128 tiles once they fill most of a GPU's SMs; else 64x64. With
    // both operands copied straight from memory, 4 warps of 64x64 and a
    // deeper K-slice (measured on H100, bf16 8192x8192x4096: 209 TFLOP/s
    // against 167 for 8 warps of 64x32 and 165 for 256x128); computed
    // operands keep 8 warps so each thread stages only two 8-element runs.
    if (big_tiles >= 96 && gm.chunk_a && gm.chunk_b) return {128, 128, 2 * bk, 2, 2, 3};
    if (big_tiles >= 96) return {128, 128, bk, 2, 4, 4};
    return {64, 64, bk, 2, 2, 4};
  }

  void gemm_tensor_core(const ir::Op& anchor, const Gemm& gm, Mma kind) {
    const MmaTile t = mma_tile(gm, kind);
    const int threads = t.warps_m * t.warps_n * 32;
    const int elem = kind == Mma::tf32 ? 4 : 2, chunk = 16 / elem;
    const char* kind_name = kind == Mma::bf16 ? "kBf16" : kind == Mma::f16 ? "kF16" : "kTf32";
    const int a_stride = t.bk + chunk, b_stride = gm.b_k_major ? t.bk + chunk : t.bn + 8;
    const int shared_bytes = t.stages * (t.bm * a_stride + (gm.b_k_major ? t.bn : t.bk) * b_stride) * elem;
    const int64_t tiles_m = (gm.m + t.bm - 1) / t.bm, tiles_n = (gm.n + t.bn - 1) / t.bn;
    KILN_USER_CHECK(tiles_m * tiles_n < (int64_t{1} << 31) && gm.batches <= 65535,
                    "{}: {} x {} tiles in {} batches exceed this matmul kernel's grid limits", g_.describe(k_.anchor), tiles_m,
                    tiles_n, gm.batches);
    std::string body;
    body += fmt::format("  typedef kiln::tc::Gemm<{}, {}, {}, {}, {}, {}, kiln::tc::{}, {}> G;\n", t.bm, t.bn, t.bk, t.warps_m,
                        t.warps_n, t.stages, kind_name, gm.b_k_major ? "true" : "false");
    body += fmt::format("  static_assert(G::kSharedBytes == {}, \"shared memory size as launched\");\n", shared_bytes);
    body += "  typedef G::T T;\n  extern __shared__ __align__(16) unsigned char kiln_shared[];\n";
    body += "  T* smem = reinterpret_cast<T*>(kiln_shared);\n";
    body += "  int tile_m, tile_n;\n";
    body += fmt::format("  kiln::tc::swizzled_tile(blockIdx.x, {}, {}, 8, tile_m, tile_n);\n", tiles_m, tiles_n);
    body += fmt::format("  const kiln::i64 m0 = (kiln::i64)tile_m * {}, n0 = (kiln::i64)tile_n * {};\n", t.bm, t.bn);
    body += "  const kiln::i64 batch = blockIdx.z;\n";

    // One loader per operand: 16-byte asynchronous copies where the operand
    // is a plain aligned tensor; else its inputs 8 at a time into registers
    // (computed and stored after the next slice's math); else element by
    // element through the emitter.
    auto loader = [&](bool is_a) {
      const ir::Op& op = anchor;
      const size_t slot = is_a ? 0 : 1;
      const ChunkFn& chunk_fn = is_a ? gm.chunk_a : gm.chunk_b;
      const std::string& pointer = is_a ? gm.pointer_a : gm.pointer_b;
      const std::string x = is_a ? "a" : "b";
      // The tile's rows x cols, cols contiguous in shared memory.
      const bool k_major = is_a || gm.b_k_major;
      const int rows = is_a ? t.bm : (k_major ? t.bn : t.bk), cols = k_major ? t.bk : t.bn;
      // GEMM coordinates of (row, col).
      const std::string row_base = is_a ? "m0" : (k_major ? "n0" : "k0"), col_base = k_major ? "k0" : "n0";
      const std::string row_name = is_a ? "m" : (k_major ? "n" : "k"), col_name = k_major ? "k" : "n";
      const std::string index = is_a ? "G::a_index(row, col)" : (k_major ? "G::b_index(col, row)" : "G::b_index(row, col)");
      const int64_t row_limit = is_a ? gm.m : (k_major ? gm.n : gm.k), col_limit = k_major ? gm.k : gm.n;
      auto at = [&]() { return is_a ? gm.at_a("m", "k", "batch") : gm.at_b("k", "n", "batch"); };
      const std::string gemm_coords = fmt::format("const kiln::i64 {} = {} + row, {} = {} + col", row_name, row_base, col_name,
                                                  col_base);
      std::string load = fmt::format("  auto load_{} = [&](T* tile, int kt) {{\n", x);
      load += fmt::format("    const kiln::i64 k0 = (kiln::i64)kt * {};\n", t.bk);
      std::string stash = fmt::format("  auto stash_{} = [&](T* tile, int kt) {{\n", x);
      std::string decls;
      if (chunk_fn) {
        load += fmt::format("    if (kiln::aligned16({})) {{\n", pointer);
        load += fmt::format("      for (int c = threadIdx.x; c < {}; c += {}) {{\n", rows * cols / chunk, threads);
        load += fmt::format("        const int row = c / {0}, col = (c % {0}) * {1};\n", cols / chunk, chunk);
        load += "        " + gemm_coords + ";\n";
        em_.begin_block();
        const auto [valid, offset] = is_a ? chunk_fn("m", "k", "batch") : chunk_fn("k", "n", "batch");
        em_.emit(fmt::format("const bool ok = {};", valid));
        em_.emit(fmt::format("kiln::tc::cp_async16(tile + {}, static_cast<const T*>({}) + (ok ? {} : 0), ok);", index,
                             pointer, offset));
        load += em_.take(8) + "      }\n      return;\n    }\n";
      } else if (is_a ? gm.a_runs_last : gm.b_runs_last) {
        // The operand's inputs that run along its last dimension, contiguous.
        const Shape& shape = g_.operand(op, slot).shape;
        std::vector<ir::TensorId> runs;
        for (const auto& [id, e] : ext_) {
          const Shape& ts = g_.tensor(id).shape;
          if (e.storage == DType::boolean || ts.empty() || ts.size() > shape.size() || ts.back() != shape.back() ||
              !std::equal(ts.begin(), ts.end(), shape.end() - static_cast<std::ptrdiff_t>(ts.size())))
            continue;
          bool ok = e.strides.back() == 1;
          for (size_t d = 0; d + 1 < ts.size(); ++d) ok = ok && (ts[d] == 1 || e.strides[d] % 8 == 0);
          if (ok) runs.push_back(id);
        }
        const int per_thread = rows * cols / 8 / threads;
        KILN_INTERNAL_CHECK(per_thread * 8 * threads == rows * cols);
        std::string aligned = "true";
        for (ir::TensorId id : runs) {
          decls += fmt::format("  float run{}[{}][8];  // {}\n", id, per_thread, g_.tensor(id).name);
          aligned += fmt::format(" && kiln::aligned16({})", ext_.at(id).pointer);
        }
        decls += fmt::format("  const bool runs_{} = {};\n", x, aligned);
        auto run_coords = [&](ir::TensorId id, const Coords& c) {
          const Shape& ts = g_.tensor(id).shape;
          Coords tc(ts.size());
          for (size_t d = 0; d < ts.size(); ++d) tc[d] = ts[d] == 1 ? "0" : c[c.size() - ts.size() + d];
          return tc;
        };
        auto chunk_header = [&](std::string& out) {
          out += fmt::format("#pragma unroll\n      for (int i = 0; i < {}; ++i) {{\n", per_thread);
          out += fmt::format("        const int row = (threadIdx.x + i * {0}) / {1}, col = ((threadIdx.x + i * {0}) % {1}) * 8;\n",
                             threads, cols / 8);
        };
        load += fmt::format("    if (runs_{}) {{\n", x);
        chunk_header(load);
        load += "        " + gemm_coords + ";\n";
        em_.begin_block();
        {
          const auto [coords, valid] = at();
          em_.emit(fmt::format("if ({}) {{", valid));
          for (ir::TensorId id : runs) {
            const ExternalTensor& e = ext_.at(id);
            em_.emit(fmt::format("  kiln::load_vec_{}<8>({}, {}, run{}[i]);", to_string(e.storage), e.pointer,
                                 em_.offset_of(e, g_.tensor(id).shape, run_coords(id, coords)), id));
          }
          em_.emit("}");
        }
        load += em_.take(8) + "      }\n      return;\n    }\n";
        stash += fmt::format("    if (!runs_{}) return;\n    const kiln::i64 k0 = (kiln::i64)kt * {};\n", x, t.bk);
        chunk_header(stash);
        stash += "        float vals[8];\n#pragma unroll\n        for (int j = 0; j < 8; ++j) {\n";
        stash += fmt::format("          const kiln::i64 {} = {} + row, {} = {} + col + j;\n", row_name, row_base, col_name,
                             col_base);
        em_.begin_block();
        {
          const auto [coords, valid] = at();
          for (ir::TensorId id : runs) em_.set_vector_source(id, run_coords(id, coords), fmt::format("run{}[i]", id), "j");
          em_.emit("float v = 0.0f;");
          em_.emit(fmt::format("if ({}) {{", valid));
          em_.emit("  v = " + operand_value(op, slot, coords) + ";");
          em_.emit("}");
          em_.emit("vals[j] = v;");
          em_.clear_vector_sources();
        }
        stash += em_.take(10) + "        }\n";
        stash += fmt::format("        kiln::tc::store_chunk8<kiln::tc::{}>(tile + {}, vals);\n      }}\n", kind_name, index);
      }
      stash += "  };\n";
      load += fmt::format("    for (int e = threadIdx.x; e < {}; e += {}) {{\n", rows * cols, threads);
      load += fmt::format("      const int row = e / {0}, col = e % {0};\n", cols);
      load += "      " + gemm_coords + ";\n";
      load += fmt::format("      float v = 0.0f;\n      if ({} < {}LL && {} < {}LL) {{\n", row_name, row_limit, col_name, col_limit);
      em_.begin_block();
      if (is_a)
        gm.load_a("m", "k", "batch");
      else
        gm.load_b("k", "n", "batch");
      load += em_.take(8) + "      }\n";
      load += fmt::format("      tile[{}] = kiln::tc::Element<kiln::tc::{}>::from_float(v);\n    }}\n", index, kind_name);
      load += "  };\n";
      return decls + load + stash;
    };
    body += loader(true) + loader(false);
    body += "  G gemm;\n";
    body += fmt::format("  gemm.run(smem, {}, load_a, load_b, stash_a, stash_b);\n", (gm.k + t.bk - 1) / t.bk);
    const std::string open =
        "#pragma unroll\n  for (int mi = 0; mi < G::kMI; ++mi)\n#pragma unroll\n    for (int ni = 0; ni < G::kNI; ++ni)\n"
        "#pragma unroll\n      for (int e = 0; e < 4; ++e) {\n"
        "        const kiln::i64 m = m0 + G::acc_row(mi, e), n = n0 + G::acc_col(ni, e);\n" +
        fmt::format("        if (m >= {}LL || n >= {}LL) continue;\n", gm.m, gm.n);
    body += epilogue(anchor, gm, open, "      }\n", "gemm.acc[mi][ni][e]", 8, true);
    finish(body, threads, "", "#include \"kiln/mma.cuh\"\n");
    out_.shared_bytes = static_cast<uint32_t>(shared_bytes);
    out_.grid = {static_cast<uint32_t>(tiles_m * tiles_n), 1, static_cast<uint32_t>(gm.batches)};
  }

  void matmul() {
    const ir::Op& mm = g_.ops[static_cast<size_t>(k_.anchor)];
    const ir::Tensor& result = g_.result(mm);
    const Shape batch_shape(result.shape.begin(), result.shape.end() - 2);
    Gemm gm;
    gm.m = result.shape[result.shape.size() - 2];
    gm.n = result.shape.back();
    gm.k = g_.operand(mm, 0).shape.back();
    gm.batches = element_count(batch_shape);
    KILN_USER_CHECK(gm.batches <= 65535, "{}: {} batches exceed this matmul kernel's grid limit of 65535",
                    g_.describe(k_.anchor), gm.batches);
    auto batch_coords = [&](const std::string& batch) { return em_.delinearize(batch, batch_shape); };
    gm.load_a = [&](const std::string& m, const std::string& k, const std::string& batch) {
      Coords c = broadcast_batch(batch_coords(batch), g_.operand(mm, 0).shape);
      c.push_back(m);
      c.push_back(k);
      em_.emit("v = " + operand_value(mm, 0, c) + ";");
    };
    gm.load_b = [&](const std::string& k, const std::string& n, const std::string& batch) {
      Coords c = broadcast_batch(batch_coords(batch), g_.operand(mm, 1).shape);
      c.push_back(k);
      c.push_back(n);
      em_.emit("v = " + operand_value(mm, 1, c) + ";");
    };
    gm.out_coords = [&](const std::string& m, const std::string& n, const std::string& batch) {
      Coords c = batch_coords(batch);
      c.push_back(m);
      c.push_back(n);
      return c;
    };
    gm.at_a = [&](const std::string& m, const std::string& k, const std::string& batch) {
      Coords c = broadcast_batch(batch_coords(batch), g_.operand(mm, 0).shape);
      c.push_back(m);
      c.push_back(k);
      return std::pair(c, fmt::format("{} < {}LL && {} < {}LL", m, gm.m, k, gm.k));
    };
    gm.at_b = [&](const std::string& k, const std::string& n, const std::string& batch) {
      Coords c = broadcast_batch(batch_coords(batch), g_.operand(mm, 1).shape);
      c.push_back(k);
      c.push_back(n);
      return std::pair(c, fmt::format("{} < {}LL && {} < {}LL", k, gm.k, n, gm.n));
    };
    gm.a_runs_last = gm.k % 8 == 0;
    if (const std::optional<Mma> kind = mma_kind(mm)) {
      const int64_t chunk = *kind == Mma::tf32 ? 4 : 8;
      const Shape& as = g_.operand(mm, 0).shape;
      const Shape& bs = g_.operand(mm, 1).shape;
      auto at = [&](const Shape& shape, const std::string& batch, const std::string& row, const std::string& col) {
        Coords c = broadcast_batch(batch_coords(batch), shape);
        c.push_back(row);
        c.push_back(col);
        return c;
      };
      auto in_range = [&](const std::string& x, const std::string& y) {
        return fmt::format("{} < {}LL && {} < {}LL", x, gm.m, y, gm.k);
      };
      if (const std::optional<ExternalTensor> e = chunkable(mm.inputs[0], *kind, as.size() - 1, chunk)) {
        gm.pointer_a = e->pointer;
        gm.chunk_a = [this, e = *e, as, at, in_range](const std::string& m, const std::string& k, const std::string& batch) {
          return std::pair(in_range(m, k), em_.offset_of(e, as, at(as, batch, m, k)));
        };
      }
      auto b_range = [&](const std::string& k, const std::string& n) {
        return fmt::format("{} < {}LL && {} < {}LL", k, gm.k, n, gm.n);
      };
      if (const std::optional<ExternalTensor> e = chunkable(mm.inputs[1], *kind, bs.size() - 1, chunk)) {
        gm.pointer_b = e->pointer;
        gm.chunk_b = [this, e = *e, bs, at, b_range](const std::string& k, const std::string& n, const std::string& batch) {
          return std::pair(b_range(k, n), em_.offset_of(e, bs, at(bs, batch, k, n)));
        };
      } else if (const std::optional<ExternalTensor> e = chunkable(mm.inputs[1], *kind, bs.size() - 2, chunk)) {
        gm.b_k_major = true;  // B is stored transposed ([n][k] in memory)
        gm.pointer_b = e->pointer;
        gm.chunk_b = [this, e = *e, bs, at, b_range](const std::string& k, const std::string& n, const std::string& batch) {
          return std::pair(b_range(k, n), em_.offset_of(e, bs, at(bs, batch, k, n)));
        };
      }
    }
    gm.b_runs_last = !gm.b_k_major && gm.n % 8 == 0;
    setup_norm_prologue();
    gemm(mm, gm);
  }

  // The matmul applies a split layer_norm/rms_norm from its row statistics
  // (the norm, and any pointwise ops after it, are recomputed in its prologue).
  void setup_norm_prologue() {
    for (int32_t oi : k_.recomputed) {
      const ir::Op& norm = g_.ops[static_cast<size_t>(oi)];
      if (norm.kind != OpKind::LayerNorm && norm.kind != OpKind::RmsNorm) continue;
      const ir::Tensor& x = g_.operand(norm, 0);
      const int64_t rows = element_count(x.shape) / x.shape.back();
      const std::string p = workspace_param(g_.result(norm).name + ".rowstats", rows * 2, 0, false);
      em_.set_norm_stats(norm.output, "static_cast<const float*>(" + p + ")");
    }
  }

  void conv() {
    const ir::Op& cv = g_.ops[static_cast<size_t>(k_.anchor)];
    const ir::Attributes& at = cv.attrs;
    const bool nhwc = at.layout == ir::Layout::NHWC;
    const Shape& xs = g_.operand(cv, 0).shape;
    const Shape& ws = g_.operand(cv, 1).shape;
    const Shape& os = g_.result(cv).shape;
    const int64_t n = xs[0], c = nhwc ? xs[3] : xs[1], h = nhwc ? xs[1] : xs[2], w = nhwc ? xs[2] : xs[3];
    const int64_t k = ws[0], r = nhwc ? ws[1] : ws[2], s = nhwc ? ws[2] : ws[3];
    const int64_t p = nhwc ? os[1] : os[2], q = nhwc ? os[2] : os[3];
    const int64_t cg = c / at.groups, kg = k / at.groups;
    Gemm gm;
    gm.m = n * p * q;
    gm.n = kg;
    gm.k = r * s * cg;
    gm.batches = at.groups;
    // Implicit im2col: GEMM row m is output pixel (ni, pi, qi); GEMM k is
    // (ri, si, ci), ci fastest.
    auto input_pixel = [&](const std::string& m, const std::string& kk, const std::string& g) {
      em_.emit(fmt::format("const kiln::i64 ni = {0} / {1}LL, pi = ({0} / {2}LL) % {3}LL, qi = {0} % {2}LL;", m, p * q, q, p));
      em_.emit(fmt::format("const kiln::i64 ri = {0} / {1}LL, si = ({0} / {2}LL) % {3}LL, ci = {4} * {2}LL + {0} % {2}LL;", kk,
                           s * cg, cg, s, g));
      em_.emit(fmt::format("const kiln::i64 hi = pi * {}LL - {}LL + ri * {}LL, wi = qi * {}LL - {}LL + si * {}LL;", at.stride[0],
                           at.padding[0], at.dilation[0], at.stride[1], at.padding[1], at.dilation[1]));
      return fmt::format("hi >= 0 && hi < {}LL && wi >= 0 && wi < {}LL", h, w);
    };
    auto filter_tap = [&](const std::string& kk, const std::string& nn, const std::string& g) {
      em_.emit(fmt::format("const kiln::i64 ri = {0} / {1}LL, si = ({0} / {2}LL) % {3}LL, ci = {0} % {2}LL;", kk, s * cg, cg, s));
      em_.emit(fmt::format("const kiln::i64 ko = {} * {}LL + {};", g, kg, nn));
      return nhwc ? Coords{"ko", "ri", "si", "ci"} : Coords{"ko", "ci", "ri", "si"};
    };
    gm.load_a = [&, nhwc](const std::string& m, const std::string& kk, const std::string& g) {
      em_.emit(fmt::format("if ({}) {{", input_pixel(m, kk, g)));
      const Coords xc = nhwc ? Coords{"ni", "hi", "wi", "ci"} : Coords{"ni", "ci", "hi", "wi"};
      em_.emit("v = " + operand_value(cv, 0, xc) + ";");
      em_.emit("}");
    };
    gm.load_b = [&](const std::string& kk, const std::string& nn, const std::string& g) {
      em_.emit("v = " + operand_value(cv, 1, filter_tap(kk, nn, g)) + ";");
    };
    gm.out_coords = [&, nhwc](const std::string& m, const std::string& nn, const std::string& g) {
      em_.emit(fmt::format("const kiln::i64 on = {0} / {1}LL, op = ({0} / {2}LL) % {3}LL, oq = {0} % {2}LL;", m, p * q, q, p));
      em_.emit(fmt::format("const kiln::i64 ok = {} * {}LL + {};", g, kg, nn));
      return nhwc ? Coords{"on", "op", "oq", "ok"} : Coords{"on", "ok", "op", "oq"};
    };
    gm.at_a = [&, nhwc](const std::string& m, const std::string& kk, const std::string& g) {
      const std::string inside = input_pixel(m, kk, g);
      return std::pair(nhwc ? Coords{"ni", "hi", "wi", "ci"} : Coords{"ni", "ci", "hi", "wi"},
                       fmt::format("{} < {}LL && {} < {}LL && {}", m, gm.m, kk, gm.k, inside));
    };
    gm.at_b = [&](const std::string& kk, const std::string& nn, const std::string& g) {
      return std::pair(filter_tap(kk, nn, g), fmt::format("{} < {}LL && {} < {}LL", kk, gm.k, nn, gm.n));
    };
    gm.a_runs_last = gm.b_runs_last = nhwc && cg % 8 == 0;  // k runs along ci within one filter tap
    // B's tile is [k-out][ri, si, ci]: the weights' own order in NHWC.
    gm.b_k_major = true;
    const std::optional<Mma> kind = mma_kind(cv);
    const int64_t chunk = kind == Mma::tf32 ? 4 : 8;
    if (kind && nhwc && cg % chunk == 0) {
      if (const std::optional<ExternalTensor> e = chunkable(cv.inputs[0], *kind, 3, chunk)) {
        gm.pointer_a = e->pointer;
        gm.chunk_a = [&, e = *e](const std::string& m, const std::string& kk, const std::string& g) {
          const std::string inside = input_pixel(m, kk, g);
          return std::pair(fmt::format("{} < {}LL && {} < {}LL && {}", m, gm.m, kk, gm.k, inside),
                           em_.offset_of(e, xs, Coords{"ni", "hi", "wi", "ci"}));
        };
      }
      if (const std::optional<ExternalTensor> e = chunkable(cv.inputs[1], *kind, 3, chunk)) {
        gm.pointer_b = e->pointer;
        gm.chunk_b = [&, e = *e](const std::string& kk, const std::string& nn, const std::string& g) {
          const Coords wc = filter_tap(kk, nn, g);
          return std::pair(fmt::format("{} < {}LL && {} < {}LL", kk, gm.k, nn, gm.n), em_.offset_of(e, ws, wc));
        };
      }
    }
    gemm(cv, gm);
  }

  // ---- attention on tensor cores: templates/kiln/attention.cuh -------------------
  // sdpa with q, k, v in memory as one 16-bit type (through transposes),
  // d contiguous, head dimension a multiple of 16 up to 256.
  bool flash_attention_fits(const ir::Op& op) const {
    if (op.kind != OpKind::Sdpa || sm_ < 80) return false;
    const int64_t d = g_.operand(op, 0).shape[3];
    if (d % 16 != 0 || d > 256) return false;
    std::optional<DType> type;
    for (size_t slot = 0; slot < 3; ++slot) {
      const std::optional<ExternalTensor> e = in_memory(op.inputs[slot]);
      if (!e || (e->storage != DType::bf16 && e->storage != DType::f16) || (type && *type != e->storage)) return false;
      type = e->storage;
      if (e->strides[3] != 1 || e->strides[0] % 8 != 0 || e->strides[1] % 8 != 0 || e->strides[2] % 8 != 0) return false;
    }
    return true;
  }

  void flash_attention(const ir::Op& op) {
    const ir::Tensor& result = g_.result(op);
    const Shape& qs = g_.operand(op, 0).shape;
    const Shape& ks = g_.operand(op, 1).shape;
    const int64_t batches = qs[0], heads = qs[1], sq = qs[2], d = qs[3], kv_heads = ks[1], skv = ks[2];
    const ExternalTensor q = *in_memory(op.inputs[0]), k = *in_memory(op.inputs[1]), v = *in_memory(op.inputs[2]);
    const int bq = 64, bkv = d <= 128 ? 64 : 32, threads = bq / 16 * 32;
    const int shared_bytes = (bq * static_cast<int>(d + 8) + 4 * bkv * static_cast<int>(d + 8)) * 2;
    KILN_USER_CHECK(batches * heads <= 65535, "{}: {} batch x head pairs exceed this attention kernel's grid limit of 65535",
                    g_.describe(k_.anchor), batches * heads);
    std::string body;
    body += fmt::format("  typedef kiln::tc::FlashAttention<{}, {}, {}, kiln::tc::{}> A;\n", d, bq, bkv,
                        q.storage == DType::bf16 ? "kBf16" : "kF16");
    body += fmt::format("  static_assert(A::kSharedBytes == {}, \"shared memory size as launched\");\n", shared_bytes);
    body += "  extern __shared__ __align__(16) unsigned char kiln_shared[];\n";
    body += fmt::format("  const kiln::i64 bi = blockIdx.y / {0}LL, hi = blockIdx.y % {0}LL, kvh = hi / {1}LL;\n", heads,
                        heads / kv_heads);
    body += fmt::format("  const int q0 = blockIdx.x * {};\n", bq);
    auto base = [&](const ExternalTensor& e, const std::string& head) {
      return fmt::format("static_cast<const kiln::u16*>({}) + bi * {}LL + {} * {}LL", e.pointer, e.strides[0], head, e.strides[1]);
    };
    body += fmt::format("  const kiln::u16* q = {};\n", base(q, "hi"));
    body += fmt::format("  const kiln::u16* k = {};\n", base(k, "kvh"));
    body += fmt::format("  const kiln::u16* v = {};\n", base(v, "kvh"));
    body += fmt::format("  const bool aligned = kiln::aligned16({}) && kiln::aligned16({}) && kiln::aligned16({});\n", q.pointer,
                        k.pointer, v.pointer);
    // Key tiles to visit: a causal mask hides keys past q0 + BQ - 1 + skv - sq.
    if (op.attrs.causal)
      body += fmt::format("  const int kv_tiles = max(0, min({0}, (int)((q0 + {1} + {2}LL + {3} - 1) / {3})));\n",
                          (skv + bkv - 1) / bkv, bq, skv - sq, bkv);
    else
      body += fmt::format("  const int kv_tiles = {};\n", (skv + bkv - 1) / bkv);
    // The score hook: scale, mask, causal.
    body += "  auto score = [&](float dot, int row, int key) -> float {\n";
    body += "    const kiln::i64 qi = q0 + row, kj = key;\n";
    em_.begin_block();
    std::string sc = fmt::format("dot * {}", Emitter::float_literal(op.attrs.scale));
    if (op.inputs.size() > 3) {
      const ir::Tensor& mask = g_.operand(op, 3);
      const Coords full{"bi", "hi", "qi", "kj"};
      Coords mc(mask.shape.size());
      for (size_t dim = 0; dim < mask.shape.size(); ++dim)
        mc[dim] = mask.shape[dim] == 1 ? "0" : full[4 - mask.shape.size() + dim];
      const std::string mv = em_.value(op.inputs[3], mc);
      sc = mask.dtype == DType::boolean ? fmt::format("({} != 0.0f ? {} : -kiln::inf())", mv, sc) : fmt::format("({} + {})", sc, mv);
    }
    if (op.attrs.causal) sc = fmt::format("(kj > qi + {}LL ? -kiln::inf() : {})", skv - sq, sc);
    em_.emit(fmt::format("return {};", sc));
    body += em_.take(4) + "  };\n";
    body += "  A fa;\n";
    body += fmt::format("  fa.run(reinterpret_cast<kiln::u16*>(kiln_shared), q, {}LL, q0, {}, k, {}LL, v, {}LL, {}, kv_tiles, aligned, score);\n",
                        q.strides[2], sq, k.strides[2], v.strides[2], skv);
    body += "#pragma unroll\n  for (int dn = 0; dn < A::kDN; ++dn)\n#pragma unroll\n    for (int e = 0; e < 4; ++e) {\n";
    body += fmt::format("      const kiln::i64 qi = q0 + A::acc_row(e), d = A::acc_col(dn, e);\n      if (qi >= {}LL) continue;\n", sq);
    em_.begin_block();
    em_.emit(fmt::format("const float out = {};  // {}", em_.rounded(result, "fa.out(dn, e)"), result.name));
    em_.set_leaf(op.output, "out");
    const Coords oc{"bi", "hi", "qi", "d"};
    for (ir::TensorId t : k_.writes) {
      const Coords tc = write_coords(op.output, oc, t);
      em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + g_.tensor(t).name);
    }
    body += em_.take(6) + "    }\n";
    finish(body, threads, "", "#include \"kiln/attention.cuh\"\n");
    out_.shared_bytes = static_cast<uint32_t>(shared_bytes);
    out_.grid = {static_cast<uint32_t>((sq + bq - 1) / bq), static_cast<uint32_t>(batches * heads), 1};
  }

  // ---- attention without tensor cores: a block per query row, exact softmax in
  // two passes (f32 or mixed operands, decomposed matmul-softmax-matmul graphs).

  // Pass 1 finds the row's max and sum, pass 2 forms each probability exactly
  // as the graph defines it (rounded where it says) and accumulates p * v.
  void attention() {
    const ir::Op& last = g_.ops[static_cast<size_t>(k_.anchor)];
    if (flash_attention_fits(last)) return flash_attention(last);
    const bool sdpa = last.kind == OpKind::Sdpa;
    const ir::Tensor& result = g_.result(last);
    // The pieces: q row source, k per key, score chain, softmax, v.
    const ir::Op* first_mm = nullptr;
    const ir::Op* softmax = nullptr;
    if (!sdpa) {
      for (int32_t oi : k_.ops) {
        const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
        if (op.kind == OpKind::Matmul && oi != k_.anchor) first_mm = &op;
        if (op.kind == OpKind::Softmax) softmax = &op;
      }
      KILN_INTERNAL_CHECK(first_mm && softmax);
    }
    const Shape& out_shape = result.shape;
    const int64_t sq = out_shape[out_shape.size() - 2], dv = out_shape.back();
    const Shape batch_shape(out_shape.begin(), out_shape.end() - 2);
    const int64_t batches = element_count(batch_shape);
    const int64_t skv = sdpa ? g_.operand(last, 1).shape[2] : g_.operand(last, 0).shape.back();
    const int64_t dq = sdpa ? g_.operand(last, 0).shape[3] : g_.operand(*first_mm, 0).shape.back();
    KILN_USER_CHECK(dq <= 1024, "{}: head dimension {} exceeds this attention kernel's limit of 1024", g_.describe(k_.anchor), dq);
    const int per_thread = static_cast<int>((dv + 127) / 128);

    std::string body = fmt::format("  __shared__ float q_row[{}];\n  __shared__ float p_chunk[128];\n  __shared__ float kiln_scratch[32];\n", dq);
    body += fmt::format("  for (kiln::i64 line = blockIdx.x; line < {}LL; line += gridDim.x) {{\n", batches * sq);
    body += fmt::format("    const kiln::i64 batch = line / {}LL, qi = line % {}LL;\n", sq, sq);
    em_.begin_block();
    const Coords bc = em_.delinearize("batch", batch_shape);
    body += em_.take(4);
    // q row into shared memory.
    body += fmt::format("    for (kiln::i64 e = threadIdx.x; e < {}LL; e += blockDim.x) {{\n", dq);
    em_.begin_block();
    if (sdpa) {
      em_.emit(fmt::format("q_row[e] = {};", em_.value(last.inputs[0], Coords{bc[0], bc[1], "qi", "e"})));
    } else {
      Coords c = broadcast_batch(bc, g_.operand(*first_mm, 0).shape);
      c.push_back("qi");
      c.push_back("e");
      em_.emit(fmt::format("q_row[e] = {};", operand_value(*first_mm, 0, c)));
    }
    body += em_.take(6) + "    }\n    __syncthreads();\n";

    // The score of key `j` (a float named by the return value).
    auto score = [&](const std::string& j) -> std::string {
      em_.emit("float dot = 0.0f;");
      if (sdpa) {
        const int64_t heads = g_.operand(last, 0).shape[1], kv_heads = g_.operand(last, 1).shape[1];
        em_.emit(fmt::format("const kiln::i64 kvh = {} / {}LL;", bc[1], heads / kv_heads));
        em_.emit(fmt::format("for (kiln::i64 e = 0; e < {}LL; ++e) {{", dq));
        em_.begin_block();
        em_.emit(fmt::format("dot += q_row[e] * {};", em_.value(last.inputs[1], Coords{bc[0], "kvh", j, "e"})));
        em_.emit("}");
        em_.begin_block();
        std::string s = fmt::format("dot * {}", Emitter::float_literal(last.attrs.scale));
        if (last.inputs.size() > 3) {
          const ir::Tensor& mask = g_.operand(last, 3);
          const Coords full{bc[0], bc[1], "qi", j};
          Coords mc(mask.shape.size());
          for (size_t d = 0; d < mask.shape.size(); ++d) mc[d] = mask.shape[d] == 1 ? "0" : full[4 - mask.shape.size() + d];
          const std::string mv = em_.value(last.inputs[3], mc);
          s = mask.dtype == DType::boolean ? fmt::format("({} != 0.0f ? {} : -kiln::inf())", mv, s) : fmt::format("({} + {})", s, mv);
        }
        if (last.attrs.causal) s = fmt::format("({} > qi + {}LL ? -kiln::inf() : {})", j, skv - sq, s);
        const std::string v = em_.fresh("s");
        em_.emit(fmt::format("const float {} = {};", v, s));
        return v;
      }
      Coords c = broadcast_batch(bc, g_.operand(*first_mm, 1).shape);
      c.push_back("e");
      c.push_back(j);
      em_.emit(fmt::format("for (kiln::i64 e = 0; e < {}LL; ++e) {{", dq));
      em_.begin_block();
      em_.emit(fmt::format("dot += q_row[e] * {};", operand_value(*first_mm, 1, c)));
      em_.emit("}");
      em_.begin_block();
      em_.emit(fmt::format("const float s_raw = {};", em_.rounded(g_.result(*first_mm), "dot")));
      em_.set_leaf(first_mm->output, "s_raw");
      Coords sc = bc;
      sc.push_back("qi");
      sc.push_back(j);
      const std::string v = em_.value(softmax->inputs[0], sc);
      return v;
    };
    const std::string neg_inf = "(-kiln::inf())";
    body += "    float row_max = " + neg_inf + ";\n";
    body += fmt::format("    for (kiln::i64 j = threadIdx.x; j < {}LL; j += blockDim.x) {{\n", skv);
    em_.begin_block();
    em_.emit(fmt::format("row_max = kiln::MaxOp::combine(row_max, {});", score("j")));
    body += em_.take(6) + "    }\n    row_max = kiln::block_reduce<kiln::MaxOp>(row_max, kiln_scratch);\n";
    body += "    float row_sum = 0.0f;\n";
    body += fmt::format("    for (kiln::i64 j = threadIdx.x; j < {}LL; j += blockDim.x) {{\n", skv);
    em_.begin_block();
    em_.emit(fmt::format("row_sum += expf({} - row_max);", score("j")));
    body += em_.take(6) + "    }\n    row_sum = kiln::block_reduce<kiln::SumOp>(row_sum, kiln_scratch);\n";
    // Pass 2: probabilities and p * v.
    body += fmt::format("    float acc[{}] = {{}};\n", per_thread);
    body += fmt::format("    for (kiln::i64 j0 = 0; j0 < {}LL; j0 += 128) {{\n", skv);
    body += "      const kiln::i64 j = j0 + threadIdx.x;\n      float p = 0.0f;\n";
    body += fmt::format("      if (j < {}LL) {{\n", skv);
    em_.begin_block();
    const std::string s = score("j");
    if (sdpa) {
      em_.emit(fmt::format("p = {};", Emitter::round_as(g_.operand(last, 2).value_dtype(),
                                                        fmt::format("expf({} - row_max) / row_sum", s))));
    } else {
      em_.emit(fmt::format("p = {};", em_.rounded(g_.result(*softmax), fmt::format("expf({} - row_max) / row_sum", s))));
    }
    body += em_.take(8) + "      }\n      __syncthreads();\n      p_chunk[threadIdx.x] = p;\n      __syncthreads();\n";
    body += fmt::format("      for (int jj = 0; jj < 128 && j0 + jj < {}LL; ++jj) {{\n", skv);
    body += "        const kiln::i64 jk = j0 + jj;\n";
    body += fmt::format("#pragma unroll\n        for (int t = 0; t < {}; ++t) {{\n", per_thread);
    body += fmt::format("          const kiln::i64 d = threadIdx.x + t * 128;\n          if (d >= {}LL) break;\n", dv);
    em_.begin_block();
    if (sdpa) {
      const int64_t heads = g_.operand(last, 0).shape[1], kv_heads = g_.operand(last, 1).shape[1];
      em_.emit(fmt::format("const kiln::i64 kvh2 = {} / {}LL;", bc[1], heads / kv_heads));
      em_.emit(fmt::format("acc[t] += p_chunk[jj] * {};", em_.value(last.inputs[2], Coords{bc[0], "kvh2", "jk", "d"})));
    } else {
      Coords c = broadcast_batch(bc, g_.operand(last, 1).shape);
      c.push_back("jk");
      c.push_back("d");
      em_.emit(fmt::format("acc[t] += p_chunk[jj] * {};", operand_value(last, 1, c)));
    }
    body += em_.take(10) + "        }\n      }\n    }\n";
    // Output and epilogue.
    body += fmt::format("#pragma unroll\n    for (int t = 0; t < {}; ++t) {{\n", per_thread);
    body += fmt::format("      const kiln::i64 d = threadIdx.x + t * 128;\n      if (d >= {}LL) break;\n", dv);
    em_.begin_block();
    // sdpa: a row whose keys are all masked gives zeros (graph-format.md rule 6).
    const std::string o = sdpa ? "(row_max == -kiln::inf() ? 0.0f : acc[t])" : "acc[t]";
    em_.emit(fmt::format("const float out = {};  // {}", em_.rounded(result, o), result.name));
    em_.set_leaf(last.output, "out");
    Coords oc = bc;
    oc.push_back("qi");
    oc.push_back("d");
    for (ir::TensorId t : k_.writes) {
      const Coords tc = write_coords(last.output, oc, t);
      em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + g_.tensor(t).name);
    }
    body += em_.take(6) + "    }\n    __syncthreads();\n  }\n";
    finish(body, 128);
    out_.grid = {blocks_for(batches * sq, 1), 1, 1};
  }

 private:
  const ir::Graph& g_;
  const ir::PlannedKernel& k_;
  ProgramState& state_;
  GeneratedKernel out_;
  std::vector<std::string> params_, param_notes_;
  std::map<ir::TensorId, std::string> writes_;
  std::map<ir::TensorId, ExternalTensor> ext_;
  int sm_;
  Emitter em_;
};

}  // namespace

int sm_of(const std::string& arch) {
  int sm = 0;
  for (char c : arch)
    if (c >= '0' && c <= '9') sm = sm * 10 + (c - '0');
  return sm;
}

DType storage_dtype(const ir::Tensor& t) {
  if (t.kind == ir::TensorKind::Input) return t.dtype;
  return t.value_dtype();
}

GeneratedProgram generate_program(const ir::Graph& g, const ir::Plan& plan, int sm) {
  ProgramState state;
  for (const ir::PlannedKernel& k : plan.kernels) {
    if (k.writes.empty() && k.workspace.empty()) continue;  // computes nothing anyone reads
    KernelBuilder b(g, k, state, sm);
    switch (k.kind) {
      case ir::KernelKind::Pointwise:
      case ir::KernelKind::Copy: b.pointwise(); break;
      case ir::KernelKind::Reduction: b.reduction(); break;
      case ir::KernelKind::Norm: b.norm(); break;
      case ir::KernelKind::Matmul: b.matmul(); break;
      case ir::KernelKind::Conv: b.conv(); break;
      case ir::KernelKind::Attention: b.attention(); break;
    }
    state.program.kernels.push_back(b.take());
    for (ir::TensorId t : k.writes)
      if (!g.tensor(t).is_output) state.program.intermediates.push_back(t);
  }
  return std::move(state.program);
}

}  // namespace kiln::codegen
