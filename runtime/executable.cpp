// Executable: compiled by the pipeline (pipeline.h), launched here through
// the Driver API into whichever context the caller's stream belongs to.
#include "kiln/executable.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <memory>
#include <utility>

#include "codegen/launch_geometry.h"
#include "compiler/graph_internal.h"
#include "compiler/specialize.h"
#include "compiler/error.h"
#include "compiler/rewrite_table.h"
#include "runtime/autotune.h"
#include "runtime/cuda_driver.h"
#include "runtime/executable_impl.h"
#include "runtime/log.h"
#include "runtime/pipeline.h"
#include "runtime/storage.h"
#include "runtime/tensor_map.h"

namespace kiln {

Executable::Executable(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executable::~Executable() = default;
Executable::Executable(Executable&&) noexcept = default;
Executable& Executable::operator=(Executable&&) noexcept = default;
const Graph& Executable::graph() const { return impl_->graph; }
const std::string& Executable::arch() const { return impl_->arch; }
const std::vector<KernelReport>& Executable::report() const { return impl_->reports; }
size_t Executable::kernel_count() const { return impl_->program().kernels.size(); }
size_t Executable::workspace_bytes() const { return impl_->workspace_bytes; }

Expected<size_t> Executable::workspace_bytes(std::span<const Shape> input_shapes) const {
  if (!impl_->probe) return impl_->workspace_bytes;
  Expected<std::shared_ptr<const runtime::SizedLaunch>> sized = impl_->sized_launch(input_shapes);
  if (!sized) return sized.error();
  return (*sized)->offsets.back();
}

namespace {

// KILN_DUMP=rewrites: each rewrite applied before planning, and each near
// miss with why, a line of the log (compiler/rewrite_table.h).
void log_rewrites(const Graph& graph) {
  const std::shared_ptr<const Options> o = current_options();
  if (("," + o->dump + ",").find(",rewrites,") == std::string::npos) return;
  const ir::Graph& planned = ir_of(graph);
  const std::string who = fmt::format("rewrites of graph {}: ", detail::quoted(graph.name()));
  if (planned.rewrites.empty()) detail::log(LogLevel::info, who + "none apply");
  const std::string text = ir::rewrite_notes_text(planned);
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at);
    detail::log(LogLevel::info, who + text.substr(at, end - at));
    at = end + 1;
  }
}

// The folders and files a compile may use, as the system will read them: a
// NUL inside would cut the path short there (and name another folder), so
// such a path is refused.
Status check_paths(const CompileOptions& options) {
  const std::shared_ptr<const Options> settings = current_options();
  const std::pair<const char*, const std::string*> paths[] = {
      {"cache_dir", &options.cache_dir},
      {"Options::cache_dir", &settings->cache_dir},
      {"Options::dump_dir", &settings->dump_dir},
      {"Options::remote_secret_file", &settings->remote_secret_file}};
  for (const auto& [what, path] : paths)
    if (path->find('\0') != std::string::npos)
      return Error{ErrorCode::InvalidInput,
                   fmt::format("{} {} holds a NUL character, which no path can hold", what, detail::quoted(*path))};
  return {};
}

}  // namespace

Expected<Executable> Executable::compile(const Graph& graph, const CompileOptions& options) {
  if (Status paths = check_paths(options); !paths) return paths.error();
  // A symbolic graph compiles once for every size where the pipeline covers it, else says why (pipeline.h).
  if (graph.is_symbolic() && options.autotune)
    return Error{ErrorCode::InvalidInput, fmt::format("graph {}: autotuning a graph with symbolic dimensions is not "
                                                      "supported; bind its sizes first (Graph::specialize)",
                                                      detail::quoted(graph.name()))};
  if (!graph.is_symbolic()) log_rewrites(graph);
  if (!options.autotune) return runtime::compile_executable(graph, options, nullptr);
  // Autotuning measures the choices; the pipeline compiles with them.
  Expected<runtime::TunedProgram> tuned = runtime::autotune(graph, options);
  if (!tuned) return tuned.error();
  CompileOptions chosen = options;
  chosen.arch = tuned->arch;
  chosen.autotune = false;
  Expected<std::unique_ptr<Impl>> impl = runtime::compile_program(graph, chosen, &tuned->choice);
  if (!impl) return impl.error();
  for (KernelReport& r : (*impl)->reports)
    for (const runtime::MeasuredTrial& t : tuned->trials)
      if (t.kernel == r.kernel) r.trials.push_back({t.tuning.to_string(), t.milliseconds});
  return Executable(std::move(*impl));
}

namespace {

size_t aligned(size_t bytes) {
  return (bytes + Executable::kWorkspaceAlignment - 1) / Executable::kWorkspaceAlignment * Executable::kWorkspaceAlignment;
}

Expected<int> index_of(const std::vector<std::string>& names, std::string_view name, const char* what, const Graph& g) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int>(i);
  return Error{ErrorCode::InvalidInput,
               fmt::format("{} is not an {} of graph {} ({}: {})", detail::quoted(name), what, detail::quoted(g.name()), what,
                           fmt::join(names, ", "))};
}

