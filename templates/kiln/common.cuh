// kiln's device-side library: the helpers every generated kernel includes.
// A real header: nvcc and editors understand it; the build embeds it into
// the kiln library as a string (no file-system lookup at run time) and
// NVRTC sees it as "kiln/common.cuh".
//
// Numerics follow graph-format.md: values are f32 in registers; storage
// types are converted exactly on load and with round-to-nearest-even on
// store (rule 2), bit for bit as the reference interpreter does (NaN
// payloads aside: a NaN stays a NaN).
#pragma once

#ifndef __CUDACC_RTC__
#include <cstdint>
#endif

#include "kiln/divisor.cuh"

namespace kiln {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// ---- storage conversions ---------------------------------------------------
__device__ __forceinline__ float bf16_to_f32(u16 bits) { return __uint_as_float(static_cast<u32>(bits) << 16); }

// Round to nearest even: one cvt on sm_80 and later (a NaN stays a NaN; its
// payload is not kept), integer arithmetic before.
__device__ __forceinline__ u16 f32_to_bf16(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u16 out;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out) : "f"(v));
  return out;
#else
  const u32 bits = __float_as_uint(v);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) return static_cast<u16>((bits >> 16) | 0x40u);
  const u32 lsb = (bits >> 16) & 1u;
  return static_cast<u16>((bits + 0x7fffu + lsb) >> 16);
#endif
}

__device__ __forceinline__ float f16_to_f32(u16 bits) {
  float out;
  asm("{ .reg .f16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(out) : "h"(bits));
  return out;
}

__device__ __forceinline__ u16 f32_to_f16(float v) {
  u16 out;
  asm("{ .reg .f16 h; cvt.rn.f16.f32 h, %1; mov.b16 %0, h; }" : "=h"(out) : "f"(v));
  return out;
}

// Two values rounded and packed: `lo` in the low half (one cvt on sm_80+).
__device__ __forceinline__ u32 f32x2_to_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
#else
  return static_cast<u32>(f32_to_bf16(lo)) | (static_cast<u32>(f32_to_bf16(hi)) << 16);
#endif
}
__device__ __forceinline__ u32 f32x2_to_f16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 out;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
#else
  return static_cast<u32>(f32_to_f16(lo)) | (static_cast<u32>(f32_to_f16(hi)) << 16);
#endif
}

// Rounding a value to a narrower type and back (rule 2), and tf32 (rule 5).
// On sm_80+ through the packing conversion (F2FP, an ALU instruction; the
// scalar F2F runs on the quarter-rate conversion pipe: 9 roundings an
// element of GPT-2's GELU written out made it the epilogue's bottleneck):
// bf16 rounded into the high half of a zero word is the f32 it stands for.
__device__ __forceinline__ float round_bf16(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __uint_as_float(f32x2_to_bf16x2(0.0f, v));
#else
  return bf16_to_f32(f32_to_bf16(v));
#endif
}
__device__ __forceinline__ float round_f16(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return f16_to_f32(static_cast<u16>(f32x2_to_f16x2(v, 0.0f)));
#else
  return f16_to_f32(f32_to_f16(v));
#endif
}
__device__ __forceinline__ float round_tf32(float v) {
  const u32 bits = __float_as_uint(v);
  if ((bits & 0x7f800000u) == 0x7f800000u) return v;
  const u32 lsb = (bits >> 13) & 1u;
  return __uint_as_float((bits + 0xfffu + lsb) & ~0x1fffu);
}

