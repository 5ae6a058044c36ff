#include "runtime/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>

#include "codegen/size_text.h"
#include "compiler/error.h"
#include "compiler/op_table.h"
#include "compiler/size_probe.h"
#include "compiler/graph_internal.h"
#include "compiler/memory_budget.h"
#include "compiler/plan_printer.h"
#include "compiler/plan_verifier.h"
#include "compiler/planner/planner.h"
#include "kiln/options.h"
#include "runtime/cache_dir.h"
#include "runtime/cublaslt.h"
#include "runtime/cuda_driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/log.h"
#include "runtime/nvrtc.h"
#include "runtime/parallel_for.h"
#include "runtime/tuning_record.h"

namespace kiln::runtime {
namespace {

// Cubins compiled or loaded by this process, by key, and whole programs by
// program key (a warm process skips planning and codegen).
std::mutex memory_mutex;
std::map<ir::Hash128, std::string>& memory_cubins() {
  static std::map<ir::Hash128, std::string> cache;
  return cache;
}
std::map<ir::Hash128, std::shared_ptr<const Compiled>>& memory_programs() {
  static std::map<ir::Hash128, std::shared_ptr<const Compiled>> programs;
  return programs;
}

std::shared_ptr<const Compiled> find_in_memory(const ir::Hash128& recipe_key) {
  std::lock_guard<std::mutex> lock(memory_mutex);
  auto it = memory_programs().find(recipe_key);
  return it == memory_programs().end() ? nullptr : it->second;
}

void remember_program(const ir::Hash128& recipe_key, std::shared_ptr<const Compiled> c) {
  std::lock_guard<std::mutex> lock(memory_mutex);
  memory_programs()[recipe_key] = std::move(c);
}

// The stages named in Options::dump ("plan,cuda,ptx"; also "ir") under
// Options::dump_dir/<graph>-<program key>/.
void write_dumps(const Options& o, const Graph& graph, const ir::Plan& plan, const codegen::GeneratedProgram& program,
                 const std::string& arch, const ir::Hash128& key) {
  namespace fs = std::filesystem;
  auto wants = [&](const char* s) { return ("," + o.dump + ",").find(std::string(",") + s + ",") != std::string::npos; };
  std::string name = graph.name().empty() ? "graph" : graph.name().substr(0, 48);
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-') ch = '_';
  const fs::path dir = fs::path(o.dump_dir) / (name + "-" + key.hex().substr(0, 12));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    detail::warn(fmt::format("KILN_DUMP_DIR: cannot make {}: {}; nothing dumped", detail::quoted(dir.string()), ec.message()));
    return;
  }
  std::vector<std::string> failed;
  auto write = [&](const std::string& file, const std::string& text) {  // whole files, never through a link
    if (!write_file_atomically((dir / file).string(), text, 0644)) failed.push_back(file + ": " + std::strerror(errno));
  };
  if (wants("ir")) write("ir.txt", graph.to_ir_text());
  if (wants("plan")) write("plan.txt", ir::plan_to_text(ir_of(graph), plan));
  for (const codegen::GeneratedKernel& k : program.kernels) {
    const std::string stem = fmt::format("kernel{}-{}", k.plan_kernel,
                                         ir::to_string(plan.kernels[static_cast<size_t>(k.plan_kernel)].kind));
    if (wants("cuda")) write(stem + ".cu", k.source);
    if (wants("ptx") && !k.library)
      if (Expected<NvrtcOutput> ptx = nvrtc_compile(k.source, arch, true); ptx) write(stem + ".ptx", ptx->binary);
  }
  if (!failed.empty())
    detail::warn(fmt::format("KILN_DUMP_DIR: cannot write in {}: {}", detail::quoted(dir.string()), fmt::join(failed, "; ")));
}

// Every cubin of a recipe from the disk cache, or nullptr if one is missing.
std::shared_ptr<Compiled> load_from_disk(const KernelCache& disk, ProgramRecipe recipe) {
  auto c = std::make_shared<Compiled>();
  for (size_t i = 0; i < recipe.kernel_keys.size(); ++i) {
    if (recipe.program.kernels[i].library) {  // a vendor library's call: no cubin
      c->cubins.emplace_back();
      continue;
    }
    std::optional<ir::Hash128> key = ir::Hash128::from_hex(recipe.kernel_keys[i]);
    std::optional<std::string> cubin = key ? disk.load(*key) : std::nullopt;
    if (!cubin) return nullptr;
    c->cubins.push_back(std::move(*cubin));
  }
  c->recipe = std::move(recipe);
  return c;
}

// The one cubin of a generated kernel: from memory, the disk, or NVRTC
// (then stored in both).
struct KernelJob {
  const Graph& graph;
  const std::string& arch;
  const KernelCache* disk;
  bool forbid_compiling;
};
Expected<std::string> kernel_cubin(const KernelJob& job, const codegen::GeneratedKernel& k, KernelReport& report) {
  if (k.library) return std::string();  // a vendor library's call: nothing to compile
  const KeyParts parts = key_parts(k.canonical, job.arch);
  const ir::Hash128 key = parts.key();
  report.key = key.hex();
  std::optional<std::string> cubin;
  {
    std::lock_guard<std::mutex> lock(memory_mutex);
    if (auto it = memory_cubins().find(key); it != memory_cubins().end()) cubin = it->second;
  }
  if (!cubin && job.disk) cubin = job.disk->load(key);
  if (!cubin) {
    if (job.forbid_compiling)
      return Error{ErrorCode::CompileOrDevice,
                   fmt::format("kernel {} ({}) is not cached and compiling is forbidden (KILN_FAIL_IF_COMPILING)",
                               k.plan_kernel, report.kind)};
    Expected<NvrtcOutput> out = nvrtc_compile(k.source, job.arch);
    if (!out)
      return Error{ErrorCode::CompileOrDevice,
                   fmt::format("kernel {}: {}\n{}", k.plan_kernel, out.error().message,
                               write_repro(job.graph.to_json(), k.source, job.arch, out.error().message))};
    cubin = std::move(out->binary);
    report.cache_hit = false;
    if (job.disk)
      if (Status s = job.disk->store(parts, report.kind, *cubin); !s)
        detail::warn(s.error().message + " (continuing without caching it)");
  }
  std::lock_guard<std::mutex> lock(memory_mutex);
  memory_cubins().emplace(key, *cubin);
  return std::move(*cubin);
}

}  // namespace

