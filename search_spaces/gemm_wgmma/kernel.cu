// gemm_wgmma: bf16 GEMM for Hopper (sm_90a). C[M,N] = A[M,K] * B[N,K]^T, fp32 accumulation.
//
// Layout of one CTA: warpgroup 0 is the producer (one elected thread issues TMA loads of A and B
// tiles into a STAGES-deep shared-memory ring, completion on "full" mbarriers); warpgroups
// 1..CONSUMERS are consumers: each owns BM/CONSUMERS rows of the BM x BN tile, issues
// wgmma.mma_async (m64nBNk16, both operands from 128-byte-swizzled shared memory) and frees a
// stage by arriving on its "empty" mbarrier once the wgmmas that read it have retired.
// setmaxnreg moves registers from the producer (40) to the consumers.
// Epilogue: accumulators -> bf16 pairs -> 32-bit global stores (bounds-checked at the edges), or
// with EPI=1 (full tiles, N % 8 == 0) staged through a swizzled smem buffer per consumer and
// written with coalesced 16-byte stores, or with EPI=2/3 (N % 8 == 0, any tile: TMA clips the
// edges) written into 64x64 boxes of smem with stmatrix and stored by TMA (cp.async.bulk.tensor
// through C's tensor map) while the consumers go on to their next tile's MMAs. EPI=2 stages the
// whole tile (BM*BN*2 bytes), so its stores are only waited for before the next tile's
// epilogue; EPI=3 reuses one 64 x EPI_W buffer per consumer (the smem of EPI=1, more stages).
// CLUSTER=2: two CTAs on vertically adjacent tiles share the B tile; each loads half of it and
// multicasts it into both, and each consumer warp frees a stage in both CTAs.
// PERSIST=1: grid of at most one CTA per SM striding over tiles, so the producer prefetches the
// next tile while the consumers run their epilogue. Tiles are rastered in groups of GROUP_M rows.
// Work items (Sched below) are a tile and a range of k-tiles. SPLITK > 1 cuts every tile's K
// into SPLITK equal ranges (small M: more CTAs than tiles). STREAMK=1 keeps whole tiles for all
// but the last one to two waves and deals those out as equal runs of k-tiles over every CTA, so
// no SM idles in a ragged last wave; STREAMK=2 shares out only the ragged last wave (runs
// shorter than a tile, fewer partial tiles). A tile computed in parts is reduced in the workspace
// (one u32 counter per tile, then fp32 partial tiles): every part counts itself in first; all
// but the last store their accumulators (16-byte stores) and count themselves as stored; the
// last waits for those stores (their CTAs have counted in, so they are running and never wait),
// adds them to its own accumulators, writes C and zeroes the counter (the counters are zero
// between launches: [launch] workspace_clean; the slots are scratch, written before read).
// TAILW > 0 balances the ragged last wave without any reduction: the last rows of tiles are
// re-cut along N into pieces TAILW or TAILW + 8 wide (recut_plan below), each a whole-K item
// with its own width of wgmma and epilogue, loaded through a fourth tensor map whose B box is
// TAILW + 8 rows (the pace is set by shared-memory traffic as much as by the MMAs).
#include "porter.cuh"

struct alignas(64) CUtensorMap { uint64_t opaque[16]; };

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
#endif
#ifndef BK
#define BK 64
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef CONSUMERS
#define CONSUMERS 2
#endif
#ifndef GROUP_M
#define GROUP_M 16
#endif
#ifndef PERSIST
#define PERSIST 1
#endif
#ifndef CLUSTER
#define CLUSTER 1
#endif
#ifndef EPI
#define EPI 1          // 0: stores straight from registers; 1: staged through smem, 16-byte stores
#endif             // 2: stmatrix into smem, TMA store, whole tile; 3: the same, 64 x EPI_W at a time
#ifndef SPLITK
#define SPLITK 1       // >1: each tile's K range is cut into SPLITK parts, reduced in the workspace
#endif
#ifndef SWAP
#define SWAP 0         // 1: compute C^T = B A^T: B's rows fill wgmma's M=64, the small M becomes
#endif                 // wgmma's N (16, 32, ...), for decode-sized M without 4x wasted MMAs
#if SWAP && (CLUSTER != 1 || EPI != 0)
#error "SWAP needs CLUSTER=1 and EPI=0"
#endif
#ifndef STREAMK
#define STREAMK 0      // 1 (persistent only): the last one to two waves of tiles are shared out
#endif                 // in equal runs of k-tiles (stream-K), partial tiles reduced in the workspace
#if STREAMK && (!PERSIST || SPLITK != 1)
#error "STREAMK needs PERSIST=1 and SPLITK=1"
#endif
#if CLUSTER != 1 && CLUSTER != 2
#error "CLUSTER must be 1 or 2"
#endif
#ifndef TAILW
#define TAILW 0        // > 0 (persistent): the last rows of tiles are re-cut along N into pieces
#endif                 // TAILW or TAILW + 8 wide, as many as fill the last wave (no fix-up)
#if TAILW && (!PERSIST || STREAMK || SPLITK != 1 || CLUSTER != 1 || SWAP || EPI < 2 || \
              TAILW % 8 != 0 || TAILW + 8 > BN)
