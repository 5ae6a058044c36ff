// kiln's depthwise and grouped convolutions: conv2d in NHWC with groups of
// CI input channels and M output channels each (depthwise: CI = 1, groups
// = C; group g's filters are output channels g*M .. g*M + M - 1, reading
// input channels g*CI .. g*CI + CI - 1). A few multiply-adds per byte: the
// kernel is built to move bytes.
//
// A block computes a tile of BP x BQ output pixels of one image for CB
// consecutive input channels (whole groups; their CB / CI * M output
// channels):
//   halo     the input pixels the tile reads (its rows and columns widened
//            by the window, zero outside the image and past C) are copied
//            into shared memory in their storage type, 16 bytes at a time
//            along the channels where the tensor allows (cp.async on
//            sm_80 and later), else element by element (codegen's loop);
//   filter   the block's weights, f32 (rounded to the conv's precision),
//            in shared memory beside the halo: depthwise [R*S taps][output
//            channels]; grouped, a thread's weights of a tap (its outputs x
//            CI) cut into chunks of up to 4 floats, chunk c of every lane
//            side by side ([tap][chunk][lane][4]), so that a quarter-warp's
//            16-byte loads meet no bank twice;
//   convolve each thread holds CT input channels (whole groups, one
//            shared-memory load of CT * bytes) and TQ consecutive output
//            pixels of one row, TQ x CT/CI*M f32 accumulators in
//            registers. Depthwise, filter row by filter row: the row's
//            S x CT*M weights come into registers and the input row slides
//            past them, each input pixel of the row loaded once and
//            multiplied by every weight it meets (a stride-1 3x3 row: 6
//            loads for 4 pixels instead of 12). Grouped, tap by tap: the
//            tap's CT/CI*M x CI weights in registers, each pixel's CT inputs
//            loaded for it;
//   epilogue codegen's: the pointwise ops after the conv, values of the
//            channel alone (bias, batch_norm's scale) once a thread, and
//            the written tensors stored CT/CI*M channels at a time.
//
// The shapes the code depends on are template parameters (filter size,
// stride, dilation, group width, the tile); the tensor's sizes (H, W, C,
// padding) are arguments.
//
// Numerics (graph-format.md rule 5): f32 accumulation; 16-bit inputs are
// exact; an f32 input is rounded to the conv's precision as it is read
// from shared memory (ROUND), the weights as they are staged.
#pragma once

#include "kiln/common.cuh"

namespace kiln {
namespace dw {

// The element type of a storage type in shared memory, and its value.
template <Storage S> struct Element;
template <> struct Element<Storage::f32> {
  typedef float type;
  static __device__ __forceinline__ float to_float(float v) { return v; }
  static __device__ __forceinline__ float from_float(float v) { return v; }
};
template <> struct Element<Storage::bf16> {
  typedef u16 type;
  static __device__ __forceinline__ float to_float(u16 v) { return bf16_to_f32(v); }
  static __device__ __forceinline__ u16 from_float(float v) { return f32_to_bf16(v); }  // (exact: v came from bf16)
};
template <> struct Element<Storage::f16> {
  typedef u16 type;
  static __device__ __forceinline__ float to_float(u16 v) { return f16_to_f32(v); }
  static __device__ __forceinline__ u16 from_float(float v) { return f32_to_f16(v); }
};

// f32 operands rounded to the conv's precision (numerics rule 5).
enum Round { kExact = 0, kTf32 = 1, kBf16 = 2, kF16 = 3 };
template <int ROUND>
__device__ __forceinline__ float round_operand(float v) {
  if constexpr (ROUND == kTf32) return round_tf32(v);
  else if constexpr (ROUND == kBf16) return round_bf16(v);
  else if constexpr (ROUND == kF16) return round_f16(v);
  else return v;
}

// One shared-memory access of BYTES bytes.
template <int BYTES> struct Word;
template <> struct Word<2> { typedef u16 type; };
template <> struct Word<4> { typedef u32 type; };
template <> struct Word<8> { typedef uint2 type; };
template <> struct Word<16> { typedef uint4 type; };

// N consecutive elements from shared memory, aligned to N * sizeof(T), in one load; as floats.
template <Storage S, int N>
__device__ __forceinline__ void load_shared(const typename Element<S>::type* p, float (&out)[N]) {
  typedef typename Element<S>::type T;
  typedef typename Word<N * static_cast<int>(sizeof(T))>::type W;
  union {
    W word;
    T e[N];
  } u;
  u.word = *reinterpret_cast<const W*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = Element<S>::to_float(u.e[i]);
}

// N consecutive floats from shared memory, aligned to N * 4 bytes: 16-byte loads where N allows.
template <int N>
__device__ __forceinline__ void load_floats(const float* p, float (&out)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + i);
      out[i] = v.x, out[i + 1] = v.y, out[i + 2] = v.z, out[i + 3] = v.w;
    }
  } else if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const float2 v = *reinterpret_cast<const float2*>(p + i);
      out[i] = v.x, out[i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = p[i];
  }
}