// Loads and stores by storage type: f32, bf16, f16 and bool (u8 0/1).
__device__ __forceinline__ float load_f32(const void* p, i64 i) { return static_cast<const float*>(p)[i]; }
__device__ __forceinline__ float load_bf16(const void* p, i64 i) { return bf16_to_f32(static_cast<const u16*>(p)[i]); }
__device__ __forceinline__ float load_f16(const void* p, i64 i) { return f16_to_f32(static_cast<const u16*>(p)[i]); }
__device__ __forceinline__ float load_bool(const void* p, i64 i) { return static_cast<const u8*>(p)[i] ? 1.0f : 0.0f; }
__device__ __forceinline__ void store_f32(void* p, i64 i, float v) { static_cast<float*>(p)[i] = v; }
__device__ __forceinline__ void store_bf16(void* p, i64 i, float v) { static_cast<u16*>(p)[i] = f32_to_bf16(v); }
__device__ __forceinline__ void store_f16(void* p, i64 i, float v) { static_cast<u16*>(p)[i] = f32_to_f16(v); }
__device__ __forceinline__ void store_bool(void* p, i64 i, float v) { static_cast<u8*>(p)[i] = v != 0.0f ? 1 : 0; }
// Two adjacent values into shared memory (a staging buffer), 4 or 8 bytes aligned.
__device__ __forceinline__ void put_pair_f32(void* p, float a, float b) { *static_cast<float2*>(p) = make_float2(a, b); }
// Element i of p from shared memory (a staging buffer), as stored: 2 or 4 bytes.
template <int BYTES>
__device__ __forceinline__ void copy_element(void* p, i64 i, const unsigned char* from) {
  if constexpr (BYTES == 2) static_cast<u16*>(p)[i] = *reinterpret_cast<const u16*>(from);
  else static_cast<u32*>(p)[i] = *reinterpret_cast<const u32*>(from);
}
// And back: element i of p into shared memory, as stored.
template <int BYTES>
__device__ __forceinline__ void fetch_element(unsigned char* to, const void* p, i64 i) {
  if constexpr (BYTES == 2) *reinterpret_cast<u16*>(to) = static_cast<const u16*>(p)[i];
  else *reinterpret_cast<u32*>(to) = static_cast<const u32*>(p)[i];
}
// Two adjacent values from shared memory (a staged residual), as floats.
__device__ __forceinline__ void get_pair_f32(const void* p, float (&v)[2]) {
  const float2 x = *static_cast<const float2*>(p);
  v[0] = x.x, v[1] = x.y;
}
__device__ __forceinline__ void get_pair_bf16(const void* p, float (&v)[2]) {
  const u32 x = *static_cast<const u32*>(p);
  v[0] = bf16_to_f32(static_cast<u16>(x & 0xffff)), v[1] = bf16_to_f32(static_cast<u16>(x >> 16));
}
__device__ __forceinline__ void get_pair_f16(const void* p, float (&v)[2]) {
  const u32 x = *static_cast<const u32*>(p);
  v[0] = f16_to_f32(static_cast<u16>(x & 0xffff)), v[1] = f16_to_f32(static_cast<u16>(x >> 16));
}
__device__ __forceinline__ void put_pair_bf16(void* p, float a, float b) {
  *static_cast<u32*>(p) = static_cast<u32>(f32_to_bf16(a)) | (static_cast<u32>(f32_to_bf16(b)) << 16);
}
__device__ __forceinline__ void put_pair_f16(void* p, float a, float b) {
  *static_cast<u32*>(p) = static_cast<u32>(f32_to_f16(a)) | (static_cast<u32>(f32_to_f16(b)) << 16);
}
// Elements i and i + 1 in one store where their address is aligned for it
// (a tensor-core epilogue's column pairs), else one by one.
__device__ __forceinline__ void store_pair_f32(void* p, i64 i, float a, float b) {
  float* q = static_cast<float*>(p) + i;
  if ((reinterpret_cast<unsigned long long>(q) & 7) == 0) *reinterpret_cast<float2*>(q) = make_float2(a, b);
  else q[0] = a, q[1] = b;
}
__device__ __forceinline__ void store_pair_bf16(void* p, i64 i, float a, float b) {
  u16* q = static_cast<u16*>(p) + i;
  if ((reinterpret_cast<unsigned long long>(q) & 3) == 0)
    *reinterpret_cast<u32*>(q) = static_cast<u32>(f32_to_bf16(a)) | (static_cast<u32>(f32_to_bf16(b)) << 16);
  else q[0] = f32_to_bf16(a), q[1] = f32_to_bf16(b);
}
// A pair already rounded to bf16 (zero low halves): their high halves, packed.
__device__ __forceinline__ void store_rounded_pair_bf16(void* p, i64 i, float a, float b) {
  u16* q = static_cast<u16*>(p) + i;
  const u32 bits = __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632);
  if ((reinterpret_cast<unsigned long long>(q) & 3) == 0)
    *reinterpret_cast<u32*>(q) = bits;
  else q[0] = static_cast<u16>(bits), q[1] = static_cast<u16>(bits >> 16);
}
__device__ __forceinline__ void store_pair_f16(void* p, i64 i, float a, float b) {
  u16* q = static_cast<u16*>(p) + i;
  if ((reinterpret_cast<unsigned long long>(q) & 3) == 0)
    *reinterpret_cast<u32*>(q) = static_cast<u32>(f32_to_f16(a)) | (static_cast<u32>(f32_to_f16(b)) << 16);
  else q[0] = f32_to_f16(a), q[1] = f32_to_f16(b);
}

