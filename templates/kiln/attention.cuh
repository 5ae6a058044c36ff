// kiln's flash-attention kernel for sm_80 and later: softmax(q k^T + mask) v
// for one (batch, head) and a tile of BQ query rows per block, streaming K
// and V through shared memory in tiles of BKV keys with an online softmax,
// so the score matrix never exists in memory.
//
// Each warp owns 16 query rows. Per key tile: S = Q K^T with mma.sync (Q's
// fragments stay in registers), the codegen hook turns raw dot products
// into scores (scale, mask, causal), the running row maximum and sum are
// updated and the accumulated output rescaled, then O += P V with P taken
// straight from S's registers. K and V tiles are double-buffered with
// cp.async (element loads when a pointer is not 16-byte aligned).
//
// Numerics (graph-format.md rule 6): scores, maxima and sums in f32; the
// probabilities are rounded to V's type before they multiply V, as every
// flash-attention kernel does (before the final division by the row sum).
// A row whose keys are all masked has sum 0 and gives zeros.
//
// WHOLE_ROWS: every row's keys lie in the one key tile (skv <= BKV, which
// may then be any multiple of 16: K and V get one buffer each), and
// each probability is formed whole, exp(s - max) / sum, then rounded to V's
// type, as a softmax op forms it: the form of a written-out attention whose
// graph rounds its scores and probabilities (compiler/attention_rewrite.h).
#pragma once

#include "kiln/mma.cuh"

namespace kiln {
namespace tc {

__device__ __forceinline__ u32 pack2(float lo, float hi, bool bf16) {
  const u16 a = bf16 ? f32_to_bf16(lo) : f32_to_f16(lo), b = bf16 ? f32_to_bf16(hi) : f32_to_f16(hi);
  return static_cast<u32>(a) | (static_cast<u32>(b) << 16);
}

// A row's value over the four threads of a quad that hold it (the MMA
// accumulator layout: lanes 4r .. 4r + 3 share rows).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
// An accumulated output over its row's sum; 0 for a row whose keys were all masked (sum 0).
__device__ __forceinline__ float normalised(float o, float row_sum) { return row_sum > 0.0f ? o / row_sum : 0.0f; }

// Rows [row0, row0 + ROWS) of a [rows][D] matrix (row stride `stride`
// elements, D contiguous) into a padded shared tile; rows >= `rows` are
// zero.
template <int ROWS, int D, int STRIDE, int THREADS>
__device__ __forceinline__ void load_rows(u16* tile, const u16* base, i64 stride, int row0, int rows, bool aligned) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < ROWS * kChunks; c += THREADS) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = row0 + r < rows;
    const u16* src = base + (valid ? (row0 + r) * stride + col : 0);
    if (aligned) {
      cp_async16(tile + r * STRIDE + col, src, valid);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) tile[r * STRIDE + col + e] = valid ? src[e] : u16(0);
    }
  }
}

template <int D, int BQ, int BKV, int KIND, bool WHOLE_ROWS = false>
struct FlashAttention {
  static_assert(KIND == kBf16 || KIND == kF16, "16-bit operands");
  static_assert(D % 16 == 0 && BKV % 16 == 0 && BQ % 16 == 0, "tile shape");
  static constexpr int kThreads = BQ / 16 * 32;
  static constexpr int kStride = D + 8;  // padded rows: conflict-free ldmatrix
  static constexpr int kKvTile = BKV * kStride;
  // K and V double-buffered; a whole row's one tile each (WHOLE_ROWS).
  static constexpr int kBuffers = WHOLE_ROWS ? 1 : 2;
  static constexpr int kSharedBytes = (BQ * kStride + 2 * kBuffers * kKvTile) * 2;  // Q, K, V
  static constexpr int kDN = D / 8, kSN = BKV / 8;

  float o[kDN][4];       // output accumulators: rows (lane/4, +8), columns d
  float row_max[2], row_sum[2];

