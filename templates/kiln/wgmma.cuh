// kiln's Hopper GEMM (sm_90a): a persistent, warp-specialised tile loop.
//
// One producer warpgroup fills a STAGES-deep ring of shared-memory slices
// (A: 128 x 64, B: BN x 64 or 64 x BN, 16-bit, 128-byte swizzled) with the
// bulk tensor copy engine (TMA), each slice completing on a `full` mbarrier;
// two consumer warpgroups multiply 64 rows each with wgmma (m64nBNk16, f32
// accumulators in registers) and hand the slice back through an `empty`
// mbarrier. Blocks walk the tiles of the problem (a persistent grid), so the
// producer loads the next tile's first slices during the epilogue.
// (Measured on H100, bf16 8192 x 8192 x 4096: this cooperative 128 x 256
// tile, 557 TFLOP/s, against 454 for two consumers taking 128 x 128 tiles
// in turn: the smaller tile reads more from L2 per flop.)
//
// Hooks (what codegen provides):
// - the producer's loads of one slice: TMA copies of plain tensors (their
//   CUtensorMaps are kernel parameters, encoded by the runtime from the
//   bound pointers), or, where a pointer is not 16-byte aligned, every
//   element through the emitter by the producer's 128 threads, stored at
//   sw128 positions (then fence_async_shared, a named barrier, and one
//   arrival);
// - or (GATHERED) every producer thread fills A itself: 16-byte cp.async
//   chunks gathered from anywhere (implicit im2col), completing on the
//   `full` barrier through cp_async_arrive, plus one arrival per thread
//   (thread 0's carries B's expected bytes); consumers fence the generic
//   proxy's writes before wgmma reads them;
// - the epilogue reads `acc` after mma_tile() through acc_row / acc_col
//   (the fragment layout of mma.cuh: acc[0][ni][e]); STAGED, it writes
//   the result's 128-byte column blocks into its warpgroup's two staging
//   buffers in turn and one thread stores each with tma_store (the next
//   tile's MMAs do not wait for global memory).
//
// Numerics: operands are 16-bit values exactly as stored; products are
// exact in the f32 accumulator (graph-format.md rule 5).
#pragma once

#include "kiln/mma.cuh"

namespace kiln {

// A CUtensorMap, opaque to the kernel: 128 bytes, 64-byte aligned, passed
// by value as a __grid_constant__ parameter.
struct __align__(64) TensorMap {
  unsigned long long opaque[16];
};

namespace wg {

typedef unsigned long long u64;

using tc::shared_address;

// ---- mbarriers ----------------------------------------------------------------
__device__ __forceinline__ void bar_init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_wait(u64* bar, u32 parity) {
  u32 done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(bar)) : "memory");
}
// One arrival, and `bytes` more to come from the copy engine.
__device__ __forceinline__ void bar_arrive_expect(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// An arrival on `bar` once every cp.async this thread issued before has
// landed (the barrier's pending count goes up by one now, so the thread
// still arrives itself as well).
__device__ __forceinline__ void cp_async_arrive(u64* bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(shared_address(bar)) : "memory");
}
// Ordinary shared-memory stores made visible to the tensor cores and the copy engine.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void named_sync(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Two consumer warpgroups (threads 128-255 and 256-383) taking turns
// through the named barriers FIRST and FIRST + 1, 256 threads each: one
// waits, the other arrives. (Barrier numbers as immediates: ptxas counts
// the barriers a kernel uses from them.)
template <int FIRST> __device__ __forceinline__ void await_turn() {
  if (threadIdx.x < 256) asm volatile("bar.sync %0, 256;\n" ::"n"(FIRST) : "memory");
  else asm volatile("bar.sync %0, 256;\n" ::"n"(FIRST + 1) : "memory");
}
template <int FIRST> __device__ __forceinline__ void pass_turn() {
  if (threadIdx.x < 256) asm volatile("bar.arrive %0, 256;\n" ::"n"(FIRST + 1) : "memory");
  else asm volatile("bar.arrive %0, 256;\n" ::"n"(FIRST) : "memory");
}

