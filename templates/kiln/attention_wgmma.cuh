// kiln's flash-attention kernel for Hopper (sm_90a): softmax(q k^T + mask) v
// for one (batch, head) and a tile of 128 query rows at a time, on the
// pieces of the Hopper GEMM (wgmma.cuh): the copy engine, an mbarrier ring,
// wgmma, register reallocation between warpgroups. Blocks loop over query
// tiles (the generated kernel's loop: persistent without a causal mask, a
// block per tile under one); the ring and the barriers' phases carry over.
//
// Warpgroup 0 produces: each tile's Q once the consumers are done with the
// last one's (q_empty), then K and V tiles of BKV keys into a STAGES-deep
// ring, K and V on barriers of their own (S = Q K^T starts before V has
// landed). The copies are bulk tensor copies of 4-d maps
// (d, row, head, batch), or, where a pointer is not 16-byte aligned,
// element loads by all 128 producer threads into the same layout.
// Warpgroups 1 and 2 consume, 64 query rows each: per key tile
//   S = Q K^T          wgmma, Q and K from shared memory (K-major),
//   scores             the codegen hook (scale, mask) and, on tiles that
//                      need it, bounds and the causal diagonal,
//   online softmax     row maxima by quad shuffles, ex2.approx, the
//                      running sums; O rescaled when the maximum moves,
//   O += P V           wgmma with P from registers (S's accumulator layout
//                      is the A fragment's), V from shared memory (N-major).
// Each tile's S = Q K^T is issued with the previous tile's P V, and the
// softmax runs while P V is on the tensor cores (FlashAttention-3's
// intra-warpgroup overlap; examples/attention/sdpa_softmax_under_pv.test
// checks it in SASS); the two consumer warpgroups take turns to issue
// (ping-pong), so one's softmax overlaps the other's multiplications.
//
// Head dimensions are padded to 64, 128 or 256 (the 128-byte swizzle holds
// 64 columns): the copy engine fills columns past the head dimension with
// zeros, which add nothing to Q K^T, and the padded output columns are
// never written.
//
// Numerics (graph-format.md rule 6): scores, maxima and sums in f32; the
// probabilities rounded to V's type before they multiply V, as in every
// flash-attention kernel (before O is normalised at the end: times the
// row's 1 / sum, within an f32 rounding of the division). A row whose keys
// are all masked has sum 0 and gives zeros.
#pragma once

#include "kiln/attention.cuh"
#include "kiln/wgmma.cuh"

namespace kiln {
namespace wg {

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Where one operand's rows lie for this block: a 4-d map (d, row, head,
// batch) and those coordinates, or (element loads) the first row's address
// and the row stride; `rows` of them exist.
struct AttentionSource {
  const TensorMap* map;
  const u16* base;
  i64 row_stride;
  int head, batch, rows;
};

template <int HEAD_DIM, int BKV, int STAGES, int KIND, bool CAUSAL>
struct FlashAttention {
  static constexpr int kBQ = 128, kThreads = 384;
  static constexpr int kD = HEAD_DIM <= 64 ? 64 : HEAD_DIM <= 128 ? 128 : 256;  // padded
  static constexpr int kBlocks = kD / 64;                                         // 64-column swizzle blocks
  static constexpr int kQBytes = kBQ * kD * 2, kKvBytes = BKV * kD * 2;
  static constexpr int kBarriers = 2 + 4 * STAGES;  // q_full, q_empty; k_full, v_full, k_empty, v_empty per stage
  static constexpr int kSharedBytes = 1024 + kQBytes + 2 * STAGES * kKvBytes + kBarriers * 8;
  static constexpr int kDN = kD / 8;
  static constexpr int kConsumerWarps = 8;
  typedef Ring<STAGES> Slots;  // where the next K and V tiles go (the producer) or come from (the consumers)
  static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM <= 256 && (BKV == 64 || BKV == 80 || BKV == 128 || BKV == 176) && STAGES >= 2, "tile shape");

