// kiln's tensor-core GEMM main loop for sm_80 and later: a block computes a
// BM x BN tile of C = A * B with mma.sync (bf16/f16 m16n8k16, tf32 m16n8k8),
// f32 accumulators in registers, operands staged through a STAGES-deep ring
// of shared-memory tiles.
//
// Hooks (what codegen provides):
// - load_a(tile, k_tile) / load_b(tile, k_tile), then stash_a / stash_b:
//   fill one stage's tiles for K-slice k_tile. A plain tensor in memory is
//   copied with cp.async (overlapping the math of earlier stages); a fused
//   prologue (normalisation, pointwise ops, views, implicit im2col) has its
//   inputs loaded into registers by load_x and is computed and stored by
//   stash_x after the next slice's math; both are complete by the time the
//   main loop reads that stage. Elements outside the problem are zero.
// - the epilogue reads `acc` after run() through acc_row / acc_col.
//
// Tiles in shared memory: A is [BM][BK] with k contiguous; B is [BN][BK] (k
// contiguous, B_K_MAJOR) or [BK][BN] (n contiguous); rows are padded by 16
// bytes so that ldmatrix and the fragment loads are free of bank conflicts.
//
// Numerics (graph-format.md rule 5): operands reach the tiles exactly
// representable in the MMA's input type; bf16/f16 products are exact in the
// f32 accumulator; tf32 operands are rounded to nearest even on the fragment
// load (round_tf32), as the reference interpreter rounds them.
#pragma once

#include "kiln/common.cuh"

namespace kiln {
namespace tc {

enum Kind { kBf16 = 0, kF16 = 1, kTf32 = 2 };

template <int K> struct Element;
template <> struct Element<kBf16> {
  typedef u16 type;
  static __device__ __forceinline__ u16 from_float(float v) { return f32_to_bf16(v); }
};
template <> struct Element<kF16> {
  typedef u16 type;
  static __device__ __forceinline__ u16 from_float(float v) { return f32_to_f16(v); }
};
template <> struct Element<kTf32> {
  typedef float type;
  static __device__ __forceinline__ float from_float(float v) { return v; }
};

__device__ __forceinline__ u32 shared_address(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared, asynchronously; zero-filled when !valid.
__device__ __forceinline__ void cp_async16(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

template <int K>
__device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]);
template <>
__device__ __forceinline__ void mma<kBf16>(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma<kF16>(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma<kTf32>(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ u32 tf32_bits(float v) { return __float_as_uint(round_tf32(v)); }

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int KIND, bool B_K_MAJOR>
struct Gemm {
  typedef typename Element<KIND>::type T;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int kWarpM = BM / WARPS_M, kWarpN = BN / WARPS_N;
  static constexpr int kMI = kWarpM / 16, kNI = kWarpN / 8;  // MMA tiles per warp
  static constexpr int kChunk = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
  static constexpr int kKStep = KIND == kTf32 ? 8 : 16;
  static constexpr int kAStride = BK + kChunk;
  static constexpr int kBStride = B_K_MAJOR ? BK + kChunk : BN + 8;
  static constexpr int kAStage = BM * kAStride;
  static constexpr int kBStage = B_K_MAJOR ? BN * kBStride : BK * kBStride;
  static constexpr int kSharedBytes = STAGES * (kAStage + kBStage) * static_cast<int>(sizeof(T));
  static_assert(BM % (16 * WARPS_M) == 0 && BN % (16 * WARPS_N) == 0 && BK % kKStep == 0, "tile shape");
  static_assert(STAGES >= 1, "a stage at least");

  float acc[kMI][kNI][4];

  static __device__ __forceinline__ T* a_tile(T* smem, int stage) { return smem + stage * (kAStage + kBStage); }
  static __device__ __forceinline__ T* b_tile(T* smem, int stage) { return a_tile(smem, stage) + kAStage; }
  // Where A(m, k) and B(k, n) of the block tile live in a stage.
  static __device__ __forceinline__ int a_index(int m, int k) { return m * kAStride + k; }
  static __device__ __forceinline__ int b_index(int k, int n) { return B_K_MAJOR ? n * kBStride + k : k * kBStride + n; }

  // Row and column in the block tile of accumulator element e of MMA tile (mi, ni).
  static __device__ __forceinline__ int acc_row(int mi, int e) {
    const int lane = threadIdx.x & 31, warp_m = (threadIdx.x >> 5) / WARPS_N;
    return warp_m * kWarpM + mi * 16 + (lane >> 2) + (e >> 1) * 8;
  }
  static __device__ __forceinline__ int acc_col(int ni, int e) {
    const int lane = threadIdx.x & 31, warp_n = (threadIdx.x >> 5) % WARPS_N;
    return warp_n * kWarpN + ni * 8 + (lane & 3) * 2 + (e & 1);
  }

  // One k-step's fragments: A for every MMA row tile, B for every column tile.
  __device__ __forceinline__ void load_fragments(const T* a, const T* b, int ks, u32 (&af)[kMI][4], u32 (&bf)[kNI][2]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = (warp / WARPS_N) * kWarpM, wn = (warp % WARPS_N) * kWarpN;
    if constexpr (KIND == kTf32) {
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) {
        const int r = wm + mi * 16 + g;
        af[mi][0] = tf32_bits(a[a_index(r, ks + t)]);
        af[mi][1] = tf32_bits(a[a_index(r + 8, ks + t)]);
        af[mi][2] = tf32_bits(a[a_index(r, ks + t + 4)]);
        af[mi][3] = tf32_bits(a[a_index(r + 8, ks + t + 4)]);
      }
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        const int n = wn + ni * 8 + g;
        bf[ni][0] = tf32_bits(b[b_index(ks + t, n)]);
        bf[ni][1] = tf32_bits(b[b_index(ks + t + 4, n)]);
      }
    } else {
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) ldmatrix_x4(af[mi], a + a_index(wm + mi * 16 + (lane & 15), ks + (lane >> 4) * 8));
#pragma unroll
      for (int nj = 0; nj < kNI / 2; ++nj) {
        u32 r[4];
        if constexpr (B_K_MAJOR)
          ldmatrix_x4(r, b + b_index(ks + ((lane >> 3) & 1) * 8, wn + nj * 16 + (lane & 7) + (lane >> 4) * 8));
        else
          ldmatrix_x4_trans(r, b + b_index(ks + (lane & 7) + ((lane >> 3) & 1) * 8, wn + nj * 16 + (lane >> 4) * 8));
        bf[2 * nj][0] = r[0], bf[2 * nj][1] = r[1], bf[2 * nj + 1][0] = r[2], bf[2 * nj + 1][1] = r[3];
      }
    }
  }

  // The MMAs of one K-slice. Fragments are double-buffered: step ks+1's
  // shared-memory loads are issued before step ks's MMAs.
  __device__ __forceinline__ void compute(const T* a, const T* b) {
    u32 af[2][kMI][4], bf[2][kNI][2];
    load_fragments(a, b, 0, af[0], bf[0]);
#pragma unroll
    for (int step = 0; step < BK / kKStep; ++step) {
      if (step + 1 < BK / kKStep) load_fragments(a, b, (step + 1) * kKStep, af[(step + 1) & 1], bf[(step + 1) & 1]);
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) mma<KIND>(acc[mi][ni], af[step & 1][mi], bf[step & 1][ni]);
    }
  }

