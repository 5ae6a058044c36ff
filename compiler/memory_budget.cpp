#include "compiler/memory_budget.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "compiler/error.h"

namespace kiln {

int64_t available_host_memory() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream fields(line.substr(13));
      int64_t kib = 0;
      if (fields >> kib) return kib * 1024;
    }
  return static_cast<int64_t>(::sysconf(_SC_AVPHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

void require_host_memory(int64_t bytes, const std::string& what) {
  const int64_t available = available_host_memory();
  KILN_USER_CHECK(bytes <= available, "{} needs {} of host memory; this machine has {} available", what,
                  human_bytes(bytes), human_bytes(available));
}

std::string human_bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / (1 << 10));
  return fmt::format("{} B", bytes);
}

}  // namespace kiln