// ---- the bulk tensor copy engine ----------------------------------------------------
__device__ __forceinline__ void prefetch_map(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, u64* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          shared_address(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(shared_address(bar)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, u64* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
          shared_address(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(shared_address(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, u64* bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(
          shared_address(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(shared_address(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// The same box into the same offset of every block in `mask` of the
// cluster, each block's barrier at `bar`'s offset told of its bytes.
__device__ __forceinline__ void tma_multicast(void* dst, const TensorMap* map, u64* bar, unsigned short mask, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4}], "
      "[%2], %5;\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(shared_address(bar)), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void tma_multicast(void* dst, const TensorMap* map, u64* bar, unsigned short mask, int c0, int c1,
                                              int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4, "
      "%5}], [%2], %6;\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(shared_address(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
      : "memory");
}

// Bulk tensor stores: a box of shared memory (laid out as the map's
// swizzle says) to global memory; the map clips what lies outside the
// tensor. Grouped per thread: commit, then wait until a group's shared
// memory has been read (the buffer may be refilled) or until all landed.
__device__ __forceinline__ void tma_store(const TensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(reinterpret_cast<u64>(map)),
               "r"(shared_address(src)), "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void tma_store(const TensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<u64>(map)),
               "r"(shared_address(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
// Bytes [p, p + bytes) into L2 (both multiples of 16), nothing waits for it.
__device__ __forceinline__ void prefetch_l2(const void* p, u32 bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(reinterpret_cast<u64>(p)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// ---- registers per thread, by warpgroup role (sm_90a) ---------------------------------
template <int N> __device__ __forceinline__ void registers_down() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> __device__ __forceinline__ void registers_up() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

// ---- shared-memory tiles ------------------------------------------------------------
// Element (row, col) of a [rows][64] tile of 16-bit values in the 128-byte
// swizzle of the copy engine and wgmma: the 16-byte chunk `col / 8` of row
// `row` sits at chunk (col / 8) ^ (row % 8). The tile starts 1024-byte aligned.
__device__ __forceinline__ int sw128(int row, int col) { return row * 64 + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7)); }

// A wgmma shared-memory matrix descriptor with the 128-byte swizzle: start
// address, leading and stride byte offsets (PTX ISA, "matrix descriptor").
__device__ __forceinline__ u64 descriptor(const void* p, u32 leading, u32 stride) {
  return static_cast<u64>((shared_address(p) & 0x3FFFF) >> 4) | (static_cast<u64>(leading >> 4) << 16) |
         (static_cast<u64>(stride >> 4) << 32) | (1ull << 62);
}

// The descriptor of the operand `bytes` further on in shared memory: the
// address field is the address / 16 in 14 bits, and shared addresses stay
// below 256 KiB, so adding never carries into the next field. (One add on
// a uniform register per wgmma, instead of encoding each address anew.)
__device__ __forceinline__ u64 advanced(u64 descriptor, u32 bytes) { return descriptor + (bytes >> 4); }

// ---- wgmma --------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// D (64 x N, f32) += A (64 x 16, K-major in shared memory) * B (16 x N,
// K-major, or N-major when TRANS_B); scale_d 0 overwrites D.
// (The operand lists were written by a script: one "+f" per accumulator.)
#define KILN_WGMMA_N64(TYPE)                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " "                 \
               "{" \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
               "}, %32, %33, p, 1, 1, 0, %35;\n}\n"                    \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B))

#define KILN_WGMMA_N128(TYPE)                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                 \
               "{" \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
               "}, %64, %65, p, 1, 1, 0, %67;\n}\n"                    \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
                 "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
                 "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
                 "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
                 "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B))

#define KILN_WGMMA_N192(TYPE)                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n192k16.f32." TYPE "." TYPE " "                 \
               "{" \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
               "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
               "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" \
               "}, %96, %97, p, 1, 1, 0, %99;\n}\n"                    \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
                 "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
                 "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
                 "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
                 "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), \
                 "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), \
                 "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), \
                 "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), \
                 "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]) \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B))

#define KILN_WGMMA_N256(TYPE)                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " "                 \
               "{" \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
               "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
               "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
               "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
               "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
               "}, %128, %129, p, 1, 1, 0, %131;\n}\n"                    \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
                 "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
                 "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
                 "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
                 "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), \
                 "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), \
                 "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), \
                 "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), \
                 "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), \
                 "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), \
                 "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), \
                 "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), \
                 "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3]) \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B))

#define KILN_WGMMA_N176(TYPE)                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n176k16.f32." TYPE "." TYPE " "                 \
               "{" \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
               "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
               "%80, %81, %82, %83, %84, %85, %86, %87" \
               "}, %88, %89, p, 1, 1, 0, %91;\n}\n"                    \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
                 "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
                 "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
                 "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
                 "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), \
                 "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), \
                 "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), \
                 "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]) \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B))