__device__ __forceinline__ float inf() { return __int_as_float(0x7f800000); }

// ---- 16-byte vector loads and stores of V consecutive elements -------------
// p + i0 must be 16-byte aligned and V * sizeof(element) a multiple of 16.
template <int V>
__device__ __forceinline__ void load_vec_f32(const void* p, i64 i0, float* out) {
  const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + i0);
#pragma unroll
  for (int c = 0; c < V / 4; ++c) {
    const float4 v = q[c];
    out[4 * c] = v.x, out[4 * c + 1] = v.y, out[4 * c + 2] = v.z, out[4 * c + 3] = v.w;
  }
}
template <int V, bool kBf16>
__device__ __forceinline__ void load_vec_16bit(const void* p, i64 i0, float* out) {
  const uint4* q = reinterpret_cast<const uint4*>(static_cast<const u16*>(p) + i0);
#pragma unroll
  for (int c = 0; c < V / 8; ++c) {
    const uint4 v = q[c];
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const u16 lo = static_cast<u16>(w[k] & 0xffffu), hi = static_cast<u16>(w[k] >> 16);
      out[8 * c + 2 * k] = kBf16 ? bf16_to_f32(lo) : f16_to_f32(lo);
      out[8 * c + 2 * k + 1] = kBf16 ? bf16_to_f32(hi) : f16_to_f32(hi);
    }
  }
}
template <int V> __device__ __forceinline__ void load_vec_bf16(const void* p, i64 i0, float* out) { load_vec_16bit<V, true>(p, i0, out); }
template <int V> __device__ __forceinline__ void load_vec_f16(const void* p, i64 i0, float* out) { load_vec_16bit<V, false>(p, i0, out); }

// One 16-byte store, always: nvcc otherwise splits some uint4 stores whose
// alignment it cannot see into four 4-byte stores (four L2 writes each).
__device__ __forceinline__ void store128(void* p, u32 a, u32 b, u32 c, u32 d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d));
}

template <int V>
__device__ __forceinline__ void store_vec_f32(void* p, i64 i0, const float* v) {
  float4* q = reinterpret_cast<float4*>(static_cast<float*>(p) + i0);
#pragma unroll
  for (int c = 0; c < V / 4; ++c)
    store128(q + c, __float_as_uint(v[4 * c]), __float_as_uint(v[4 * c + 1]), __float_as_uint(v[4 * c + 2]),
             __float_as_uint(v[4 * c + 3]));
}
template <int V, bool kBf16>
__device__ __forceinline__ void store_vec_16bit(void* p, i64 i0, const float* v) {
  uint4* q = reinterpret_cast<uint4*>(static_cast<u16*>(p) + i0);
#pragma unroll
  for (int c = 0; c < V / 8; ++c) {
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      w[k] = kBf16 ? f32x2_to_bf16x2(v[8 * c + 2 * k], v[8 * c + 2 * k + 1]) : f32x2_to_f16x2(v[8 * c + 2 * k], v[8 * c + 2 * k + 1]);
    store128(q + c, w[0], w[1], w[2], w[3]);
  }
}
template <int V> __device__ __forceinline__ void store_vec_bf16(void* p, i64 i0, const float* v) { store_vec_16bit<V, true>(p, i0, v); }
template <int V> __device__ __forceinline__ void store_vec_f16(void* p, i64 i0, const float* v) { store_vec_16bit<V, false>(p, i0, v); }

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15) == 0; }

