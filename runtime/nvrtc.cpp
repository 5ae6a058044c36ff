#include "runtime/nvrtc.h"

#include <fmt/format.h>
#include <nvrtc.h>

#include <chrono>
#include <regex>

#include "runtime/embedded_templates.h"

namespace kiln::runtime {

std::vector<std::string> nvrtc_options(const std::string& arch, bool ptx) {
  std::string virtual_arch = arch;
  if (ptx) virtual_arch.replace(0, 2, "compute");
  return {"--gpu-architecture=" + virtual_arch, "-std=c++17", "--fmad=true"};
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return fmt::format("{}.{}", major, minor);
}

bool is_valid_arch(const std::string& arch) { return std::regex_match(arch, std::regex("sm_[0-9]{2,3}a?")); }

Expected<NvrtcOutput> nvrtc_compile(const std::string& source, const std::string& arch, bool ptx) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<const char*> header_text, header_names;
  for (const EmbeddedFile& f : embedded_templates()) {
    header_text.push_back(f.text.data());
    header_names.push_back(f.name.data());
  }
  nvrtcProgram program;
  nvrtcResult rc = nvrtcCreateProgram(&program, source.c_str(), "kiln_kernel.cu", static_cast<int>(header_text.size()),
                                      header_text.data(), header_names.data());
  if (rc != NVRTC_SUCCESS)
    return Error{ErrorCode::CompileOrDevice, fmt::format("NVRTC could not create a program: {}", nvrtcGetErrorString(rc))};
  const std::vector<std::string> options = nvrtc_options(arch, ptx);
  std::vector<const char*> option_ptrs;
  for (const std::string& o : options) option_ptrs.push_back(o.c_str());
  rc = nvrtcCompileProgram(program, static_cast<int>(option_ptrs.size()), option_ptrs.data());
  NvrtcOutput out;
  size_t log_size = 0;
  nvrtcGetProgramLogSize(program, &log_size);
  out.log.resize(log_size);
  if (log_size) nvrtcGetProgramLog(program, out.log.data());
  while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n')) out.log.pop_back();
  if (rc != NVRTC_SUCCESS) {
    nvrtcDestroyProgram(&program);
    return Error{ErrorCode::CompileOrDevice,
                 fmt::format("NVRTC failed for {} ({}):\n{}", arch, nvrtcGetErrorString(rc), out.log)};
  }
  size_t size = 0;
  if (ptx) {
    nvrtcGetPTXSize(program, &size);
    out.binary.resize(size);
    nvrtcGetPTX(program, out.binary.data());
    while (!out.binary.empty() && out.binary.back() == '\0') out.binary.pop_back();
  } else {
    nvrtcGetCUBINSize(program, &size);
    out.binary.resize(size);
    nvrtcGetCUBIN(program, out.binary.data());
  }
  nvrtcDestroyProgram(&program);
  out.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace kiln::runtime