codegen::VendorLibraries vendor_libraries(const Options& settings) {
  codegen::VendorLibraries v;
  if (settings.vendor == Options::Vendor::kOff) {
    v.why_not = "vendor libraries are off (KILN_VENDOR=off)";
  } else if (settings.vendor == Options::Vendor::kAlways) {
    v.cublaslt = v.always = true;
  } else if (Expected<const cublaslt::Library*> lt = cublaslt::library(); lt) {
    v.cublaslt = true;
  } else {
    v.why_not = lt.error().message;
  }
  return v;
}

std::string target_arch(const CompileOptions& options) {
  if (!options.arch.empty()) return options.arch;
  return device_arch(std::max(options.device, 0)).value_or("sm_90");
}

Expected<Target> compile_target(const Graph& graph, const CompileOptions& options, const codegen::ProgramTuning* chosen) {
  Target target;
  target.arch = target_arch(options);
  if (std::string problem = arch_problem(target.arch); !problem.empty()) return Error{ErrorCode::InvalidInput, problem};
  target.fuse = options.fuse;
  const std::shared_ptr<const Options> settings = current_options();
  // (cuBLASLt is loaded, hundreds of MiB, only for a graph that has a matmul for it)
  const auto& ops = ir_of(graph).ops;
  if (std::any_of(ops.begin(), ops.end(), [](const ir::Op& op) { return op.kind == ir::OpKind::Matmul; }))
    target.vendors = vendor_libraries(*settings);
  // (a program that calls cuBLASLt is another program than one that does not)
  const std::string vendors = target.vendors.always ? "+cublasLt-always" : target.vendors.cublaslt ? "+cublasLt" : "";
  target.program_key = program_key(graph.to_json(), target.arch + vendors, options.fuse);
  if (chosen)
    target.tuning = *chosen;
  else if (options.use_cache && settings->use_cache)
    target.tuning = recorded_tuning(options.cache_dir.empty() ? settings->cache_dir : options.cache_dir, target.program_key);
  return target;
}

