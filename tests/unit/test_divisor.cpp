// templates/kiln/divisor.cuh on the host: a symbolic kernel's division by a
// size known at launch gives `/` and `%` exactly, for every divisor a size
// can be and every index below 2^63.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "templates/kiln/divisor.cuh"

namespace {

void expect_divides_like_the_operators(int64_t d, int64_t n) {
  const kiln::Divisor divisor(d);
  ASSERT_EQ(divisor.div(n), n / d) << n << " / " << d;
  ASSERT_EQ(divisor.mod(n), n % d) << n << " % " << d;
  if (d > (int64_t{1} << 32)) return;  // (a narrow divisor's sizes: at most 2^32)
  const kiln::NarrowDivisor narrow(d);
  ASSERT_EQ(narrow.div(n), n / d) << n << " / " << d << " (narrow)";
  ASSERT_EQ(narrow.mod(n), n % d) << n << " % " << d << " (narrow)";
}

// Indices near d's multiples and near the largest index, and random ones (each in [0, 2^63)).
std::vector<int64_t> numerators_near_multiples(int64_t d, std::mt19937_64& random) {
  std::vector<int64_t> out;
  auto add = [&](__int128 n) {
    if (n >= 0 && n <= INT64_MAX) out.push_back(static_cast<int64_t>(n));
  };
  for (__int128 n : {__int128{0}, __int128{1}, __int128{2}, __int128{INT64_MAX}, __int128{INT64_MAX} - 1,
                     __int128{INT64_MAX} - d, __int128{INT64_MAX} / d * d, __int128{INT64_MAX} / d * d - 1})
    add(n);
  for (long long k : {1LL, 2LL, 3LL, 1LL << 20, 1LL << 31, (1LL << 32) + 7})
    for (int delta : {-1, 0, 1}) add(__int128{k} * d + delta);
  for (int i = 0; i < 64; ++i) add(static_cast<__int128>(random() >> 1));
  for (int i = 0; i < 64; ++i) add(static_cast<__int128>(random() % (uint64_t{1} << 34)));
  for (__int128 n : {__int128{UINT32_MAX}, __int128{UINT32_MAX} - 1, __int128{UINT32_MAX} + 1, __int128{UINT32_MAX} / d * d})
    add(n);
  return out;
}

TEST(Divisor, SmallDivisorsOverEverySmallIndex) {
  for (int64_t d = 1; d <= 600; ++d)
    for (int64_t n = 0; n <= 5000; ++n) expect_divides_like_the_operators(d, n);
}

TEST(Divisor, EveryKindOfDivisorNearItsMultiplesAndTheLargestIndices) {
  std::mt19937_64 random(49);
  std::vector<int64_t> divisors = {1, 2, 3, 7, 128, 1000, 4096, 32768, 2147483647, 2147483648LL, 4294967295LL,
                                   4294967296LL, 4294967297LL, (int64_t{1} << 40) + 3, INT64_MAX};
  for (int shift = 1; shift < 63; ++shift)
    for (int64_t delta : {-1, 0, 1}) divisors.push_back((int64_t{1} << shift) + delta);
  for (int i = 0; i < 200; ++i) divisors.push_back(static_cast<int64_t>(random() % (uint64_t{1} << 32)) + 1);
  for (int64_t d : divisors)
    for (int64_t n : numerators_near_multiples(d, random)) expect_divides_like_the_operators(d, n);
}

TEST(Divisor, DivisorsPastTwoToTheThirtyTwoDivideWithTheOperator) {
  EXPECT_FALSE(kiln::Divisor(int64_t{1} << 32).wide);
  EXPECT_TRUE(kiln::Divisor((int64_t{1} << 32) + 1).wide);
}

}  // namespace
