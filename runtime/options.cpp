// Options: the one place kiln reads its environment variables.
#include "kiln/options.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>

namespace kiln {
namespace {

std::string variable(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool flag(const char* name) {
  const std::string v = variable(name);
  return !v.empty() && v != "0";
}

std::mutex options_mutex;
std::shared_ptr<const Options>& options_slot() {
  static std::shared_ptr<const Options> slot;
  return slot;
}

}  // namespace

Options Options::from_environment(LogFunction log) {
  Options o;
  o.log = std::move(log);
  if (std::string dir = variable("KILN_CACHE_DIR"); !dir.empty())
    o.cache_dir = dir;
  else if (std::string xdg = variable("XDG_CACHE_HOME"); !xdg.empty())
    o.cache_dir = xdg + "/kiln";
  else if (std::string home = variable("HOME"); !home.empty())
    o.cache_dir = home + "/.cache/kiln";
  else
    o.cache_dir = "/tmp/kiln-cache";
  if (std::string v = variable("KILN_CACHE_MAX_BYTES"); !v.empty()) {
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (errno == 0 && end && *end == '\0' && n > 0)
      o.cache_max_bytes = n;
    else if (o.log)
      o.log(LogLevel::warning, fmt::format("KILN_CACHE_MAX_BYTES='{}' is not a positive number of bytes; using {}", v,
                                           o.cache_max_bytes));
  }
  o.fail_if_compiling = flag("KILN_FAIL_IF_COMPILING");
  o.remote_cache = variable("KILN_REMOTE_CACHE");
  o.remote_secret_file = variable("KILN_REMOTE_CACHE_SECRET_FILE");
  auto milliseconds = [&](const char* name, int& into) {
    const std::string v = variable(name);
    if (v.empty()) return;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (errno == 0 && end && *end == '\0' && n >= 1 && n <= 600000)
      into = static_cast<int>(n);
    else if (o.log)
      o.log(LogLevel::warning, fmt::format("{}='{}' is not a number of milliseconds (1 to 600000); using {}", name, v, into));
  };
  milliseconds("KILN_REMOTE_CACHE_TIMEOUT_MS", o.remote_timeout_ms);
  milliseconds("KILN_REMOTE_CACHE_BREAKER_MS", o.remote_breaker_ms);
  o.dump = variable("KILN_DUMP");
  if (std::string dir = variable("KILN_DUMP_DIR"); !dir.empty()) o.dump_dir = dir;
  o.trace_launch = flag("KILN_TRACE_LAUNCH");
  o.break_nvrtc_for_tests = flag("KILN_TEST_NVRTC_FAIL");
  if (std::string v = variable("KILN_VENDOR"); v == "off")
    o.vendor = Vendor::kOff;
  else if (v == "always")
    o.vendor = Vendor::kAlways;
  else if (!v.empty() && v != "auto" && o.log)
    o.log(LogLevel::warning, fmt::format("KILN_VENDOR='{}' is not auto, off or always; using auto", v));
  return o;
}

std::shared_ptr<const Options> current_options() {
  std::lock_guard<std::mutex> lock(options_mutex);
  if (!options_slot()) options_slot() = std::make_shared<const Options>(Options::from_environment());
  return options_slot();
}

void set_options(Options options) {
  std::lock_guard<std::mutex> lock(options_mutex);
  options_slot() = std::make_shared<const Options>(std::move(options));
}

namespace detail {
void log(LogLevel level, std::string_view message) {
  const std::shared_ptr<const Options> o = current_options();
  if (o->log) o->log(level, message);
}
}  // namespace detail

}  // namespace kiln