// A value computed once and kept in a register: the compiler cannot
// recompute it from what it was made of (it did, in each K slice, the
// divisions that made a conv's output pixel from its row).
__device__ __forceinline__ int kept(int x) { asm volatile("" : "+r"(x)); return x; }
__device__ __forceinline__ i64 kept(i64 x) { asm volatile("" : "+l"(x)); return x; }
__device__ __forceinline__ bool kept(bool b) { int x = b; asm volatile("" : "+r"(x)); return x != 0; }
template <class T> __device__ __forceinline__ const T* kept(const T* p) { asm volatile("" : "+l"(p)); return p; }

// A chunk of V consecutive elements at p + i0 of a tensor stored as S: one
// 16-byte access per 16 bytes when `vector` (the caller checked the
// alignment), else element by element.
enum class Storage { f32, bf16, f16 };
template <Storage S, int V>
__device__ __forceinline__ void load_chunk(const void* p, i64 i0, float* out, bool vector) {
  if (vector) {
    if constexpr (S == Storage::f32) load_vec_f32<V>(p, i0, out);
    else load_vec_16bit<V, S == Storage::bf16>(p, i0, out);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v)
      out[v] = S == Storage::f32 ? load_f32(p, i0 + v) : S == Storage::bf16 ? load_bf16(p, i0 + v) : load_f16(p, i0 + v);
  }
}
template <Storage S, int V>
__device__ __forceinline__ void store_chunk(void* p, i64 i0, const float* in, bool vector) {
  if (vector) {
    if constexpr (S == Storage::f32) store_vec_f32<V>(p, i0, in);
    else store_vec_16bit<V, S == Storage::bf16>(p, i0, in);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if constexpr (S == Storage::f32) store_f32(p, i0 + v, in[v]);
      else if constexpr (S == Storage::bf16) store_bf16(p, i0 + v, in[v]);
      else store_f16(p, i0 + v, in[v]);
    }
  }
}

// ---- one functor per pointwise op (graph-format.md's catalogue) -----------
// maximum, minimum, relu and clamp propagate NaN, as the reference does.
// The larger (smaller) of two values, NaN where either is: one instruction
// from sm_80 on (max.NaN gives the canonical NaN, as the fallback does).
template <bool LARGER>
__device__ __forceinline__ float nan_pick(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  if constexpr (LARGER) asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  else asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? __int_as_float(0x7fc00000) : LARGER ? fmaxf(a, b) : fminf(a, b);
#endif
}
__device__ __forceinline__ float nan_max(float a, float b) { return nan_pick<true>(a, b); }
__device__ __forceinline__ float nan_min(float a, float b) { return nan_pick<false>(a, b); }

__device__ __forceinline__ float op_identity(float x) { return x; }
__device__ __forceinline__ float op_neg(float x) { return -x; }
__device__ __forceinline__ float op_abs(float x) { return fabsf(x); }
__device__ __forceinline__ float op_relu(float x) { return nan_max(x, 0.0f); }
__device__ __forceinline__ float op_leaky_relu(float x, float alpha) { return x > 0.0f ? x : alpha * x; }
__device__ __forceinline__ float op_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float op_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
// SiLU and sigmoid divide by 1 + e^-x with the reciprocal unit and one
// multiply (__fdividef: within 2 ulp, the bound expf already has) rather than
// IEEE division, whose rounding fix-up and slow-path branch cost each element
// about ten instructions more. Where a GEMM's epilogue is the work (a 1 x 1
// conv over 16 channels into 96, with batch norm and SiLU: EfficientNet-B0's
// expansion at B32), the kernel took 243 us against 375 (H200, ncu). A
// divisor above 2^126 (x below -87.34) gives 0 where IEEE division gives at
// most 1.03e-36 in magnitude; x = -inf gives NaN either way.
__device__ __forceinline__ float op_silu(float x) { return __fdividef(x, 1.0f + expf(-x)); }
__device__ __forceinline__ float op_sigmoid(float x) { return __fdividef(1.0f, 1.0f + expf(-x)); }
__device__ __forceinline__ float op_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float op_exp(float x) { return expf(x); }
__device__ __forceinline__ float op_log(float x) { return logf(x); }
__device__ __forceinline__ float op_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float op_rsqrt(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ float op_reciprocal(float x) { return 1.0f / x; }
__device__ __forceinline__ float op_square(float x) { return x * x; }
__device__ __forceinline__ float op_erf(float x) { return erff(x); }
__device__ __forceinline__ float op_sin(float x) { return sinf(x); }
__device__ __forceinline__ float op_cos(float x) { return cosf(x); }
__device__ __forceinline__ float op_softplus(float x) { return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x)); }
__device__ __forceinline__ float op_clamp_min(float x, float lo) { return nan_max(x, lo); }
__device__ __forceinline__ float op_clamp_max(float x, float hi) { return nan_min(x, hi); }
__device__ __forceinline__ float op_to_bool(float x) { return x != 0.0f ? 1.0f : 0.0f; }

