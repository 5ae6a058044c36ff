// kiln cache stats|ls|verify|clear|explain: inspect and maintain the kernel
// cache (runtime/kernel_cache.h says how it is laid out).
#include <fmt/format.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <map>
#include <set>

#include "compiler/memory_budget.h"
#include "compiler/graph_internal.h"
#include "codegen/kernel_codegen.h"
#include "compiler/error.h"
#include "runtime/cache_dir.h"
#include "runtime/kernel_cache.h"
#include "runtime/pipeline.h"
#include "runtime/program_cache.h"
#include "runtime/remote_cache.h"
#include "runtime/tuning_record.h"
#include "runtime/nvrtc.h"
#include "tools/commands.h"
#include "tools/helpers.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

std::string when(int64_t seconds) {
  const std::time_t t = static_cast<std::time_t>(seconds);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
  return buffer;
}

int stats(const std::string& dir) {
  const auto entries = runtime::KernelCache(dir).list();
  const auto recipes = runtime::list_recipes(dir);
  int64_t bytes = 0, oldest = INT64_MAX, newest = 0;
  std::map<std::pair<std::string, std::string>, std::pair<int, int64_t>> groups;
  for (const runtime::CacheEntry& e : entries) {
    bytes += e.bytes;
    oldest = std::min(oldest, e.last_use);
    newest = std::max(newest, e.last_use);
    auto& g = groups[{e.parts.arch, e.kind}];
    ++g.first;
    g.second += e.bytes;
  }
  fmt::print("cache {}\n", dir);
  fmt::print("kernels: {} entries, {} (limit {})\n", entries.size(), human_bytes(bytes), human_bytes(runtime::cache_size_limit()));
  fmt::print("graphs: {} recipes\n", recipes.size());
  if (const auto tunings = runtime::list_tunings(dir); !tunings.empty())
    fmt::print("tuning: {} autotuned graph{}\n", tunings.size(), tunings.size() == 1 ? "" : "s");
  for (const auto& [key, g] : groups) fmt::print("  {} {}: {} entries, {}\n", key.first, key.second, g.first, human_bytes(g.second));
  if (!entries.empty()) fmt::print("last used: oldest {}, newest {} (UTC)\n", when(oldest), when(newest));
  const runtime::RemoteCounters c = runtime::stored_counters(dir);
  if (runtime::RemoteCache* remote = runtime::RemoteCache::instance()) fmt::print("remote: {}\n", remote->description());
  if (c.hits + c.misses + c.writes + c.refused + c.errors > 0 || runtime::RemoteCache::instance())
    fmt::print("remote cache, all runs with this cache: {} hits, {} misses, {} writes, {} refused, {} errors\n", c.hits,
               c.misses, c.writes, c.refused, c.errors);
  return 0;
}

int ls(const std::string& dir) {
  std::map<std::string, std::set<std::string>> users;  // key -> graph names
  for (const auto& [path, r] : runtime::list_recipes(dir))
    for (const std::string& key : r.kernel_keys) users[key].insert(r.graph_name.empty() ? "(unnamed)" : detail::quoted(r.graph_name));
  auto entries = runtime::KernelCache(dir).list();
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.last_use > b.last_use; });
  for (const runtime::CacheEntry& e : entries) {
    const auto& names = users[e.key.hex()];
    fmt::print("{}  {:<10} {:<7} {:>10}  {}  {}\n", e.key.hex(), e.kind, e.parts.arch, human_bytes(e.bytes), when(e.last_use),
               names.empty() ? "-" : fmt::format("{}", fmt::join(names, ", ")));
  }
  return 0;
}

// Files in the cache's folders that kiln did not write: said, never deleted.
void report_foreign(const std::vector<std::string>& foreign) {
  for (const std::string& path : foreign)
    fmt::print("left {}: not written by kiln (no kiln header); kiln deletes only its own files\n", path);
}

int verify(const std::string& dir) {
  std::vector<std::string> problems, foreign;
  const auto entries = runtime::KernelCache(dir).list(&problems, /*remove_bad=*/true, &foreign);
  const auto recipes = runtime::list_recipes(dir, &problems, /*remove_bad=*/true, &foreign);
  const auto tunings = runtime::list_tunings(dir, &problems, /*remove_bad=*/true, &foreign);
  for (const std::string& p : problems) fmt::print("removed {}\n", p);
  report_foreign(foreign);
  fmt::print("verified: {} kernels and {} graph recipes ok{}, {} removed{}\n", entries.size(), recipes.size(),
             tunings.empty() ? "" : fmt::format(", {} tuning records ok", tunings.size()), problems.size(),
             foreign.empty() ? "" : fmt::format(", {} files not kiln's left alone", foreign.size()));
  return 0;
}