// Makes `context` current on this thread for the lifetime of the guard,
// when it is not already; the caller's current context is restored.
class ContextGuard {
 public:
  ContextGuard(const runtime::Driver& cu, CUcontext context) : cu_(cu) {
    CUcontext current = nullptr;
    cu_.cuCtxGetCurrent(&current);
    if (current != context) pushed_ = cu_.cuCtxPushCurrent(context) == CUDA_SUCCESS;
  }
  ContextGuard(const runtime::Driver& cu, CUcontext context, CUcontext current) : cu_(cu) {
    if (current != context) pushed_ = cu_.cuCtxPushCurrent(context) == CUDA_SUCCESS;
  }
  bool failed_to_switch(CUcontext context, CUcontext current) const { return current != context && !pushed_; }
  ~ContextGuard() {
    CUcontext popped;
    if (pushed_) cu_.cuCtxPopCurrent(&popped);
  }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  const runtime::Driver& cu_;
  bool pushed_ = false;
};

// The context a launch on `stream` runs in: the stream's; for the default
// stream, the thread's current context, else the primary context of
// `device` (made current: the default stream is the current context's).
Expected<CUcontext> launch_context(const runtime::Driver& cu, CUstream stream, int device, CUcontext& current) {
  cu.cuCtxGetCurrent(&current);
  if (stream != nullptr && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD) {
    CUcontext context = nullptr;
    if (cu.cuStreamGetCtx(stream, &context) != CUDA_SUCCESS || !context)
      return Error{ErrorCode::InvalidInput, "launch: the stream is not a valid CUDA stream"};
    return context;
  }
  if (current) return current;
  const int d = std::max(device, 0);
  CUcontext primary = runtime::primary_context(d);
  if (!primary) return Error{ErrorCode::CompileOrDevice, fmt::format("launch: there is no CUDA device {}", d)};
  cu.cuCtxSetCurrent(primary);
  current = primary;
  return primary;
}

// The driver, the context a launch on `stream` runs in, and the context
// current on the calling thread (restored after the launch).
struct LaunchScope {
  const runtime::Driver* cu = nullptr;
  CUcontext context = nullptr, current = nullptr;
};
Expected<LaunchScope> launch_scope(CUstream stream, int device) {
  LaunchScope scope;
  scope.cu = runtime::loaded_driver();
  if (!scope.cu) return runtime::driver().error();
  Expected<CUcontext> context = launch_context(*scope.cu, stream, device, scope.current);
  if (!context) return context.error();
  scope.context = *context;
  return scope;
}

}  // namespace

Expected<int> Executable::input_index(std::string_view name) const {
  return index_of(impl_->input_names, name, "input", impl_->graph);
}
Expected<int> Executable::output_index(std::string_view name) const {
  return index_of(impl_->output_names, name, "output", impl_->graph);
}

Expected<size_t> Executable::binding_bytes(std::string_view name) const {
  for (size_t i = 0; i < impl_->input_names.size(); ++i)
    if (impl_->input_names[i] == name) return impl_->input_bytes[i];
  for (size_t i = 0; i < impl_->output_names.size(); ++i)
    if (impl_->output_names[i] == name) return impl_->output_bytes[i];
  return Error{ErrorCode::InvalidInput, fmt::format("{} is not an input or output of graph {}", detail::quoted(name),
                                                    detail::quoted(impl_->graph.name()))};
}

const ir::Graph& Executable::Impl::planned_ir() const { return probe_graph ? ir_of(*probe_graph) : ir_of(graph); }

int64_t Executable::Impl::elements_at(const ir::Tensor& t, const ir::DimValues& values) const {
  if (!probe) return element_count(t.shape);
  const std::optional<ir::DimExpr> e = probe->expr_of(element_count(t.shape));
  KILN_INTERNAL_CHECK(e.has_value());
  return ir::evaluate(*e, values);
}

Expected<ir::DimValues> Executable::Impl::bind_sizes(std::span<const Shape> input_shapes) const {
  const ir::Graph& g = ir_of(graph);
  if (input_shapes.empty()) {
    if (!probe) return ir::DimValues{};
    return Error{ErrorCode::InvalidInput,
                 fmt::format("launch: graph {} has symbolic dimensions: bind the inputs' shapes (BoundArgs::input_shapes)",
                             detail::quoted(graph.name()))};
  }
  if (input_shapes.size() != g.inputs.size())
    return Error{ErrorCode::InvalidInput, fmt::format("launch: {} input shapes given; graph {} has {} inputs",
                                                      input_shapes.size(), detail::quoted(graph.name()), g.inputs.size())};
  if (!probe) {
    for (size_t i = 0; i < g.inputs.size(); ++i)
      if (const ir::Tensor& t = g.tensor(g.inputs[i]); input_shapes[i] != t.shape)
        return Error{ErrorCode::InvalidInput, fmt::format("binding error: input '{}' has shape {}, the graph's is {}", t.name,
                                                          to_string(input_shapes[i]), to_string(t.shape))};
    return ir::DimValues{};
  }
  Expected<ir::DimValues> values = detail::catch_errors(
      [&] { return ir::dim_values_from_shapes(g, std::vector<Shape>(input_shapes.begin(), input_shapes.end())); });
  if (!values) return Error{ErrorCode::InvalidInput, "binding error: " + values.error().message};
  return values;
}

