#include "kiln/types.h"

#include <fmt/format.h>

namespace kiln {

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::boolean: return "bool";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view text) {
  if (text == "f32") return DType::f32;
  if (text == "f16") return DType::f16;
  if (text == "bf16") return DType::bf16;
  if (text == "bool") return DType::boolean;
  return std::nullopt;
}

int byte_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::boolean: return 1;
  }
  return 0;
}

bool is_floating(DType dtype) { return dtype != DType::boolean; }

int64_t element_count(const Shape& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= shape[i];
  }
  return strides;
}

std::string to_string(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ",")); }

}  // namespace kiln
