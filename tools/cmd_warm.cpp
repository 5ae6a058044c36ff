// kiln warm PATH... [--arch sm_XX]... [--jobs N]: fill the kernel cache ahead
// of deployment. No GPU needed. Each kernel is compiled once however many
// graphs share it; a failure is reported and the rest go on.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include "compiler/graph_internal.h"
#include "codegen/kernel_codegen.h"
#include "compiler/error.h"
#include "compiler/planner/planner.h"
#include "kiln/executable.h"
#include "compiler/memory_budget.h"
#include "runtime/cache_dir.h"
#include "runtime/kernel_cache.h"
#include "runtime/nvrtc.h"
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
    if (archs.empty()) archs.push_back(default_arch());
    for (const std::string& a : archs)
      if (std::string problem = runtime::arch_problem(a); !problem.empty())
        return report({ErrorCode::InvalidInput, "--arch: " + problem});
    Expected<std::vector<std::string>> paths = collect(args->paths);
    if (!paths) return report(paths.error());
    const std::string dir = common.cache_dir.empty() ? runtime::default_cache_dir() : common.cache_dir;
    if (Status safe = runtime::secure_cache_dir(dir); !safe) return report(safe.error());
    const runtime::KernelCache cache(dir);

    // 1. Plan and generate every graph (fast); gather the kernels not cached.
    int invalid = 0, hits = 0;
    std::map<ir::Hash128, Job> jobs;
    std::vector<std::pair<Graph, std::string>> ready;  // graph, arch
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
      if (graph->is_symbolic()) {  // issue #49: warm would compile what every size in range needs
        ++invalid;
        std::fprintf(stderr, "kiln: error: %s: the graph has symbolic dimensions; kiln warm does not compile those "
                             "yet (kiln compile --dim NAME=VALUE compiles it at one size)\n", path.c_str());
        continue;
      }
      const ir::Plan plan = ir::plan_fusion(ir_of(*graph));
      for (const std::string& arch : archs) {
        Expected<codegen::GeneratedProgram> program = generate(*graph, plan, arch, &common);  // kernels depend on the arch
        if (!program) {
          ++invalid;
          std::fprintf(stderr, "kiln: error: %s: %s\n", path.c_str(), program.error().message.c_str());
          break;
        }
        for (const codegen::GeneratedKernel& k : program->kernels) {
          const runtime::KeyParts parts = runtime::key_parts(k.canonical, arch);
          const ir::Hash128 key = parts.key();
          if (jobs.count(key)) continue;
          const std::string kind(ir::to_string(plan.kernels[static_cast<size_t>(k.plan_kernel)].kind));
          if (cache.load(key)) {
            ++hits;
            jobs[key] = {"", arch, kind, path, "", parts};  // counted once, nothing to do
          } else {
            jobs[key] = {k.source, arch, kind, path, graph->to_json(), parts};
          }
        }
        ready.emplace_back(*graph, arch);
      }
    }

    // 2. Compile what is missing, in parallel.
    std::vector<std::pair<ir::Hash128, Job*>> todo;
    for (auto& [key, job] : jobs)
      if (!job.source.empty()) todo.emplace_back(key, &job);
    // Capped at the kernels to compile and at 4x the cores: more threads would only wait.
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int workers = std::clamp(args->jobs > 0 ? std::min(args->jobs, 4 * cores) : cores, 1,
                                   std::max(1, static_cast<int>(todo.size())));
    std::atomic<size_t> next{0}, done{0};
    std::atomic<int> compiled{0}, failed{0};
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
        Expected<runtime::NvrtcOutput> out = runtime::nvrtc_compile(job.source, job.arch);
        if (!out) {
          ++failed;
          std::lock_guard<std::mutex> lock(print);
          std::fprintf(stderr, "%skiln: error: %s: %s\n%s\n", tty ? "\n" : "", job.graph.c_str(), out.error().message.c_str(),
                       runtime::write_repro(job.graph_json, job.source, job.arch, out.error().message).c_str());
          continue;
        }
        if (Status s = cache.store(job.parts, job.kind, out->binary); !s) {
          ++failed;
          std::lock_guard<std::mutex> lock(print);
          std::fprintf(stderr, "%skiln: error: %s\n", tty ? "\n" : "", s.error().message.c_str());
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

    // 3. Graph recipes, so warm processes skip planning too (nothing compiles here).
    for (const auto& [graph, arch] : ready)
      (void)Executable::compile(graph, {.arch = arch, .cache_dir = dir, .fail_if_compiling = true});

    // 4. The size limit, as every other store keeps it.
    const int evicted = compiled > 0 ? cache.evict(runtime::cache_size_limit()) : 0;

    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("warmed: {} graphs, {} kernels ({} compiled, {} cached, {} failed) in {:.2f} s{}\n",
               paths->size() - static_cast<size_t>(invalid), jobs.size(), compiled.load(), hits, failed.load(), seconds,
               evicted > 0 ? fmt::format("; {} least recently used entries evicted to keep the cache under {}", evicted,
                                         human_bytes(runtime::cache_size_limit()))
                           : "");
    if (failed > 0) return static_cast<int>(ErrorCode::CompileOrDevice);
    if (invalid > 0) return static_cast<int>(ErrorCode::InvalidInput);
    return 0;
  };
}

}  // namespace kiln::cli