  float o[kDN][4];  // output accumulators: rows (lane/4, +8) of the warp's 16, columns d
  float row_max[2], row_sum[2];  // row maxima of the hook's scores (before exponent_scale)
  float inverse_sum[2];          // 1 / row_sum once a tile is done
  float exponent_scale;          // log2(e) times the scale the hook left to the softmax

  // ---- shared memory: Q [blocks][128][64], K and V [stage][blocks][BKV][64], barriers ----
  static __device__ __forceinline__ unsigned char* base(unsigned char* raw) {
    return raw + ((1024 - (shared_address(raw) & 1023)) & 1023);
  }
  static __device__ __forceinline__ u16* q_tile(unsigned char* s) { return reinterpret_cast<u16*>(s); }
  static __device__ __forceinline__ u16* k_tile(unsigned char* s, int stage) {
    return reinterpret_cast<u16*>(s + kQBytes + stage * kKvBytes);
  }
  static __device__ __forceinline__ u16* v_tile(unsigned char* s, int stage) {
    return reinterpret_cast<u16*>(s + kQBytes + (STAGES + stage) * kKvBytes);
  }
  static __device__ __forceinline__ u64* q_full(unsigned char* s) {
    return reinterpret_cast<u64*>(s + kQBytes + 2 * STAGES * kKvBytes);
  }
  static __device__ __forceinline__ u64* q_empty(unsigned char* s) { return q_full(s) + 1; }
  static __device__ __forceinline__ u64* k_full(unsigned char* s) { return q_full(s) + 2; }
  static __device__ __forceinline__ u64* v_full(unsigned char* s) { return q_full(s) + 2 + STAGES; }
  static __device__ __forceinline__ u64* k_empty(unsigned char* s) { return q_full(s) + 2 + 2 * STAGES; }
  static __device__ __forceinline__ u64* v_empty(unsigned char* s) { return q_full(s) + 2 + 3 * STAGES; }

  // Full barriers complete on one arrival plus the copy engine's bytes;
  // empty ones on one arrival per consumer warp.
  static __device__ __forceinline__ void init_barriers(unsigned char* s) {
    if (threadIdx.x == 0) {
      bar_init(q_full(s), 1), bar_init(q_empty(s), kConsumerWarps);
      for (int i = 0; i < STAGES; ++i) {
        bar_init(k_full(s) + i, 1), bar_init(v_full(s) + i, 1);
        bar_init(k_empty(s) + i, kConsumerWarps), bar_init(v_empty(s) + i, kConsumerWarps);
      }
      fence_barrier_init();
    }
    __syncthreads();
  }

  // ---- the producer warpgroup ------------------------------------------------------------
  // The block's n-th query tile (blocks loop over tiles; `ring` carries the
  // K and V slots from one tile to the next). Thread 0 copies Q's tile once
  // the consumers are done with the last one, then K and V tile by tile,
  // each into its slot once the consumers have handed it back.
  static __device__ __forceinline__ void produce_by_copies(unsigned char* s, Ring<STAGES>& ring, int n, const AttentionSource& q,
                                                           const AttentionSource& k, const AttentionSource& v, int q0,
                                                           int kv_tiles) {
    if (threadIdx.x != 0) return;
    if (n == 0) prefetch_map(q.map), prefetch_map(k.map), prefetch_map(v.map);
    bar_wait(q_empty(s), (n & 1) ^ 1);
    bar_arrive_expect(q_full(s), kQBytes);
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) tma_load(q_tile(s) + b * kBQ * 64, q.map, q_full(s), b * 64, q0, q.head, q.batch);
    for (int t = 0; t < kv_tiles; ++t, ring.advance()) {
      bar_wait(k_empty(s) + ring.stage, ring.phase ^ 1);
      bar_arrive_expect(k_full(s) + ring.stage, kKvBytes);
#pragma unroll
      for (int b = 0; b < kBlocks; ++b)
        tma_load(k_tile(s, ring.stage) + b * BKV * 64, k.map, k_full(s) + ring.stage, b * 64, t * BKV, k.head, k.batch);
      bar_wait(v_empty(s) + ring.stage, ring.phase ^ 1);
      bar_arrive_expect(v_full(s) + ring.stage, kKvBytes);
#pragma unroll
      for (int b = 0; b < kBlocks; ++b)
        tma_load(v_tile(s, ring.stage) + b * BKV * 64, v.map, v_full(s) + ring.stage, b * 64, t * BKV, v.head, v.batch);
    }
  }

