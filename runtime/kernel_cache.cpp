#include "runtime/kernel_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "runtime/nvrtc.h"

namespace kiln::runtime {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'U', 'B', '1'};
constexpr uint32_t kFormat = 1;

struct Header {
  char magic[8];
  uint32_t format;
  uint32_t reserved;
  uint64_t key_high, key_low;
  uint64_t size;
  uint64_t checksum;
};
static_assert(sizeof(Header) == 48);

}  // namespace

ir::Hash128 kernel_key(const std::string& canonical_source, const std::string& arch) {
  ir::HashBuilder h;
  h.add(std::string_view("kiln-kernel-v1")).add(std::string_view(KILN_VERSION)).add(std::string_view(arch));
  h.add(std::string_view(nvrtc_version()));
  for (const std::string& o : nvrtc_options(arch, false)) h.add(std::string_view(o));
  h.add(std::string_view(canonical_source));
  return h.digest();
}

std::string default_cache_dir() {
  if (const char* dir = std::getenv("KILN_CACHE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/kiln";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/kiln";
  return "/tmp/kiln-cache";
}

std::string KernelCache::path_of(const ir::Hash128& key) const {
  const std::string hex = key.hex();
  return fmt::format("{}/kernels/{}/{}.cubin", dir_, hex.substr(0, 2), hex);
}

std::optional<std::string> KernelCache::load(const ir::Hash128& key) const {
  const std::string path = path_of(key);
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  std::string data((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  Header h;
  bool good = data.size() >= sizeof h;
  if (good) {
    std::memcpy(&h, data.data(), sizeof h);
    good = std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.format == kFormat && h.key_high == key.high &&
           h.key_low == key.low && h.size == data.size() - sizeof h &&
           XXH3_64bits(data.data() + sizeof h, h.size) == h.checksum;
  }
  if (!good) {  // corrupt, truncated or foreign: drop it, recompile
    std::error_code ec;
    std::filesystem::remove(path, ec);
    return std::nullopt;
  }
  return data.substr(sizeof h);
}

Status KernelCache::store(const ir::Hash128& key, const std::string& cubin) const {
  const std::string path = path_of(key);
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) return Error{ErrorCode::CompileOrDevice, fmt::format("kernel cache: cannot create {}: {}", folder.string(), ec.message())};
  for (auto p = folder; p.string().size() >= dir_.size(); p = p.parent_path()) {
    ::chmod(p.c_str(), 0700);
    if (p == p.parent_path()) break;
  }
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.format = kFormat;
  h.key_high = key.high;
  h.key_low = key.low;
  h.size = cubin.size();
  h.checksum = XXH3_64bits(cubin.data(), cubin.size());
  std::random_device rd;
  const std::string temp = fmt::format("{}.tmp.{}.{:08x}", path, ::getpid(), rd());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  if (fd < 0) return Error{ErrorCode::CompileOrDevice, fmt::format("kernel cache: cannot write {}: {}", temp, std::strerror(errno))};
  std::string bytes(reinterpret_cast<const char*>(&h), sizeof h);
  bytes += cubin;
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  const bool ok = written == bytes.size() && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(temp.c_str(), path.c_str()) != 0) {
    ::unlink(temp.c_str());
    return Error{ErrorCode::CompileOrDevice, fmt::format("kernel cache: writing {} failed: {}", path, std::strerror(errno))};
  }
  return {};
}

}  // namespace kiln::runtime