namespace {

// Before planning: what one compile for every size does not take yet.
void check_symbolic_ops(const ir::Graph& g) {
  for (const ir::Op& op : g.ops) {
    if (op.symbolic && (op.symbolic->start || op.symbolic->end))
      throw codegen::NotSymbolic(fmt::format("{} slices at a symbolic position", detail::quoted(g.result(op).name)));
  }
}

// Steps 1-3 at one probe of the symbolic graph.
Planned run_at_probe(const Graph& graph, const Target& target, int64_t first_prime) {
  Planned out;
  out.probe = std::make_shared<const ir::SizeProbe>(ir_of(graph), first_prime);
  try {
    out.probe_graph = std::make_shared<const Graph>(
        Graph::Internal::make(std::make_shared<const ir::Graph>(ir::probe_graph(ir_of(graph), *out.probe))));
  } catch (const std::exception& e) {  // e.g. an element count past 2^62 at the probe
    throw codegen::RangeLimit(fmt::format("the graph at its probe sizes: {}", e.what()));
  }
  const ir::Graph& g = ir_of(*out.probe_graph);
  const int sm = codegen::sm_of(target.arch);
  out.plan = ir::plan_fusion(g, {.fuse = target.fuse, .sm = sm});
  if (std::string problem = ir::verify_plan(g, out.plan); !problem.empty())
    KILN_UNREACHABLE("invalid plan of a probe graph: " + problem);
  try {
    out.program = codegen::generate_program(g, out.plan, sm, target.tuning, out.probe.get(), target.vendors);
  } catch (const detail::UserError& e) {
    // A limit of a kernel at the probe's sizes (which lie past every max: "131101 batches exceed
    // this matmul kernel's grid limit"): compiled per size, where a size that breaks it says so.
    throw codegen::RangeLimit(fmt::format("at the probe sizes: {}", e.what()));
  }
  return out;
}

bool same_map(const codegen::TensorMapSpec& a, const codegen::TensorMapSpec& b) {
  return a.dtype == b.dtype && a.rank == b.rank && a.box == b.box && a.offset_bytes == b.offset_bytes &&
         a.dim_exprs == b.dim_exprs && a.stride_exprs == b.stride_exprs;
}

bool same_arg(const codegen::KernelArg& a, const codegen::KernelArg& b) {
  return a.role == b.role && a.tensor == b.tensor && a.workspace == b.workspace && a.symbol == b.symbol &&
         (a.role != codegen::KernelArg::Role::TensorMap || same_map(a.map, b.map));
}

// Where two probes' sources first differ: ": `<line>`", the first probe's
// line with its products of sizes written as expressions (a number left in
// it is a size computed otherwise: a ceiling, a sum).
std::string first_different_line(const std::string& a, const std::string& b, const ir::SizeProbe& probe) {
  size_t start = 0;
  while (true) {
    const size_t end_a = a.find('\n', start), end_b = b.find('\n', start);
    const std::string line_a = a.substr(start, end_a == std::string::npos ? std::string::npos : end_a - start);
    if (end_a != end_b || a.compare(start, line_a.size(), b, start, line_a.size()) != 0) {
      std::string line = ir::with_symbols(line_a, probe);
      line.erase(0, line.find_first_not_of(' '));
      return line.empty() ? "" : fmt::format(": `{}`", line.size() > 160 ? line.substr(0, 157) + "..." : line);
    }
    if (end_a == std::string::npos) return "";
    start = end_a + 1;
  }
}

// The first way two probes' plans or programs differ, or "".
std::string first_difference(const Planned& a, const Planned& b) {
  if (a.plan.kernels.size() != b.plan.kernels.size()) return "the plan's kernels depend on the sizes";
  for (size_t i = 0; i < a.plan.kernels.size(); ++i) {
    const ir::PlannedKernel &x = a.plan.kernels[i], &y = b.plan.kernels[i];
    if (x.kind != y.kind || x.ops != y.ops || x.reads != y.reads || x.writes != y.writes || x.recomputed != y.recomputed)
      return fmt::format("the plan's kernel {} depends on the sizes", x.id);
  }
  if (a.program.kernels.size() != b.program.kernels.size() || a.program.intermediates != b.program.intermediates ||
      a.program.workspaces.size() != b.program.workspaces.size())
    return "the program depends on the sizes";
  for (size_t w = 0; w < a.program.workspaces.size(); ++w) {
    const codegen::WorkspaceSpec &x = a.program.workspaces[w], &y = b.program.workspaces[w];
    if (x.name != y.name || x.fill != y.fill || x.words_expr != y.words_expr || (!x.words_expr && x.words != y.words))
      return fmt::format("workspace {} depends on the sizes beyond a product of them", x.name);
  }
  for (size_t i = 0; i < a.program.kernels.size(); ++i) {
    const codegen::GeneratedKernel &x = a.program.kernels[i], &y = b.program.kernels[i];
    const bool same_args = x.args.size() == y.args.size() &&
                           std::equal(x.args.begin(), x.args.end(), y.args.begin(), same_arg);
    if (x.canonical != y.canonical || !same_args)
      return fmt::format("kernel {}'s source{} depends on the sizes beyond its size parameters{}", x.plan_kernel,
                         x.tactics.chosen.empty() ? "" : fmt::format(" (tactic {})", x.tactics.chosen),
                         first_different_line(x.canonical, y.canonical, *a.probe));
    if (x.grid_rule != y.grid_rule || x.grid[1] != y.grid[1] || x.grid[2] != y.grid[2] || x.block != y.block ||
        x.shared_bytes != y.shared_bytes || x.persistent_group != y.persistent_group ||
        (!x.grid_rule && x.grid[0] != y.grid[0]))
      return fmt::format("kernel {}'s launch depends on the sizes beyond its grid rule", x.plan_kernel);
  }
  return "";
}

// A symbolic graph: the pipeline at two probes, compared; `per_size` says
// why one compile does not serve every size (then the result is empty).
Planned run_symbolic_pipeline(const Graph& graph, const Target& target, PerSize& per_size) {
  try {
    check_symbolic_ops(ir_of(graph));
    Planned first = run_at_probe(graph, target, int64_t{1} << 17);
    const Planned second = run_at_probe(graph, target, int64_t{1} << 18);
    per_size = {first_difference(first, second), false};
    return per_size.why.empty() ? std::move(first) : Planned{};
  } catch (const codegen::NotSymbolic& e) {
    per_size = {e.what(), e.range_limit};
    return {};
  }
}

}  // namespace