#define KILN_WGMMA_N80(TYPE)                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n80k16.f32." TYPE "." TYPE " "                 \
               "{" \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39" \
               "}, %40, %41, p, 1, 1, 0, %43;\n}\n"                    \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
                 "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]) \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B))

template <int N, int KIND, int TRANS_B>
__device__ __forceinline__ void mma(float (&d)[N / 8][4], u64 desc_a, u64 desc_b, int scale_d) {
  static_assert(N == 64 || N == 80 || N == 128 || N == 176 || N == 192 || N == 256, "wgmma N");
  if constexpr (N == 64) {
    if constexpr (KIND == tc::kBf16) KILN_WGMMA_N64("bf16"); else KILN_WGMMA_N64("f16");
  } else if constexpr (N == 80) {  // the attention kernel's key tile at head dim 256 (kiln/attention_wgmma.cuh)
    if constexpr (KIND == tc::kBf16) KILN_WGMMA_N80("bf16"); else KILN_WGMMA_N80("f16");
  } else if constexpr (N == 128) {
    if constexpr (KIND == tc::kBf16) KILN_WGMMA_N128("bf16"); else KILN_WGMMA_N128("f16");
  } else if constexpr (N == 176) {  // the attention kernel's key tile at head dim 128 (kiln/attention_wgmma.cuh)
    if constexpr (KIND == tc::kBf16) KILN_WGMMA_N176("bf16"); else KILN_WGMMA_N176("f16");
  } else if constexpr (N == 192) {  // a matmul's tiles of 192 columns (one round where 128 would take two)
    if constexpr (KIND == tc::kBf16) KILN_WGMMA_N192("bf16"); else KILN_WGMMA_N192("f16");
  } else {
    if constexpr (KIND == tc::kBf16) KILN_WGMMA_N256("bf16"); else KILN_WGMMA_N256("f16");
  }
}

// D (64 x N, f32) += A (64 x 16, in registers: the accumulator layout's
// fragment, two 16-bit values a register) * B (16 x N, N-major in shared
// memory); scale_d 0 overwrites D. (Operand lists written by a script.)
#define KILN_WGMMA_RS_N64(TYPE)                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " "                 \
               "{" \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
               "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                    \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

#define KILN_WGMMA_RS_N128(TYPE)                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                 \
               "{" \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
               "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                    \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
                 "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
                 "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
                 "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
                 "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

#define KILN_WGMMA_RS_N256(TYPE)                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " "                 \
               "{" \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
               "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
               "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
               "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
               "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
               "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                    \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
                 "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
                 "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
                 "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
                 "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), \
                 "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), \
                 "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), \
                 "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), \
                 "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), \
                 "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), \
                 "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), \
                 "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), \
                 "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

