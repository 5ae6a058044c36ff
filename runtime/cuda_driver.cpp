#include "runtime/cuda_driver.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include "compiler/memory_budget.h"

#include <mutex>
#include <vector>

namespace kiln::runtime {
namespace {

struct Loaded {
  Driver driver;
  std::optional<Error> error;
  std::vector<std::string> archs;  // per device
  std::vector<CUcontext> primary;  // per device, retained on first use
};

Loaded load() {
  Loaded l;
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    l.error = Error{ErrorCode::CompileOrDevice, "no GPU: the CUDA driver (libcuda.so.1) is not installed on this machine"};
    return l;
  }
#define KILN_CU(member, symbol)                                                         \
  l.driver.member = reinterpret_cast<decltype(l.driver.member)>(dlsym(handle, symbol)); \
  if (!l.driver.member) {                                                               \
    l.error = Error{ErrorCode::CompileOrDevice, "the CUDA driver lacks " symbol};       \
    return l;                                                                           \
  }
  KILN_CUDA_DRIVER_FUNCTIONS(KILN_CU)
#undef KILN_CU
  const Driver& d = l.driver;
  int count = 0;
  if (d.cuInit(0) != CUDA_SUCCESS || d.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    l.error = Error{ErrorCode::CompileOrDevice, "no GPU: the CUDA driver found no device"};
    return l;
  }
  for (int i = 0; i < count; ++i) {
    CUdevice device = 0;
    int major = 0, minor = 0;
    if (d.cuDeviceGet(&device, i) != CUDA_SUCCESS ||
        d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) != CUDA_SUCCESS ||
        d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device) != CUDA_SUCCESS) {
      l.error = Error{ErrorCode::CompileOrDevice, fmt::format("the CUDA driver could not open device {}", i)};
      return l;
    }
    l.archs.push_back(fmt::format("sm_{}{}", major, minor));
  }
  l.primary.assign(static_cast<size_t>(count), nullptr);
  return l;
}

Loaded& loaded() {
  static Loaded l = load();
  return l;
}
std::mutex primary_mutex;

}  // namespace

CUcontext primary_context(int device) {
  Loaded& l = loaded();
  if (l.error || device < 0 || device >= static_cast<int>(l.primary.size())) return nullptr;
  std::lock_guard<std::mutex> lock(primary_mutex);
  CUcontext& c = l.primary[static_cast<size_t>(device)];
  CUdevice handle = 0;
  if (!c && l.driver.cuDeviceGet(&handle, device) == CUDA_SUCCESS) l.driver.cuDevicePrimaryCtxRetain(&c, handle);
  return c;
}

Expected<const Driver*> driver() {
  const Loaded& l = loaded();
  if (l.error) return *l.error;
  CUcontext current = nullptr;
  l.driver.cuCtxGetCurrent(&current);
  if (!current) {
    CUcontext primary = primary_context(0);
    if (!primary) return Error{ErrorCode::CompileOrDevice, "the CUDA driver could not open device 0"};
    l.driver.cuCtxSetCurrent(primary);
  }
  return &l.driver;
}

const Driver* loaded_driver() { return loaded().error ? nullptr : &loaded().driver; }

int device_count() { return loaded().error ? 0 : static_cast<int>(loaded().archs.size()); }

std::optional<std::string> device_arch(int device) {
  const Loaded& l = loaded();
  if (l.error || device < 0 || device >= static_cast<int>(l.archs.size())) return std::nullopt;
  return l.archs[static_cast<size_t>(device)];
}

std::optional<std::string> device_name(int device) {
  const Loaded& l = loaded();
  if (l.error) return std::nullopt;
  CUdevice handle;
  char name[256] = {};
  if (l.driver.cuDeviceGet(&handle, device) != CUDA_SUCCESS ||
      l.driver.cuDeviceGetName(name, sizeof name - 1, handle) != CUDA_SUCCESS)
    return std::nullopt;
  return std::string(name);
}

Status check(CUresult result, const std::string& what) {
  if (result == CUDA_SUCCESS) return {};
  const char* message = nullptr;
  if (const Loaded& l = loaded(); !l.error) l.driver.cuGetErrorString(result, &message);
  return Error{result == CUDA_ERROR_OUT_OF_MEMORY ? ErrorCode::OutOfMemory : ErrorCode::CompileOrDevice, fmt::format("CUDA error in {}: {} ({})", what, message ? message : "unknown", static_cast<int>(result))};
}

Status require_device_memory(const Driver& cu, int64_t bytes, const std::string& what) {
  size_t free = 0, total = 0;
  if (cu.cuMemGetInfo(&free, &total) != CUDA_SUCCESS || bytes <= static_cast<int64_t>(free)) return {};
  return Error{ErrorCode::OutOfMemory, fmt::format("{} needs {} of device memory; the GPU has {} free (of {})", what,
                                                   human_bytes(bytes), human_bytes(static_cast<int64_t>(free)),
                                                   human_bytes(static_cast<int64_t>(total)))};
}

}  // namespace kiln::runtime