#error "TAILW needs PERSIST=1, EPI=2/3, no STREAMK, SPLITK, CLUSTER or SWAP, and TAILW + 8 <= BN"
#endif

// A stage holds BK / 64 sub-tiles of 64 bf16 along K per operand (one 128-byte swizzle row
// each, one TMA box each): BK=128 reads 256 contiguous bytes of every row per stage, which the
// memory-bound small-M shapes like.
#define KSUB (BK / 64)
#define A_SUB_BYTES (BM * 128)
#define B_SUB_BYTES (BN * 128)
#if BK != 64 && BK != 128
#error "BK must be 64 or 128"
#endif

#define THREADS (128 * (CONSUMERS + 1))
#define WM (BM / CONSUMERS)          // rows per consumer warpgroup
#define MT (WM / 64)                 // m64 wgmma tiles per consumer
#define A_TILE_BYTES (BM * BK * 2)
#define B_TILE_BYTES (BN * BK * 2)
#define STAGE_BYTES (A_TILE_BYTES + B_TILE_BYTES)

#if WM % 64 != 0
#error "BM / CONSUMERS must be a multiple of 64"
#endif

#if CONSUMERS == 1
#define CONSUMER_REGS 240
#else
#define CONSUMER_REGS 232
#endif
#define PRODUCER_REGS 40

// EPI=1: each consumer stages 64 rows x EPI_W columns of bf16 at a time in its own smem buffer
#define EPI_W ((BN % 128 == 0) ? 128 : 64)
#define EPI_BUF_BYTES (64 * EPI_W * 2)
#if EPI >= 2 && (BN < 64 || SWAP)
#error "EPI=2/3 store 64x64 boxes (and the columns past the last one directly): BN >= 64, no SWAP"
#endif

// ---------------------------------------------------------------------------------------------
// mbarrier, TMA and wgmma wrappers (PTX ISA 8.0+, sm_90a)

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];"
      :: "r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

// Multicast variant: the box lands at the same smem offset in every CTA of `mask`, and
// complete_tx is signalled on the mbarrier at the same offset in each of them.
__device__ __forceinline__ void tma_load_2d_mc(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                               int c0, int c1, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;"
      :: "r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
}

// Arrive on the mbarrier at the same smem offset in CTA `rank` of the cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  asm volatile("{\n.reg .b32 ra;\n"
               "mapa.shared::cluster.u32 ra, %0, %1;\n"
               "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n"
               :: "r"(bar), "r"(rank) : "memory");
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// TMA store of one box from (swizzled) smem to global, in this thread's bulk async-group.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"((uint64_t)map), "r"(src), "r"(c0), "r"(c1) : "memory");
}

__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Wait until this thread's earlier TMA stores have read their smem (it may be written again).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

__device__ __forceinline__ void tma_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Four 8x8 bf16 matrices to smem: thread t gives the address of row t%8 of matrix t/8; register
// i holds this thread's pair of matrix i in the mma accumulator layout.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
               :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" :: "l"((uint64_t)map) : "memory");
}

// Shared-memory matrix descriptor: K-major tile, rows of 128 bytes, 128-byte swizzle,
// 8-row groups 1024 bytes apart (SBO), LBO unused for swizzled K-major (set to 1).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across wgmma issue/wait points.
template <int R>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// ---- wgmma m64nNk16, bf16 x bf16 -> f32, A and B from shared memory (generated text) ----
__device__ __forceinline__ void wgmma_m64n16k16(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db), "n"(1));
}

__device__ __forceinline__ void wgmma_m64n32k16(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "n"(1));
}

__device__ __forceinline__ void wgmma_m64n64k16(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "n"(1));
}

__device__ __forceinline__ void wgmma_m64n128k16(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "n"(1));
}

__device__ __forceinline__ void wgmma_m64n192k16(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
      "}, %96, %97, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "l"(da), "l"(db), "n"(1));
}

__device__ __forceinline__ void wgmma_m64n200k16(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %102, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n200k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99"
      "}, %100, %101, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99])
      : "l"(da), "l"(db), "n"(1));
}

__device__ __forceinline__ void wgmma_m64n224k16(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %114, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n224k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
      "}, %112, %113, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
      : "l"(da), "l"(db), "n"(1));
}