  // Rows [row0, row0 + ROWS) of a source into a tile, element by element by
  // the 128 producer threads, zeros past its rows and past the head
  // dimension; then visible to wgmma, and one arrival on `full`.
  template <int ROWS>
  static __device__ __forceinline__ void load_elements(u16* tile, const AttentionSource& src, int row0, u64* full) {
#pragma unroll 1
    for (int e = threadIdx.x; e < ROWS * kD; e += 128) {
      const int r = e / kD, c = e % kD;
      const bool valid = row0 + r < src.rows && c < HEAD_DIM;
      tile[(c >> 6) * ROWS * 64 + sw128(r, c & 63)] = valid ? src.base[static_cast<i64>(row0 + r) * src.row_stride + c] : u16(0);
    }
    fence_async_shared();
    named_sync(1, 128);
    if (threadIdx.x == 0) bar_arrive(full);
  }
  static __device__ __forceinline__ void produce_by_elements(unsigned char* s, Ring<STAGES>& ring, int n, const AttentionSource& q,
                                                             const AttentionSource& k, const AttentionSource& v, int q0,
                                                             int kv_tiles) {
    bar_wait(q_empty(s), (n & 1) ^ 1);
    load_elements<kBQ>(q_tile(s), q, q0, q_full(s));
    for (int t = 0; t < kv_tiles; ++t, ring.advance()) {
      bar_wait(k_empty(s) + ring.stage, ring.phase ^ 1);
      load_elements<BKV>(k_tile(s, ring.stage), k, t * BKV, k_full(s) + ring.stage);
      bar_wait(v_empty(s) + ring.stage, ring.phase ^ 1);
      load_elements<BKV>(v_tile(s, ring.stage), v, t * BKV, v_full(s) + ring.stage);
    }
  }

  // ---- the consumer warpgroups ---------------------------------------------------------------
  // A key tile's scores in S's accumulator layout, and its probabilities as
  // wgmma's A fragments.
  typedef float Scores[BKV / 8][4];
  typedef u32 Fragments[BKV / 16][4];

  // What every step of the key loop reads: where the block's query tile
  // lies (its first row, the lengths, skv - sq: key j is hidden from row i
  // when j > i + causal_offset), and whether this thread is its warp's lane
  // 0, which arrives on the ring's barriers for the warp.
  struct KeyLoop {
    int q0, sq, skv, causal_offset;
    bool signals;
  };

  // Row in the block's query tile of accumulator element e, and column.
  static __device__ __forceinline__ int acc_row(int e) {
    const int t = threadIdx.x - 128;  // consumers follow the producer warpgroup
    return (t >> 7) * 64 + ((t >> 5) & 3) * 16 + ((t & 31) >> 2) + (e >> 1) * 8;
  }
  static __device__ __forceinline__ int acc_col(int dn, int e) { return dn * 8 + (threadIdx.x & 3) * 2 + (e & 1); }

