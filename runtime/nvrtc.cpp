#include "runtime/nvrtc.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nvrtc.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <vector>

#include "kiln/options.h"
#include "runtime/embedded_templates.h"
#include "runtime/temp_files.h"

namespace kiln::runtime {

std::vector<std::string> nvrtc_options(const std::string& arch, bool ptx) {
  // Compute capability 9.0 is compiled for sm_90a, its arch-specific target:
  // wgmma and setmaxnreg exist only there, and the cubin runs on exactly the
  // GPUs that sm_90 names.
  std::string virtual_arch = arch == "sm_90" ? "sm_90a" : arch;
  if (ptx) virtual_arch.replace(0, 2, "compute");
  return {"--gpu-architecture=" + virtual_arch, "-std=c++17", "--fmad=true"};
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return fmt::format("{}.{}", major, minor);
}

// sm_ then 2 or 3 digits, then an optional 'a'. (Not std::regex: in a
// process that also holds PyTorch, libstdc++'s regex crashes on its locale.)
bool is_valid_arch(const std::string& arch) {
  if (arch.rfind("sm_", 0) != 0) return false;
  size_t digits = 0;
  while (3 + digits < arch.size() && std::isdigit(static_cast<unsigned char>(arch[3 + digits]))) ++digits;
  const std::string_view rest = std::string_view(arch).substr(3 + digits);
  return digits >= 2 && digits <= 3 && (rest.empty() || rest == "a");
}

std::string arch_problem(const std::string& arch) {
  if (!is_valid_arch(arch)) return fmt::format("arch '{}': expected sm_XX (e.g. sm_80, sm_90)", arch);
  int count = 0;
  if (nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0) return {};  // cannot ask: NVRTC will say
  std::vector<int> archs(static_cast<size_t>(count));
  if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) return {};
  const int wanted = std::stoi(arch.substr(3, arch.find_first_not_of("0123456789", 3) - 3));
  if (std::find(archs.begin(), archs.end(), wanted) != archs.end()) return {};
  std::vector<std::string> names;
  for (int a : archs) names.push_back(fmt::format("sm_{}", a));
  return fmt::format("arch '{}': NVRTC {} does not compile for it; it compiles for {}", arch, nvrtc_version(),
                     fmt::join(names, ", "));
}

namespace {

// NVRTC opens its builtins library (libnvrtc-builtins.so.<version>) by
// name when it first compiles. The toolkit's folder is on the loader's
// path; the PyPI wheel's (nvidia/cu13/lib) is not, and libnvrtc carries no
// RPATH. Loading the builtins that sit beside the libnvrtc this process
// uses, by full path, lets NVRTC's own open find them already loaded.
void load_builtins_beside_nvrtc() {
  static std::once_flag once;
  std::call_once(once, [] {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) || !info.dli_fname) return;
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::path(info.dli_fname).parent_path();
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("libnvrtc-builtins.so", 0) == 0 && name.find(".alt.") == std::string::npos)
        dlopen(entry.path().c_str(), RTLD_NOW | RTLD_GLOBAL);
    }
  });
}

Expected<NvrtcOutput> compile_with(const std::string& source_in, const std::string& arch, bool ptx,
                                   const std::vector<std::string>& extra) {
  // Test hook (Options::break_nvrtc_for_tests, KILN_TEST_NVRTC_FAIL=1):
  // every kernel breaks on purpose, so the failure path (log, saved source,
  // repro) runs against the real compiler.
  std::string source = source_in;
  if (current_options()->break_nvrtc_for_tests)
    source += "\n#error \"broken on purpose (KILN_TEST_NVRTC_FAIL)\"\n";
  load_builtins_beside_nvrtc();
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
  std::vector<std::string> options = nvrtc_options(arch, ptx);
  options.insert(options.end(), extra.begin(), extra.end());
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

}  // namespace

Expected<NvrtcOutput> nvrtc_compile(const std::string& source, const std::string& arch, bool ptx) {
  return compile_with(source, arch, ptx, {});
}

Expected<std::string> nvrtc_resource_usage(const std::string& source, const std::string& arch) {
  Expected<NvrtcOutput> out = compile_with(source, arch, false, {"--ptxas-options=--verbose"});
  if (!out) return out.error();
  std::string lines;
  size_t at = 0;
  while (at < out->log.size()) {
    size_t end = out->log.find('\n', at);
    if (end == std::string::npos) end = out->log.size();
    const std::string line = out->log.substr(at, end - at);
    if (line.find("Used") != std::string::npos || line.find("spill") != std::string::npos) lines += line + "\n";
    at = end + 1;
  }
  return lines;
}

std::string write_repro(const std::string& graph_json, const std::string& source, const std::string& arch,
                        const std::string& log) {
  // A fresh private folder: a shared /tmp holds other users' files and links.
  Expected<std::filesystem::path> dir = make_private_folder("kiln-repro-");
  if (!dir) return "no repro folder was written: " + dir.error().message;
  std::string options;
  for (const std::string& o : nvrtc_options(arch, false)) options += o + "\n";
  const std::pair<const char*, std::string> files[] = {{"graph.json", graph_json},
                                                      {"kernel.cu", source},
                                                      {"log.txt", log + "\n"},
                                                      {"nvrtc_options.txt", options + "NVRTC " + nvrtc_version() + "\n"}};
  for (const auto& [name, text] : files)
    if (Expected<bool> written = write_new_file(*dir / name, text); !written)
      return "the repro folder is incomplete: " + written.error().message;
  return fmt::format("a repro folder is at {} (graph.json, kernel.cu, nvrtc_options.txt, log.txt); to reproduce: "
                     "kiln compile {} --arch {} --no-cache",
                     dir->string(), (*dir / "graph.json").string(), arch);
}

}  // namespace kiln::runtime
