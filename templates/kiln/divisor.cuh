// Division by a size known only at launch: a symbolic graph's kiln_size<i>.
// A kernel makes one Divisor per symbol it divides by, at its start; each
// quotient is then a multiply-high, two adds and two shifts, where `/` by a
// value the compiler cannot see is a long emulated 64-bit sequence (a 3x
// slower pointwise kernel when a layout change divides every index by S).
//
// The method: Granlund and Montgomery, "Division by invariant integers using
// multiplication" (PLDI 1994), figure 4.1, with N = 64: for 1 <= d < 2^64,
// l = ceil(log2 d), m = floor(2^64 (2^l - d) / d) + 1, and for every
// 0 <= n < 2^64, n / d = (t + ((n - t) >> min(l, 1))) >> max(l - 1, 0)
// with t = (m n) >> 64. m is found by two 64-by-32 divisions, so d must be
// at most 2^32; a larger divisor divides with `/`.
//
// Plain C++ for the host too: tests/unit/test_divisor.cpp checks it against
// `/` and `%`.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KILN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KILN_HOST_DEVICE inline
#endif

namespace kiln {

KILN_HOST_DEVICE unsigned long long mul_high_u64(unsigned long long a, unsigned long long b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

KILN_HOST_DEVICE int leading_zeros_u64(unsigned long long x) {  // x > 0
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(x));
#else
  return __builtin_clzll(x);
#endif
}

// kMayBeWide false: a divisor known to be at most 2^32 (every size a kernel divides by: a
// symbol's range stays far below), so no `/` branch is compiled in. With it, each quotient's
// emulated 64-bit division sat in the code unexecuted: a symbolic kernel's epilogue unrolled
// over its elements grew fourfold in SASS and ran 2.4x slower (H100, Llama's v projection).
template <bool kMayBeWide>
struct BasicDivisor {
  unsigned long long divisor, magic;
  unsigned int shift1, shift2;
  bool wide;  // a divisor past 2^32: `/` and `%` (never where kMayBeWide is false)

  // `d` >= 1 (a size; at most 2^32 where kMayBeWide is false).
  KILN_HOST_DEVICE explicit BasicDivisor(long long d) : divisor(static_cast<unsigned long long>(d)) {
    wide = kMayBeWide && divisor > (1ull << 32);
    const int l = divisor == 1 ? 0 : 64 - leading_zeros_u64(divisor - 1);
    shift1 = l < 1 ? l : 1;
    shift2 = l > 1 ? l - 1 : 0;
    // 2^64 (2^l - d) / d, 32 bits at a time: 2^l - d < d <= 2^32.
    const unsigned long long a = wide ? 0 : (1ull << l) - divisor;
    const unsigned long long high = (a << 32) / (wide ? 1 : divisor);
    const unsigned long long rest = (a << 32) - high * divisor;
    const unsigned long long low = (rest << 32) / (wide ? 1 : divisor);
    magic = (high << 32 | low) + 1;
  }
  // n / d and n % d for 0 <= n < 2^63 (an index).
  KILN_HOST_DEVICE long long div(long long n) const {
    const unsigned long long x = static_cast<unsigned long long>(n);
    if constexpr (kMayBeWide)
      if (wide) return static_cast<long long>(x / divisor);
    const unsigned long long t = mul_high_u64(magic, x);
    return static_cast<long long>((t + ((x - t) >> shift1)) >> shift2);
  }
  KILN_HOST_DEVICE long long mod(long long n) const { return n - div(n) * static_cast<long long>(divisor); }
};

using Divisor = BasicDivisor<true>;
using NarrowDivisor = BasicDivisor<false>;

}  // namespace kiln
