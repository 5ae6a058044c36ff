// Executable: plan -> codegen -> NVRTC (or the kernel cache) -> Driver API.
#include "kiln/executable.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "codegen/kernel_codegen.h"
#include "compiler/error.h"
#include "compiler/numerics.h"
#include "compiler/plan_printer.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "runtime/autotune.h"
#include "runtime/cache_dir.h"
#include "runtime/cuda_driver.h"
#include "runtime/tensor_map.h"
#include "runtime/kernel_cache.h"
#include "runtime/nvrtc.h"
#include "runtime/program_cache.h"
#include "runtime/storage.h"

namespace kiln {
namespace {

// Cubins compiled or loaded by this process, by key.
std::mutex memory_cache_mutex;
std::map<ir::Hash128, std::string>& memory_cache() {
  static std::map<ir::Hash128, std::string> cache;
  return cache;
}

// Compiled programs of this process, by program key: a warm process skips
// planning and codegen.
struct Compiled {
  runtime::ProgramRecipe recipe;
  std::vector<std::string> cubins;
};
std::map<ir::Hash128, std::shared_ptr<const Compiled>>& program_memory() {
  static std::map<ir::Hash128, std::shared_ptr<const Compiled>> programs;
  return programs;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

// The stages named in KILN_DUMP ("plan,cuda,ptx"; also "ir") under
// $KILN_DUMP_DIR (default ./kiln_dump)/<graph>-<program key>/.
void write_dumps(const std::string& stages, const Graph& graph, const ir::Plan& plan,
                 const codegen::GeneratedProgram& program, const std::string& arch, const ir::Hash128& key) {
  namespace fs = std::filesystem;
  auto wants = [&](const char* s) { return ("," + stages + ",").find(std::string(",") + s + ",") != std::string::npos; };
  std::string name = graph.name().empty() ? "graph" : graph.name().substr(0, 48);
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-') ch = '_';
  const char* base = std::getenv("KILN_DUMP_DIR");
  const fs::path dir = fs::path(base && *base ? base : "kiln_dump") / (name + "-" + key.hex().substr(0, 12));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (wants("ir")) std::ofstream(dir / "ir.txt") << graph.to_ir_text();
  if (wants("plan")) std::ofstream(dir / "plan.txt") << ir::plan_to_text(graph.ir(), plan);
  for (const codegen::GeneratedKernel& k : program.kernels) {
    const std::string stem = fmt::format("kernel{}-{}", k.plan_kernel,
                                         ir::to_string(plan.kernels[static_cast<size_t>(k.plan_kernel)].kind));
    if (wants("cuda")) std::ofstream(dir / (stem + ".cu")) << k.source;
    if (wants("ptx"))
      if (Expected<runtime::NvrtcOutput> ptx = runtime::nvrtc_compile(k.source, arch, true); ptx)
        std::ofstream(dir / (stem + ".ptx")) << ptx->binary;
  }
}


}  // namespace

struct Executable::Impl {
  Graph graph;
  std::string arch;
  std::shared_ptr<const Compiled> compiled;
  std::vector<KernelReport> reports;
  const codegen::GeneratedProgram& program() const { return compiled->recipe.program; }

  // Device state, made on first launch.
  const runtime::Driver* driver = nullptr;
  std::vector<CUmodule> modules;
  std::vector<CUfunction> functions;
  std::map<ir::TensorId, CUdeviceptr> intermediates;
  std::vector<CUdeviceptr> workspaces;
  uint32_t multiprocessors = 1;
  std::vector<uint32_t> resident_blocks;  // per kernel: how many of its blocks run at once (persistent kernels)

  explicit Impl(Graph g) : graph(std::move(g)) {}
  ~Impl() {
    if (!driver) return;
    for (auto& [t, p] : intermediates) driver->cuMemFree(p);
    for (CUdeviceptr p : workspaces) driver->cuMemFree(p);
    for (CUmodule m : modules) driver->cuModuleUnload(m);
  }

