// kiln's flash-decoding kernel: few query rows against many keys (an LLM's
// decode step: Sq of 1 to a few, Skv in the thousands), where the tensor
// cores' 64-row tiles would compute on empty rows and the work is reading
// K and V.
//
// A block takes one (batch, kv head) and one chunk of CHUNK keys; its
// ROWS query rows are every query of every head that shares the kv head
// (grouped-query heads read K and V once). In three steps, on CUDA cores:
//   prefetch every line of the chunk's K and V rows into L2 first (V's
//            reads then wait for L2, not for memory, after the softmax);
//   scores   a thread per key: its K row in 16-byte loads, a dot product
//            with each query row (held in shared memory as f32), the codegen
//            hook (scale, mask, causal);
//   softmax  per row over the chunk: maximum, exponentials (rounded to V's
//            type, rule 6), sum;
//   P V      threads over (key group, four columns): V's rows read
//            coalesced, ROWS x 4 accumulators each; the key groups' sums
//            added in a fixed order (reruns are bitwise identical).
// With more than one chunk, each block leaves its unnormalised output and
// its rows' maximum and sum in a workspace; the last block of a (batch, kv
// head) to finish (a counter) merges every chunk's, in chunk order.
#pragma once

#include "kiln/attention.cuh"

namespace kiln {
namespace decode {

template <int D, int ROWS, int CHUNK, int BF16>
struct DecodeAttention {
  static constexpr int kThreads = 256;
  static constexpr int kQuads = D / 4, kGroups = kThreads / kQuads;  // P V: four columns x key groups
  static_assert(D % 8 == 0 && D <= 256 && ROWS >= 1 && ROWS <= 16 && CHUNK % kThreads == 0, "decode shape");
  // Shared memory: q [ROWS][D], p [ROWS][CHUNK], the key groups' sums [kGroups][ROWS][D], m and l [ROWS].
  static constexpr int kSharedBytes = (ROWS * D + ROWS * CHUNK + kGroups * ROWS * D + 2 * ROWS) * 4;

  float* q_s;
  float* p_s;
  float* o_s;  // the key groups' sums; group 0's holds the block's output
  float* m_s;
  float* l_s;

  __device__ __forceinline__ explicit DecodeAttention(float* smem)
      : q_s(smem), p_s(smem + ROWS * D), o_s(p_s + ROWS * CHUNK), m_s(o_s + kGroups * ROWS * D), l_s(m_s + ROWS) {}

  static __device__ __forceinline__ float element(const u16* p, int i) {
    return BF16 ? bf16_to_f32(p[i]) : f16_to_f32(p[i]);
  }
  // Eight consecutive values (16 bytes when aligned).
  static __device__ __forceinline__ void load8(const u16* p, bool aligned, float (&v)[8]) {
    if (aligned) {
      const uint4 raw = *reinterpret_cast<const uint4*>(p);
      const u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const u16 lo = static_cast<u16>(words[i] & 0xffffu), hi = static_cast<u16>(words[i] >> 16);
        v[2 * i] = element(&lo, 0), v[2 * i + 1] = element(&hi, 0);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = element(p, i);
    }
  }