Shape Executable::Impl::shape_at(const ir::Tensor& t, const ir::DimValues& values) const {
  if (!probe) return t.shape;
  Shape out;
  for (int64_t d : t.shape) {
    const std::optional<ir::DimExpr> e = probe->expr_of(d);
    KILN_INTERNAL_CHECK(e.has_value());
    out.push_back(ir::evaluate(*e, values));
  }
  return out;
}

Strides Executable::Impl::strides_at(const ir::Tensor& t, const Shape& shape) const {
  // (A symbolic graph's input is contiguous unless the document declared its strides, which are integers.)
  return probe && t.strides == contiguous_strides(t.shape) ? contiguous_strides(shape) : t.strides;
}

size_t Executable::Impl::output_bytes_at(size_t o, const ir::DimValues& values) const {
  if (!probe) return output_bytes[o];
  const ir::Tensor& t = planned_ir().tensor(planned_ir().outputs[o]);
  return static_cast<size_t>(elements_at(t, values) * byte_size(codegen::storage_dtype(t)));
}

Expected<std::vector<Shape>> Executable::output_shapes(std::span<const Shape> input_shapes) const {
  const Impl& x = *impl_;
  Expected<ir::DimValues> sizes = x.bind_sizes(input_shapes);
  if (!sizes) return sizes.error();
  const ir::Graph& g = x.planned_ir();
  std::vector<Shape> out;
  for (ir::TensorId id : g.outputs) out.push_back(x.shape_at(g.tensor(id), *sizes));
  return out;
}

std::vector<size_t> Executable::Impl::layout_at(const ir::DimValues& values) const {
  const ir::Graph& g = planned_ir();
  std::vector<size_t> offsets;
  size_t offset = 0;
  for (ir::TensorId t : program().intermediates) {
    const ir::Tensor& tensor = g.tensor(t);
    offsets.push_back(offset);
    offset += aligned(static_cast<size_t>(elements_at(tensor, values) * byte_size(codegen::storage_dtype(tensor))));
  }
  offsets.resize(offsets.size() + program().workspaces.size());
  for (int w : workspace_order) {
    offsets[program().intermediates.size() + static_cast<size_t>(w)] = offset;
    offset += aligned(static_cast<size_t>(program().workspaces[static_cast<size_t>(w)].words_at(values)) * 4);
  }
  offsets.push_back(offset);
  return offsets;
}

Expected<std::shared_ptr<const runtime::SizedLaunch>> Executable::Impl::sized_launch(std::span<const Shape> input_shapes) const {
  {
    std::lock_guard<std::mutex> lock(sized_mutex);
    if (last_sized && std::ranges::equal(last_sized->input_shapes, input_shapes)) return last_sized;
  }
  Expected<ir::DimValues> sizes = bind_sizes(input_shapes);
  if (!sizes) return sizes.error();
  auto sized = std::make_shared<runtime::SizedLaunch>();
  sized->input_shapes.assign(input_shapes.begin(), input_shapes.end());
  if (probe)
    for (const ir::DimSymbol& s : probe->table().symbols) sized->size_of_symbol.push_back(sizes->at(s.name));
  sized->offsets = probe ? layout_at(*sizes) : slot_offsets;
  for (const codegen::GeneratedKernel& k : program().kernels) sized->geometry.push_back(codegen::launch_geometry(k, *sizes));
  sized->runs = codegen::kernels_run_at(program().kernels, *sizes);
  for (const codegen::WorkspaceSpec& w : program().workspaces) sized->workspace_words.push_back(static_cast<size_t>(w.words_at(*sizes)));
  for (int w : workspace_order) {
    if (!reset_up_front[static_cast<size_t>(w)]) continue;
    const size_t at = sized->offsets[program().intermediates.size() + static_cast<size_t>(w)];
    const size_t end = at + sized->workspace_words[static_cast<size_t>(w)] * 4;
    const uint32_t fill = program().workspaces[static_cast<size_t>(w)].fill;
    std::vector<runtime::SizedLaunch::Reset>& r = sized->resets;
    if (!r.empty() && r.back().fill == fill) r.back().words = (end - r.back().offset) / 4;  // (the alignment between: filled too)
    else r.push_back({at, (end - at) / 4, fill});
  }
  for (size_t o = 0; o < output_names.size(); ++o) sized->output_bytes.push_back(output_bytes_at(o, *sizes));
  sized->sizes = std::move(*sizes);
  std::lock_guard<std::mutex> lock(sized_mutex);
  last_sized = sized;
  return std::shared_ptr<const runtime::SizedLaunch>(std::move(sized));
}