int clear(const std::string& dir) {
  std::vector<std::string> foreign;
  const auto entries = runtime::KernelCache(dir).list(nullptr, false, &foreign);
  const auto recipes = runtime::list_recipes(dir, nullptr, false, &foreign);
  const auto tunings = runtime::list_tunings(dir, nullptr, false, &foreign);
  int64_t bytes = 0;
  for (const auto& e : entries) bytes += e.bytes;
  // Only what kiln recognises as its own: entries, recipes and records that
  // parse, then the folders if nothing else is left in them.
  std::error_code ec;
  for (const auto& e : entries) fs::remove(e.path, ec);
  for (const auto& [path, recipe] : recipes) fs::remove(path, ec);
  for (const auto& [path, record] : tunings) fs::remove(path, ec);
  for (const char* folder : {"kernels", "graphs", "tuning"}) {
    const fs::path root = fs::path(dir) / folder;
    std::vector<fs::path> folders{root};
    std::error_code walk;
    for (auto it = fs::recursive_directory_iterator(root, walk); !walk && it != fs::recursive_directory_iterator();
         it.increment(walk))
      if (it->is_directory() && !it->is_symlink()) folders.push_back(it->path());
    for (auto f = folders.rbegin(); f != folders.rend(); ++f) ::rmdir(f->c_str());  // only if empty
  }
  report_foreign(foreign);
  fmt::print("cleared: {} kernels ({}) and {} graph recipes{} from {}{}\n", entries.size(), human_bytes(bytes), recipes.size(),
             tunings.empty() ? "" : fmt::format(" and {} tuning records", tunings.size()), dir,
             foreign.empty() ? "" : fmt::format("; {} files not kiln's left alone", foreign.size()));
  return 0;
}

// For each kernel of the graph, as a compile for `arch` would build it
// (its plan, its tile choices): cached, or which part of its key differs
// from the closest entry (the one sharing the most parts, source first).
int explain(const std::string& dir, const std::string& path, const std::string& wanted_arch) {
  Expected<Graph> graph = load_sized(path, {});  // a symbolic graph: a usage error naming its symbols
  if (!graph) return report(graph.error());
  Expected<runtime::Target> target = runtime::compile_target(*graph, {.arch = wanted_arch, .cache_dir = dir});
  if (!target) return report(target.error());
  Expected<runtime::Planned> planned = runtime::run_pipeline(*graph, *target);
  if (!planned) return report(planned.error());
  const std::string& arch = target->arch;
  const ir::Plan& plan = planned->plan;
  const codegen::GeneratedProgram& program = planned->program;
  const auto entries = runtime::KernelCache(dir).list();
  int cached = 0;
  for (const codegen::GeneratedKernel& k : program.kernels) {
    const runtime::KeyParts want = runtime::key_parts(k.canonical, arch);
    const std::string kind(ir::to_string(plan.kernels[static_cast<size_t>(k.plan_kernel)].kind));
    const std::string head = fmt::format("kernel {} ({}, {})", k.plan_kernel, kind, arch);
    if (k.library) {  // nothing compiled, nothing cached
      ++cached;
      fmt::print("{}: a cuBLASLt call, nothing to cache\n", head);
      continue;
    }
    const runtime::CacheEntry* best = runtime::closest_entry(entries, want);
    const std::vector<std::string> best_diff = best ? runtime::key_differences(best->parts, want) : std::vector<std::string>{};
    std::string remote;
    if (runtime::RemoteCache* r = runtime::RemoteCache::instance()) {
      const std::optional<bool> held = r->holds("kernel", want.key().hex());
      remote = !held ? "; remote: not reachable" : *held ? "; remote: held" : "; remote: not held";
    }
    if (best && best_diff.empty()) {
      ++cached;
      fmt::print("{}: cached, key {}{}\n", head, best->key.hex(), remote);
    } else if (!best) {
      fmt::print("{}: not cached; the cache is empty{}\n", head, remote);
    } else {
      fmt::print("{}: not cached; the closest entry {} differs in {}{}\n", head, best->key.hex(), fmt::join(best_diff, "; "),
                 remote);
    }
  }
  fmt::print("{} of {} kernels cached in {}\n", cached, program.kernels.size(), dir);
  return 0;
}

}  // namespace

Runner add_cache(CLI::App& app, const CommonOptions& common) {
  CLI::App* cmd = app.add_subcommand("cache", "inspect and maintain the kernel cache: stats, ls, verify, clear, explain");
  cmd->require_subcommand(1);
  struct Args {
    std::string graph, arch;
  };
  auto args = std::make_shared<Args>();
  CLI::App* s = cmd->add_subcommand("stats", "entries, bytes, per arch and kernel kind, oldest and newest use");
  CLI::App* l = cmd->add_subcommand("ls", "one line per entry: key, kind, arch, size, last use, graphs using it");
  CLI::App* v = cmd->add_subcommand("verify", "re-check every entry; remove and report bad ones (files kiln did not write are reported, never removed)");
  CLI::App* c = cmd->add_subcommand("clear", "remove every entry (files kiln did not write are reported, never removed)");
  CLI::App* e = cmd->add_subcommand("explain", "say whether each kernel of a graph is cached, and if not, why");
  e->add_option("GRAPH", args->graph, "graph file")->required();
  e->add_option("--arch", args->arch, "target architecture (default: the GPU present, else sm_90)");
  return [=, &common] {
    const std::string dir = common.cache_dir.empty() ? runtime::default_cache_dir() : common.cache_dir;
    if (Status safe = runtime::secure_cache_dir(dir); !safe) return report(safe.error());
    if (s->parsed()) return stats(dir);
    if (l->parsed()) return ls(dir);
    if (v->parsed()) return verify(dir);
    if (c->parsed()) return clear(dir);
    return explain(dir, args->graph, args->arch);
  };
}

}  // namespace kiln::cli