__device__ __forceinline__ void wgmma_m64n232k16(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %118, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n232k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115"
      "}, %116, %117, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115])
      : "l"(da), "l"(db), "n"(1));
}

__device__ __forceinline__ void wgmma_m64n256k16(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "n"(1));
}

// m64nWDk16 for the tile's width (BN) or a re-cut piece's (TAILW, TAILW + 8)
template <int WD>
__device__ __forceinline__ void wgmma_w(float* d, uint64_t da, uint64_t db) {
  static_assert(WD == 16 || WD == 32 || WD == 64 || WD == 128 || WD == 192 || WD == 200 ||
                WD == 224 || WD == 232 || WD == 256,
                "BN must be 16, 32, 64, 128, 192, 200, 224 or 256 (TAILW 192 or 224)");
  if constexpr (WD == 16) wgmma_m64n16k16(d, da, db);
  else if constexpr (WD == 32) wgmma_m64n32k16(d, da, db);
  else if constexpr (WD == 64) wgmma_m64n64k16(d, da, db);
  else if constexpr (WD == 128) wgmma_m64n128k16(d, da, db);
  else if constexpr (WD == 192) wgmma_m64n192k16(d, da, db);
  else if constexpr (WD == 200) wgmma_m64n200k16(d, da, db);
  else if constexpr (WD == 224) wgmma_m64n224k16(d, da, db);
  else if constexpr (WD == 232) wgmma_m64n232k16(d, da, db);
  else wgmma_m64n256k16(d, da, db);
}

template <int V> struct IntC { enum { value = V }; };

// Column blocks JB .. JE - 1 of one 64-row slab stored straight from the accumulators, with
// bounds checks (a partial tile; or the columns past the last whole 64-wide group of the staged
// epilogues when the width is not a multiple of 64, e.g. BN = 200 or a 232-wide piece): row is
// this thread's first row, col0 its first column of block 0.
template <int JB, int JE = BN / 8>
__device__ __forceinline__ void store_tail_cols(const float* a, bf16_t* __restrict__ C, int row,
                                                int col0, int M, int N) {
#pragma unroll
  for (int j = JB; j < JE; ++j) {
    const int col = col0 + j * 8;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;
      if (r >= M) continue;
      const float v0 = a[4 * j + 2 * h], v1 = a[4 * j + 2 * h + 1];
      if (col + 1 < N && (N % 2 == 0)) {
        *reinterpret_cast<uint32_t*>(C + (size_t)r * N + col) = pack_bf16x2(v0, v1);
      } else {
        if (col < N) C[(size_t)r * N + col] = float_to_bf16(v0);
        if (col + 1 < N) C[(size_t)r * N + col + 1] = float_to_bf16(v1);
      }
    }
  }
}

__device__ __forceinline__ void tile_coords(int tile, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int group = GROUP_M * tiles_n;
  const int first_m = (tile / group) * GROUP_M;
  const int gm = min(tiles_m - first_m, GROUP_M);
  const int r = tile % group;
  tm = first_m + r % gm;
  tn = r / gm;
}

// TAILW: the last R rows of tiles are cut along N into P pieces each, the first r of them
// TAILW + 8 wide and the rest TAILW (N % 8 == 0: they tile N exactly), dealt out after the
// Tf = (tiles_m - R) * tiles_n whole tiles in the same round robin. With T tiles on G CTAs
// (k = ceil(T / G) waves), the smallest R with Tf <= (k - 1) * G and Tf + R * P <= k * G gives
// every CTA at most k - 1 whole tiles and one piece, or k - 2 and two: its work shrinks from k
// tile widths to (k - 1) * BN + TAILW + 8 (4096^3 at 128x256: R = 8 of 32 rows in 18 pieces, 1000
// columns a CTA instead of 1024). R = 0 where no R fits (plain round robin).
struct Recut { int R, P, r, Tf; };

__device__ __forceinline__ Recut recut_plan(int tiles_m, int tiles_n, int N, int G) {
  Recut rc{0, 1, 0, tiles_m * tiles_n};
#if TAILW
  const int T = tiles_m * tiles_n, k = (T + G - 1) / G, P = N / TAILW, r = (N - P * TAILW) / 8;
  if (T % G != 0 && P > tiles_n && N % 8 == 0 && r <= P) {
    const int rmin = max(1, (T - (k - 1) * G + tiles_n - 1) / tiles_n);
    const int rmax = min(tiles_m, (k * G - T) / (P - tiles_n));
    if (rmin <= rmax) rc = Recut{rmin, P, r, (tiles_m - rmin) * tiles_n};
  }
#endif
  return rc;
}