Expected<PerSize> per_size(const Graph& graph, const Target& target) {
  if (!graph.is_symbolic()) return PerSize{"the graph has no symbolic dimensions", false};
  PerSize out;
  Expected<Planned> p = detail::catch_errors([&] { return run_symbolic_pipeline(graph, target, out); });
  if (!p) return p.error();
  return out;
}

Expected<std::string> per_size_reason(const Graph& graph, const Target& target) {
  Expected<PerSize> p = per_size(graph, target);
  if (!p) return p.error();
  return p->why;
}

Expected<Planned> run_pipeline(const Graph& graph, const Target& target, Stage until) {
  if (graph.is_symbolic()) {
    PerSize per_size;
    Expected<Planned> p = detail::catch_errors([&] { return run_symbolic_pipeline(graph, target, per_size); });
    const std::string& why = per_size.why;
    if (p && !why.empty())
      return Error{ErrorCode::InvalidInput,
                   fmt::format("graph {}: one compile for every size does not cover it yet: {}; bind its sizes first "
                               "(--dim NAME=VALUE for each symbol, or Graph::specialize)",
                               detail::quoted(graph.name()), why)};
    return p;
  }
  // 0. The graph as the planner takes it, made when the graph was built
  //    (compiler/graph_internal.h): patch convolutions as matmuls, transposes
  //    sunk, thin convolutions' channels padded.
  const ir::Graph& g = ir_of(graph);
  const int sm = codegen::sm_of(target.arch);
  // 1. Plan fusion for the target (compiler/planner/planner.h).
  Planned out{ir::plan_fusion(g, {.fuse = target.fuse, .sm = sm, .cublaslt_f32_matmuls = target.vendors.cublaslt}), {},
              nullptr, nullptr};
  // 2. Verify the plan (compiler/plan_verifier.h).
  if (std::string problem = ir::verify_plan(g, out.plan); !problem.empty())
    return Error{ErrorCode::Internal, "internal error: invalid plan: " + problem + " (this is a bug in kiln; please report it)"};
  if (until == Stage::plan) return out;
  // 3. Generate each kernel's CUDA C++ with the target's tile choices
  //    (codegen/kernel_codegen.h). NVRTC follows in compile_program.
  Expected<codegen::GeneratedProgram> program =
      detail::catch_errors([&] { return codegen::generate_program(g, out.plan, sm, target.tuning, nullptr, target.vendors); });
  if (!program) return program.error();
  out.program = std::move(program).value();
  return out;
}

