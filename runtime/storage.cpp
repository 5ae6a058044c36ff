#include "runtime/storage.h"

#include <cmath>
#include <cstring>

#include "compiler/numerics.h"

namespace kiln::runtime {

int64_t span_elements(const Shape& shape, const Strides& strides) {
  int64_t span = 1;
  for (size_t d = 0; d < shape.size(); ++d) span += (shape[d] - 1) * strides[d];
  return span;
}

std::string to_storage(const HostTensor& t, const Strides& strides) {
  const int64_t span = span_elements(t.shape, strides);
  const int size = byte_size(t.dtype);
  std::string bytes(static_cast<size_t>(span * size), '\0');
  std::vector<int64_t> index(t.shape.size(), 0);
  for (size_t i = 0; i < t.values.size(); ++i) {
    int64_t at = 0;
    for (size_t d = 0; d < index.size(); ++d) at += index[d] * strides[d];
    char* p = bytes.data() + at * size;
    const float v = t.values[i];
    switch (t.dtype) {
      case DType::f32: std::memcpy(p, &v, 4); break;
      case DType::bf16: { const uint16_t b = f32_to_bf16_bits(v); std::memcpy(p, &b, 2); break; }
      case DType::f16: { const uint16_t b = f32_to_f16_bits(v); std::memcpy(p, &b, 2); break; }
      case DType::boolean: *p = v != 0.0f ? 1 : 0; break;
    }
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
  return bytes;
}

std::vector<float> from_storage(const std::string& bytes, DType dtype, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const char* p = bytes.data() + i * byte_size(dtype);
    switch (dtype) {
      case DType::f32: std::memcpy(&out[static_cast<size_t>(i)], p, 4); break;
      case DType::bf16: { uint16_t b; std::memcpy(&b, p, 2); out[static_cast<size_t>(i)] = bf16_bits_to_f32(b); break; }
      case DType::f16: { uint16_t b; std::memcpy(&b, p, 2); out[static_cast<size_t>(i)] = f16_bits_to_f32(b); break; }
      case DType::boolean: {
        const auto b = static_cast<unsigned char>(*p);
        out[static_cast<size_t>(i)] = b == 0 ? 0.0f : b == 1 ? 1.0f : NAN;  // anything else: never written
        break;
      }
    }
  }
  return out;
}

}  // namespace kiln::runtime