template <int N, int KIND>
__device__ __forceinline__ void mma_rs(float (&d)[N / 8][4], const u32 (&a)[4], u64 desc_b, int scale_d) {
  static_assert(N == 64 || N == 128 || N == 256, "wgmma N");
  if constexpr (N == 64) {
    if constexpr (KIND == tc::kBf16) KILN_WGMMA_RS_N64("bf16"); else KILN_WGMMA_RS_N64("f16");
  } else if constexpr (N == 128) {
    if constexpr (KIND == tc::kBf16) KILN_WGMMA_RS_N128("bf16"); else KILN_WGMMA_RS_N128("f16");
  } else {
    if constexpr (KIND == tc::kBf16) KILN_WGMMA_RS_N256("bf16"); else KILN_WGMMA_RS_N256("f16");
  }
}

// Keeps the compiler from moving accumulator reads above a wgmma wait.
template <int NI>
__device__ __forceinline__ void fence_accumulators(float (&d)[NI][4]) {
#pragma unroll
  for (int i = 0; i < NI; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

// Where the ring stands: slot and the parity of its current fill.
template <int STAGES>
struct Ring {
  int stage = 0;
  u32 phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == STAGES) stage = 0, phase ^= 1;
  }
  // Past n fills (another warpgroup's slices).
  __device__ __forceinline__ void skip(int n) {
    stage += n;
    phase ^= static_cast<u32>(stage / STAGES) & 1u;
    stage %= STAGES;
  }
};

// PINGPONG: the two consumer warpgroups take tiles of 64 rows of their own,
// in turn (the producer fills the ring with one warpgroup's slices, then
// the other's), so one warpgroup's epilogue runs while the other's main
// loop keeps the tensor cores busy; each slice is read by one warpgroup.
// Otherwise (cooperative) both split each 128-row tile.
//
// CLUSTER blocks (1 or 2, a thread-block cluster along M) work on tiles
// that share their columns: each block loads its own A slice and 1 /
// CLUSTER of the B slice, multicast into every block of the cluster, so B
// crosses L2 once per cluster. A slot is refilled only after the consumers
// of every block of the cluster are done with it (they arrive on the
// `empty` barriers of all of them).
template <int BN, int STAGES, int KIND, bool B_K_MAJOR, int CLUSTER, bool GATHERED = false, bool STAGED = false,
          bool PINGPONG = false>
struct Gemm {
  typedef u16 T;
  static constexpr int kBM = PINGPONG ? 64 : 128, kBK = 64;  // a slice row is one 128-byte swizzle row
  static constexpr int kThreads = 384;                       // producer, then two consumers of 64 rows each
  static constexpr int kABytes = kBM * kBK * 2, kBBytes = BN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // The slices, 1024-byte aligned; STAGED: each consumer warpgroup's two
  // 64-row x 128-byte output buffers (128-byte swizzle) for bulk stores
  // (and bulk loads of a residual) and a barrier for each buffer's loads;
  // then full[STAGES] and empty[STAGES].
  static constexpr int kStagingBytes = STAGED ? 4 * 64 * 128 + 4 * 8 : 0;
  static constexpr int kSharedBytes = 1024 + STAGES * kStageBytes + kStagingBytes + 2 * STAGES * 8;
  static constexpr int kMI = 1, kNI = BN / 8;
  static_assert(BN % (64 * CLUSTER) == 0 && BN <= 256 && STAGES >= 2 && (CLUSTER == 1 || CLUSTER == 2), "tile shape");
  static_assert(!(PINGPONG && GATHERED), "a gathering producer fills 128 rows");
  static constexpr int kReaders = PINGPONG ? 4 : 8;  // consumer warps that read each slice

  float acc[1][kNI][4];