  // q(r): row r's first element; k, v: the kv head's first key, rows
  // `k_stride` / `v_stride` apart; keys [key0, key0 + CHUNK) of skv.
  // score(dot, r, key) -> the score (or -inf).
  template <class QRow, class Score>
  __device__ __forceinline__ void run(QRow&& q, const u16* k, i64 k_stride, const u16* v, i64 v_stride, int key0, int skv,
                                      bool aligned, Score&& score) {
    const int keys = min(CHUNK, skv - key0);
    constexpr int kLines = (D * 2 + 127) / 128;  // 128-byte lines of a row
    for (int i = threadIdx.x; i < 2 * keys * kLines; i += kThreads) {
      const int key = i / kLines % keys, line = i % kLines;
      const u16* row = i < keys * kLines ? k + static_cast<i64>(key0 + key) * k_stride : v + static_cast<i64>(key0 + key) * v_stride;
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + line * 64));
    }
    for (int i = threadIdx.x; i < ROWS * D; i += kThreads) q_s[i] = element(q(i / D), i % D);
    __syncthreads();
    // Scores: a thread per key.
    for (int jj = threadIdx.x; jj < CHUNK; jj += kThreads) {
      const int key = key0 + jj;
      float dot[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) dot[r] = 0.0f;
      if (key < skv) {
        const u16* row = k + static_cast<i64>(key) * k_stride;
#pragma unroll 4
        for (int c = 0; c < D; c += 8) {
          float kv[8];
          load8(row + c, aligned, kv);
#pragma unroll
          for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) dot[r] = fmaf(q_s[r * D + c + e], kv[e], dot[r]);
        }
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r) p_s[r * CHUNK + jj] = key < skv ? score(dot[r], r, key) : -inf();
    }
    __syncthreads();
    // Softmax per row over the chunk: warp w takes rows w, w + 8, ...
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = warp; r < ROWS; r += kThreads / 32) {
      float mx = -inf();
      for (int jj = lane; jj < CHUNK; jj += 32) mx = fmaxf(mx, p_s[r * CHUNK + jj]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_use = mx == -inf() ? 0.0f : mx;  // nothing seen: keep exp finite
      float sum = 0.0f;
      for (int jj = lane; jj < CHUNK; jj += 32) {
        const float e = expf(p_s[r * CHUNK + jj] - m_use);
        sum += e;
        p_s[r * CHUNK + jj] = BF16 ? round_bf16(e) : round_f16(e);  // rounded to V's type
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) m_s[r] = mx, l_s[r] = sum;
    }
    __syncthreads();
    // P V: thread (group, quad) sums keys group, group + kGroups, ... for columns 4 quad .. 4 quad + 3.
    const int quad = threadIdx.x % kQuads, group = threadIdx.x / kQuads;
    float acc[ROWS][4];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.0f;
    const int my_keys = group < kGroups ? keys : 0;  // threads past the last group idle
#pragma unroll 4
    for (int jj = group; jj < my_keys; jj += kGroups) {
      const u16* row = v + static_cast<i64>(key0 + jj) * v_stride + 4 * quad;
      float vv[4];
      if (aligned) {
        const uint2 raw = *reinterpret_cast<const uint2*>(row);
        const u16 w[4] = {static_cast<u16>(raw.x & 0xffffu), static_cast<u16>(raw.x >> 16), static_cast<u16>(raw.y & 0xffffu),
                          static_cast<u16>(raw.y >> 16)};
#pragma unroll
        for (int c = 0; c < 4; ++c) vv[c] = element(w, c);
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c) vv[c] = element(row, c);
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const float p = p_s[r * CHUNK + jj];
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(p, vv[c], acc[r][c]);
      }
    }
    if (group < kGroups)
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) o_s[(group * ROWS + r) * D + 4 * quad + c] = acc[r][c];
    __syncthreads();
    for (int i = threadIdx.x; i < ROWS * D; i += kThreads) {
      float sum = o_s[i];
#pragma unroll
      for (int g = 1; g < kGroups; ++g) sum += o_s[g * ROWS * D + i];
      o_s[i] = sum;
    }
    __syncthreads();
  }

  // This block's chunk into partials (ROWS x D outputs, then the rows'
  // maxima and sums, per chunk); true in the last block of the (batch, kv
  // head) to finish, which then holds the merge of every chunk in o_s,
  // m_s and l_s.
  __device__ __forceinline__ bool merge_chunks(float* partials, unsigned int* arrived, i64 unit, int chunk, int chunks) {
    constexpr int kChunkWords = ROWS * D + 2 * ROWS;
    float* mine = partials + (unit * chunks + chunk) * kChunkWords;
    for (int i = threadIdx.x; i < ROWS * D; i += kThreads) mine[i] = o_s[i];
    for (int r = threadIdx.x; r < ROWS; r += kThreads) mine[ROWS * D + r] = m_s[r], mine[ROWS * D + ROWS + r] = l_s[r];
    __threadfence();
    __syncthreads();
    __shared__ bool last;
    if (threadIdx.x == 0) last = atomicAdd(arrived + unit, 1u) == static_cast<unsigned int>(chunks - 1);
    __syncthreads();
    if (!last) return false;
    __threadfence();
    const float* all = partials + unit * chunks * kChunkWords;
    if (threadIdx.x < ROWS) {
      const int r = threadIdx.x;
      float m = -inf();
      for (int c = 0; c < chunks; ++c) m = fmaxf(m, __ldcg(all + c * kChunkWords + ROWS * D + r));
      m_s[r] = m;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ROWS * D; i += kThreads) {
      const int r = i / D;
      const float m_use = m_s[r] == -inf() ? 0.0f : m_s[r];
      float o = 0.0f;
      for (int c = 0; c < chunks; ++c) {
        const float* part = all + c * kChunkWords;
        o += __ldcg(part + i) * expf(__ldcg(part + ROWS * D + r) - m_use);
      }
      o_s[i] = o;
    }
    if (threadIdx.x < ROWS) {
      const int r = threadIdx.x;
      const float m_use = m_s[r] == -inf() ? 0.0f : m_s[r];
      float l = 0.0f;
      for (int c = 0; c < chunks; ++c) l += __ldcg(all + c * kChunkWords + ROWS * D + ROWS + r) * expf(__ldcg(all + c * kChunkWords + ROWS * D + r) - m_use);
      l_s[r] = l;
    }
    __syncthreads();
    return true;
  }

  // The normalised output of row r, column d (0 for a row that saw no key).
  __device__ __forceinline__ float out(int r, int d) const { return tc::normalised(o_s[r * D + d], l_s[r]); }
};

}  // namespace decode
}  // namespace kiln
