// kiln warm PATH... [--arch sm_XX]... [--jobs N]: fill the kernel cache ahead
// of deployment. No GPU needed. Each graph goes through the pipeline a
// compile for that arch runs (runtime::run_pipeline), so the kernels warmed
// are those it builds; each kernel is compiled once however many graphs
// share it; a failure is reported and the rest go on. At the end every
// warmed graph is checked: a compile of it would compile nothing, else the
// exit is nonzero.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include "compiler/graph_internal.h"
#include "codegen/kernel_codegen.h"
#include "compiler/error.h"
#include "kiln/executable.h"
#include "kiln/options.h"
#include "compiler/memory_budget.h"
#include "runtime/cache_dir.h"
#include "runtime/kernel_cache.h"
#include "runtime/nvrtc.h"
#include "runtime/pipeline.h"
#include "tools/commands.h"
#include "tools/helpers.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

// Graph files named by PATHs: a graph, a folder (recursively *.json), or a
// manifest (one graph path per line, relative to the manifest; # comments).
Expected<std::vector<std::string>> collect(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(path, ec))
        if (e.path().extension() == ".json") found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else if (fs::path(path).extension() == ".json") {
      out.push_back(path);
    } else {
      std::ifstream manifest(path);
      if (!manifest) return Error{ErrorCode::InvalidInput, fmt::format("{}: cannot open (a graph, folder or manifest)", path)};
      std::string line;
      while (std::getline(manifest, line)) {
        line.erase(0, line.find_first_not_of(" \t"));
        line.erase(line.find_last_not_of(" \t\r") + 1);
        if (line.empty() || line[0] == '#') continue;
        out.push_back(fs::path(line).is_absolute() ? line : (fs::path(path).parent_path() / line).string());
      }
    }
  }
  return out;
}

struct Job {
  std::string source, arch, kind, graph, graph_json;
  runtime::KeyParts parts;
};

// A graph through the pipeline for one arch, its kernels' keys, and whether
// an error about it was printed already.
struct Warmed {
  Graph graph;
  std::string path, arch;
  std::vector<ir::Hash128> keys;
  bool reported = false;
};

// The check of what was warmed, part one: each graph compiled for its arch
// with compiling forbidden, as a deployed process will compile it (which
// also stores its recipe, so that a warm process skips planning too).
// Reports each graph such a compile would still compile something for;
// returns how many.
int check_compiles(std::vector<Warmed>& warmed, const std::string& dir) {
  int unwarmed = 0;
  for (Warmed& w : warmed) {
    if (w.reported) continue;
    Expected<Executable> exe = Executable::compile(w.graph, {.arch = w.arch, .cache_dir = dir, .fail_if_compiling = true});
    if (!exe) {
      ++unwarmed;
      w.reported = true;
      std::fprintf(stderr, "kiln: error: %s (%s): warmed, yet its compile would compile again (checked with compiling forbidden): %s\n", w.path.c_str(),
                   w.arch.c_str(), exe.error().message.c_str());
    }
  }
  return unwarmed;
}

// Part two, once the cache is kept to its size limit: every kernel of every
// warmed graph still on disk. Reports and counts the graphs that lost one.
int check_kept(std::vector<Warmed>& warmed, const runtime::KernelCache& cache) {
  std::set<ir::Hash128> kept;
  for (const runtime::CacheEntry& e : cache.list()) kept.insert(e.key);
  int unwarmed = 0;
  for (Warmed& w : warmed) {
    if (w.reported) continue;
    const auto missing = std::count_if(w.keys.begin(), w.keys.end(), [&](const ir::Hash128& k) { return !kept.count(k); });
    if (missing == 0) continue;
    ++unwarmed;
    w.reported = true;
    std::fprintf(stderr,
                 "kiln: error: %s (%s): %zu of its %zu kernels are no longer in the cache after warming (its size "
                 "limit, KILN_CACHE_MAX_BYTES, is %s)\n",
                 w.path.c_str(), w.arch.c_str(), static_cast<size_t>(missing), w.keys.size(),
                 human_bytes(runtime::cache_size_limit()).c_str());
  }
  return unwarmed;
}

}  // namespace