  Status prepare_device();
};

Executable::Executable(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executable::~Executable() = default;
Executable::Executable(Executable&&) noexcept = default;
Executable& Executable::operator=(Executable&&) noexcept = default;
const Graph& Executable::graph() const { return impl_->graph; }
const std::string& Executable::arch() const { return impl_->arch; }
const std::vector<KernelReport>& Executable::report() const { return impl_->reports; }
size_t Executable::kernel_count() const { return impl_->program().kernels.size(); }

Expected<Executable> Executable::compile(const Graph& graph, const CompileOptions& options) {
  if (options.autotune) return runtime::autotune(graph, options);
  return ExecutableFactory::compile(graph, options, nullptr);
}

std::vector<KernelReport>& ExecutableFactory::reports(Executable& exe) { return exe.impl_->reports; }

Expected<ExecutableFactory::Planned> ExecutableFactory::plan_and_generate(const Graph& graph, bool fuse, const std::string& arch,
                                                                          const codegen::ProgramTuning& tuning) {
  ir::Plan plan = ir::plan_fusion(graph.ir(), {.fuse = fuse});
  if (std::string problem = ir::verify_plan(graph.ir(), plan); !problem.empty())
    return Error{ErrorCode::Internal, "internal error: invalid plan: " + problem + " (this is a bug in kiln; please report it)"};
  Expected<codegen::GeneratedProgram> program =
      detail::catch_errors([&] { return codegen::generate_program(graph.ir(), plan, codegen::sm_of(arch), tuning); });
  if (!program) return program.error();
  return Planned{std::move(plan), std::move(program).value()};
}

Expected<Executable> ExecutableFactory::compile(const Graph& graph, const CompileOptions& options,
                                                const codegen::ProgramTuning* chosen) {
  using Impl = Executable::Impl;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(); };
  auto impl = std::make_unique<Impl>(graph);
  impl->arch = options.arch.empty() ? runtime::device_arch().value_or("sm_90") : options.arch;
  if (!runtime::is_valid_arch(impl->arch))
    return Error{ErrorCode::InvalidInput, fmt::format("arch '{}': expected sm_XX (e.g. sm_80, sm_90)", impl->arch)};
  const std::string cache_dir = options.cache_dir.empty() ? runtime::default_cache_dir() : options.cache_dir;
  const ir::Hash128 program_key = runtime::program_key(graph.to_json(), impl->arch, options.fuse);
  // Tile choices: the caller's, else those an autotuning run recorded for
  // this program. They are part of the program's identity.
  const codegen::ProgramTuning tuning =
      chosen ? *chosen : options.use_cache ? runtime::recorded_tuning(cache_dir, program_key) : codegen::ProgramTuning{};
  const ir::Hash128 recipe_key = runtime::tuned_program_key(program_key, tuning);
  const size_t tensors = graph.ir().tensors.size();
  auto report_of = [&](const codegen::GeneratedKernel& k, const std::string& kind, const std::string& key) {
    KernelReport r{.kernel = k.plan_kernel, .kind = kind, .key = key, .cache_hit = true, .milliseconds = 0,
                   .tuning = k.tuning.to_string(), .tuned = false, .trials = {}};
    // (a recorded choice the generator did not accept was not used)
    const auto wanted = tuning.find(k.plan_kernel);
    r.tuned = wanted != tuning.end() && wanted->second == k.tuning;
    return r;
  };
  auto hit = [&](std::shared_ptr<const Compiled> c) {
    impl->compiled = std::move(c);
    const double ms = elapsed();
    for (size_t i = 0; i < impl->program().kernels.size(); ++i) {
      impl->reports.push_back(report_of(impl->program().kernels[i], impl->compiled->recipe.kernel_kinds[i],
                                        impl->compiled->recipe.kernel_keys[i]));
      impl->reports.back().milliseconds = ms;
    }
    return Executable(std::move(impl));
  };

  // KILN_DUMP=plan,cuda,ptx writes those stages to KILN_DUMP_DIR: planning
  // and codegen must run, so the caches of whole programs are bypassed.
  const std::string dump = std::getenv("KILN_DUMP") ? std::getenv("KILN_DUMP") : "";
  // 1. This process compiled it already.
  {
    std::lock_guard<std::mutex> lock(memory_cache_mutex);
    if (auto it = program_memory().find(recipe_key); it != program_memory().end() && dump.empty()) return hit(it->second);
  }
  // 2. The disk has its recipe and every cubin: no planning, no codegen.
  std::optional<runtime::KernelCache> disk;
  if (options.use_cache) {
    if (Status safe = runtime::secure_cache_dir(cache_dir); safe) {
      disk.emplace(cache_dir);
    } else {
      static std::once_flag warned;  // once per process: every compile would say the same
      std::call_once(warned, [&] { std::fprintf(stderr, "kiln: warning: %s; compiling in memory\n", safe.error().message.c_str()); });
    }
  }
  if (disk && dump.empty()) {
    if (std::optional<runtime::ProgramRecipe> recipe = runtime::load_recipe(cache_dir, recipe_key, tensors)) {
      auto c = std::make_shared<Compiled>();
      bool complete = true;
      for (const std::string& hex : recipe->kernel_keys) {
        std::optional<ir::Hash128> key = ir::Hash128::from_hex(hex);
        std::optional<std::string> cubin = key ? disk->load(*key) : std::nullopt;
        if (!cubin) {
          complete = false;
          break;
        }
        c->cubins.push_back(std::move(*cubin));
      }
      if (complete) {
        c->recipe = std::move(*recipe);
        std::lock_guard<std::mutex> lock(memory_cache_mutex);
        program_memory()[recipe_key] = c;
        return hit(c);
      }
    }
  }
  // 3. Plan, generate, and compile (or find) each kernel.
  Expected<ExecutableFactory::Planned> planned = plan_and_generate(graph, options.fuse, impl->arch, tuning);
  if (!planned) return planned.error();
  const ir::Plan& plan = planned->plan;
  auto c = std::make_shared<Compiled>();
  c->recipe.program = std::move(planned->program);
  c->recipe.graph_name = graph.name();
  if (!dump.empty()) write_dumps(dump, graph, plan, c->recipe.program, impl->arch, recipe_key);
  const bool forbid = options.fail_if_compiling || env_flag("KILN_FAIL_IF_COMPILING");
  for (codegen::GeneratedKernel& k : c->recipe.program.kernels) {
    const auto kernel_start = std::chrono::steady_clock::now();
    const runtime::KeyParts parts = runtime::key_parts(k.canonical, impl->arch);
    const ir::Hash128 key = parts.key();
    KernelReport report = report_of(k, std::string(ir::to_string(plan.kernels[static_cast<size_t>(k.plan_kernel)].kind)), key.hex());
    std::optional<std::string> cubin;
    {
      std::lock_guard<std::mutex> lock(memory_cache_mutex);
      if (auto it = memory_cache().find(key); it != memory_cache().end()) cubin = it->second;
    }
    if (!cubin && disk) cubin = disk->load(key);
    if (!cubin) {
      if (forbid)
        return Error{ErrorCode::CompileOrDevice,
                     fmt::format("kernel {} ({}) is not cached and compiling is forbidden (KILN_FAIL_IF_COMPILING)",
                                 k.plan_kernel, report.kind)};
      Expected<runtime::NvrtcOutput> out = runtime::nvrtc_compile(k.source, impl->arch);
      if (!out)
        return Error{ErrorCode::CompileOrDevice,
                     fmt::format("kernel {}: {}\n{}", k.plan_kernel, out.error().message,
                                 runtime::write_repro(graph.to_json(), k.source, impl->arch, out.error().message))};
      cubin = out->binary;
      report.cache_hit = false;
      if (disk) {
        if (Status s = disk->store(parts, report.kind, *cubin); !s)
          std::fprintf(stderr, "kiln: warning: %s (continuing without caching it)\n", s.error().message.c_str());
      }
    }
    {
      std::lock_guard<std::mutex> lock(memory_cache_mutex);
      memory_cache().emplace(key, *cubin);
    }
    report.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - kernel_start).count();
    c->cubins.push_back(std::move(*cubin));
    c->recipe.kernel_keys.push_back(report.key);
    c->recipe.kernel_kinds.push_back(report.kind);
    impl->reports.push_back(std::move(report));
    k.source.clear();  // not needed to launch
    k.canonical.clear();
  }
  if (disk) {
    runtime::store_recipe(cache_dir, recipe_key, c->recipe);
    disk->evict(runtime::cache_size_limit());
  }
  {
    std::lock_guard<std::mutex> lock(memory_cache_mutex);
    program_memory()[recipe_key] = c;
  }
  impl->compiled = std::move(c);
  return Executable(std::move(impl));
}

Status Executable::Impl::prepare_device() {
  if (driver) {  // loaded already; make the primary context current on this thread too
    Expected<const runtime::Driver*> d = runtime::driver();
    if (!d) return d.error();
    return {};
  }
  Expected<const runtime::Driver*> d = runtime::driver();
  if (!d) return d.error();
  const runtime::Driver& cu = **d;
  if (auto arch_here = runtime::device_arch(); arch_here && *arch_here != arch)
    return Error{ErrorCode::CompileOrDevice,
                 fmt::format("the kernels were compiled for {} but the GPU is {}", arch, *arch_here)};
  for (size_t i = 0; i < compiled->cubins.size(); ++i) {
    CUmodule module;
    CUfunction function;
    if (Status s = runtime::check(cu.cuModuleLoadData(&module, compiled->cubins[i].data()), "cuModuleLoadData"); !s) return s;
    modules.push_back(module);
    if (Status s = runtime::check(cu.cuModuleGetFunction(&function, module, "kiln_kernel"), "cuModuleGetFunction"); !s)
      return s;
    functions.push_back(function);
    if (const uint32_t shared = program().kernels[i].shared_bytes; shared > 48 * 1024)
      if (Status s = runtime::check(cu.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                          static_cast<int>(shared)),
                                    fmt::format("cuFuncSetAttribute (kernel {}: {} bytes of shared memory)",
                                                program().kernels[i].plan_kernel, shared));
          !s)
        return s;
  }
  {
    CUdevice device;
    int count = 0;
    if (Status s = runtime::check(cu.cuDeviceGet(&device, 0), "cuDeviceGet"); !s) return s;
    if (Status s = runtime::check(cu.cuDeviceGetAttribute(&count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
                                  "cuDeviceGetAttribute (multiprocessors)");
        !s)
      return s;
    multiprocessors = static_cast<uint32_t>(std::max(count, 1));
  }
  // Persistent kernels launch as many blocks as run at once (whole clusters).
  for (size_t i = 0; i < compiled->cubins.size(); ++i) {
    const codegen::GeneratedKernel& k = program().kernels[i];
    uint32_t resident = 0;
    if (k.persistent_group > 1) {
      CUlaunchConfig config{};
      config.gridDimX = k.persistent_group, config.gridDimY = config.gridDimZ = 1;
      config.blockDimX = k.block[0], config.blockDimY = k.block[1], config.blockDimZ = k.block[2];
      config.sharedMemBytes = k.shared_bytes;
      int clusters = 0;
      if (cu.cuOccupancyMaxActiveClusters(&clusters, functions[i], &config) == CUDA_SUCCESS)
        resident = static_cast<uint32_t>(clusters) * k.persistent_group;
    } else if (k.persistent_group == 1) {
      int per_sm = 0;
      if (cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, functions[i], static_cast<int>(k.block[0] * k.block[1] * k.block[2]),
                                                         k.shared_bytes) == CUDA_SUCCESS)
        resident = static_cast<uint32_t>(per_sm) * multiprocessors;
    }
    if (k.persistent_group && resident == 0)  // no answer: one block per SM, whole clusters
      resident = std::max(multiprocessors / k.persistent_group, 1u) * k.persistent_group;
    resident_blocks.push_back(resident);
    if (k.persistent_group && std::getenv("KILN_TRACE_LAUNCH"))
      fmt::print(stderr, "kiln: kernel {} is persistent: {} of its {} blocks run at once ({} SMs, groups of {})\n", k.plan_kernel,
                 resident, k.grid[0], multiprocessors, k.persistent_group);
  }
  for (ir::TensorId t : program().intermediates) {
    const ir::Tensor& tensor = graph.ir().tensor(t);
    CUdeviceptr p;
    const size_t bytes = static_cast<size_t>(element_count(tensor.shape)) *
                         static_cast<size_t>(byte_size(codegen::storage_dtype(tensor)));
    if (Status s = runtime::check(cu.cuMemAlloc(&p, std::max<size_t>(bytes, 4)), "cuMemAlloc"); !s) return s;
    intermediates[t] = p;
  }
  for (const codegen::WorkspaceSpec& w : program().workspaces) {
    CUdeviceptr p;
    if (Status s = runtime::check(cu.cuMemAlloc(&p, static_cast<size_t>(w.words) * 4), "cuMemAlloc"); !s) return s;
    workspaces.push_back(p);
  }
  driver = &cu;
  return {};
}

