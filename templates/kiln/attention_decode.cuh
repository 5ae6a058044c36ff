// kiln's flash-decoding kernel: few query rows against many keys (an LLM's
// decode step: Sq of 1 to a few, Skv in the thousands), where the tensor
// cores' 64-row tiles would compute on empty rows and the work is reading
// K and V.
//
// A block takes one (batch, kv head) and one chunk of CHUNK keys; its
// ROWS query rows are every query of every head that shares the kv head
// (grouped-query heads read K and V once). K's tiles, then V's, stream
// through a STAGES-deep ring in shared memory (cp.async, 16 bytes a
// thread, issued STAGES - 1 tiles ahead), so that each block keeps a few
// tiles in flight and the whole grid never asks for more than L2 holds:
//   scores   kLanes lanes a key, each dotting its interleaved 16-byte
//            pieces of the key with every query row (shared memory, f32),
//            a shuffle tree over the lanes, the codegen hook (scale, mask,
//            causal);
//   softmax  per row over the chunk: maximum, exponentials (rounded to V's
//            type, rule 6), sum (while V's first tiles arrive);
//   P V      threads over (key group, four columns): ROWS x 4 accumulators
//            each over the keys group, group + kGroups, ... in order; the
//            key groups' sums added in a fixed order (reruns are bitwise
//            identical).
// With more than one chunk, each block leaves its unnormalised output and
// its rows' maximum and sum in a workspace; the last block of a (batch, kv
// head) to finish (a counter) merges every chunk's, in chunk order.
#pragma once

#include "kiln/attention.cuh"

namespace kiln {
namespace decode {

// Lanes that share a key in the scores: as many as leave each lane whole
// 16-byte pieces, at least 16 elements (D = 128: 8 lanes of 16).
__host__ __device__ constexpr int lanes_per_key(int d) {
  int lanes = 32;
  while (lanes > 1 && (d % lanes != 0 || (d / lanes) % 8 != 0 || d / lanes < 16)) lanes /= 2;
  return lanes;
}

template <int D, int ROWS, int CHUNK, int BF16>
struct DecodeAttention {
  static constexpr int kThreads = 256, kStages = 3;
  static constexpr int kQuads = D / 4, kGroups = kThreads / kQuads;  // P V: four columns x key groups
  static constexpr int kLanes = lanes_per_key(D), kSpan = D / kLanes;  // scores: lanes a key, elements a lane
  // Keys a ring slot: the block's passes (kThreads / kLanes keys each) that fill at most 16 KiB, at least one.
  static constexpr int kPassKeys = kThreads / kLanes;
  static constexpr int kPasses = 16384 / (kPassKeys * D * 2) > 1 ? 16384 / (kPassKeys * D * 2) : 1;
  static constexpr int kTile = kPasses * kPassKeys, kTiles = CHUNK / kTile;
  static_assert(D % 8 == 0 && D <= 256 && ROWS >= 1 && ROWS <= 16 && CHUNK % kThreads == 0 && CHUNK % kTile == 0,
                "decode shape");
  // Shared memory: the ring [kStages][kTile][D] (16-bit), which the key groups' sums [kGroups][ROWS][D] take
  // over once V has been read; then q [ROWS][D], p [CHUNK][ROWS], m and l [ROWS] (f32).
  static constexpr int kRingFloats = kStages * kTile * D / 2, kSumFloats = kGroups * ROWS * D;
  static constexpr int kFirstFloats = kRingFloats > kSumFloats ? kRingFloats : kSumFloats;
  static constexpr int kSharedBytes = (kFirstFloats + ROWS * D + ROWS * CHUNK + 2 * ROWS) * 4;

  u16* ring;
  float* q_s;
  float* p_s;
  float* o_s;  // the key groups' sums; group 0's holds the block's output
  float* m_s;
  float* l_s;

  __device__ __forceinline__ explicit DecodeAttention(float* smem)
      : ring(reinterpret_cast<u16*>(smem)), q_s(smem + kFirstFloats), p_s(q_s + ROWS * D), o_s(smem),
        m_s(p_s + ROWS * CHUNK), l_s(m_s + ROWS) {}

  static __device__ __forceinline__ float element(const u16* p, int i) {
    return BF16 ? bf16_to_f32(p[i]) : f16_to_f32(p[i]);
  }
  // Eight consecutive values of a ring slot (16 bytes, aligned whatever the source was).
  static __device__ __forceinline__ void load8(const u16* p, float (&v)[8]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const u16 lo = static_cast<u16>(words[i] & 0xffffu), hi = static_cast<u16>(words[i] >> 16);
      v[2 * i] = element(&lo, 0), v[2 * i + 1] = element(&hi, 0);
    }
  }