// Where item u lies: a whole tile (row tm, column tn, first column cs, width code 0: BN) or a
// piece (row tm, first column cs, width code 1: TAILW, 2: TAILW + 8).
__device__ __forceinline__ void place(int u, int tiles_m, int tiles_n, const Recut& rc, int& tm,
                                      int& tn, int& cs, int& wsel) {
#if TAILW
  if (u >= rc.Tf) {
    const int p = (u - rc.Tf) % rc.P;
    tm = tiles_m - rc.R + (u - rc.Tf) / rc.P;
    tn = 0;
    cs = p * TAILW + 8 * min(p, rc.r);
    wsel = p < rc.r ? 2 : 1;
    return;
  }
#endif
  tile_coords(u, tiles_m - rc.R, tiles_n, tm, tn);
  cs = tn * BN;
  wsel = 0;
}

// A consumer warp frees a stage in every CTA of its cluster (their producers multicast into it).
__device__ __forceinline__ void release_stage(uint32_t bar) {
#if CLUSTER > 1
#pragma unroll
  for (uint32_t r = 0; r < CLUSTER; ++r) mbar_arrive_cluster(bar, r);
#else
  mbar_arrive(bar);
#endif
}

// One unit of work: k-tiles [kb, ke) of tile `tile`. Sched::parts/first/me/slot say how the
// tile is shared (recomputed after the main loop rather than kept in registers through it).
struct Work { int tile, kb, ke; };

// The work items of one CTA (cluster), the same sequence for its producer and its consumers.
struct Sched {
  // Which k-tiles of which tile a CTA (cluster) works on next, as a pure function of how many it
  // has had (a stateful "next item" made ptxas move the accumulators to the stack).
  static __device__ __forceinline__ int ncl() { return gridDim.x / CLUSTER; }
  static __device__ __forceinline__ int cid() { return blockIdx.x / CLUSTER; }
  // tiles (split-K: units) below dp_end are whole-tile items dealt out round robin; stream-K
  // keeps all but the last one to two waves so
  static __device__ __forceinline__ int dp_end(int ntiles) {
    if (!STREAMK) return ntiles * SPLITK;
    const int waves = ntiles / ncl();
    if (STREAMK == 2) return waves * ncl();     // only the ragged last wave is shared out
    return (ntiles % ncl() == 0) ? ntiles : (waves >= 2 ? (waves - 1) * ncl() : 0);
  }
  // stream-K: the k-tiles of the remaining tiles, in runs of sk_len per CTA
  static __device__ __forceinline__ int sk_len(int ntiles, int kt_n) {
    return ((ntiles - dp_end(ntiles)) * kt_n + ncl() - 1) / ncl();
  }

  // The item that starts at this CTA's k-tile count `it` (k-tiles it has already been given):
  // nothing but `it`, which the main loops keep anyway, has to live across them.
  static __device__ __forceinline__ bool at(int it, Work& w, int ntiles, int kt_n) {
    const int dp = dp_end(ntiles);
    const int n_dp = PERSIST ? (cid() < dp ? (dp - cid() + ncl() - 1) / ncl() : 0)
                             : (cid() < dp ? 1 : 0);
    const int per = kt_n / SPLITK;      // the space requires K % (BK * SPLITK) == 0
    const int i = it / per;
    if (i < n_dp) {
      const int u = cid() + i * ncl();
      w.tile = u / SPLITK;
      w.kb = (u % SPLITK) * per;
      w.ke = w.kb + per;
      return true;
    }
    if (!STREAMK) return false;
    // This CTA's run is [b, e) of the shared k-tiles (tile-major). The head of its last tile
    // [ls, e) goes first, then [b, ls) in order: every CTA then starts at k = 0 and later runs
    // at a k offset that is the same for all (kt_n - len), so CTAs that share A rows or B
    // columns read the same k slices at about the same time and L2 serves them (in run order,
    // each CTA sat at its own k offset and the operands of the whole tail streamed from HBM).
    const int total = (ntiles - dp) * kt_n, len = sk_len(ntiles, kt_n);
    const int b = min(total, cid() * len), e = min(total, b + len);
    const int s = it - n_dp * per;
    if (b + s >= e) return false;
    const int ls = max(b, (e - 1) / kt_n * kt_n);
    int start, stop;
    if (s < e - ls) {
      start = ls + s;
      stop = e;
    } else {
      start = b + (s - (e - ls));
      stop = ls;
    }
    w.tile = dp + start / kt_n;
    w.kb = start % kt_n;
    w.ke = min(kt_n, w.kb + (stop - start));
    return true;
  }