  static __device__ __forceinline__ unsigned char* base(unsigned char* raw) {
    return raw + ((1024 - (shared_address(raw) & 1023)) & 1023);
  }
  static __device__ __forceinline__ T* a_tile(unsigned char* s, int stage) {
    return reinterpret_cast<T*>(s + stage * kStageBytes);
  }
  static __device__ __forceinline__ T* b_tile(unsigned char* s, int stage) {
    return reinterpret_cast<T*>(s + stage * kStageBytes + kABytes);
  }
  static __device__ __forceinline__ unsigned char* staging(unsigned char* s, int consumer, int buffer) {
    return s + STAGES * kStageBytes + (consumer * 2 + buffer) * 64 * 128;
  }
  // Completes when a bulk load into staging buffer (consumer, buffer) has landed.
  static __device__ __forceinline__ u64* staging_loaded(unsigned char* s, int consumer, int buffer) {
    return reinterpret_cast<u64*>(s + STAGES * kStageBytes + 4 * 64 * 128) + consumer * 2 + buffer;
  }
  // Byte offset of a 4- or 8-byte value at (row, byte column) of a 64 x 128-byte staging buffer.
  static __device__ __forceinline__ int staging_offset(int row, int byte) { return row * 128 + ((((byte >> 4) ^ (row & 7))) << 4) + (byte & 15); }
  // The same offset for this thread's column pair (half, nj) of a block of BYTES-byte elements:
  // staging_offset(acc_row(0, 2 * half) & 63, (acc_col(nj, 2 * half) % (128 / BYTES)) * BYTES), in
  // two instructions a pair. The row's low bits are the lane's (lane / 4), and the pair's byte
  // in its 8 columns, q, reaches past 16 bytes only in its chunk's lowest bit, which nj's
  // chunks (nj * BYTES / 2, even for 4-byte elements) leave clear: so the chunk's XOR splits
  // into nj's part and the thread's.
  template <int BYTES>
  static __device__ __forceinline__ int staging_pair_offset(int half, int nj) {
    static_assert(BYTES == 2 || BYTES == 4, "16-bit or f32 pairs");
    const int lane = threadIdx.x & 31;
    const int row = ((threadIdx.x >> 5) & 3) * 16 + (lane >> 2);
    const int q = (lane & 3) * 2 * BYTES;
    const int thread_part = row * 128 + (q & 15), thread_chunk = ((q >> 4) ^ (lane >> 2)) << 4;
    return thread_part + half * 1024 + ((nj * 8 * BYTES) ^ thread_chunk);
  }
  static __device__ __forceinline__ u64* full(unsigned char* s) {
    return reinterpret_cast<u64*>(s + STAGES * kStageBytes + kStagingBytes);
  }
  static __device__ __forceinline__ u64* empty(unsigned char* s) { return full(s) + STAGES; }

  // Element offsets in a stage's tiles: A(m, k), m < kBM; B(k, n), n < BN.
  static __device__ __forceinline__ int a_index(int m, int k) { return sw128(m, k); }
  static __device__ __forceinline__ int b_index(int k, int n) {
    return B_K_MAJOR ? sw128(n, k) : (n >> 6) * (kBK * 64) + sw128(k, n & 63);
  }

  static __device__ __forceinline__ u32 rank() {
    if constexpr (CLUSTER == 1) return 0;
    else return cluster_rank();
  }