namespace {

// One compile's settings and keys, fixed before any step runs.
struct CompileJob {
  CompileJob(const Graph& g, const CompileOptions& o) : graph(g), options(o) {}
  const Graph& graph;
  const CompileOptions& options;
  std::shared_ptr<const Options> settings = current_options();
  Target target;  // arch, fuse, the tile choices and the graph's key
  std::string cache_dir;
  bool use_cache = false, dumping = false;
  ir::Hash128 recipe_key;  // the compiled program's: the graph's key with the tuning
  std::optional<KernelCache> disk;  // when the cache folder is usable
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  double elapsed_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  // A kernel's report (cache hit until it is compiled).
  KernelReport report_of(const codegen::GeneratedKernel& k, const std::string& kind, const std::string& key) const {
    KernelReport r{.kernel = k.plan_kernel, .kind = kind, .key = key, .cache_hit = true, .milliseconds = 0,
                   .tuning = k.tuning.to_string(), .tuned = false, .trials = {}, .tactic = k.tactics.chosen};
    // (a recorded choice the generator did not accept was not used)
    const auto wanted = target.tuning.find(k.plan_kernel);
    r.tuned = wanted != target.tuning.end() && wanted->second == k.tuning;
    return r;
  }
};

// Settings and keys: the target (compile_target; its tile choices are part
// of the program's identity) and the cache's folder.
void settle(CompileJob& job, Target target) {
  job.target = std::move(target);
  job.use_cache = job.options.use_cache && job.settings->use_cache;
  job.cache_dir = job.options.cache_dir.empty() ? job.settings->cache_dir : job.options.cache_dir;
  job.dumping = !job.settings->dump.empty();
  job.recipe_key = tuned_program_key(job.target.program_key, job.target.tuning);
}

// The disk cache, when its folder is safe to use (else a warning, once per process).
void open_disk_cache(CompileJob& job) {
  if (!job.use_cache) return;
  if (Status safe = secure_cache_dir(job.cache_dir); safe) {
    job.disk.emplace(job.cache_dir);
  } else {
    static std::once_flag warned;  // every compile would say the same
    std::call_once(warned, [&] { detail::warn(safe.error().message + "; compiling in memory"); });
  }
}

// The program from this process's memory or the disk (its recipe and every
// cubin), or nullptr. Dumps need planning and codegen, so they skip both.
std::shared_ptr<const Compiled> cached_program(const CompileJob& job) {
  if (job.dumping) return nullptr;
  if (std::shared_ptr<const Compiled> c = find_in_memory(job.recipe_key)) return c;
  if (!job.disk) return nullptr;
  std::optional<ProgramRecipe> recipe = load_recipe(job.cache_dir, job.recipe_key, ir_of(job.graph).tensors.size());
  if (!recipe) return nullptr;
  std::shared_ptr<Compiled> c = load_from_disk(*job.disk, std::move(*recipe));
  if (c) remember_program(job.recipe_key, c);
  return c;
}

// Each generated kernel's cubin (memory, disk or NVRTC), with its report.
Expected<std::shared_ptr<Compiled>> compile_kernels(const CompileJob& job, Planned& planned, Executable::Impl& impl) {
  auto c = std::make_shared<Compiled>();
  c->recipe.program = std::move(planned.program);
  c->recipe.graph_name = job.graph.name();
  if (job.dumping) write_dumps(*job.settings, job.graph, planned.plan, c->recipe.program, job.target.arch, job.recipe_key);
  const KernelJob kernel_job{job.graph, job.target.arch, job.disk ? &*job.disk : nullptr,
                             job.options.fail_if_compiling || job.settings->fail_if_compiling};
  // The distinct kernels (a model's identical layers generate identical kernels) are found or
  // compiled at once on every core; the others take their cubin.
  std::vector<codegen::GeneratedKernel>& kernels = c->recipe.program.kernels;
  std::vector<size_t> same_as(kernels.size()), distinct;
  std::map<ir::Hash128, size_t> first_of_key;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const auto [it, fresh] = first_of_key.emplace(key_parts(kernels[i].canonical, job.target.arch).key(), i);
    same_as[i] = it->second;
    if (fresh) distinct.push_back(i);
  }
  std::vector<KernelReport> reports;
  for (const codegen::GeneratedKernel& k : kernels)
    reports.push_back(job.report_of(k, std::string(ir::to_string(planned.plan.kernels[static_cast<size_t>(k.plan_kernel)].kind)), ""));
  std::vector<std::optional<Expected<std::string>>> cubins(kernels.size());
  parallel_for(distinct.size(), [&](size_t d) {
    const size_t i = distinct[d];
    const auto kernel_start = std::chrono::steady_clock::now();
    cubins[i] = kernel_cubin(kernel_job, kernels[i], reports[i]);
    reports[i].milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - kernel_start).count();
  });
  for (size_t i = 0; i < kernels.size(); ++i) {
    const Expected<std::string>& cubin = *cubins[same_as[i]];
    if (!cubin) return cubin.error();
    if (same_as[i] != i) reports[i].key = reports[same_as[i]].key;  // (found in memory: a hit taking no time)
    c->cubins.push_back(*cubin);
    c->recipe.kernel_keys.push_back(reports[i].key);
    c->recipe.kernel_kinds.push_back(reports[i].kind);
    impl.reports.push_back(std::move(reports[i]));
  }
  for (codegen::GeneratedKernel& k : kernels) {  // not needed to launch
    k.source.clear();
    k.canonical.clear();
  }
  return c;
}