void Executable::Impl::resolve() {
  const ir::Graph& g = planned_ir();
  // A symbolic graph's bytes and workspace layout at its largest sizes (enough for every size).
  ir::DimValues largest;
  if (probe)
    for (const ir::DimSymbol& s : probe->table().symbols) largest[s.name] = s.largest();
  std::map<ir::TensorId, size_t> input_of, output_of, scratch_of;
  for (ir::TensorId id : g.inputs) {
    const ir::Tensor& t = g.tensor(id);
    input_of[id] = input_names.size();
    input_names.push_back(t.name);
    const Shape at_largest = shape_at(t, largest);
    input_bytes.push_back(static_cast<size_t>(runtime::span_elements(at_largest, strides_at(t, at_largest)) * byte_size(t.dtype)));
    input_contiguous.push_back(t.strides == contiguous_strides(t.shape));
    input_alignment.push_back(static_cast<size_t>(byte_size(t.dtype)));
  }
  for (ir::TensorId id : g.outputs) {
    const ir::Tensor& t = g.tensor(id);
    output_of[id] = output_names.size();
    output_names.push_back(t.name);
    output_bytes.push_back(static_cast<size_t>(elements_at(t, largest) * byte_size(codegen::storage_dtype(t))));
    output_alignment.push_back(static_cast<size_t>(byte_size(codegen::storage_dtype(t))));
    output_is_input.push_back(t.kind == ir::TensorKind::Input ? static_cast<int>(input_of.at(id)) : -1);
  }
  // The workspace: intermediates, then kernel workspaces, each aligned; those
  // one kernel resets first, by fill.
  for (size_t i = 0; i < program().intermediates.size(); ++i) scratch_of[program().intermediates[i]] = i;
  std::vector<int> resetters(program().workspaces.size(), 0);
  for (const codegen::GeneratedKernel& k : program().kernels)
    for (int w : k.reset_workspaces) ++resetters[static_cast<size_t>(w)];
  reset_up_front.assign(program().workspaces.size(), false);
  for (size_t w = 0; w < program().workspaces.size(); ++w) {
    reset_up_front[w] = resetters[w] == 1;
    workspace_order.push_back(static_cast<int>(w));
  }
  std::stable_sort(workspace_order.begin(), workspace_order.end(), [&](int a, int b) {
    const auto key = [&](int w) { return std::pair{!reset_up_front[static_cast<size_t>(w)], program().workspaces[static_cast<size_t>(w)].fill}; };
    return key(a) < key(b);
  });
  slot_offsets = layout_at(largest);
  workspace_bytes = slot_offsets.back();
  slot_offsets.pop_back();
  for (const codegen::GeneratedKernel& k : program().kernels) {
    runtime::KernelLaunch launch;
    for (const codegen::KernelArg& a : k.args) {
      using Role = codegen::KernelArg::Role;
      using From = runtime::ArgSource::From;
      runtime::ArgSource source;
      if (a.role == Role::Workspace) {
        source = {From::Workspace, program().intermediates.size() + static_cast<size_t>(a.workspace)};
      } else if (a.role == Role::Size) {
        source = {From::Size, static_cast<size_t>(a.symbol)};
      } else if (input_of.count(a.tensor)) {  // inputs first: an output that is an input is read where it is bound
        source = {From::Input, input_of.at(a.tensor)};
      } else if (output_of.count(a.tensor)) {
        source = {From::Output, output_of.at(a.tensor)};
      } else {
        source = {From::Workspace, scratch_of.at(a.tensor)};
      }
      launch.args.push_back(source);
      launch.is_map.push_back(a.role == Role::TensorMap);
      launch.map_count += a.role == Role::TensorMap;
    }
    launches.push_back(std::move(launch));
  }
}

runtime::DeviceState::~DeviceState() {
  const runtime::Driver* cu = runtime::loaded_driver();
  if (!cu) return;
  CUcontext current = nullptr;
  cu->cuCtxGetCurrent(&current);
  ContextGuard guard(*cu, context, current);
  if (guard.failed_to_switch(context, current)) {  // the context is gone, and its modules with it
    for (std::unique_ptr<VendorGemmCall>& call : vendor_calls) (void)call.release();
    return;
  }
  vendor_calls.clear();
  for (CUmodule m : modules) cu->cuModuleUnload(m);
}

