// Rounding f32 values to the narrower types of graph-format.md (round to
// nearest even, as numerics rule 2 says), and back.
#pragma once

#include <cstdint>

#include "kiln/types.h"

namespace kiln {

uint16_t f32_to_bf16_bits(float value);
float bf16_bits_to_f32(uint16_t bits);
uint16_t f32_to_f16_bits(float value);
float f16_bits_to_f32(uint16_t bits);

inline float round_to_bf16(float value) { return bf16_bits_to_f32(f32_to_bf16_bits(value)); }
inline float round_to_f16(float value) { return f16_bits_to_f32(f32_to_f16_bits(value)); }
// TF32: 10 explicit mantissa bits, f32's exponent range.
float round_to_tf32(float value);

// The value a tensor of `dtype` holds for `value`: rounded for f16/bf16,
// `value != 0` for bool, unchanged for f32.
float round_to(DType dtype, float value);

}  // namespace kiln
