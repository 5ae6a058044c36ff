// The CUDA Driver API, loaded at run time with dlopen: kiln starts, plans,
// generates and compiles (NVRTC) on machines with no GPU driver at all, and
// only the GPU paths need libcuda.so.1.
#pragma once

#include <cuda.h>

#include <optional>
#include <string>

#include "kiln/status.h"

namespace kiln::runtime {

// KILN_CU(member, exported symbol): every entry point kiln uses.
#define KILN_CUDA_DRIVER_FUNCTIONS(KILN_CU)            \
  KILN_CU(cuInit, "cuInit")                            \
  KILN_CU(cuGetErrorString, "cuGetErrorString")        \
  KILN_CU(cuDeviceGetCount, "cuDeviceGetCount")        \
  KILN_CU(cuDeviceGet, "cuDeviceGet")                  \
  KILN_CU(cuDeviceGetName, "cuDeviceGetName")          \
  KILN_CU(cuDeviceGetAttribute, "cuDeviceGetAttribute") \
  KILN_CU(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") \
  KILN_CU(cuCtxSetCurrent, "cuCtxSetCurrent")          \
  KILN_CU(cuCtxGetCurrent, "cuCtxGetCurrent")          \
  KILN_CU(cuCtxSynchronize, "cuCtxSynchronize")        \
  KILN_CU(cuCtxPushCurrent, "cuCtxPushCurrent_v2")     \
  KILN_CU(cuCtxPopCurrent, "cuCtxPopCurrent_v2")       \
  KILN_CU(cuCtxGetDevice, "cuCtxGetDevice")            \
  KILN_CU(cuCtxCreate, "cuCtxCreate_v4")               \
  KILN_CU(cuCtxDestroy, "cuCtxDestroy_v2")             \
  KILN_CU(cuStreamCreate, "cuStreamCreate")            \
  KILN_CU(cuStreamDestroy, "cuStreamDestroy_v2")       \
  KILN_CU(cuMemGetInfo, "cuMemGetInfo_v2")             \
  KILN_CU(cuMemAllocAsync, "cuMemAllocAsync")          \
  KILN_CU(cuMemFreeAsync, "cuMemFreeAsync")            \
  KILN_CU(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2")   \
  KILN_CU(cuModuleLoadData, "cuModuleLoadData")        \
  KILN_CU(cuModuleUnload, "cuModuleUnload")            \
  KILN_CU(cuModuleGetFunction, "cuModuleGetFunction")  \
  KILN_CU(cuFuncSetAttribute, "cuFuncSetAttribute")    \
  KILN_CU(cuLaunchKernel, "cuLaunchKernel")            \
  KILN_CU(cuMemAlloc, "cuMemAlloc_v2")                 \
  KILN_CU(cuMemFree, "cuMemFree_v2")                   \
  KILN_CU(cuMemcpyHtoD, "cuMemcpyHtoD_v2")             \
  KILN_CU(cuMemcpyDtoH, "cuMemcpyDtoH_v2")             \
  KILN_CU(cuMemsetD32Async, "cuMemsetD32Async")        \
  KILN_CU(cuMemsetD8Async, "cuMemsetD8Async")          \
  KILN_CU(cuStreamSynchronize, "cuStreamSynchronize")  \
  KILN_CU(cuStreamGetCtx, "cuStreamGetCtx")            \
  KILN_CU(cuStreamIsCapturing, "cuStreamIsCapturing")  \
  KILN_CU(cuEventCreate, "cuEventCreate")              \
  KILN_CU(cuEventRecord, "cuEventRecord")              \
  KILN_CU(cuEventSynchronize, "cuEventSynchronize")    \
  KILN_CU(cuEventElapsedTime, "cuEventElapsedTime_v2") \
  KILN_CU(cuEventDestroy, "cuEventDestroy_v2")        \
  KILN_CU(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled") \
  KILN_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor") \
  KILN_CU(cuOccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters")

struct Driver {
#define KILN_CU(member, symbol) decltype(&::member) member = nullptr;
  KILN_CUDA_DRIVER_FUNCTIONS(KILN_CU)
#undef KILN_CU
};

// The loaded driver, or an Error (CompileOrDevice) saying why there is
// none. When no context is current on this thread, device 0's primary
// context is made current (a caller's own current context is left alone).
Expected<const Driver*> driver();
// The loaded driver without touching any context (the launch path).
const Driver* loaded_driver();
// Device `device`'s primary context, retained (null without a GPU or
// such a device).
CUcontext primary_context(int device = 0);
int device_count();
// "sm_90" for a device, when a GPU and its driver are present.
std::optional<std::string> device_arch(int device = 0);
// A device's name ("NVIDIA H100 80GB HBM3").
std::optional<std::string> device_name(int device = 0);
// An Error naming `what` and the driver's message, or success.
Status check(CUresult result, const std::string& what);
// Before allocating `bytes` of device memory for `what` in the current
// context: an OutOfMemory error naming both when the device has less free
// (cuMemGetInfo); success when it has, or when it cannot say (no context).
Status require_device_memory(const Driver& cu, int64_t bytes, const std::string& what);

}  // namespace kiln::runtime