Expected<runtime::DeviceState*> Executable::Impl::device_state(CUcontext context) const {
  {
    std::shared_lock<std::shared_mutex> lock(devices_mutex);
    if (auto it = devices.find(context); it != devices.end()) return it->second.get();
  }
  std::unique_lock<std::shared_mutex> lock(devices_mutex);
  if (auto it = devices.find(context); it != devices.end()) return it->second.get();
  const runtime::Driver& cu = *runtime::loaded_driver();
  ContextGuard guard(cu, context);
  CUdevice device;
  int major = 0, minor = 0, multiprocessors = 1;
  if (Status s = runtime::check(cu.cuCtxGetDevice(&device), "cuCtxGetDevice"); !s) return s.error();
  cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  cu.cuDeviceGetAttribute(&multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
  if (const std::string here = fmt::format("sm_{}{}", major, minor); here != arch)
    return Error{ErrorCode::CompileOrDevice,
                 fmt::format("the kernels were compiled for {} but the GPU (device {}) is {}", arch, device, here)};
  auto state = std::make_unique<runtime::DeviceState>();
  state->context = context;
  state->maps.resize(program().kernels.size());
  const uint32_t sms = static_cast<uint32_t>(std::max(multiprocessors, 1));
  for (size_t i = 0; i < compiled->cubins.size(); ++i) {
    const codegen::GeneratedKernel& k = program().kernels[i];
    if (k.library) {  // a vendor library's call: its descriptors and algorithm, made once here
      Expected<std::unique_ptr<runtime::VendorGemmCall>> call = runtime::VendorGemmCall::prepare(*k.library, k.plan_kernel);
      if (!call) return call.error();
      state->vendor_calls.push_back(std::move(*call));
      state->functions.push_back(nullptr);
      state->resident_blocks.push_back(0);
      continue;
    }
    state->vendor_calls.push_back(nullptr);
    CUmodule module;
    CUfunction function;
    if (Status s = runtime::check(cu.cuModuleLoadData(&module, compiled->cubins[i].data()), "cuModuleLoadData"); !s)
      return s.error();
    state->modules.push_back(module);
    if (Status s = runtime::check(cu.cuModuleGetFunction(&function, module, "kiln_kernel"), "cuModuleGetFunction"); !s)
      return s.error();
    state->functions.push_back(function);
    if (k.shared_bytes > 48 * 1024)
      if (Status s = runtime::check(cu.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                          static_cast<int>(k.shared_bytes)),
                                    fmt::format("cuFuncSetAttribute (kernel {}: {} bytes of shared memory)", k.plan_kernel,
                                                k.shared_bytes));
          !s)
        return s.error();
    // Persistent kernels launch as many blocks as run at once (whole clusters).
    uint32_t resident = 0;
    if (k.persistent_group > 1) {
      CUlaunchConfig config{};
      config.gridDimX = k.persistent_group, config.gridDimY = config.gridDimZ = 1;
      config.blockDimX = k.block[0], config.blockDimY = k.block[1], config.blockDimZ = k.block[2];
      config.sharedMemBytes = k.shared_bytes;
      int clusters = 0;
      if (cu.cuOccupancyMaxActiveClusters(&clusters, function, &config) == CUDA_SUCCESS)
        resident = static_cast<uint32_t>(clusters) * k.persistent_group;
    } else if (k.persistent_group == 1) {
      int per_sm = 0;
      if (cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, function, static_cast<int>(k.block[0] * k.block[1] * k.block[2]),
                                                         k.shared_bytes) == CUDA_SUCCESS)
        resident = static_cast<uint32_t>(per_sm) * sms;
    }
    if (k.persistent_group && resident == 0)  // no answer: one block per SM, whole clusters
      resident = std::max(sms / k.persistent_group, 1u) * k.persistent_group;
    state->resident_blocks.push_back(resident);
    if (k.persistent_group && current_options()->trace_launch)
      detail::log(LogLevel::info, fmt::format("kernel {} is persistent: {} of its {} blocks run at once ({} SMs, groups of {})",
                                              k.plan_kernel, resident, k.grid[0], sms, k.persistent_group));
  }
  runtime::DeviceState* raw = state.get();
  devices.emplace(context, std::move(state));
  return raw;
}

namespace {

// A symbolic graph's tensor map at bound sizes: its extents and strides evaluated.
codegen::TensorMapSpec map_at(const codegen::TensorMapSpec& spec, const ir::DimValues& sizes) {
  codegen::TensorMapSpec at = spec;
  for (size_t d = 0; d < spec.dim_exprs.size(); ++d) at.dims[d] = static_cast<uint64_t>(ir::evaluate(spec.dim_exprs[d], sizes));
  for (size_t d = 0; d < spec.stride_exprs.size(); ++d)
    at.strides[d] = static_cast<uint64_t>(ir::evaluate(spec.stride_exprs[d], sizes));
  return at;
}

}  // namespace

// The tensor maps of kernel `kernel` over the pointers in `values` (one per
// argument), into `out` in argument order: each encoded once per pointer,
// sizes (`size_key`, a symbolic graph's) and context, then copied from the cache.
Status Executable::Impl::tensor_maps(runtime::DeviceState& st, size_t kernel, const CUdeviceptr* values,
                                     const ir::DimValues& sizes, const std::vector<int64_t>& size_key, CUtensorMap* out) const {
  const codegen::GeneratedKernel& k = program().kernels[kernel];
  const runtime::KernelLaunch& plan = launches[kernel];
  std::lock_guard<std::mutex> lock(st.maps_mutex);
  auto& cache = st.maps[kernel];
  for (size_t a = 0, m = 0; a < plan.args.size(); ++a) {
    if (!plan.is_map[a]) continue;
    const codegen::TensorMapSpec& spec = k.args[a].map;
    const bool sized = !spec.dim_exprs.empty();
    auto it = cache.find({a, values[a], sized ? size_key : std::vector<int64_t>{}});
    if (it == cache.end()) {
      if (cache.size() >= 256) cache.clear();  // bounded: a caller cycling through many buffers or sizes re-encodes
      Expected<CUtensorMap> map =
          runtime::encode_tensor_map(*runtime::loaded_driver(), sized ? map_at(spec, sizes) : spec, values[a]);
      if (!map)
        return Error{map.error().code, fmt::format("kernel {}: tensor '{}': {}", k.plan_kernel,
                                                   ir_of(graph).tensor(k.args[a].tensor).name, map.error().message)};
      it = cache.emplace(std::make_tuple(a, values[a], sized ? size_key : std::vector<int64_t>{}), *map).first;
    }
    out[m++] = it->second;
  }
  return {};
}