// 16 bytes global -> shared, zero-filled when !valid (then `global` is not read).
__device__ __forceinline__ void copy16(void* shared, const void* global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(static_cast<u32>(__cvta_generic_to_shared(shared))),
               "l"(global), "r"(valid ? 16 : 0));
#else
  *static_cast<uint4*>(shared) = valid ? *static_cast<const uint4*>(global) : make_uint4(0, 0, 0, 0);
#endif
}
// Every copy16 of this thread has landed.
__device__ __forceinline__ void copies_done() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
#endif
}

// The tile: S storage, an R x S_ filter at stride (SH, SW) and dilation (DH,
// DW), groups of CI input and M output channels; a thread's CT input
// channels and TQ output pixels along a row; CG x TX x TY threads (channel
// lanes fastest).
template <Storage S, int R, int S_, int SH, int SW, int DH, int DW, int M, int CT, int TQ, int CG, int TX, int TY, int ROUND,
          int CI = 1>
struct Tile {
  typedef typename Element<S>::type T;
  static constexpr int kThreads = CG * TX * TY;
  static constexpr int kCT = CT, kTQ = TQ;               // input channels and output pixels a thread
  static constexpr int kJ = CT / CI * M;                 // output channels a thread
  static constexpr int kCB = CG * CT, kKB = kCB / CI * M;  // input and output channels a block
  static constexpr int kBP = TY, kBQ = TX * TQ;          // output rows and columns a block
  static constexpr int kSpanQ = (TQ - 1) * SW + (S_ - 1) * DW + 1;  // input columns of a thread's row of pixels
  static constexpr int kHP = (kBP - 1) * SH + (R - 1) * DH + 1, kHQ = (kBQ - 1) * SW + (S_ - 1) * DW + 1;
  // A halo pixel's channels: 16-byte aligned, and 16 bytes apart from the next
  // pixel's banks where a pixel's are fewer than the 128 a quarter-warp reads.
  static constexpr int kPixelBytes = (kCB * static_cast<int>(sizeof(T)) + 15) / 16 * 16 + (kCB * sizeof(T) < 128 ? 16 : 0);
  static constexpr int kPitch = kPixelBytes / static_cast<int>(sizeof(T));  // elements
  static constexpr int kHaloBytes = kHP * kHQ * kPixelBytes;
  static constexpr int kWeightBytes = R * S_ * kKB * CI * 4;
  // Grouped: a thread's weights of one tap, and the chunk they are stored in.
  static constexpr int kWT = kJ * CI, kW = kWT % 4 == 0 ? 4 : kWT % 2 == 0 ? 2 : 1;
  static constexpr int kSharedBytes = kHaloBytes + kWeightBytes;
  static_assert(CT >= 1 && 16 % (CT * static_cast<int>(sizeof(T))) == 0, "a thread's channels: one shared-memory load");
  static_assert(CI >= 1 && CT % CI == 0, "a thread's channels: whole groups");

  // The halo's element e (in [0, kHP * kHQ * kCB)): its pixel's row and column and its channel.
  static __device__ __forceinline__ void halo_element(int e, int& row, int& column, int& channel) {
    const int pixel = e / kCB;
    channel = e % kCB, row = pixel / kHQ, column = pixel % kHQ;
  }
  static __device__ __forceinline__ int halo_index(int row, int column, int channel) {
    return (row * kHQ + column) * kPitch + channel;
  }

  // A thread's place in the tile: its channel lane, column group and row.
  struct Thread {
    int lane, tx, ty;
  };
  static __device__ __forceinline__ Thread thread() {
    return {static_cast<int>(threadIdx.x) % CG, static_cast<int>(threadIdx.x) / CG % TX, static_cast<int>(threadIdx.x) / (CG * TX)};
  }
  // Its first input pixel and channel in the halo, its first output channel's weights.
  static __device__ __forceinline__ const T* input_of(const T* halo, Thread th) {
    return halo + halo_index(th.ty * SH, th.tx * TQ * SW, th.lane * CT);
  }
  static __device__ __forceinline__ const float* weights_of(const float* weights, Thread th) {
    if constexpr (CI == 1) return weights + th.lane * kJ;
    else return weights + th.lane * kW;
  }

  // The halo by 16-byte copies: `x` is image n's pixel (0, 0) channel 0,
  // pixels stride_h and stride_w elements apart (channels contiguous, C a
  // multiple of 16 bytes, x 16-byte aligned); the tile's input starts at
  // row h0, column w0, channel c0 (h0 and w0 may be negative: padding).
  static __device__ __forceinline__ void stage_halo_vectors(T* halo, const T* x, i64 stride_h, i64 stride_w, int h0, int w0,
                                                            int c0, int h, int w, int c) {
    constexpr int kV = 16 / static_cast<int>(sizeof(T)), kChunks = kCB / kV;
    static_assert(kCB % kV == 0, "a block's channels are whole 16-byte chunks");
    for (int e = threadIdx.x; e < kHP * kHQ * kChunks; e += kThreads) {
      const int pixel = e / kChunks, chunk = e % kChunks;
      const int row = pixel / kHQ, column = pixel % kHQ;
      const int hi = h0 + row, wi = w0 + column, ci = c0 + chunk * kV;
      const bool inside = hi >= 0 && hi < h && wi >= 0 && wi < w && ci < c;
      copy16(halo + halo_index(row, column, chunk * kV), inside ? x + hi * stride_h + wi * stride_w + ci : x, inside);
    }
    copies_done();
  }

