#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "compiler/numerics.h"
#include "runtime/npy.h"

namespace kiln {
namespace {

TEST(Numerics, Bf16RoundsToNearestEven) {
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  // bf16 keeps 7 mantissa bits: spacing 2^-7 at 1.0.
  EXPECT_EQ(round_to_bf16(1.0f + 0x1.0p-8f), 1.0f);                      // tie -> even (1.0)
  EXPECT_EQ(round_to_bf16(1.0f + 3 * 0x1.0p-8f), 1.0f + 0x1.0p-6f);      // tie -> even (up)
  EXPECT_EQ(round_to_bf16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 1.0f + 0x1.0p-7f);  // above the tie
  EXPECT_EQ(round_to_bf16(-2.5f), -2.5f);
  EXPECT_EQ(round_to_bf16(3.4e38f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(round_to_bf16(NAN)));
  EXPECT_EQ(f32_to_bf16_bits(1.0f), 0x3f80);
}

TEST(Numerics, F16RoundsToNearestEvenWithSubnormalsAndOverflow) {
  EXPECT_EQ(round_to_f16(1.0f), 1.0f);
  EXPECT_EQ(round_to_f16(1.0f + 0x1.0p-11f), 1.0f);                  // tie -> even
  EXPECT_EQ(round_to_f16(1.0f + 3 * 0x1.0p-11f), 1.0f + 0x1.0p-9f);  // tie -> even (up)
  EXPECT_EQ(round_to_f16(65504.0f), 65504.0f);
  EXPECT_EQ(round_to_f16(65519.0f), 65504.0f);
  EXPECT_EQ(round_to_f16(65520.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_to_f16(0x1.0p-24f), 0x1.0p-24f);                   // smallest subnormal
  EXPECT_EQ(round_to_f16(0x1.0p-25f), 0.0f);                         // tie -> even (0)
  EXPECT_EQ(round_to_f16(3 * 0x1.0p-25f), 0x1.0p-23f);               // tie -> even (2 units)
  EXPECT_EQ(round_to_f16(0x1.ffcp-15f), 0x1.0p-14f);                 // subnormal rounds up to normal
  EXPECT_EQ(f32_to_f16_bits(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(round_to_f16(NAN)));
  for (uint32_t bits = 0; bits < 0x7c00; ++bits)  // every finite f16 survives a round trip
    ASSERT_EQ(f32_to_f16_bits(f16_bits_to_f32(static_cast<uint16_t>(bits))), bits);
}

TEST(Numerics, Tf32KeepsTenMantissaBits) {
  EXPECT_EQ(round_to_tf32(1.0f + 0x1.0p-11f), 1.0f);
  EXPECT_EQ(round_to_tf32(1.0f + 0x1.0p-10f), 1.0f + 0x1.0p-10f);
  EXPECT_EQ(round_to_tf32(1e30f), round_to_tf32(1e30f));  // f32 exponent range kept
  EXPECT_NE(round_to_tf32(1e30f), std::numeric_limits<float>::infinity());
}

TEST(Numerics, BoolCastIsNonZero) {
  EXPECT_EQ(round_to(DType::boolean, 0.0f), 0.0f);
  EXPECT_EQ(round_to(DType::boolean, -0.0f), 0.0f);
  EXPECT_EQ(round_to(DType::boolean, 0.25f), 1.0f);
  EXPECT_EQ(round_to(DType::boolean, NAN), 1.0f);
}

TEST(Numerics, F64ToBf16RoundsOnce) {
  // 1 + 2^-8 + 2^-30 is just above a bf16 tie; through f32 with plain
  // rounding it would become the tie 1 + 2^-8 and then round down to 1.
  const double value = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  EXPECT_EQ(round_from_f64(DType::bf16, value), 1.0f + 0x1.0p-7f);
  EXPECT_EQ(round_from_f64(DType::f32, 0.1), 0.1f);
  EXPECT_EQ(round_from_f64(DType::boolean, 2.0), 1.0f);
}

}  // namespace
}  // namespace kiln