  // S = Q K^T for this warpgroup's 64 rows and the key tile in `stage`, issued, not waited for.
  static __device__ __forceinline__ void issue_scores(Scores& s_acc, unsigned char* s, int stage) {
    const u64 q = descriptor(reinterpret_cast<const unsigned char*>(q_tile(s)) + ((threadIdx.x >> 7) - 1) * 64 * 128, 16, 1024);
    const u64 k = descriptor(k_tile(s, stage), 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      mma<BKV, KIND, 0>(s_acc, advanced(q, (kk >> 2) * kBQ * 128 + (kk & 3) * 32), advanced(k, (kk >> 2) * BKV * 128 + (kk & 3) * 32),
                        kk > 0);
    wgmma_commit();
  }

  // O += P V for the key tile in `stage`, issued, not waited for.
  __device__ __forceinline__ void issue_values(const Fragments& p, unsigned char* s, int stage) {
    const u64 v = descriptor(v_tile(s, stage), BKV * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BKV / 16; ++kk) mma_rs<kD, KIND>(o, p[kk], advanced(v, kk * 2048), 1);
    wgmma_commit();
  }

  // Scores of key tile `t` from raw dot products, in place: the hook on
  // every element; on tiles at an edge (keys past skv, rows past sq, the
  // causal diagonal), -inf where the key does not exist or is hidden. There
  // the hook still reads in bounds without a branch: rows past the queries
  // (there only to fill the tile, never stored) ask for the last query row,
  // keys past skv for the last key. Predicated loads would take a predicate
  // an element, and with a runtime skv (a symbolic graph) ptxas then issues
  // the mask's loads one after another, each waited for (BERT's padding
  // mask, S300, H200: 300 us against 171 for the same kernel with S a
  // constant; clamped, 135 against 120).
  // (`loop` by value, as the ints it carries once were: by reference,
  // ptxas kept the edge tests' constants in registers.)
  template <class Score>
  static __device__ __forceinline__ void scores(Scores& s_acc, int t, KeyLoop loop, Score& score) {
    const int key0 = t * BKV, wg_row0 = loop.q0 + ((threadIdx.x >> 7) - 1) * 64;
    const int last_row = loop.sq - 1 - loop.q0;  // of the block's tile
    const bool edge = key0 + BKV > loop.skv || wg_row0 + 64 > loop.sq || (CAUSAL && key0 + BKV - 1 > wg_row0 + loop.causal_offset);
    if (!edge) {
#pragma unroll
      for (int ni = 0; ni < BKV / 8; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[ni][e] = score(s_acc[ni][e], acc_row(e), key0 + acc_col(ni, e));
      return;
    }
#pragma unroll
    for (int ni = 0; ni < BKV / 8; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = min(acc_row(e), last_row), key = key0 + acc_col(ni, e);
        const bool seen = key < loop.skv && (!CAUSAL || key <= loop.q0 + row + loop.causal_offset);
        const float value = score(s_acc[ni][e], row, min(key, loop.skv - 1));
        s_acc[ni][e] = seen ? value : -inf();
      }
  }

  // The online softmax over one tile's scores, in place: new row maxima,
  // the probabilities, the running sums, and how far the maxima moved
  // (`correction`, for O once no wgmma still writes it). Probabilities are
  // 2^(score * exponent_scale - max * exponent_scale): one multiply-add an
  // element, the scale folded in.
  __device__ __forceinline__ void softmax(Scores& s_acc, float (&correction)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float maxima[2] = {-inf(), -inf()};
#pragma unroll
      for (int ni = 0; ni < BKV / 8; ++ni) maxima[ni & 1] = fmaxf(maxima[ni & 1], fmaxf(s_acc[ni][2 * h], s_acc[ni][2 * h + 1]));
      float mx = fmaxf(maxima[0], maxima[1]);
      mx = tc::quad_max(mx);
      const float m_new = fmaxf(row_max[h], mx);
      const float m_use = m_new == -inf() ? 0.0f : m_new;  // nothing seen yet: keep exp finite
      correction[h] = exp2_approx((row_max[h] - m_use) * exponent_scale);
      row_max[h] = m_new;
      row_sum[h] *= correction[h];
      const float offset = m_use * exponent_scale;
      float sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // four chains, not one: the adds overlap
#pragma unroll
      for (int ni = 0; ni < BKV / 8; ++ni) {
        s_acc[ni][2 * h] = exp2_approx(fmaf(s_acc[ni][2 * h], exponent_scale, -offset));
        s_acc[ni][2 * h + 1] = exp2_approx(fmaf(s_acc[ni][2 * h + 1], exponent_scale, -offset));
        sums[ni & 3] += s_acc[ni][2 * h] + s_acc[ni][2 * h + 1];
      }
      row_sum[h] += (sums[0] + sums[1]) + (sums[2] + sums[3]);
    }
  }
  __device__ __forceinline__ void rescale(const float (&correction)[2]) {
#pragma unroll
    for (int dn = 0; dn < kDN; ++dn)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dn][e] *= correction[e >> 1];
  }
  // The probabilities as wgmma's A fragments (rounded to V's type).
  static __device__ __forceinline__ void pack(const Scores& s_acc, Fragments& p) {
    const bool bf = KIND == tc::kBf16;
#pragma unroll
    for (int kk = 0; kk < BKV / 16; ++kk) {
      p[kk][0] = tc::pack2(s_acc[2 * kk][0], s_acc[2 * kk][1], bf);
      p[kk][1] = tc::pack2(s_acc[2 * kk][2], s_acc[2 * kk][3], bf);
      p[kk][2] = tc::pack2(s_acc[2 * kk + 1][0], s_acc[2 * kk + 1][1], bf);
      p[kk][3] = tc::pack2(s_acc[2 * kk + 1][2], s_acc[2 * kk + 1][3], bf);
    }
  }
  // Keeps P's registers live (not reused) until the wgmma reading them is waited for.
  static __device__ __forceinline__ void fence_fragments(Fragments& p) {
#pragma unroll
    for (int kk = 0; kk < BKV / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(p[kk][i])::"memory");
  }