namespace {

// A launch's bindings: as many as the graph has, none null, a workspace
// where one is needed, and an output that is a strided input bound to it.
Status check_bindings(const Executable::Impl& x, const BoundArgs& args, const void* workspace) {
  if (args.inputs.size() != x.input_names.size() || args.outputs.size() != x.output_names.size())
    return Error{ErrorCode::InvalidInput, fmt::format("launch: {} inputs and {} outputs bound; graph {} has {} and {}",
                                                      args.inputs.size(), args.outputs.size(), detail::quoted(x.graph.name()),
                                                      x.input_names.size(), x.output_names.size())};
  // A binding's address is a multiple of its element's size (kernels load whole elements; a
  // misaligned load would fault and poison the context), and not null.
  auto check_address = [&](const void* p, const std::string& name, size_t alignment) -> Status {
    if (!p) return Error{ErrorCode::InvalidInput, fmt::format("binding '{}': null pointer", name)};
    if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
      return Error{ErrorCode::InvalidInput,
                   fmt::format("binding '{}': address {} is not a multiple of {} bytes, its element's size", name, p, alignment)};
    return {};
  };
  for (size_t i = 0; i < args.inputs.size(); ++i)
    if (Status s = check_address(args.inputs[i], x.input_names[i], x.input_alignment[i]); !s) return s;
  for (size_t i = 0; i < args.outputs.size(); ++i)
    if (Status s = check_address(args.outputs[i], x.output_names[i], x.output_alignment[i]); !s) return s;
  if (x.workspace_bytes > 0 && (!workspace || reinterpret_cast<uintptr_t>(workspace) % Executable::kWorkspaceAlignment != 0))
    return Error{ErrorCode::InvalidInput,
                 fmt::format("launch: graph {} needs a workspace of {} bytes, {}-byte aligned (workspace_bytes()); {}",
                             detail::quoted(x.graph.name()), x.workspace_bytes, Executable::kWorkspaceAlignment, workspace ? "this one is not aligned" : "none given")};
  for (size_t o = 0; o < x.output_is_input.size(); ++o)
    if (const int i = x.output_is_input[o]; i >= 0 && args.outputs[o] != args.inputs[static_cast<size_t>(i)] &&
                                            !x.input_contiguous[static_cast<size_t>(i)])
      return Error{ErrorCode::InvalidInput, fmt::format("output '{}' is the strided input '{}': bind the same buffer to both",
                                                        x.output_names[o], x.input_names[static_cast<size_t>(i)])};
  return {};
}

}  // namespace

Status Executable::launch(const BoundArgs& args, void* workspace, void* stream_handle) const {
  const Impl& x = *impl_;
  if (Status s = check_bindings(x, args, workspace); !s) return s;
  // The sizes, checked before anything runs, and what follows from them (the last launch's for the same shapes).
  Expected<std::shared_ptr<const runtime::SizedLaunch>> sized_or = x.sized_launch(args.input_shapes);
  if (!sized_or) return sized_or.error();
  const runtime::SizedLaunch& sized = **sized_or;
  const std::vector<int64_t>& size_of_symbol = sized.size_of_symbol;
  const auto scratch = reinterpret_cast<CUdeviceptr>(workspace);
  const std::vector<size_t>& offsets = sized.offsets;
  const auto stream = static_cast<CUstream>(stream_handle);
  Expected<LaunchScope> scope = launch_scope(stream, x.device);
  if (!scope) return scope.error();
  const runtime::Driver& cu = *scope->cu;
  Expected<runtime::DeviceState*> state = x.device_state(scope->context);
  if (!state) return state.error();
  ContextGuard guard(cu, scope->context, scope->current);

  auto pointer = [&](const runtime::ArgSource& s) -> CUdeviceptr {
    switch (s.from) {
      case runtime::ArgSource::From::Input: return reinterpret_cast<CUdeviceptr>(args.inputs[s.index]);
      case runtime::ArgSource::From::Output: return reinterpret_cast<CUdeviceptr>(args.outputs[s.index]);
      case runtime::ArgSource::From::Workspace: return scratch + offsets[s.index];
      case runtime::ArgSource::From::Size: return static_cast<CUdeviceptr>(size_of_symbol[s.index]);  // an i64 parameter
    }
    return 0;
  };
  for (const runtime::SizedLaunch::Reset& r : sized.resets)
    if (r.words > 0)  // (a symbolic graph's workspaces at a small size may be empty)
      if (CUresult e = cu.cuMemsetD32Async(scratch + r.offset, r.fill, r.words, stream); e != CUDA_SUCCESS)
        return runtime::check(e, "cuMemsetD32Async");
  for (size_t i = 0; i < x.program().kernels.size(); ++i) {
    if (!sized.runs[i]) continue;  // (another variant of its plan kernel runs at these sizes)
    const codegen::GeneratedKernel& k = x.program().kernels[i];
    const runtime::KernelLaunch& plan = x.launches[i];
    for (int w : k.reset_workspaces) {
      if (x.reset_up_front[static_cast<size_t>(w)]) continue;
      const codegen::WorkspaceSpec& spec = x.program().workspaces[static_cast<size_t>(w)];
      if (CUresult r = cu.cuMemsetD32Async(scratch + offsets[x.program().intermediates.size() + static_cast<size_t>(w)], spec.fill,
                                           sized.workspace_words[static_cast<size_t>(w)], stream);
          r != CUDA_SUCCESS)
        return runtime::check(r, "cuMemsetD32Async");
    }
    // Pointers and tensor maps live here until cuLaunchKernel has copied them.
    constexpr size_t kMaxArgs = 64;
    std::array<CUdeviceptr, kMaxArgs> values;
    std::array<void*, kMaxArgs> params;
    if (plan.args.size() > kMaxArgs)
      return Error{ErrorCode::Internal, fmt::format("internal error: kernel {} has {} arguments (at most {})", k.plan_kernel,
                                                    plan.args.size(), kMaxArgs)};
    for (size_t a = 0; a < plan.args.size(); ++a) values[a] = pointer(plan.args[a]);
    if (const runtime::VendorGemmCall* call = (*state)->vendor_calls[i].get()) {
      if (Status s = call->launch(values.data(), sized.sizes, stream); !s) return s;
      continue;
    }
    constexpr size_t kMaxMaps = 16;
    std::array<CUtensorMap, kMaxMaps> maps;
    if (static_cast<size_t>(plan.map_count) > kMaxMaps)
      return Error{ErrorCode::Internal, fmt::format("internal error: kernel {} has {} tensor maps (at most {})", k.plan_kernel,
                                                    plan.map_count, kMaxMaps)};
    if (plan.map_count > 0)
      if (Status s = x.tensor_maps(**state, i, values.data(), sized.sizes, size_of_symbol, maps.data()); !s) return s;
    for (size_t a = 0, m = 0; a < plan.args.size(); ++a)
      params[a] = plan.is_map[a] ? static_cast<void*>(&maps[m++]) : static_cast<void*>(&values[a]);
    const runtime::DeviceState& st = **state;
    const codegen::LaunchGeometry& at = sized.geometry[i];
    const uint32_t grid_x = k.persistent_group ? std::min(at.grid[0], st.resident_blocks[i]) : at.grid[0];
    if (CUresult r = cu.cuLaunchKernel(st.functions[i], grid_x, at.grid[1], at.grid[2], at.block[0], at.block[1], at.block[2],
                                       at.shared_bytes, stream, params.data(), nullptr);
        r != CUDA_SUCCESS)
      return runtime::check(r, fmt::format("cuLaunchKernel (kernel {})", k.plan_kernel));
  }
  // Outputs that are graph inputs: the input's values (contiguous, checked above).
  for (size_t o = 0; o < x.output_is_input.size(); ++o)
    if (const int i = x.output_is_input[o]; i >= 0 && args.outputs[o] != args.inputs[static_cast<size_t>(i)])
      if (Status s = runtime::check(cu.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(args.outputs[o]),
                                                          reinterpret_cast<CUdeviceptr>(args.inputs[static_cast<size_t>(i)]),
                                                          sized.output_bytes[o], stream),
                                    "cuMemcpyDtoDAsync");
          !s)
        return s;
  return {};
}