  // The main loop over k_tiles K-slices of BK. On return every thread's
  // accumulators hold its share of the tile and shared memory is free.
  // load_x(tile, kt) starts K-slice kt (asynchronous copies, or loads into
  // registers); stash_x(tile, kt) runs after the math of the current slice
  // and finishes it (registers -> shared memory), so that global-memory
  // latency of computed operands hides behind the MMAs.
  template <class LoadA, class LoadB, class StashA, class StashB>
  __device__ __forceinline__ void run(T* smem, int k_tiles, LoadA&& load_a, LoadB&& load_b, StashA&& stash_a,
                                      StashB&& stash_b) {
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
    if constexpr (STAGES == 1) {  // one stage, each slice loaded, waited for and multiplied in turn
      for (int kt = 0; kt < k_tiles; ++kt) {
        if (kt > 0) __syncthreads();  // the slice before is no longer read
        load_a(a_tile(smem, 0), kt), load_b(b_tile(smem, 0), kt);
        stash_a(a_tile(smem, 0), kt), stash_b(b_tile(smem, 0), kt);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        compute(a_tile(smem, 0), b_tile(smem, 0));
      }
      __syncthreads();
      return;
    }
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < k_tiles) {
        load_a(a_tile(smem, s), s), load_b(b_tile(smem, s), s);
        stash_a(a_tile(smem, s), s), stash_b(b_tile(smem, s), s);
      }
      cp_async_commit();
    }
    for (int kt = 0; kt < k_tiles; ++kt) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // stage kt is complete; stage kt-1 is no longer read
      const int next = kt + STAGES - 1;
      if (next < k_tiles) load_a(a_tile(smem, next % STAGES), next), load_b(b_tile(smem, next % STAGES), next);
      compute(a_tile(smem, kt % STAGES), b_tile(smem, kt % STAGES));
      if (next < k_tiles) stash_a(a_tile(smem, next % STAGES), next), stash_b(b_tile(smem, next % STAGES), next);
      cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();
  }
};

// Eight consecutive tile elements from f32 values, one or two 16-byte stores.
template <int KIND>
__device__ __forceinline__ void store_chunk8(typename Element<KIND>::type* dst, const float (&v)[8]) {
  if constexpr (KIND == kTf32) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = static_cast<u32>(Element<KIND>::from_float(v[2 * i])) |
             (static_cast<u32>(Element<KIND>::from_float(v[2 * i + 1])) << 16);
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The accumulators of column block `blk` (NJ 8-column groups of every
// row group), copied with static indices only: a loop over blocks that is
// not unrolled still finds them in registers.
template <int NJ, int MI, int NI>
__device__ __forceinline__ void column_block(const float (&acc)[MI][NI][4], int blk, float (&out)[MI][NJ][4]) {
  static_assert(NI % NJ == 0, "whole blocks");
#pragma unroll
  for (int b = 0; b < NI / NJ; ++b)
    if (b == blk) {
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) out[mi][j][e] = acc[mi][b * NJ + j][e];
    }
}

// Tile order: groups of `group` tile rows are walked column by column so that
// blocks running together share A rows and B columns in L2.
__device__ __forceinline__ void swizzled_tile(int linear, int tiles_m, int tiles_n, int group, int& tm, int& tn) {
  const int per_group = group * tiles_n;
  const int first_m = (linear / per_group) * group;
  const int rows = min(tiles_m - first_m, group);
  tm = first_m + (linear % per_group) % rows;
  tn = (linear % per_group) / rows;
}

}  // namespace tc
}  // namespace kiln