  // Barriers: full completes on one arrival (one per producer thread when
  // GATHERED) plus the copy engines' bytes; empty on one arrival per
  // consumer warp that reads it (kReaders) of every block of the cluster.
  // Every block's barriers exist before any block signals one.
  static __device__ __forceinline__ void init_barriers(unsigned char* s) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < STAGES; ++i) bar_init(full(s) + i, GATHERED ? 128 : 1), bar_init(empty(s) + i, kReaders * CLUSTER);
      if constexpr (STAGED)
        for (int i = 0; i < 4; ++i) bar_init(staging_loaded(s, i / 2, i % 2), 1);
      fence_barrier_init();
    }
    if constexpr (CLUSTER > 1) cluster_sync();
    else __syncthreads();
  }
  // No block leaves while another may still write into its shared memory.
  static __device__ __forceinline__ void finish() {
    if constexpr (CLUSTER > 1) cluster_sync();
  }

  // Row and column in the block tile of accumulator element e of MMA tile (mi, ni).
  static __device__ __forceinline__ int acc_row(int, int e) {
    const int t = threadIdx.x - 128;  // consumers follow the producer warpgroup
    return (PINGPONG ? 0 : (t >> 7) * 64) + ((t >> 5) & 3) * 16 + ((t & 31) >> 2) + (e >> 1) * 8;
  }
  static __device__ __forceinline__ int acc_col(int ni, int e) { return ni * 8 + (threadIdx.x & 3) * 2 + (e & 1); }

  // Hands a slot back to every block of the cluster.
  static __device__ __forceinline__ void release(unsigned char* s, int stage) {
    if constexpr (CLUSTER == 1) {
      bar_arrive(empty(s) + stage);
    } else {
#pragma unroll
      for (u32 r = 0; r < CLUSTER; ++r) {
        u32 remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(shared_address(empty(s) + stage)), "r"(r));
        asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
      }
    }
  }

  // Ping-pong: the warpgroups start their main loops in turn (named barriers
  // 4 and 5; a warpgroup passes the turn once it has waited for all its
  // tile's slices). Besides alternating the tensor cores, this keeps a
  // warpgroup that skipped the other's fills from waiting on a slot more
  // than one fill ahead: an mbarrier's parity tells only its last two
  // phases apart.
  static __device__ __forceinline__ void await_turn() { wg::await_turn<4>(); }
  static __device__ __forceinline__ void pass_turn() { wg::pass_turn<4>(); }

  // A consumer warpgroup's 64 rows of one tile over k_tiles slices: on
  // return acc holds them and every slice it read is handed back. (Ping-pong:
  // the slices are this warpgroup's alone, all 64 rows its own.)
  __device__ __forceinline__ void mma_tile(unsigned char* s, Ring<STAGES>& ring, int k_tiles) {
    const int consumer = (threadIdx.x >> 7) - 1;
    const bool signals = (threadIdx.x & 31) == 0;
    int previous = -1;
    for (int kt = 0; kt < k_tiles; ++kt) {
      bar_wait(full(s) + ring.stage, ring.phase);
      if constexpr (GATHERED) fence_async_shared();  // the producer's cp.async writes, seen by wgmma
      const unsigned char* a = reinterpret_cast<const unsigned char*>(a_tile(s, ring.stage)) + (PINGPONG ? 0 : consumer) * 64 * 128;
      const unsigned char* b = reinterpret_cast<const unsigned char*>(b_tile(s, ring.stage));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        // K-major B: 16 k are 32 bytes along a row; N-major: 16 rows of 128
        // bytes, the 64-wide column blocks kBK * 128 bytes apart.
        const u64 db = B_K_MAJOR ? descriptor(b + kk * 32, 16, 1024) : descriptor(b + kk * 2048, kBK * 128, 1024);
        mma<BN, KIND, B_K_MAJOR ? 0 : 1>(acc[0], descriptor(a + kk * 32, 16, 1024), db, (kt | kk) != 0);
      }
      wgmma_commit();
      wgmma_wait<1>();  // the slice before this one is no longer read
      if (previous >= 0 && signals) release(s, previous);
      previous = ring.stage;
      ring.advance();
    }
    wgmma_wait<0>();
    fence_accumulators(acc[0]);
    if (previous >= 0 && signals) release(s, previous);
  }
};