  // w's tile among the split ones (stream-K: counted from dp_end)
  static __device__ __forceinline__ int t(const Work& w, int ntiles) {
    return STREAMK ? w.tile - dp_end(ntiles) : w.tile;
  }
  // w's tile is computed in parts first .. first + parts - 1
  static __device__ __forceinline__ int first(const Work& w, int ntiles, int kt_n) {
    return STREAMK ? t(w, ntiles) * kt_n / sk_len(ntiles, kt_n) : 0;
  }
  static __device__ __forceinline__ int parts(const Work& w, int ntiles, int kt_n) {
#if STREAMK
    if (w.tile < dp_end(ntiles)) return 1;
    return (t(w, ntiles) * kt_n + kt_n - 1) / sk_len(ntiles, kt_n) - first(w, ntiles, kt_n) + 1;
#else
    return SPLITK;
#endif
  }
  // This CTA's part number of w's tile: stream-K, its CTA (cluster) index; split-K, its K range.
  static __device__ __forceinline__ int me(const Work& w, int kt_n) {
#if STREAMK
    return cid();
#else
    return w.kb / (kt_n / SPLITK);
#endif
  }
  // Workspace slot (partial tile) of part `who` of w's tile. Stream-K: a CTA has at most two
  // split items, the one holding the start of its run (slot 2 * who) and the one holding its
  // end (2 * who + 1).
  static __device__ __forceinline__ int slot(const Work& w, int who, int ntiles, int kt_n) {
#if STREAMK
    return 2 * who + ((who * sk_len(ntiles, kt_n)) / kt_n == t(w, ntiles) ? 0 : 1);
#else
    return w.tile * SPLITK + who;
#endif
  }
};

__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 8, %0;" :: "n"(128 * CONSUMERS) : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_wgmma(const bf16_t* __restrict__ A, const bf16_t* __restrict__ B, bf16_t* __restrict__ C,
           int M, int N, int K, void* workspace,
           const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
           const __grid_constant__ CUtensorMap tmC,     // tmC: used by EPI=2/3 only
           const __grid_constant__ CUtensorMap tmBp) {  // TAILW: B in boxes of TAILW + 8 rows
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sA = base;
  const uint32_t sB = base + STAGES * A_TILE_BYTES;
  const uint32_t bars = sB + STAGES * B_TILE_BYTES;   // full[STAGES], empty[STAGES]
  const uint32_t flag = bars + 16 * STAGES;            // split tiles: "this part came last"
  // EPI staging, per consumer (EPI=2/3: 64x64 boxes, 1024-aligned for the 128-byte swizzle)
  const uint32_t sC = EPI >= 2 ? (flag + 4 + 1023u) & ~1023u : (flag + 4 + 127u) & ~127u;
  (void)flag;
  (void)sC;

  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bars + 8 * s, 1);
      mbar_init(bars + 8 * (STAGES + s), CONSUMERS * 4 * CLUSTER);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
#if CLUSTER > 1
  cluster_sync();
  // The CLUSTER CTAs of a cluster take CLUSTER vertically adjacent tiles (same tn) and share the
  // B tile: each loads 1/CLUSTER of it and multicasts it to all of them.
  const uint32_t crank = cluster_rank();
#else
  __syncthreads();
  const uint32_t crank = 0;