Expected<size_t> Executable::binding_bytes(const std::string& name) const {
  const ir::Graph& g = impl_->graph.ir();
  for (ir::TensorId id : g.inputs)
    if (g.tensor(id).name == name) {
      const ir::Tensor& t = g.tensor(id);
      return static_cast<size_t>(runtime::span_elements(t.shape, t.strides) * byte_size(t.dtype));
    }
  for (ir::TensorId id : g.outputs)
    if (g.tensor(id).name == name) {
      const ir::Tensor& t = g.tensor(id);
      return static_cast<size_t>(element_count(t.shape) * byte_size(codegen::storage_dtype(t)));
    }
  return Error{ErrorCode::InvalidInput, fmt::format("'{}' is not an input or output of graph '{}'", name, g.name)};
}

Status Executable::launch(const std::vector<DeviceBinding>& bindings, void* stream_handle) {
  if (Status s = impl_->prepare_device(); !s) return s;
  const runtime::Driver& cu = *impl_->driver;
  const ir::Graph& g = impl_->graph.ir();
  auto stream = static_cast<CUstream>(stream_handle);
  // A stream of another context would run kernels that context does not
  // have: refuse it before anything is launched. (0 and the legacy and
  // per-thread default-stream handles mean the current context's.)
  if (stream != nullptr && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD) {
    CUcontext stream_context = nullptr;
    if (cu.cuStreamGetCtx(stream, &stream_context) != CUDA_SUCCESS)
      return Error{ErrorCode::InvalidInput, "launch: the stream is not a valid CUDA stream"};
    if (stream_context != runtime::primary_context())
      return Error{ErrorCode::InvalidInput, "launch: the stream belongs to another CUDA context; kiln launches into device 0's "
                                            "primary context (create the stream while it is current, e.g. with the CUDA runtime)"};
  }
  std::map<ir::TensorId, CUdeviceptr> bound;
  for (const DeviceBinding& b : bindings) {
    Expected<size_t> need = binding_bytes(b.name);
    if (!need) return need.error();
    if (b.pointer == nullptr) return Error{ErrorCode::InvalidInput, fmt::format("binding '{}': null pointer", b.name)};
    if (b.bytes < *need)
      return Error{ErrorCode::InvalidInput, fmt::format("binding '{}': {} bytes given, {} needed", b.name, b.bytes, *need)};
    for (size_t id = 0; id < g.tensors.size(); ++id)
      if (g.tensors[id].name == b.name) bound[static_cast<ir::TensorId>(id)] = reinterpret_cast<CUdeviceptr>(b.pointer);
  }
  for (ir::TensorId id : g.inputs)
    if (!bound.count(id)) return Error{ErrorCode::InvalidInput, fmt::format("input '{}' is not bound", g.tensor(id).name)};
  for (ir::TensorId id : g.outputs)
    if (!bound.count(id)) return Error{ErrorCode::InvalidInput, fmt::format("output '{}' is not bound", g.tensor(id).name)};

  for (size_t i = 0; i < impl_->program().kernels.size(); ++i) {
    const codegen::GeneratedKernel& k = impl_->program().kernels[i];
    for (int w : k.reset_workspaces) {
      const codegen::WorkspaceSpec& spec = impl_->program().workspaces[static_cast<size_t>(w)];
      if (Status s = runtime::check(cu.cuMemsetD32Async(impl_->workspaces[static_cast<size_t>(w)], spec.fill,
                                                         static_cast<size_t>(spec.words), stream), "cuMemsetD32Async");
          !s)
        return s;
    }
    // Pointers, and tensor maps of them; params point into these (reserved: no reallocation).
    std::vector<CUdeviceptr> values;
    std::vector<CUtensorMap> maps;
    values.reserve(k.args.size());
    maps.reserve(k.args.size());
    std::vector<void*> params;
    auto pointer_of = [&](ir::TensorId t) { return bound.count(t) ? bound.at(t) : impl_->intermediates.at(t); };
    for (const codegen::KernelArg& a : k.args) {
      switch (a.role) {
        case codegen::KernelArg::Role::Input:
        case codegen::KernelArg::Role::Output:
        case codegen::KernelArg::Role::Intermediate: values.push_back(pointer_of(a.tensor)); break;
        case codegen::KernelArg::Role::Workspace: values.push_back(impl_->workspaces[static_cast<size_t>(a.workspace)]); break;
        case codegen::KernelArg::Role::TensorMap: {
          Expected<CUtensorMap> map = runtime::encode_tensor_map(cu, a.map, pointer_of(a.tensor));
          if (!map)
            return Error{map.error().code, fmt::format("kernel {}: tensor '{}': {}", k.plan_kernel, g.tensor(a.tensor).name,
                                                       map.error().message)};
          maps.push_back(*map);
          params.push_back(&maps.back());
          continue;
        }
      }
      params.push_back(&values.back());
    }
    const uint32_t grid_x = k.persistent_group ? std::min(k.grid[0], impl_->resident_blocks[i]) : k.grid[0];
    if (Status s = runtime::check(cu.cuLaunchKernel(impl_->functions[i], grid_x, k.grid[1], k.grid[2], k.block[0], k.block[1],
                                                    k.block[2], k.shared_bytes, stream, params.data(), nullptr),
                                  fmt::format("cuLaunchKernel (kernel {})", k.plan_kernel));
        !s)
      return s;
  }
  return {};
}

