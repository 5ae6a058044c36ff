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

// The loaded driver with device 0's primary context current on this
// thread, or an Error (CompileOrDevice) saying why there is none.
Expected<const Driver*> driver();
// The context kiln loads its modules in and launches into: device 0's
// primary context (null without a GPU).
CUcontext primary_context();
// "sm_90" for device 0, when a GPU and its driver are present.
std::optional<std::string> device_arch();
// Device 0's name ("NVIDIA H100 80GB HBM3").
std::optional<std::string> device_name();
// An Error naming `what` and the driver's message, or success.
Status check(CUresult result, const std::string& what);

}  // namespace kiln::runtime