#endif

  // Tiles are counted in cluster units: a unit is CLUSTER tiles stacked along M.
  // Tile rows run over MR (wgmma's M), tile columns over NC: C's rows and columns, or with
  // SWAP its columns and rows (the operands swap roles: B's rows fill the tile rows).
  const int MR = SWAP ? N : M, NC = SWAP ? M : N;
  const CUtensorMap* mapR = SWAP ? &tmB : &tmA;
  const CUtensorMap* mapC = SWAP ? &tmA : &tmB;
  const int tiles_m = (MR + BM * CLUSTER - 1) / (BM * CLUSTER);
  const int tiles_n = (NC + BN - 1) / BN;
  const int ntiles = tiles_m * tiles_n;
  const int kt_n = (K + BK - 1) / BK;
  const Recut rc = recut_plan(tiles_m, tiles_n, NC, Sched::ncl());
  const int nitems = rc.Tf + rc.R * rc.P;   // = ntiles without TAILW (the scheduler's items)
  (void)ntiles;
  Work w;

  if (wg == 0) {
    // ------------------------------------------------------------------ producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(PRODUCER_REGS));
    if (tid == 0) {
      tma_prefetch_desc(&tmA);
      tma_prefetch_desc(&tmB);
      if (EPI >= 2) tma_prefetch_desc(&tmC);
      if (TAILW) tma_prefetch_desc(&tmBp);
      uint32_t it = 0;
      while (Sched::at(it, w, nitems, kt_n)) {
        int tm, tn, cs, wsel;
        place(w.tile, tiles_m, tiles_n, rc, tm, tn, cs, wsel);
        tm = tm * CLUSTER + crank;
        for (int kt = w.kb; kt < w.ke; ++kt, ++it) {
          const uint32_t s = it % STAGES;
          const uint32_t ph = (it / STAGES) & 1;
          mbar_wait(bars + 8 * (STAGES + s), ph ^ 1);
          const uint32_t full = bars + 8 * s;
          // a re-cut piece loads TAILW + 8 rows of B (smem traffic, not only MMAs, sets the pace)
          mbar_expect_tx(full, wsel ? A_TILE_BYTES + KSUB * (TAILW + 8) * 128 : STAGE_BYTES);
#pragma unroll
          for (int j = 0; j < KSUB; ++j) {
            tma_load_2d(sA + s * A_TILE_BYTES + j * A_SUB_BYTES, mapR, full, kt * BK + 64 * j,
                        tm * BM);
#if CLUSTER > 1
            tma_load_2d_mc(sB + s * B_TILE_BYTES + j * B_SUB_BYTES + crank * (B_SUB_BYTES / CLUSTER),
                           mapC, full, kt * BK + 64 * j, cs + crank * (BN / CLUSTER),
                           (uint16_t)((1 << CLUSTER) - 1));
#else
            tma_load_2d(sB + s * B_TILE_BYTES + j * B_SUB_BYTES, wsel ? &tmBp : mapC, full,
                        kt * BK + 64 * j, cs);
#endif
          }
        }
      }
    }
  } else {
    // ------------------------------------------------------------------ consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(CONSUMER_REGS));
    const int c = wg - 1;
    const int warp = tid / 32, lane = tid % 32;
    float acc[MT][BN / 2];
    uint32_t it = 0;
    // (this loop form, and not `while (at(...))`, is the one ptxas keeps the accumulators of
    // every configuration in registers for, without serializing the wgmmas)
    for (bool more = Sched::at(it, w, nitems, kt_n); more; more = Sched::at(it, w, nitems, kt_n)) {
      int tm, tn, cs, wsel;
      place(w.tile, tiles_m, tiles_n, rc, tm, tn, cs, wsel);
      tm = tm * CLUSTER + crank;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[mt][i] = 0.f;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) fence_regs<BN / 2>(acc[mt]);

      uint32_t prev = 0;
      // the k-loop for the item's width: BN, or a re-cut piece's (one copy of the loop each)
      const auto kloop = [&](auto wdc) {
        constexpr int WD = decltype(wdc)::value;
        for (int kt = w.kb; kt < w.ke; ++kt, ++it) {
          const uint32_t s = it % STAGES;
          const uint32_t ph = (it / STAGES) & 1;
          mbar_wait(bars + 8 * s, ph);
          const uint32_t a0 = sA + s * A_TILE_BYTES + c * (WM * 128);
          const uint32_t b0 = sB + s * B_TILE_BYTES;
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < BK / 16; ++kk) {
            const int j = kk / 4, k16 = kk % 4;     // sub-tile, 16-wide step inside it
            const uint64_t db = smem_desc(b0 + j * B_SUB_BYTES + k16 * 32);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
              wgmma_w<WD>(acc[mt], smem_desc(a0 + j * A_SUB_BYTES + mt * (64 * 128) + k16 * 32), db);
          }
          wgmma_commit();
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) fence_regs<BN / 2>(acc[mt]);
          if (kt > w.kb) {
            wgmma_wait<1>();
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) fence_regs<BN / 2>(acc[mt]);
            if (lane == 0) release_stage(bars + 8 * (STAGES + prev));
          }
          prev = s;
        }
      };
#if TAILW
      if (wsel == 1) kloop(IntC<TAILW>{});
      else if (wsel == 2) kloop(IntC<TAILW + 8>{});
      else
#endif
        kloop(IntC<BN>{});
      wgmma_wait<0>();
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) fence_regs<BN / 2>(acc[mt]);
      if (lane == 0) release_stage(bars + 8 * (STAGES + prev));

      const int col0 = cs + (lane % 4) * 2;