// A staged block copied out by the threads, where the result's rows are no
// 16-byte multiple (an odd N, a vocabulary of 50257): a block row's 128
// bytes start `past` elements past a 16-byte boundary of memory, so they
// touch nine 16-byte chunks of memory, the first and the last in part. Its
// staging row holds them rotated: byte b of the block at
// ((b + past * BYTES + 16 * (row & 7)) & 127), so that chunk u = 1..7 of
// memory (elements first - past + u * 16 / BYTES...) is the whole 16-byte
// unit (u + row) & 7, and unit row & 7 holds the row's first columns in its
// bytes from past * BYTES on and its last columns before them: each chunk
// goes out with one 16-byte load and one 16-byte store. (The 16 * (row & 7)
// spreads eight rows' units over the 32 banks.)
__device__ __forceinline__ int rotated_offset(int row, int byte, int past_bytes) {
  return row * 128 + ((byte + past_bytes + 16 * (row & 7)) & 127);
}
template <int BYTES>
__device__ __forceinline__ void put_rotated_element(unsigned char* staging, int row, int column, int past, u32 bits) {
  unsigned char* q = staging + rotated_offset(row, column * BYTES, past * BYTES);
  if constexpr (BYTES == 2) *reinterpret_cast<u16*>(q) = static_cast<u16>(bits);
  else *reinterpret_cast<u32*>(q) = bits;
}
__device__ __forceinline__ void put_rotated_pair_bf16(unsigned char* staging, int row, int column, int past, float a, float b) {
  put_rotated_element<2>(staging, row, column, past, f32_to_bf16(a));
  put_rotated_element<2>(staging, row, column + 1, past, f32_to_bf16(b));
}
__device__ __forceinline__ void put_rotated_pair_f16(unsigned char* staging, int row, int column, int past, float a, float b) {
  put_rotated_element<2>(staging, row, column, past, f32_to_f16(a));
  put_rotated_element<2>(staging, row, column + 1, past, f32_to_f16(b));
}
__device__ __forceinline__ void put_rotated_pair_f32(unsigned char* staging, int row, int column, int past, float a, float b) {
  put_rotated_element<4>(staging, row, column, past, __float_as_uint(a));
  put_rotated_element<4>(staging, row, column + 1, past, __float_as_uint(b));
}
// Chunk `unit` (1..7) of a rotated staging row to the 16-byte aligned `to`.
__device__ __forceinline__ void copy_out_unit(unsigned char* to, const unsigned char* staging, int row, int unit) {
  *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(staging + rotated_offset(row, 16 * unit, 0));
}
// Bytes [lo, hi) of the 16 bytes v (lo and hi multiples of 2) to the same
// bytes of the 16-byte aligned `to`, in aligned stores of 2, 4 and 8 bytes.
__device__ __forceinline__ void store_bytes(unsigned char* to, uint4 v, int lo, int hi) {
  const u64 low = static_cast<u64>(v.x) | (static_cast<u64>(v.y) << 32), high = static_cast<u64>(v.z) | (static_cast<u64>(v.w) << 32);
#pragma unroll
  for (int piece = 0; piece < 5; ++piece) {
    if (lo >= hi) break;
    const u64 word = (lo < 8 ? low : high) >> (8 * (lo & 7));
    if ((lo & 7) == 0 && lo + 8 <= hi) {
      *reinterpret_cast<u64*>(to + lo) = word;
      lo += 8;
    } else if ((lo & 3) == 0 && lo + 4 <= hi) {
      *reinterpret_cast<u32*>(to + lo) = static_cast<u32>(word);
      lo += 4;
    } else {
      *reinterpret_cast<u16*>(to + lo) = static_cast<u16>(word);
      lo += 2;
    }
  }
}
// The two partial chunks of a rotated staging row: its first columns into
// the chunk at `chunk` (bytes from past * BYTES on), its last columns into
// the chunk 128 bytes on (bytes before past * BYTES).
template <int BYTES>
__device__ __forceinline__ void copy_out_ends(unsigned char* chunk, const unsigned char* staging, int row, int past) {
  const uint4 v = *reinterpret_cast<const uint4*>(staging + rotated_offset(row, 0, 0));
  store_bytes(chunk, v, past * BYTES, 16);
  store_bytes(chunk + 128, v, 0, past * BYTES);
}

}  // namespace wg
}  // namespace kiln