Expected<std::vector<HostTensor>> Executable::run_host(const std::vector<HostTensor>& inputs) {
  if (Status s = impl_->prepare_device(); !s) return s.error();
  const runtime::Driver& cu = *impl_->driver;
  const ir::Graph& g = impl_->graph.ir();
  if (inputs.size() != g.inputs.size())
    return Error{ErrorCode::InvalidInput, fmt::format("{} inputs given, the graph has {}", inputs.size(), g.inputs.size())};
  std::vector<CUdeviceptr> allocations;
  auto release = [&] {
    for (CUdeviceptr p : allocations) cu.cuMemFree(p);
  };
  std::vector<DeviceBinding> bindings;
  auto allocate = [&](size_t bytes) -> Expected<CUdeviceptr> {
    CUdeviceptr p;
    if (Status s = runtime::check(cu.cuMemAlloc(&p, std::max<size_t>(bytes, 4)), "cuMemAlloc"); !s) return s.error();
    allocations.push_back(p);
    return p;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::Tensor& t = g.tensor(g.inputs[i]);
    if (inputs[i].shape != t.shape || inputs[i].dtype != t.dtype) {
      release();
      return Error{ErrorCode::InvalidInput, fmt::format("input '{}': expected {}{}, got {}{}", t.name, to_string(t.dtype),
                                                        to_string(t.shape), to_string(inputs[i].dtype), to_string(inputs[i].shape))};
    }
    const std::string bytes = runtime::to_storage(inputs[i], t.strides);
    Expected<CUdeviceptr> p = allocate(bytes.size());
    if (!p) return release(), p.error();
    if (Status s = runtime::check(cu.cuMemcpyHtoD(*p, bytes.data(), bytes.size()), "cuMemcpyHtoD"); !s) return release(), s.error();
    bindings.push_back({t.name, reinterpret_cast<void*>(*p), bytes.size()});
  }
  std::vector<std::pair<ir::TensorId, CUdeviceptr>> outputs;
  for (ir::TensorId id : g.outputs) {
    const ir::Tensor& t = g.tensor(id);
    if (t.kind == ir::TensorKind::Input) continue;  // an input returned as is
    const size_t bytes = static_cast<size_t>(element_count(t.shape) * byte_size(codegen::storage_dtype(t)));
    Expected<CUdeviceptr> p = allocate(bytes);
    if (!p) return release(), p.error();
    if (Status s = runtime::check(cu.cuMemsetD8Async(*p, 0xff, bytes, nullptr), "cuMemsetD8Async"); !s) return release(), s.error();
    bindings.push_back({t.name, reinterpret_cast<void*>(*p), bytes});
    outputs.emplace_back(id, *p);
  }
  if (Status s = launch(bindings, nullptr); !s) return release(), s.error();
  if (Status s = runtime::check(cu.cuCtxSynchronize(), "running the kernels"); !s) return release(), s.error();
  std::vector<HostTensor> result;
  for (ir::TensorId id : g.outputs) {
    const ir::Tensor& t = g.tensor(id);
    if (t.kind == ir::TensorKind::Input) {
      result.push_back(inputs[static_cast<size_t>(t.producer)]);
      continue;
    }
    const CUdeviceptr p = std::find_if(outputs.begin(), outputs.end(), [&](auto& o) { return o.first == id; })->second;
    const DType storage = codegen::storage_dtype(t);
    std::string bytes(static_cast<size_t>(element_count(t.shape) * byte_size(storage)), '\0');
    if (Status s = runtime::check(cu.cuMemcpyDtoH(bytes.data(), p, bytes.size()), "cuMemcpyDtoH"); !s) return release(), s.error();
    result.push_back(HostTensor{t.shape, t.dtype, runtime::from_storage(bytes, storage, element_count(t.shape))});
  }
  release();
  return result;
}

}  // namespace kiln