Status Executable::launch(const std::vector<DeviceBinding>& bindings, void* stream_handle) const {
  const Impl& x = *impl_;
  if (x.probe)
    return Error{ErrorCode::InvalidInput, fmt::format("launch: graph {} has symbolic dimensions: launch it with BoundArgs "
                                                      "and the inputs' shapes",
                                                      detail::quoted(x.graph.name()))};
  std::vector<void*> inputs(x.input_names.size(), nullptr), outputs(x.output_names.size(), nullptr);
  for (const DeviceBinding& b : bindings) {
    Expected<size_t> need = binding_bytes(b.name);
    if (!need) return need.error();
    if (b.pointer == nullptr) return Error{ErrorCode::InvalidInput, fmt::format("binding '{}': null pointer", b.name)};
    if (b.bytes < *need)
      return Error{ErrorCode::InvalidInput, fmt::format("binding '{}': {} bytes given, {} needed", b.name, b.bytes, *need)};
    if (Expected<int> i = input_index(b.name); i) inputs[static_cast<size_t>(*i)] = b.pointer;
    if (Expected<int> o = output_index(b.name); o) outputs[static_cast<size_t>(*o)] = b.pointer;
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i]) return Error{ErrorCode::InvalidInput, fmt::format("input '{}' is not bound", x.input_names[i])};
  for (size_t o = 0; o < outputs.size(); ++o)
    if (!outputs[o]) return Error{ErrorCode::InvalidInput, fmt::format("output '{}' is not bound", x.output_names[o])};
  if (x.workspace_bytes == 0) return launch(BoundArgs{inputs, outputs}, nullptr, stream_handle);
  const auto stream = static_cast<CUstream>(stream_handle);
  Expected<LaunchScope> scope = launch_scope(stream, x.device);
  if (!scope) return scope.error();
  const runtime::Driver& cu = *scope->cu;
  ContextGuard guard(cu, scope->context, scope->current);
  CUdeviceptr workspace = 0;
  if (Status s = runtime::check(cu.cuMemAllocAsync(&workspace, x.workspace_bytes, stream),
                                fmt::format("cuMemAllocAsync (a workspace of {} bytes)", x.workspace_bytes));
      !s)
    return s;
  Status launched = launch(BoundArgs{inputs, outputs}, reinterpret_cast<void*>(workspace), stream_handle);
  Status freed = runtime::check(cu.cuMemFreeAsync(workspace, stream), "cuMemFreeAsync");
  return launched.ok() ? freed : launched;
}