  // The two consumer warpgroups take turns to issue their wgmmas (named
  // barriers 2 and 3), so one computes its softmax while the other's
  // multiplications run.
  static __device__ __forceinline__ void await_turn() { wg::await_turn<2>(); }
  static __device__ __forceinline__ void pass_turn() { wg::pass_turn<2>(); }

  // ---- the key loop, a tile at a time: begin, steps, finish ----
  // The first tile (in `ring`'s slot): S = Q K^T alone, then its softmax.
  template <class Score>
  __device__ __forceinline__ void begin(unsigned char* s, const Ring<STAGES>& ring, const KeyLoop& loop, Scores& s_acc,
                                        Fragments& p, float (&correction)[2], Score& score) {
    bar_wait(k_full(s) + ring.stage, ring.phase);
    await_turn();
    issue_scores(s_acc, s, ring.stage);
    pass_turn();
    wgmma_wait<0>();
    fence_accumulators(s_acc);
    if (loop.signals) bar_arrive(k_empty(s) + ring.stage);
    scores(s_acc, 0, loop, score);
    softmax(s_acc, correction);
    pack(s_acc, p);
  }

  // Tile t (the ring's next slot) while the tile before it (in `ring`'s
  // slot, its probabilities in `p`) finishes: S of tile t and P V of tile
  // t - 1 are issued together; the softmax of tile t runs while P V of tile
  // t - 1 is on the tensor cores. On return `ring` is tile t's slot and `p`
  // holds its probabilities.
  template <class Score>
  __device__ __forceinline__ void step(unsigned char* s, Ring<STAGES>& ring, int t, const KeyLoop& loop, Scores& s_acc,
                                       Fragments& p, float (&correction)[2], Score& score) {
    Ring<STAGES> next = ring;
    next.advance();
    bar_wait(k_full(s) + next.stage, next.phase);
    bar_wait(v_full(s) + ring.stage, ring.phase);
    await_turn();
    issue_scores(s_acc, s, next.stage);
    rescale(correction);  // O for tile t - 1's maxima, while S runs (no wgmma writes O now)
    issue_values(p, s, ring.stage);
    pass_turn();
    wgmma_wait<1>();  // S of tile t (P V of tile t - 1 may still run)
    fence_accumulators(s_acc);
    scores(s_acc, t, loop, score);
    softmax(s_acc, correction);
    // K's slot is handed back once the softmax is done, and the predicate
    // reads the row sums so that it cannot be done sooner: ptxas places the
    // wait for P V after the last memory operation before it, and an arrive
    // it could move up would bring the wait with it, before the softmax
    // (measured: the overlap lost, the tensor pipe idle while the softmax
    // runs). The sums are never negative, so every warp's lane 0 arrives.
    if (loop.signals && !(row_sum[0] + row_sum[1] < 0.0f)) bar_arrive(k_empty(s) + next.stage);
    wgmma_wait<0>();
    fence_accumulators(o);
    fence_fragments(p);
    if (loop.signals) bar_arrive(v_empty(s) + ring.stage);
    pack(s_acc, p);
    ring = next;
  }