#if SPLITK > 1 || STREAMK
      const int parts = Sched::parts(w, ntiles, kt_n);
      if (parts > 1) {
        // ---------------------------------------------------------- a tile in parts
        // Count in first: the part that counts last keeps its accumulators and adds the
        // others' partial tiles once they are stored; the others store and leave.
        const int ctile = tm * tiles_n + tn;
        // workspace: a u32 counter per tile (zero between launches), padded to 256 bytes, then
        // the fp32 partial-tile slots (scratch: always written before they are read)
        const size_t cbytes = ((size_t)tiles_m * CLUSTER * tiles_n * 4 + 255) & ~(size_t)255;
        float4* slots = reinterpret_cast<float4*>(reinterpret_cast<char*>(workspace) + cbytes);
        uint32_t* counter = reinterpret_cast<uint32_t*>(workspace) + ctile;
        const size_t lane_off = (size_t)c * (MT * (BN / 8) * 128) + tid;   // float4 units
        if (threadIdx.x == 128) {
          const uint32_t arrived = atomicAdd(counter, 1u) & 0xFFFFu;
          const uint32_t last = arrived == (uint32_t)(parts - 1);
          asm volatile("st.shared.u32 [%0], %1;" :: "r"(flag), "r"(last) : "memory");
        }
        consumers_sync();
        uint32_t last;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(last) : "r"(flag) : "memory");
        if (!last) {
          float4* dst = slots + (size_t)(Sched::slot(w, Sched::me(w, kt_n), ntiles, kt_n) * CLUSTER + crank) * (BM * BN / 4) +
                        lane_off;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
              __stcg(dst + (size_t)(mt * (BN / 8) + j) * 128,
                     make_float4(acc[mt][4 * j], acc[mt][4 * j + 1], acc[mt][4 * j + 2],
                                 acc[mt][4 * j + 3]));
          __threadfence();
          consumers_sync();   // also: nobody reads `flag` any more
          if (threadIdx.x == 128) atomicAdd(counter, 0x10000u);   // "stored"
          continue;
        }
        if (threadIdx.x == 128) {
          // the others have counted in, so they are running and will store without waiting
          uint32_t v;
          do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
          } while ((v >> 16) != (uint32_t)(parts - 1));
          *counter = 0u;   // every part has been counted: the tile is done with it
        }
        consumers_sync();
        const int me = Sched::me(w, kt_n);
        const int first = Sched::first(w, ntiles, kt_n);
        for (int q = first; q < first + parts; ++q) {
          if (q == me) continue;
          float4* src = slots + (size_t)(Sched::slot(w, q, ntiles, kt_n) * CLUSTER + crank) * (BM * BN / 4) +
                        lane_off;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
              float4* pq = src + (size_t)(mt * (BN / 8) + j) * 128;
              const float4 v = __ldcg(pq);
              acc[mt][4 * j] += v.x;
              acc[mt][4 * j + 1] += v.y;
              acc[mt][4 * j + 2] += v.z;
              acc[mt][4 * j + 3] += v.w;
            }
        }
      }
#endif

      // -------------------------------------------------------------- epilogue
#if SWAP
      // tile rows are C's columns: element (r, col) of the tile is C[col][r]
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int row = tm * BM + c * WM + mt * 64 + warp * 16 + lane / 4;
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
          const int r = row + 8 * ((i / 2) % 2);
          const int col = col0 + (i / 4) * 8 + (i % 2);
          if (r < N && col < M) C[(size_t)col * N + r] = float_to_bf16(acc[mt][i]);
        }
      }
#elif EPI >= 2
      // Boxes of 64 rows x 64 columns (128 bytes, 16-byte chunk q of row r at (q ^ r % 8) * 16,
      // TMA's 128-byte swizzle). EPI=2: box (mt, b) of this consumer at its own offset; EPI=3:
      // EPI_W / 64 boxes reused, so each group waits for the previous group's stores to read.
      // the item's width: BN, or a re-cut piece's (its columns past the last whole box from the
      // registers, like BN = 200 / 224)
      const auto epi = [&](auto wdc) {
        constexpr int WD = decltype(wdc)::value;
        constexpr int BOX = 64 * 64 * 2;
        constexpr int GB = EPI == 2 ? BN / 64 : EPI_W / 64;     // boxes per group
        const uint32_t cbuf = sC + c * (EPI == 2 ? MT * (BN / 64) * BOX : GB * BOX);
        // stmatrix: this thread's row of matrix lane / 8 = (column block +lane/16, half lane/8%2)
        const int r = warp * 16 + 8 * ((lane / 8) % 2) + lane % 8;
        const int jsel = lane / 16;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int g = 0; g < (WD / 64 + GB - 1) / GB; ++g) {
            if (EPI == 3 || (mt == 0 && g == 0)) {
              if (tid == 0) tma_store_wait_read();
              asm volatile("bar.sync %0, 128;" :: "r"(1 + c) : "memory");   // buffer free
            }
#pragma unroll
            for (int bx = 0; bx < GB; ++bx) {
              if (g * GB + bx >= WD / 64) continue;
              const int box = EPI == 2 ? mt * (BN / 64) + g * GB + bx : bx;
              const uint32_t bb = cbuf + box * BOX + r * 128;
#pragma unroll
              for (int jp = 0; jp < 4; ++jp) {          // pairs of 8-column blocks in the box
                const int j = (g * GB + bx) * 8 + 2 * jp;   // column block in the tile
                const int q = 2 * jp + jsel;                // 16-byte chunk in the box row
                stmatrix_x4(bb + ((q ^ (r % 8)) * 16),
                            pack_bf16x2(acc[mt][4 * j], acc[mt][4 * j + 1]),
                            pack_bf16x2(acc[mt][4 * j + 2], acc[mt][4 * j + 3]),
                            pack_bf16x2(acc[mt][4 * j + 4], acc[mt][4 * j + 5]),
                            pack_bf16x2(acc[mt][4 * j + 6], acc[mt][4 * j + 7]));
              }
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // visible to TMA
            asm volatile("bar.sync %0, 128;" :: "r"(1 + c) : "memory");     // buffer full
            if (tid == 0) {
#pragma unroll
              for (int bx = 0; bx < GB; ++bx) {
                if (g * GB + bx >= WD / 64) continue;
                const int box = EPI == 2 ? mt * (BN / 64) + g * GB + bx : bx;
                tma_store_2d(&tmC, cbuf + box * BOX, cs + (g * GB + bx) * 64,
                             tm * BM + c * WM + mt * 64);
              }
              tma_store_commit();
            }
          }
          if constexpr (WD % 64 != 0)   // the columns past the last whole box
            store_tail_cols<WD / 64 * 8, WD / 8>(acc[mt], C,
                                                 tm * BM + c * WM + mt * 64 + warp * 16 + lane / 4,
                                                 col0, M, N);
        }
      };
