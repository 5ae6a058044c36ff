// kiln's settings: one object, filled once from the environment and
// overridable in code. The library reads no environment variable anywhere
// else, and writes nothing to stderr of its own: diagnostics go to `log`.
//
//   kiln::Options o = kiln::Options::from_environment();
//   o.cache_dir = "/srv/kiln-cache";
//   o.log = [](kiln::LogLevel, std::string_view m) { my_logger.warn(m); };
//   kiln::set_options(o);  // every later compile and launch uses it
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace kiln {

enum class LogLevel : uint8_t { warning, info };
using LogFunction = std::function<void(LogLevel, std::string_view message)>;

struct Options {
  // The on-disk kernel cache. Environment: KILN_CACHE_DIR, else
  // $XDG_CACHE_HOME/kiln, else ~/.cache/kiln.
  std::string cache_dir;
  bool use_cache = true;
  // Least recently used entries are evicted past this size.
  // Environment: KILN_CACHE_MAX_BYTES (a positive integer), default 2 GiB.
  int64_t cache_max_bytes = int64_t{2} << 30;
  // Fail instead of compiling anything: proves a warm cache.
  // Environment: KILN_FAIL_IF_COMPILING=1.
  bool fail_if_compiling = false;
  // Stages written by every compile ("ir,plan,cuda,ptx") under dump_dir;
  // "rewrites" says through `log` (info) what the rewrites before planning
  // did and declined. Environment: KILN_DUMP, KILN_DUMP_DIR (default
  // ./kiln_dump).
  std::string dump;
  std::string dump_dir = "kiln_dump";
  // Say (at info level) how persistent kernels are launched.
  // Environment: KILN_TRACE_LAUNCH=1.
  bool trace_launch = false;
  // Vendor libraries as tactics of matmul kernels (cuBLASLt, loaded at run
  // time; never needed to build or plan): kAuto calls cuBLASLt where it is
  // installed and kiln's rule, measured on the GPU machine, finds it faster
  // (f32 operands, in full f32 or TF32; `--autotune` times it beside kiln's
  // own kernels); kOff builds
  // kiln's own kernels only; kAlways calls cuBLASLt for every matmul it can
  // compute exactly, installed here or not (a launch without it fails,
  // saying so): for tests and benchmarks. Environment: KILN_VENDOR=auto,
  // off or always.
  enum class Vendor : uint8_t { kAuto, kOff, kAlways };
  Vendor vendor = Vendor::kAuto;
  // Test hook: every NVRTC compile fails on purpose (KILN_TEST_NVRTC_FAIL=1),
  // so the failure path runs against the real compiler.
  bool break_nvrtc_for_tests = false;
  // The remote cache (cli.md): redis://[user:password@]host[:port][/db].
  // Environment: KILN_REMOTE_CACHE, KILN_REMOTE_CACHE_SECRET_FILE (the
  // fleet's HMAC secret: a file of the user's, readable by no one else),
  // KILN_REMOTE_CACHE_TIMEOUT_MS (connect and each request, default 250),
  // KILN_REMOTE_CACHE_BREAKER_MS (how long a failed server is left alone,
  // default 30000).
  std::string remote_cache;
  std::string remote_secret_file;
  int remote_timeout_ms = 250;
  int remote_breaker_ms = 30000;
  // Where diagnostics go; empty: nowhere.
  LogFunction log;

  // The settings the environment gives. A variable whose value does not
  // parse is reported through `log` (one warning naming the variable and
  // the value used instead).
  static Options from_environment(LogFunction log = {});
};

// The settings in force: those given to set_options(), else, from the first
// call on, Options::from_environment() (no log). Thread-safe.
std::shared_ptr<const Options> current_options();
void set_options(Options options);

}  // namespace kiln