  // The last tile's P V (in `ring`'s slot), once every S = Q K^T is
  // done (the producer may load the next query tile's Q); the ring moves on.
  // The second warpgroup's last turn is passed to no one.
  __device__ __forceinline__ void finish(unsigned char* s, Ring<STAGES>& ring, const KeyLoop& loop, Fragments& p,
                                         const float (&correction)[2], bool first) {
    if (loop.signals) bar_arrive(q_empty(s));
    bar_wait(v_full(s) + ring.stage, ring.phase);
    await_turn();
    rescale(correction);
    issue_values(p, s, ring.stage);
    if (first) pass_turn();
    wgmma_wait<0>();
    fence_accumulators(o);
    fence_fragments(p);
    if (loop.signals) bar_arrive(v_empty(s) + ring.stage);
    ring.advance();
  }

  // A consumer warpgroup's 64 query rows of the block's n-th query tile
  // over kv_tiles key tiles, the first in `ring`'s slot (on return, the
  // next tile's); then o, row_max and row_sum hold them. score(dot, row, key): the score of
  // query row `row` of the block's tile and key `key`, called only for
  // keys < skv and rows < sq. causal_offset: skv - sq (key j is hidden from
  // row i when j > i + causal_offset). softmax_scale: the positive factor
  // the hook's scores still need (1 where the hook applies the scale).
  template <class Score>
  __device__ __forceinline__ void consume(unsigned char* s, Ring<STAGES>& ring, int n, int q0, int sq, int skv, int kv_tiles,
                                          int causal_offset, float softmax_scale, Score&& score) {
    exponent_scale = softmax_scale * 1.4426950408889634f;
    const bool signals = (threadIdx.x & 31) == 0;
#pragma unroll
    for (int dn = 0; dn < kDN; ++dn)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dn][e] = 0.0f;
    row_max[0] = row_max[1] = -inf();
    row_sum[0] = row_sum[1] = 0.0f;
    bar_wait(q_full(s), n & 1);
    if (kv_tiles == 0 && signals) bar_arrive(q_empty(s));
    if (kv_tiles > 0) {
      // Both warpgroups issue kv_tiles + 1 times; the first goes first.
      const bool first = threadIdx.x < 256;
      if (!first) pass_turn();
      Scores s_acc;
      Fragments p;
      float correction[2];
      const KeyLoop loop = {q0, sq, skv, causal_offset, signals};
      begin(s, ring, loop, s_acc, p, correction, score);
      for (int t = 1; t < kv_tiles; ++t) step(s, ring, t, loop, s_acc, p, correction, score);
      finish(s, ring, loop, p, correction, first);
    }
    // Each row's 1 / sum once (0 for a row whose keys are all masked), for its 64 or more outputs.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_sum[h] = tc::quad_sum(row_sum[h]);
      inverse_sum[h] = row_sum[h] > 0.0f ? 1.0f / row_sum[h] : 0.0f;
    }
  }

  // The normalised output element e of column tile dn: O times the row's 1 / sum, as flash-attention
  // kernels divide (within an f32 rounding of O / sum; 0 for an all-masked row).
  __device__ __forceinline__ float out(int dn, int e) const { return o[dn][e] * inverse_sum[e >> 1]; }
};

}  // namespace wg
}  // namespace kiln
