// The kernel templates of templates/, embedded into the library at build
// time (cmake/embed_files.cmake): NVRTC gets them as named headers, so kiln
// never looks for files at run time.
#pragma once

#include <string_view>
#include <vector>

namespace kiln::runtime {

struct EmbeddedFile {
  std::string_view name;  // as included: "kiln/common.cuh"
  std::string_view text;
};

const std::vector<EmbeddedFile>& embedded_templates();

}  // namespace kiln::runtime