#if TAILW
      if (wsel == 1) epi(IntC<TAILW>{});
      else if (wsel == 2) epi(IntC<TAILW + 8>{});
      else
#endif
        epi(IntC<BN>{});
#else
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int row = tm * BM + c * WM + mt * 64 + warp * 16 + lane / 4;
        const bool full_tile = (tm + 1) * BM <= M && (tn + 1) * BN <= N && (N % 2 == 0);
#if EPI == 1
        if (full_tile && N % 8 == 0) {
          // 128B-style XOR swizzle of 16-byte chunks by row keeps both the fragment writes and
          // the 16-byte reads free of bank conflicts.
          const uint32_t buf = sC + c * EPI_BUF_BYTES;
          const int r0 = warp * 16 + lane / 4;
#pragma unroll
          for (int h = 0; h < BN / EPI_W; ++h) {
            asm volatile("bar.sync %0, 128;" :: "r"(1 + c) : "memory");   // buffer free
#pragma unroll
            for (int jj = 0; jj < EPI_W / 8; ++jj) {
              const int j = h * (EPI_W / 8) + jj;
#pragma unroll
              for (int hr = 0; hr < 2; ++hr) {
                const int r = r0 + 8 * hr;
                const uint32_t addr = buf + r * (EPI_W * 2) + ((jj ^ (r % 8)) * 16) + 4 * (lane % 4);
                const uint32_t v = pack_bf16x2(acc[mt][4 * j + 2 * hr], acc[mt][4 * j + 2 * hr + 1]);
                asm volatile("st.shared.b32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
              }
            }
            asm volatile("bar.sync %0, 128;" :: "r"(1 + c) : "memory");   // buffer full
            constexpr int QPR = EPI_W / 8;                                  // chunks per row
#pragma unroll
            for (int i = 0; i < 64 * QPR / 128; ++i) {
              const int idx = tid + 128 * i;
              const int r = idx / QPR, q = idx % QPR;
              uint32_t x, y, z, w;
              asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                           : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                           : "r"(buf + r * (EPI_W * 2) + ((q ^ (r % 8)) * 16)) : "memory");
              const int grow = tm * BM + c * WM + mt * 64 + r;
              const int gcol = tn * BN + h * EPI_W + q * 8;
              asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                           :: "l"(C + (size_t)grow * N + gcol), "r"(x), "r"(y), "r"(z), "r"(w)
                           : "memory");
            }
          }
          if (BN % EPI_W != 0) store_tail_cols<BN / EPI_W * EPI_W / 8>(acc[mt], C, row, col0, M, N);
        } else
#endif
        if (full_tile) {
          uint32_t* p0 = reinterpret_cast<uint32_t*>(C + (size_t)row * N + col0);
          uint32_t* p1 = reinterpret_cast<uint32_t*>(C + (size_t)(row + 8) * N + col0);
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            p0[j * 4] = pack_bf16x2(acc[mt][4 * j + 0], acc[mt][4 * j + 1]);
            p1[j * 4] = pack_bf16x2(acc[mt][4 * j + 2], acc[mt][4 * j + 3]);
          }
        } else {
          store_tail_cols<0>(acc[mt], C, row, col0, M, N);   // a partial tile: every column checked
        }
      }
#endif
    }
  }
#if EPI >= 2
  if (wg > 0 && tid == 0) tma_store_wait_all();   // the staging smem must outlive the stores
#endif
#if CLUSTER > 1
  // No CTA may leave while its peers can still multicast into it or arrive on its barriers.
  cluster_sync();
#endif
}
