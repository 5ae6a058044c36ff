#include "runtime/cuda_driver.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>

namespace kiln::runtime {
namespace {

struct Loaded {
  Driver driver;
  CUcontext context = nullptr;
  std::optional<Error> error;
  std::string arch;
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
  CUdevice device = 0;
  if (d.cuInit(0) != CUDA_SUCCESS || d.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    l.error = Error{ErrorCode::CompileOrDevice, "no GPU: the CUDA driver found no device"};
    return l;
  }
  int major = 0, minor = 0;
  if (d.cuDeviceGet(&device, 0) != CUDA_SUCCESS ||
      d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) != CUDA_SUCCESS ||
      d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device) != CUDA_SUCCESS ||
      d.cuDevicePrimaryCtxRetain(&l.context, device) != CUDA_SUCCESS) {
    l.error = Error{ErrorCode::CompileOrDevice, "the CUDA driver could not open device 0"};
    return l;
  }
  l.arch = fmt::format("sm_{}{}", major, minor);
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

Expected<const Driver*> driver() {
  const Loaded& l = loaded();
  if (l.error) return *l.error;
  // kiln's modules live in the primary context: make it current on this
  // thread (a caller's own context would not know kiln's functions).
  CUcontext current = nullptr;
  l.driver.cuCtxGetCurrent(&current);
  if (current != l.context) l.driver.cuCtxSetCurrent(l.context);
  return &l.driver;
}

CUcontext primary_context() { return loaded().error ? nullptr : loaded().context; }

std::optional<std::string> device_arch() {
  const Loaded& l = loaded();
  if (l.error) return std::nullopt;
  return l.arch;
}

std::optional<std::string> device_name() {
  const Loaded& l = loaded();
  if (l.error) return std::nullopt;
  CUdevice device;
  char name[256] = {};
  if (l.driver.cuDeviceGet(&device, 0) != CUDA_SUCCESS || l.driver.cuDeviceGetName(name, sizeof name - 1, device) != CUDA_SUCCESS)
    return std::nullopt;
  return std::string(name);
}

Status check(CUresult result, const std::string& what) {
  if (result == CUDA_SUCCESS) return {};
  const char* message = nullptr;
  if (const Loaded& l = loaded(); !l.error) l.driver.cuGetErrorString(result, &message);
  return Error{ErrorCode::CompileOrDevice, fmt::format("CUDA error in {}: {} ({})", what, message ? message : "unknown", static_cast<int>(result))};
}

}  // namespace kiln::runtime