  // Row in the query tile of accumulator element e (0..3), and column.
  static __device__ __forceinline__ int acc_row(int e) { return (threadIdx.x >> 5) * 16 + ((threadIdx.x & 31) >> 2) + (e >> 1) * 8; }
  static __device__ __forceinline__ int acc_col(int dn, int e) { return dn * 8 + (threadIdx.x & 3) * 2 + (e & 1); }

  // q: the (batch, head)'s first query row; k, v: its kv head's first key.
  // score(dot, row, key) -> the score of query row `row` of this tile and
  // key `key` (or -inf), called only for key < skv and q0 + row < sq. kv_tiles: key tiles to visit
  // (fewer than ceil(skv / BKV) when a causal mask hides the rest).
  template <class Score>
  __device__ __forceinline__ void run(u16* smem, const u16* q, i64 q_stride, int q0, int sq, const u16* k, i64 k_stride,
                                      const u16* v, i64 v_stride, int skv, int kv_tiles, bool aligned, Score&& score) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u16* qs = smem;
    // Buffers by parity (arithmetic, not an array: arrays indexed at run time live in local memory).
    auto ks = [&](int parity) { return smem + BQ * kStride + parity * kKvTile; };
    auto vs = [&](int parity) { return smem + BQ * kStride + (kBuffers + parity) * kKvTile; };
    load_rows<BQ, D, kStride, kThreads>(qs, q, q_stride, q0, sq, aligned);
    if (kv_tiles > 0) {
      load_rows<BKV, D, kStride, kThreads>(ks(0), k, k_stride, 0, skv, aligned);
      load_rows<BKV, D, kStride, kThreads>(vs(0), v, v_stride, 0, skv, aligned);
    }
    cp_async_commit();
#pragma unroll
    for (int dn = 0; dn < kDN; ++dn)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dn][e] = 0.0f;
    row_max[0] = row_max[1] = -inf();
    row_sum[0] = row_sum[1] = 0.0f;
    u32 qf[D / 16][4];
    constexpr float kLog2e = 1.4426950408889634f;

    for (int t = 0; t < kv_tiles; ++t) {
      cp_async_wait<0>();
      __syncthreads();  // tile t is in; tile t-1's buffers are free
      if (t == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          ldmatrix_x4(qf[kk], qs + (warp * 16 + (lane & 15)) * kStride + kk * 16 + (lane >> 4) * 8);
      }
      if (t + 1 < kv_tiles) {
        load_rows<BKV, D, kStride, kThreads>(ks((t + 1) & 1), k, k_stride, (t + 1) * BKV, skv, aligned);
        load_rows<BKV, D, kStride, kThreads>(vs((t + 1) & 1), v, v_stride, (t + 1) * BKV, skv, aligned);
      }
      cp_async_commit();
      const u16* kt = ks(t & 1);
      const u16* vt = vs(t & 1);

      // S = Q K^T (K's tile is [key][d]: the B operand with k = d contiguous).
      float s[kSN][4];
#pragma unroll
      for (int ni = 0; ni < kSN; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[ni][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int nj = 0; nj < kSN / 2; ++nj) {
          u32 r[4];
          ldmatrix_x4(r, kt + (nj * 16 + (lane & 7) + (lane >> 4) * 8) * kStride + kk * 16 + ((lane >> 3) & 1) * 8);
          const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
          mma<KIND>(s[2 * nj], qf[kk], b0);
          mma<KIND>(s[2 * nj + 1], qf[kk], b1);
        }

      // Scores, then the online softmax for this thread's two rows.
#pragma unroll
      for (int ni = 0; ni < kSN; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = t * BKV + ni * 8 + (lane & 3) * 2 + (e & 1);
          // The hook reads in bounds without a branch (attention_wgmma.cuh's scores says why): rows past
          // the queries (never stored) ask for the last query row, keys past skv for the last key.
          const float value = score(s[ni][e], min(acc_row(e), sq - 1 - q0), min(key, skv - 1));
          s[ni][e] = key < skv ? value : -inf();
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (WHOLE_ROWS) {  // the whole row is in this tile (kv_tiles is 1)
          float mx = -inf();
#pragma unroll
          for (int ni = 0; ni < kSN; ++ni) mx = fmaxf(mx, fmaxf(s[ni][2 * h], s[ni][2 * h + 1]));
          mx = quad_max(mx);
          const float m_use = mx == -inf() ? 0.0f : mx;
          float sum = 0.0f;
#pragma unroll
          for (int ni = 0; ni < kSN; ++ni) {
            s[ni][2 * h] = exp2f((s[ni][2 * h] - m_use) * kLog2e);
            s[ni][2 * h + 1] = exp2f((s[ni][2 * h + 1] - m_use) * kLog2e);
            sum += s[ni][2 * h] + s[ni][2 * h + 1];
          }
          sum = quad_sum(sum);
          // out() divides by 1 (0 for a row whose keys are all masked).
          row_sum[h] = sum > 0.0f ? 1.0f : 0.0f;
#pragma unroll
          for (int ni = 0; ni < kSN; ++ni) {
            s[ni][2 * h] = sum > 0.0f ? s[ni][2 * h] / sum : 0.0f;
            s[ni][2 * h + 1] = sum > 0.0f ? s[ni][2 * h + 1] / sum : 0.0f;
          }
          continue;
        }
        float mx = -inf();
#pragma unroll
        for (int ni = 0; ni < kSN; ++ni) mx = fmaxf(mx, fmaxf(s[ni][2 * h], s[ni][2 * h + 1]));
        mx = quad_max(mx);
        const float m_new = fmaxf(row_max[h], mx);
        const float m_use = m_new == -inf() ? 0.0f : m_new;  // nothing seen yet: keep exp finite
        const float correction = exp2f((row_max[h] - m_use) * kLog2e);
        row_max[h] = m_new;
        row_sum[h] *= correction;
#pragma unroll
        for (int dn = 0; dn < kDN; ++dn) o[dn][2 * h] *= correction, o[dn][2 * h + 1] *= correction;
#pragma unroll
        for (int ni = 0; ni < kSN; ++ni) {
          s[ni][2 * h] = exp2f((s[ni][2 * h] - m_use) * kLog2e);
          s[ni][2 * h + 1] = exp2f((s[ni][2 * h + 1] - m_use) * kLog2e);
          row_sum[h] += s[ni][2 * h] + s[ni][2 * h + 1];
        }
      }

      // O += P V (V's tile is [key][d]: the B operand with n = d contiguous).
#pragma unroll
      for (int kk = 0; kk < BKV / 16; ++kk) {
        const bool bf = KIND == kBf16;
        const u32 a[4] = {pack2(s[2 * kk][0], s[2 * kk][1], bf), pack2(s[2 * kk][2], s[2 * kk][3], bf),
                          pack2(s[2 * kk + 1][0], s[2 * kk + 1][1], bf), pack2(s[2 * kk + 1][2], s[2 * kk + 1][3], bf)};
#pragma unroll
        for (int dj = 0; dj < kDN / 2; ++dj) {
          u32 r[4];
          ldmatrix_x4_trans(r, vt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + dj * 16 + (lane >> 4) * 8);
          const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
          mma<KIND>(o[2 * dj], a, b0);
          mma<KIND>(o[2 * dj + 1], a, b1);
        }
      }
    }
    cp_async_wait<0>();
    if constexpr (!WHOLE_ROWS) row_sum[0] = quad_sum(row_sum[0]), row_sum[1] = quad_sum(row_sum[1]);
  }

  // The normalised output element e of column tile dn (0 for an all-masked row).
  __device__ __forceinline__ float out(int dn, int e) const { return normalised(o[dn][e], row_sum[e >> 1]); }
};

}  // namespace tc
}  // namespace kiln
