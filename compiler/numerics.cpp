#include "compiler/numerics.h"

#include <cmath>
#include <cstring>

namespace kiln {
namespace {

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float float_of(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Keeps the top `keep` mantissa bits of an f32, rounding to nearest even.
float round_mantissa(float value, int keep) {
  uint32_t bits = bits_of(value);
  if ((bits & 0x7f800000u) == 0x7f800000u) return value;  // inf, NaN
  const int drop = 23 - keep;
  const uint32_t half = 1u << (drop - 1);
  const uint32_t lsb = (bits >> drop) & 1u;
  bits += half - 1 + lsb;  // may carry into the exponent: that is the correct rounding
  bits &= ~((1u << drop) - 1);
  return float_of(bits);
}

}  // namespace

uint16_t f32_to_bf16_bits(float value) {
  const uint32_t bits = bits_of(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>(bits_of(round_mantissa(value, 7)) >> 16);
}

float bf16_bits_to_f32(uint16_t bits) { return float_of(static_cast<uint32_t>(bits) << 16); }

float round_to_tf32(float value) { return round_mantissa(value, 10); }

uint16_t f32_to_f16_bits(float value) {
  const uint32_t bits = bits_of(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return static_cast<uint16_t>(sign | 0x7e00u);
  if (magnitude >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (magnitude < 6.103515625e-05f) {
    // Subnormal (or zero): units of 2^-24; nearbyint rounds half to even.
    const float units = std::nearbyint(magnitude * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));
  }
  const uint32_t rounded = bits_of(round_mantissa(magnitude, 10));
  const uint32_t exponent = ((rounded >> 23) & 0xffu) - 127 + 15;
  const uint32_t mantissa = (rounded >> 13) & 0x3ffu;
  return static_cast<uint16_t>(sign | (exponent << 10) | mantissa);
}

float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;  // 2^-24
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return float_of(sign | 0x7f800000u | (mantissa << 13));
  return float_of(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::f32: return value;
    case DType::f16: return round_to_f16(value);
    case DType::bf16: return round_to_bf16(value);
    case DType::boolean: return value != 0.0f ? 1.0f : 0.0f;
  }
  return value;
}

}  // namespace kiln
