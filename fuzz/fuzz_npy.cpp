// libFuzzer target: the .npy reader (runtime/npy.cpp) on arbitrary bytes.
//
// Any input must give a tensor or an Error: a crash, a sanitizer report, an
// uncaught exception, a hang or an allocation past the data the file holds
// is a finding. The bytes go through a file, as `kiln run --inputs` reads them.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    char dir[] = "/tmp/kiln-fuzz-npy-XXXXXX";
    if (!::mkdtemp(dir)) std::abort();
    return std::string(dir) + "/x.npy";
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  for (kiln::DType dtype : {kiln::DType::f32, kiln::DType::bf16, kiln::DType::boolean}) {
    kiln::Expected<kiln::HostTensor> t = kiln::read_npy(path, dtype);
    if (t && t->values.size() > size) std::abort();  // more elements than bytes in the file
  }
  return 0;
}