Expected<std::vector<HostTensor>> Executable::run_host(const std::vector<HostTensor>& inputs) const {
  const ir::Graph& g = impl_->planned_ir();
  if (inputs.size() != g.inputs.size())
    return Error{ErrorCode::InvalidInput, fmt::format("{} inputs given, the graph has {}", inputs.size(), g.inputs.size())};
  // The sizes from the inputs' shapes, checked before the GPU is touched.
  std::vector<Shape> shapes;
  for (const HostTensor& t : inputs) shapes.push_back(t.shape);
  Expected<ir::DimValues> sizes = impl_->bind_sizes(impl_->probe ? std::span<const Shape>(shapes) : std::span<const Shape>());
  if (!sizes) return sizes.error();
  std::vector<size_t> output_bytes;
  for (size_t o = 0; o < g.outputs.size(); ++o) output_bytes.push_back(impl_->output_bytes_at(o, *sizes));
  Expected<const runtime::Driver*> d = runtime::driver();
  if (!d) return d.error();
  const runtime::Driver& cu = **d;
  std::vector<CUdeviceptr> allocations;
  auto release = [&] {
    for (CUdeviceptr p : allocations) cu.cuMemFree(p);
  };
  auto allocate = [&](size_t bytes) -> Expected<CUdeviceptr> {
    CUdeviceptr p;
    if (Status s = runtime::check(cu.cuMemAlloc(&p, std::max<size_t>(bytes, 4)),
                                  fmt::format("cuMemAlloc ({} bytes)", bytes));
        !s)
      return s.error();
    allocations.push_back(p);
    return p;
  };
  // (A symbolic graph's inputs and workspace at the bound sizes, not its range's largest.)
  int64_t device_bytes = static_cast<int64_t>(impl_->probe ? impl_->layout_at(*sizes).back() : impl_->workspace_bytes);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::Tensor& t = g.tensor(g.inputs[i]);
    const Shape shape = impl_->shape_at(t, *sizes);
    device_bytes += runtime::span_elements(shape, impl_->strides_at(t, shape)) * byte_size(t.dtype);
  }
  for (size_t o = 0; o < g.outputs.size(); ++o)
    if (impl_->output_is_input[o] < 0) device_bytes += static_cast<int64_t>(output_bytes[o]);
  if (Status s = runtime::require_device_memory(cu, device_bytes, fmt::format("running graph {} (inputs, outputs and "
                                                                               "workspace)", detail::quoted(impl_->graph.name())));
      !s)
    return s.error();
  std::vector<void*> in(inputs.size()), out(g.outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::Tensor& t = g.tensor(g.inputs[i]);
    const Shape shape = impl_->shape_at(t, *sizes);
    if (inputs[i].shape != shape || inputs[i].dtype != t.dtype) {
      release();
      return Error{ErrorCode::InvalidInput, fmt::format("input '{}': expected {}{}, got {}{}", t.name, to_string(t.dtype),
                                                        to_string(shape), to_string(inputs[i].dtype), to_string(inputs[i].shape))};
    }
    const std::string bytes = runtime::to_storage(inputs[i], impl_->strides_at(t, shape));
    Expected<CUdeviceptr> p = allocate(bytes.size());
    if (!p) return release(), p.error();
    if (Status s = runtime::check(cu.cuMemcpyHtoD(*p, bytes.data(), bytes.size()), "cuMemcpyHtoD"); !s) return release(), s.error();
    in[i] = reinterpret_cast<void*>(*p);
  }
  for (size_t o = 0; o < g.outputs.size(); ++o) {
    if (impl_->output_is_input[o] >= 0) {  // an input returned as is
      out[o] = in[static_cast<size_t>(impl_->output_is_input[o])];
      continue;
    }
    Expected<CUdeviceptr> p = allocate(output_bytes[o]);
    if (!p) return release(), p.error();
    if (Status s = runtime::check(cu.cuMemsetD8Async(*p, 0xff, output_bytes[o], nullptr), "cuMemsetD8Async"); !s)
      return release(), s.error();
    out[o] = reinterpret_cast<void*>(*p);
  }
  const size_t workspace_bytes = impl_->probe ? impl_->layout_at(*sizes).back() : impl_->workspace_bytes;
  Expected<CUdeviceptr> workspace = workspace_bytes ? allocate(workspace_bytes) : Expected<CUdeviceptr>(0);
  if (!workspace) return release(), workspace.error();
  if (Status s = launch(BoundArgs{in, out, impl_->probe ? std::span<const Shape>(shapes) : std::span<const Shape>()},
                        reinterpret_cast<void*>(*workspace), nullptr);
      !s)
    return release(), s.error();
  if (Status s = runtime::check(cu.cuCtxSynchronize(), "running the kernels"); !s) return release(), s.error();
  std::vector<HostTensor> result;
  for (size_t o = 0; o < g.outputs.size(); ++o) {
    const ir::Tensor& t = g.tensor(g.outputs[o]);
    if (impl_->output_is_input[o] >= 0) {
      result.push_back(inputs[static_cast<size_t>(impl_->output_is_input[o])]);
      continue;
    }
    const DType storage = codegen::storage_dtype(t);
    const Shape shape = impl_->shape_at(t, *sizes);
    std::string bytes(output_bytes[o], '\0');
    if (Status s = runtime::check(cu.cuMemcpyDtoH(bytes.data(), reinterpret_cast<CUdeviceptr>(out[o]), bytes.size()),
                                  "cuMemcpyDtoH");
        !s)
      return release(), s.error();
    result.push_back(HostTensor{shape, t.dtype, runtime::from_storage(bytes, storage, element_count(shape))});
  }
  release();
  return result;
}

}  // namespace kiln