  // Tile t of the stream (K's tiles 0 .. kTiles - 1, then V's) into its
  // ring slot: rows of keys past the chunk's last are not loaded (never
  // read); unaligned rows element by element.
  __device__ __forceinline__ void load_tile(int t, const u16* k, i64 k_stride, const u16* v, i64 v_stride, int key0, int keys,
                                            bool aligned) {
    if (t >= 2 * kTiles) return;
    const bool is_k = t < kTiles;
    const int first = (is_k ? t : t - kTiles) * kTile;
    const u16* base = is_k ? k : v;
    const i64 stride = is_k ? k_stride : v_stride;
    u16* slot = ring + (t % kStages) * kTile * D;
    const u16* tile = base + static_cast<i64>(key0 + first) * stride;
    if (aligned) {  // (a test per block, outside the copies)
      for (int c = threadIdx.x; c < kTile * D / 8; c += kThreads) {
        const int row = c / (D / 8), col = (c % (D / 8)) * 8;
        if (first + row < keys) tc::cp_async16(slot + row * D + col, tile + row * stride + col, true);
      }
    } else {
      for (int c = threadIdx.x; c < kTile * D / 8; c += kThreads) {
        const int row = c / (D / 8), col = (c % (D / 8)) * 8;
        if (first + row >= keys) continue;
#pragma unroll
        for (int e = 0; e < 8; ++e) slot[row * D + col + e] = tile[row * stride + col + e];
      }
    }
  }

  // q(r): row r's first element; k, v: the kv head's first key, rows
  // `k_stride` / `v_stride` apart; keys [key0, key0 + CHUNK) of skv.
  // score(dot, r, key) -> the score (or -inf).
  template <class QRow, class Score>
  __device__ __forceinline__ void run(QRow&& q, const u16* k, i64 k_stride, const u16* v, i64 v_stride, int key0, int skv,
                                      bool aligned, Score&& score) {
    // K's and V's first keys as values the compiler keeps: seen through, it folds their offsets' products
    // (a symbolic graph's: skv times the head's index) into every copy's address.
    asm("" : "+l"(k));
    asm("" : "+l"(v));
    const int keys = min(CHUNK, skv - key0);
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
      load_tile(t, k, k_stride, v, v_stride, key0, keys, aligned);
      tc::cp_async_commit();
    }
    // Tile t has landed for every thread, and the slot tile t + kStages - 1 takes was last read at t - 1.
    auto next_tile = [&](int t) {
      tc::cp_async_wait<kStages - 2>();
      __syncthreads();
      load_tile(t + kStages - 1, k, k_stride, v, v_stride, key0, keys, aligned);
      tc::cp_async_commit();
    };
    // Scores: key kk of each tile to lanes part = 0 .. kLanes - 1 of a warp.
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int part = lane % kLanes, kk = warp * (32 / kLanes) + lane / kLanes;
    // A lane's pieces of the query rows stay in registers where they fit (shared memory's reads bound the
    // scores otherwise: ncu, B8 H32/8 Skv8192, L1 76% busy).
    // Two 16-bit values a register, as stored (exact).
    constexpr bool kQInRegisters = ROWS * kSpan <= 64;
    u32 q_reg[kQInRegisters ? ROWS : 1][kQInRegisters ? kSpan / 2 : 1];
    if constexpr (kQInRegisters) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int i = 0; i < kSpan / 8; ++i)
#pragma unroll
          for (int e = 0; e < 8; e += 2) {
            const u16* row = q(r) + (part + kLanes * i) * 8 + e;
            q_reg[r][(8 * i + e) / 2] = static_cast<u32>(row[0]) | (static_cast<u32>(row[1]) << 16);
          }
    } else {  // read after tile 0's barrier in next_tile
      for (int i = threadIdx.x; i < ROWS * D; i += kThreads) q_s[i] = element(q(i / D), i % D);
    }
    for (int t = 0; t < kTiles; ++t) {
      next_tile(t);
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int key_in_tile = pass * kPassKeys + kk;
        const u16* key_row = ring + (t % kStages) * kTile * D + key_in_tile * D;
        float dot[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) dot[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < kSpan / 8; ++i) {
          const int c = (part + kLanes * i) * 8;  // interleaved pieces: a key's lanes read 16 * kLanes bytes in a row
          float kv[8];
          load8(key_row + c, kv);
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            if constexpr (kQInRegisters) {
#pragma unroll
              for (int e = 0; e < 8; e += 2) {
                const u32 pair = q_reg[r][(8 * i + e) / 2];
                const u16 lo = static_cast<u16>(pair & 0xffffu), hi = static_cast<u16>(pair >> 16);
                dot[r] = fmaf(element(&lo, 0), kv[e], dot[r]);
                dot[r] = fmaf(element(&hi, 0), kv[e + 1], dot[r]);
              }
            } else {
              const float4 q0 = *reinterpret_cast<const float4*>(q_s + r * D + c);
              const float4 q1 = *reinterpret_cast<const float4*>(q_s + r * D + c + 4);
              dot[r] = fmaf(q0.x, kv[0], dot[r]), dot[r] = fmaf(q0.y, kv[1], dot[r]);
              dot[r] = fmaf(q0.z, kv[2], dot[r]), dot[r] = fmaf(q0.w, kv[3], dot[r]);
              dot[r] = fmaf(q1.x, kv[4], dot[r]), dot[r] = fmaf(q1.y, kv[5], dot[r]);
              dot[r] = fmaf(q1.z, kv[6], dot[r]), dot[r] = fmaf(q1.w, kv[7], dot[r]);
            }
          }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
          for (int o = kLanes / 2; o > 0; o >>= 1) dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], o);
        const int jj = t * kTile + key_in_tile, key = key0 + jj;
        if (part == 0) {
          // Every row's score under one test of the key, before any is stored: the hook's loads of the
          // key (a mask every row shares) are then one load and one address.
          float s[ROWS];
          if (jj < keys) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) s[r] = score(dot[r], r, key);
          } else {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) s[r] = -inf();
          }