Runner add_warm(CLI::App& app, const CommonOptions& common) {
  CLI::App* cmd = app.add_subcommand("warm", "pre-warm the kernel cache from graphs, folders of graphs or manifests");
  struct Args {
    std::vector<std::string> paths, archs;
    int jobs = 0;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("PATH", args->paths, "graph files, folders (recursively *.json) or manifests (a path per line)")->required();
  cmd->add_option("--arch", args->archs, "target architecture (repeatable); default: the GPU present, else sm_90");
  cmd->add_option("--jobs", args->jobs, "parallel compiles (default: the number of cores; at most the kernels to compile and 4x the cores)")
      ->check(CLI::Validator(
          [](std::string& text) {
            return !text.empty() && text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos &&
                           std::stoi(text) > 0
                       ? std::string()
                       : "a number of parallel compiles (1 or more), not '" + text + "'";
          },
          "N"));
  return [args, &common] {
    const auto start = std::chrono::steady_clock::now();
    if (common.no_cache) return report({ErrorCode::InvalidInput, "warm fills the cache: it cannot run with --no-cache"});
    std::vector<std::string> archs = args->archs;
    if (archs.empty()) archs.push_back(runtime::target_arch({}));
    for (const std::string& a : archs)
      if (std::string problem = runtime::arch_problem(a); !problem.empty())
        return report({ErrorCode::InvalidInput, "--arch: " + problem});
    Expected<std::vector<std::string>> paths = collect(args->paths);
    if (!paths) return report(paths.error());
    const std::string dir = common.cache_dir.empty() ? runtime::default_cache_dir() : common.cache_dir;
    if (Status safe = runtime::secure_cache_dir(dir); !safe) return report(safe.error());
    const runtime::KernelCache cache(dir);

    // 1. Every graph through the pipeline, for each arch as a compile for it
    //    (fast); gather the kernels not cached.
    int invalid = 0, hits = 0;
    std::map<ir::Hash128, Job> jobs;
    std::vector<Warmed> warmed;
    for (const std::string& path : *paths) {
      Expected<Graph> graph = Graph::load(path);
      if (!graph) {
        ++invalid;
        const std::string& message = graph.error().message;
        // Name the file where the loader's message does not already.
        const std::string where = message.rfind(path, 0) == 0 ? message : path + ": " + message;
        std::fprintf(stderr, "kiln: error: %s\n", where.c_str());
        continue;
      }
      // A symbolic graph warms its kernels for every size where one compile serves them
      // (runtime/pipeline.h); the pipeline says why not otherwise (kiln compile --dim compiles it at one size).
      for (const std::string& arch : archs) {  // plans and kernels depend on the arch
        Expected<runtime::Target> target = runtime::compile_target(*graph, {.arch = arch, .cache_dir = dir});
        Expected<runtime::Planned> planned =
            target ? runtime::run_pipeline(*graph, *target) : Expected<runtime::Planned>(target.error());
        if (!planned) {
          ++invalid;
          std::fprintf(stderr, "kiln: error: %s: %s\n", path.c_str(), planned.error().message.c_str());
          break;
        }
        Warmed& w = warmed.emplace_back(Warmed{*graph, path, arch, {}});
        for (const codegen::GeneratedKernel& k : planned->program.kernels) {
          if (k.library) continue;  // a vendor library's call: nothing to compile
          const runtime::KeyParts parts = runtime::key_parts(k.canonical, arch);
          const ir::Hash128 key = parts.key();
          w.keys.push_back(key);
          if (jobs.count(key)) continue;
          const std::string kind(ir::to_string(planned->plan.kernels[static_cast<size_t>(k.plan_kernel)].kind));
          if (cache.load(key)) {
            ++hits;
            jobs[key] = {"", arch, kind, path, "", parts};  // counted once, nothing to do
          } else {
            jobs[key] = {k.source, arch, kind, path, graph->to_json(), parts};
          }
        }
      }
    }

    // 2. Compile what is missing, in parallel (unless compiling is forbidden:
    //    KILN_FAIL_IF_COMPILING proves that a warm run has nothing to compile).
    std::vector<std::pair<ir::Hash128, Job*>> todo;
    for (auto& [key, job] : jobs)
      if (!job.source.empty()) todo.emplace_back(key, &job);
    // Capped at the kernels to compile and at 4x the cores: more threads would only wait.
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int workers = std::clamp(args->jobs > 0 ? std::min(args->jobs, 4 * cores) : cores, 1,
                                   std::max(1, static_cast<int>(todo.size())));
    std::atomic<size_t> next{0}, done{0};
    std::atomic<int> compiled{0}, failed{0};
    std::set<ir::Hash128> failed_keys;  // under `print`
    const bool forbidden = current_options()->fail_if_compiling;
    std::mutex print;
    const bool tty = ::isatty(STDERR_FILENO);
    auto progress = [&](const Job& job, const std::string& what) {
      std::lock_guard<std::mutex> lock(print);
      const size_t n = ++done;
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double rate = static_cast<double>(n) / std::max(seconds, 1e-3);
      if (tty) {
        const int width = 30, filled = static_cast<int>(width * n / std::max<size_t>(todo.size(), 1));
        std::fprintf(stderr, "\r[%s%s] %zu/%zu kernels  %.1f/s  ETA %.0f s ", std::string(filled, '#').c_str(),
                     std::string(width - filled, '.').c_str(), n, todo.size(), rate,
                     static_cast<double>(todo.size() - n) / std::max(rate, 1e-3));
        if (n == todo.size()) std::fprintf(stderr, "\n");
      } else {
        std::fprintf(stderr, "[%zu/%zu] %s (%s, %s) from %s\n", n, todo.size(), what.c_str(), job.kind.c_str(),
                     job.arch.c_str(), job.graph.c_str());
      }
    };
    auto worker = [&] {
      for (size_t i; (i = next++) < todo.size();) {
        Job& job = *todo[i].second;
        auto fail = [&](const std::string& message) {
          ++failed;
          std::lock_guard<std::mutex> lock(print);
          failed_keys.insert(todo[i].first);
          std::fprintf(stderr, "%skiln: error: %s\n", tty ? "\n" : "", message.c_str());
        };
        if (forbidden) {
          fail(fmt::format("{}: kernel {} ({}, {}) is not cached and compiling is forbidden (KILN_FAIL_IF_COMPILING)",
                           job.graph, todo[i].first.hex().substr(0, 12), job.kind, job.arch));
          continue;
        }
        Expected<runtime::NvrtcOutput> out = runtime::nvrtc_compile(job.source, job.arch);
        if (!out) {
          fail(fmt::format("{}: {}\n{}", job.graph, out.error().message,
                           runtime::write_repro(job.graph_json, job.source, job.arch, out.error().message)));
          continue;
        }
        if (Status s = cache.store(job.parts, job.kind, out->binary); !s) {
          fail(s.error().message);
          continue;
        }
        ++compiled;
        progress(job, fmt::format("compiled kernel {} in {:.0f} ms", todo[i].first.hex().substr(0, 12), out->milliseconds));
      }
    };
    // A thread the system will not start is not an abort: the compiles run
    // on the threads that did start, or fail with the system's reason.
    std::vector<std::thread> threads;
    std::string refused;
    for (int w = 0; w < workers && refused.empty(); ++w) {
      try {
        threads.emplace_back(worker);
      } catch (const std::system_error& e) {
        refused = e.what();
      }
    }
    if (threads.empty()) return report({ErrorCode::CompileOrDevice, "warm: cannot start a compile thread: " + refused});
    if (!refused.empty())
      std::fprintf(stderr, "kiln: warning: warm: %zu of %d compile threads started (%s)\n", threads.size(), workers,
                   refused.c_str());
    for (std::thread& t : threads) t.join();

    // 3. Each graph compiled as it will be, compiling forbidden: the check
    //    that its kernels are warm, which stores its recipe too (graphs
    //    with a kernel that failed above are reported already).
    for (Warmed& w : warmed)
      w.reported = std::any_of(w.keys.begin(), w.keys.end(), [&](const ir::Hash128& k) { return failed_keys.count(k) > 0; });
    int unwarmed = check_compiles(warmed, dir);

    // 4. The size limit, as every other store keeps it; 5. the check that
    //    every warmed kernel is still there.
    const int evicted = compiled > 0 ? cache.evict(runtime::cache_size_limit()) : 0;
    unwarmed += check_kept(warmed, cache);

    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("warmed: {} graphs, {} kernels ({} compiled, {} cached, {} failed) in {:.2f} s{}\n",
               paths->size() - static_cast<size_t>(invalid), jobs.size(), compiled.load(), hits, failed.load(), seconds,
               evicted > 0 ? fmt::format("; {} least recently used entries evicted to keep the cache under {}", evicted,
                                         human_bytes(runtime::cache_size_limit()))
                           : "");
    if (failed > 0 || unwarmed > 0) return static_cast<int>(ErrorCode::CompileOrDevice);
    if (invalid > 0) return static_cast<int>(ErrorCode::InvalidInput);
    return 0;
  };
}

}  // namespace kiln::cli