  // The block's weights into shared memory (the layouts above): for the
  // block's output channels k (kKB of them) and their group's input
  // channels i, `weight(k, ri, si)` (depthwise) or `weight(k, i, ri, si)`
  // for those below the conv's (in `limit`), else 0.
  template <class Weight>
  static __device__ __forceinline__ void stage_weights(float* weights, i64 k0, i64 limit, Weight weight) {
    for (int e = threadIdx.x; e < R * S_ * kKB * CI; e += kThreads) {
      const int tap = e / (kKB * CI);
      if constexpr (CI == 1) {
        const int k = e % kKB;
        weights[e] = k0 + k < limit ? weight(k0 + k, tap / S_, tap % S_) : 0.0f;
      } else {  // e = ((tap * chunks + c) * CG + lane) * kW + r: the lane's weight c * kW + r of the tap
        const int at = e % (kKB * CI), c = at / (CG * kW), lane = at / kW % CG, own = c * kW + at % kW;
        const int k = lane * kJ + own / CI;
        weights[e] = k0 + k < limit ? weight(k0 + k, own % CI, tap / S_, tap % S_) : 0.0f;
      }
    }
  }

  // This thread's accumulators: acc[t][j] for its output pixels t (one row,
  // TQ columns) and output channels j (input channel j / M). `in`: the halo
  // at the thread's first input pixel and channel; `w`: the weights at its
  // first output channel.
  static __device__ __forceinline__ void convolve(const T* in, const float* w, float (&acc)[TQ][kJ]) {
#pragma unroll
    for (int t = 0; t < TQ; ++t)
#pragma unroll
      for (int j = 0; j < kJ; ++j) acc[t][j] = 0.0f;
    if constexpr (CI > 1) {
      convolve_groups(in, w, acc);
      return;
    }
    // (Filter rows one at a time: unrolled, the compiler hoists every row's
    // loads together and runs out of registers.)
#pragma unroll 1
    for (int ri = 0; ri < R; ++ri) {
      float wr[S_][kJ];
#pragma unroll
      for (int si = 0; si < S_; ++si) load_floats<kJ>(w + (ri * S_ + si) * kKB, wr[si]);
      const T* row = in + ri * DH * kHQ * kPitch;
#pragma unroll
      for (int q = 0; q < kSpanQ; ++q) {
        float x[CT];
        load_shared<S, CT>(row + q * kPitch, x);
#pragma unroll
        for (int c = 0; c < CT; ++c) x[c] = round_operand<ROUND>(x[c]);
#pragma unroll
        for (int t = 0; t < TQ; ++t) {
          const int d = q - t * SW;  // the tap's column offset (compile time once unrolled)
          if (d < 0 || d % DW != 0 || d / DW >= S_) continue;
#pragma unroll
          for (int c = 0; c < CT; ++c)
#pragma unroll
            for (int m = 0; m < M; ++m) acc[t][c * M + m] = fmaf(x[c], wr[d / DW][c * M + m], acc[t][c * M + m]);
        }
      }
    }
  }

  // Grouped (CI > 1): tap by tap, the tap's weights for the thread's kJ
  // output channels (kJ x CI, chunk by chunk) in registers, then each of its
  // pixels' CT inputs, group g's CI of them into g's M outputs.
  static __device__ __forceinline__ void convolve_groups(const T* in, const float* w, float (&acc)[TQ][kJ]) {
#pragma unroll 1
    for (int ri = 0; ri < R; ++ri) {
      const T* row = in + ri * DH * kHQ * kPitch;
#pragma unroll
      for (int si = 0; si < S_; ++si) {
        float wt[kWT];
#pragma unroll
        for (int c = 0; c < kWT / kW; ++c) {
          float chunk[kW];
          load_floats<kW>(w + (ri * S_ + si) * kKB * CI + c * CG * kW, chunk);
#pragma unroll
          for (int r = 0; r < kW; ++r) wt[c * kW + r] = chunk[r];
        }
#pragma unroll
        for (int t = 0; t < TQ; ++t) {
          float x[CT];
          load_shared<S, CT>(row + (t * SW + si * DW) * kPitch, x);
#pragma unroll
          for (int c = 0; c < CT; ++c) x[c] = round_operand<ROUND>(x[c]);
#pragma unroll
          for (int j = 0; j < kJ; ++j)
#pragma unroll
            for (int i = 0; i < CI; ++i) acc[t][j] = fmaf(x[j / M * CI + i], wt[j * CI + i], acc[t][j]);
        }
      }
    }
  }
};

}  // namespace dw
}  // namespace kiln