#pragma unroll
          for (int r = 0; r < ROWS; ++r) p_s[jj * ROWS + r] = s[r];
        }
      }
    }
    __syncthreads();
    // Softmax per row over the chunk: warp w takes rows w, w + 8, ...
    for (int r = warp; r < ROWS; r += kThreads / 32) {
      float mx = -inf();
      for (int jj = lane; jj < CHUNK; jj += 32) mx = fmaxf(mx, p_s[jj * ROWS + r]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_use = mx == -inf() ? 0.0f : mx;  // nothing seen: keep exp finite
      float sum = 0.0f;
      for (int jj = lane; jj < CHUNK; jj += 32) {
        const float e = expf(p_s[jj * ROWS + r] - m_use);
        sum += e;
        p_s[jj * ROWS + r] = BF16 ? round_bf16(e) : round_f16(e);  // rounded to V's type
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) m_s[r] = mx, l_s[r] = sum;
    }
    // P V: thread (group, quad) sums keys group, group + kGroups, ... for columns 4 quad .. 4 quad + 3.
    const int quad = threadIdx.x % kQuads, group = threadIdx.x / kQuads;
    float acc[ROWS][4];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.0f;
    for (int t = kTiles; t < 2 * kTiles; ++t) {
      next_tile(t);  // (its barrier also ends the softmax)
      const int first = (t - kTiles) * kTile;
      const u16* tile = ring + (t % kStages) * kTile * D + 4 * quad;
      const int last = group < kGroups ? min(kTile, keys - first) : 0;  // threads past the last group idle
      for (int j = group; j < last; j += kGroups) {
        const uint2 raw = *reinterpret_cast<const uint2*>(tile + j * D);
        const u16 w[4] = {static_cast<u16>(raw.x & 0xffffu), static_cast<u16>(raw.x >> 16), static_cast<u16>(raw.y & 0xffffu),
                          static_cast<u16>(raw.y >> 16)};
        const float* p = p_s + (first + j) * ROWS;  // the key's probabilities of every row, side by side
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(p[r], element(w, c), acc[r][c]);
      }
    }
    __syncthreads();  // the ring's last tile read: the sums take its place
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
      for (const float* part = all; part < all + chunks * kChunkWords; part += kChunkWords)
        m = fmaxf(m, __ldcg(part + ROWS * D + r));
      m_s[r] = m;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ROWS * D; i += kThreads) {
      const int r = i / D;
      const float m_use = m_s[r] == -inf() ? 0.0f : m_s[r];
      float o = 0.0f;
      for (const float* part = all; part < all + chunks * kChunkWords; part += kChunkWords)
        o += __ldcg(part + i) * expf(__ldcg(part + ROWS * D + r) - m_use);
      o_s[i] = o;
    }
    if (threadIdx.x < ROWS) {
      const int r = threadIdx.x;
      const float m_use = m_s[r] == -inf() ? 0.0f : m_s[r];
      float l = 0.0f;
      for (const float* part = all; part < all + chunks * kChunkWords; part += kChunkWords)
        l += __ldcg(part + ROWS * D + ROWS + r) * expf(__ldcg(part + ROWS * D + r) - m_use);
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