// The recipe to disk, and the cache back within its size limit.
void store_program(const CompileJob& job, const Compiled& c) {
  if (!job.disk) return;
  store_recipe(job.cache_dir, job.recipe_key, c.recipe);
  int64_t program_bytes = 0;
  for (const std::string& cubin : c.cubins) program_bytes += static_cast<int64_t>(cubin.size());
  const int64_t limit = job.settings->cache_max_bytes;
  if (job.disk->evict(limit) > 0 && program_bytes > limit) {
    static std::once_flag warned;  // once per process
    std::call_once(warned, [&] {
      detail::warn(fmt::format("the kernel cache's size limit ({}, KILN_CACHE_MAX_BYTES) is smaller than this graph's "
                               "kernels ({}): the cache keeps none of them",
                               human_bytes(limit), human_bytes(program_bytes)));
    });
  }
}

}  // namespace

Expected<std::unique_ptr<Executable::Impl>> compile_program(const Graph& graph, const CompileOptions& options,
                                                            const codegen::ProgramTuning* chosen) {
  CompileJob job(graph, options);
  Expected<Target> target = compile_target(graph, options, chosen);
  if (!target) return target.error();
  settle(job, std::move(*target));
  auto impl = std::make_unique<Executable::Impl>(graph, job.target.arch);
  impl->device = options.device;
  // 1, 2. This process compiled it already, or the disk holds its recipe and every cubin.
  open_disk_cache(job);
  // (A symbolic graph's recipe is not kept: its kernels are, by their symbolic source.)
  if (std::shared_ptr<const Compiled> c = graph.is_symbolic() ? nullptr : cached_program(job)) {
    impl->compiled = std::move(c);
    for (size_t i = 0; i < impl->program().kernels.size(); ++i) {
      impl->reports.push_back(job.report_of(impl->program().kernels[i], impl->compiled->recipe.kernel_kinds[i],
                                            impl->compiled->recipe.kernel_keys[i]));
      impl->reports.back().milliseconds = job.elapsed_ms();
    }
    impl->resolve();
    return impl;
  }
  // 3. Plan, verify, generate.
  Expected<Planned> planned = run_pipeline(graph, job.target);
  if (!planned) return planned.error();
  // 4. Each kernel from memory, disk or NVRTC; 5. the recipe stored, the cache kept to its limit.
  Expected<std::shared_ptr<Compiled>> c = compile_kernels(job, *planned, *impl);
  if (!c) return c.error();
  if (!graph.is_symbolic()) {
    store_program(job, **c);
    remember_program(job.recipe_key, *c);
  }
  impl->probe = planned->probe;
  impl->probe_graph = planned->probe_graph;
  impl->compiled = std::move(*c);
  impl->resolve();
  return impl;
}

Expected<Executable> compile_executable(const Graph& graph, const CompileOptions& options,
                                        const codegen::ProgramTuning* tuning) {
  Expected<std::unique_ptr<Executable::Impl>> impl = compile_program(graph, options, tuning);
  if (!impl) return impl.error();
  return Executable(std::move(*impl));
}

}  // namespace kiln::runtime