__device__ __forceinline__ float op_add(float a, float b) { return a + b; }
__device__ __forceinline__ float op_sub(float a, float b) { return a - b; }
__device__ __forceinline__ float op_mul(float a, float b) { return a * b; }
__device__ __forceinline__ float op_div(float a, float b) { return a / b; }
__device__ __forceinline__ float op_maximum(float a, float b) { return nan_max(a, b); }
__device__ __forceinline__ float op_minimum(float a, float b) { return nan_min(a, b); }
// pow(x, 2), the square of RMSNorm written out, as one multiply: exact,
// as the reference's pow is, and a few instructions where powf is dozens.
// pow(x, 3) (GPT-2's tanh GELU written out) as two: within 1.5 ulp of the
// exact cube, where powf's own bound is 2 ulp (CUDA C Programming Guide,
// Mathematical Functions), and what PyTorch computes for it on CUDA.
__device__ __forceinline__ float op_pow(float a, float b) {
  return b == 2.0f ? a * a : b == 3.0f ? a * a * a : powf(a, b);
}
__device__ __forceinline__ float op_eq(float a, float b) { return a == b ? 1.0f : 0.0f; }
__device__ __forceinline__ float op_ne(float a, float b) { return a != b ? 1.0f : 0.0f; }
__device__ __forceinline__ float op_lt(float a, float b) { return a < b ? 1.0f : 0.0f; }
__device__ __forceinline__ float op_le(float a, float b) { return a <= b ? 1.0f : 0.0f; }
__device__ __forceinline__ float op_gt(float a, float b) { return a > b ? 1.0f : 0.0f; }
__device__ __forceinline__ float op_ge(float a, float b) { return a >= b ? 1.0f : 0.0f; }
__device__ __forceinline__ float op_where(float c, float a, float b) { return c != 0.0f ? a : b; }

// ---- reductions --------------------------------------------------------------
struct SumOp {
  __device__ static float identity() { return 0.0f; }
  __device__ static float combine(float a, float b) { return a + b; }
};
struct MaxOp {
  __device__ static float identity() { return -__int_as_float(0x7f800000); }
  __device__ static float combine(float a, float b) { return nan_max(a, b); }
};
struct MinOp {
  __device__ static float identity() { return __int_as_float(0x7f800000); }
  __device__ static float combine(float a, float b) { return nan_min(a, b); }
};

template <class Op>
__device__ __forceinline__ float warp_reduce(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = Op::combine(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduces one value per thread over the block; every thread gets the result.
// `scratch` holds at least 32 floats; the block is at most 1024 threads.
template <class Op>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warp_reduce<Op>(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : Op::identity();
  return warp_reduce<Op>(v);
}

// ---- thread-block clusters (sm_90): distributed shared memory -------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}
// Every thread of every block of the cluster arrives (release) and waits
// (acquire): shared memory written before is visible to the whole cluster.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}
// `local` (this block's shared memory) as it lies in block `rank` of the cluster.
__device__ __forceinline__ float cluster_load(const float* local, unsigned rank) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
#endif

// Atomic max/min on f32 that propagate NaN (epilogue reductions across tiles).
__device__ __forceinline__ void atomic_combine(SumOp, float* address, float v) { atomicAdd(address, v); }
template <class Op>
__device__ __forceinline__ void atomic_combine(Op, float* address, float v) {
  u32* bits = reinterpret_cast<u32*>(address);
  u32 old = *bits, assumed;
  do {
    assumed = old;
    const float next = Op::combine(__uint_as_float(assumed), v);
    if (__float_as_uint(next) == assumed) break;
    old = atomicCAS(bits, assumed, __float_as_uint(next));
  } while (old != assumed);
}

}  // namespace kiln
