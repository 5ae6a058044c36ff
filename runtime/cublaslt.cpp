#include "runtime/cublaslt.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <vector>

namespace kiln::runtime::cublaslt {
namespace {

struct Loaded {
  Library library;
  std::optional<Error> error;
};

// Where to look: the loader's own path first (a process that has loaded
// cuBLASLt already, PyTorch's, gets that copy), then CUDA's folders.
std::vector<std::string> candidates() {
  std::vector<std::string> names = {"libcublasLt.so.13", "libcublasLt.so.12"};
  std::vector<std::string> dirs;
  if (const char* home = std::getenv("CUDA_HOME"); home && *home) dirs.push_back(std::string(home) + "/lib64");
  dirs.push_back("/usr/local/cuda/lib64");
  dirs.push_back("/usr/local/cuda/targets/x86_64-linux/lib");
  std::vector<std::string> out = names;
  for (const std::string& d : dirs)
    for (const std::string& n : names) out.push_back(d + "/" + n);
  return out;
}

Loaded load() {
  Loaded l;
  void* handle = nullptr;
  for (const std::string& path : candidates())
    if ((handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL))) {
      l.library.path = path;
      break;
    }
  if (!handle) {
    l.error = Error{ErrorCode::CompileOrDevice,
                    "cuBLASLt (libcublasLt.so.13 or .12) is not installed on this machine, or not on the loader's path"};
    return l;
  }
#define KILN_LT(member, symbol, signature)                                                          \
  l.library.member = reinterpret_cast<Pointer<signature>>(dlsym(handle, symbol));                            \
  if (!l.library.member) {                                                                          \
    l.error = Error{ErrorCode::CompileOrDevice, fmt::format("{} lacks " symbol, l.library.path)};   \
    return l;                                                                                       \
  }
  KILN_CUBLASLT_FUNCTIONS(KILN_LT)
#undef KILN_LT
  // The enums above are those of cuBLASLt 12 and 13.
  if (const size_t v = l.library.version(); v < 120000)
    l.error = Error{ErrorCode::CompileOrDevice, fmt::format("{} is cuBLASLt {}; kiln calls 12.0 and newer", l.library.path, v)};
  return l;
}

}  // namespace

Expected<const Library*> library() {
  static const Loaded l = load();
  if (l.error) return *l.error;
  return &l.library;
}

std::string status_text(const Library& lt, Status s) {
  const char* name = lt.status_name(s);
  return fmt::format("{} ({})", name ? name : "unknown status", s);
}

}  // namespace kiln::runtime::cublaslt
