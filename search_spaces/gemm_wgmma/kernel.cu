// gemm_wgmma: bf16 GEMM for Hopper (sm_90a). C[M,N] = A[M,K] * B[N,K]^T, fp32 accumulation.
// DTYPE=1 (the gemm_wgmma_f16 variant of space.toml: op gemm_f16) makes A, B and C fp16: the
// MMAs become .f16 ones and the epilogues convert to fp16; nothing else changes.
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
// through C's tensor map) while the consumers go on to their next tile's MMAs (a width 24 or
// more columns past a multiple of 64 ends in a box that overlaps the one before it). EPI=2
// stages the whole tile (BM x NBOX boxes), so its stores are only waited for before the next
// tile's epilogue; EPI=3 reuses one 64 x EPI_W buffer per consumer (the smem of EPI=1, more stages).
// EPI=4: EPI=3's buffer, but each warp stores its own 16 rows of a box by TMA (C's tensor map
// has 16-row boxes), with no barrier across the warpgroup: the buffer's EPI_W / 64 boxes are a
// ring of slices a warp writes again once its own store from that slice has read it.
// EPI=5 (one whole-K tile per CTA: PERSIST=0, SPLITK=1): EPI=2's whole tile staged at once, in
// the consumer's own rows of the stage ring's A tiles, free once its last MMAs have retired
// (nothing more is loaded there and no other consumer reads them), so no smem is set aside for
// the epilogue and a tile takes one stage more (128x200 in clusters of 4: 5 stages, as cuBLAS).
// CLUSTER=2/4: two or four CTAs on vertically adjacent tiles share the B tile; each loads its
// share of it and multicasts it into all, and each consumer warp frees a stage in all of them.
// PERSIST=1: grid of at most one CTA per SM striding over tiles, so the producer prefetches the
// next tile while the consumers run their epilogue. Tiles are rastered in groups of GROUP_M rows.
// PINGPONG=1 (persistent): the two consumers take a CTA's work items in turn, each a whole
// BM x BN tile (BM = 64 or 128). A consumer starts its k-loop when the other's has taken its
// last stage (named barriers 3 and 4), so its MMAs run while the other stores its tile.
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
// Built on porter's Hopper tile primitives (porter/include/hopper/): the stage ring and its
// barriers (pipeline.cuh), TMA (tma.cuh), the wgmma mainloop step (wgmma.cuh), the work items
// (tile_scheduler.cuh), the sums of tiles in parts (tile_reduce.cuh) and the epilogues
// (epilogue.cuh); what is left here is the GEMM's own: tile shapes, the re-cut last rows, and
// which mainloop and epilogue each item takes.
#include "porter.cuh"
#include "hopper/hopper.cuh"

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
#endif             // 2: stmatrix into smem, TMA store, whole tile; 3: the same, 64 x EPI_W at a time;
                   // 4: as 3, each warp storing its own 16 rows; 5: as 2, staged in the ring
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
#if CLUSTER != 1 && CLUSTER != 2 && CLUSTER != 4
#error "CLUSTER must be 1, 2 or 4"
#endif
#ifndef DTYPE
#define DTYPE 0        // the element type of A, B and C: 0 bf16, 1 fp16
#endif
#if DTYPE != 0 && DTYPE != 1
#error "DTYPE must be 0 (bf16) or 1 (fp16)"
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
// CLUSTER > 1: each CTA multicasts MC_ROWS rows of B, whole 8-row swizzle atoms (a TMA box
// swizzled 128 bytes lands 1024-aligned); where BN / CLUSTER is not a multiple of 8 the last
// CTA's box runs past the tile, so the B tile in smem is CLUSTER * MC_ROWS rows (256 x 152 in
// clusters of 2: 80 + 80 rows for 152, the last 8 unused)
#define MC_ROWS ((BN / CLUSTER + 7) / 8 * 8)
#define BN_SMEM (CLUSTER > 1 ? CLUSTER * MC_ROWS : BN)
#define B_SUB_BYTES (BN_SMEM * 128)
#if BK != 64 && BK != 128
#error "BK must be 64 or 128"
#endif

#ifndef RELEASE
#define RELEASE 0      // 1: each k-tile's MMAs issued in two halves, the previous stage freed
#endif                 // between them (cuBLAS's order) instead of after all of them
#ifndef PINGPONG
#define PINGPONG 0     // 1 (persistent, 2 consumers): each consumer takes every other work item
#endif                 // whole (BM rows), so one's epilogue runs beside the other's MMAs
#if PINGPONG && (CONSUMERS != 2 || !PERSIST || SPLITK != 1 || STREAMK || TAILW || SWAP || EPI == 2)
#error "PINGPONG needs CONSUMERS=2, PERSIST=1, no SPLITK, STREAMK, TAILW or SWAP, EPI != 2"
#endif

#define THREADS (128 * (CONSUMERS + 1))
#define WM (PINGPONG ? BM : BM / CONSUMERS)   // rows per consumer warpgroup (of its own item)
#define WROW(c) (PINGPONG ? 0 : (c) * WM)     // its first row in the tile
#define MT (WM / 64)                 // m64 wgmma tiles per consumer
#define A_TILE_BYTES (BM * BK * 2)
#define B_TILE_BYTES (BN_SMEM * BK * 2)
#define STAGE_BYTES (A_TILE_BYTES + B_TILE_BYTES)

#if WM % 64 != 0
#error "BM / CONSUMERS must be a multiple of 64"
#endif

#if CONSUMERS == 1
#define CONSUMER_REGS 240
#elif CONSUMERS == 2
#define CONSUMER_REGS 232
#else                                // 3 (192-row tiles): 128 x (40 + 3 x 152) <= 65536
#define CONSUMER_REGS 152
#endif
#define PRODUCER_REGS 40

// EPI=1: each consumer stages 64 rows x EPI_W columns of bf16 at a time in its own smem buffer
#define EPI_W ((BN % 128 == 0) ? 128 : 64)
#define EPI_BUF_BYTES (64 * EPI_W * 2)
#ifndef EPI_OVERLAP_MIN
#define EPI_OVERLAP_MIN 24           // EPI=2/3: a width with at least this many columns past its
#endif                               // last whole box stores them in an overlapping box, else
                                     // from the registers (H200: 2-5 % faster at 40-56 columns,
                                     // ~1 % slower at 8-16; gemm_probe_overlap_h200.json)
// 64-column boxes a width w takes (its last one overlapping where that stores the remainder)
#define NBOX_OF(w) ((w) % 64 >= EPI_OVERLAP_MIN ? ((w) + 63) / 64 : (w) / 64)
#define NBOX NBOX_OF(BN)             // boxes a slab takes
#if EPI >= 2 && (BN < 64 || SWAP)
#error "EPI=2/3/4/5 store 64-column boxes (the last one may overlap the one before): BN >= 64, no SWAP"
#endif
#if EPI == 5 && (PERSIST || SPLITK != 1 || NBOX > STAGES * KSUB)
#error "EPI=5 needs PERSIST=0, SPLITK=1 and a box of the ring's A rows per box of a slab"
#endif

using namespace hopper;
#if DTYPE == 1
typedef f16_elem Elem;   // MMA and epilogue conversions (porter.cuh, wgmma.cuh)
#else
typedef bf16_elem Elem;
#endif
using Sched = TileScheduler<CLUSTER, PERSIST, SPLITK, STREAMK>;

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
  raster_grouped<GROUP_M>(u, tiles_m - rc.R, tiles_n, tm, tn);
  cs = tn * BN;
  wsel = 0;
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_wgmma(const uint16_t* __restrict__ A, const uint16_t* __restrict__ B, uint16_t* __restrict__ C,
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
  const Pipeline<STAGES> ring(bars);

  // the warpgroup, read from lane 0 so that ptxas knows it warp-uniform: what is computed from
  // it (the consumer's rows, its MMA descriptors) stays in uniform registers
  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
  const int tid = threadIdx.x % 128;
  TRACE_START(threadIdx.x == 0);   // DEV_TRACE=1 only (hopper/trace.cuh): the phases' timeline

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
#if CLUSTER > 1
  // The CLUSTER CTAs of a cluster take CLUSTER vertically adjacent tiles (same tn) and share the
  // B tile: each loads 1/CLUSTER of it and multicasts it to all of them.
  const uint32_t crank = cluster_rank();
#else
  const uint32_t crank = 0;
#endif
  // The tensor maps' descriptors fetched at entry, so that their fetch overlaps the barriers'
  // set-up and the start barrier instead of delaying the first load after it (+0.3 to +0.8 %
  // at 1000x3000x1000 and 1536^3, nothing lost at 4096^3: H100, two passes in one process,
  // gemm_probe_early_prefetch_h100.json)
  if (threadIdx.x == 0) {
    tma::prefetch_desc(&tmA);
    tma::prefetch_desc(&tmB);
    if (EPI >= 2) tma::prefetch_desc(&tmC);
    if (TAILW) tma::prefetch_desc(&tmBp);
  }
  Work w;
  // The producer's first item, worked out before the barrier below: its ~0.3 us of integer
  // division would otherwise delay the first load (gemm_trace.py); the empty asm keeps the
  // compiler from moving the arithmetic past the barrier.
  Work w0;
  bool first = false;
  int tm0 = 0, tn0 = 0, cs0 = 0, ws0 = 0;
  if (threadIdx.x == 0) {
    first = Sched::at(0, w0, nitems, kt_n);
    place(w0.tile, tiles_m, tiles_n, rc, tm0, tn0, cs0, ws0);
    tm0 = tm0 * CLUSTER + crank;
    asm volatile("" : "+r"(tm0), "+r"(cs0), "+r"(ws0), "+r"(w0.kb));
  }

  if (threadIdx.x == 0) {
    // every consumer warp of the cluster frees a stage (PINGPONG: those of the one reading it)
    ring.init((PINGPONG ? 1 : CONSUMERS) * 4 * CLUSTER);
    fence_barrier_init();
  }
#if CLUSTER > 1
  // a relaxed arrive: +1.6 to +2.5 % at 1000-1536 in clusters, nothing lost at 3000x5000x1000
  // or 4096^3 (H100, same process; gemm_probe_relaxed_start_h100.json)
  cluster_sync_relaxed();
#else
  __syncthreads();
#endif
  TRACE(threadIdx.x == 0, 16);   // barriers ready

  if (wg == 0) {
    // ------------------------------------------------------------------ producer
    // k-tile kt of the item at (tm, cs) (wsel: its width) into the ring's stage `it`
    const auto issue = [&](uint32_t it, int kt, int tm, int cs, int wsel) {
      const auto st = Cursor<STAGES>::at(it);
      ring.acquire(st);
      TRACE(it == 0, 19);
      // a re-cut piece loads TAILW + 8 rows of B (smem traffic, not only MMAs, sets the pace)
      const uint32_t full =
          ring.commit(st, wsel ? A_TILE_BYTES + KSUB * (TAILW + 8) * 128 : STAGE_BYTES);
#pragma unroll
      for (int j = 0; j < KSUB; ++j) {
        tma::load_2d(sA + st.stage * A_TILE_BYTES + j * A_SUB_BYTES, mapR, full,
                     kt * BK + 64 * j, tm * BM);
#if CLUSTER > 1
        tma::load_2d_mc(sB + st.stage * B_TILE_BYTES + j * B_SUB_BYTES + crank * (MC_ROWS * 128),
                        mapC, full, kt * BK + 64 * j, cs + crank * MC_ROWS,
                        (uint16_t)((1 << CLUSTER) - 1));
#else
        tma::load_2d(sB + st.stage * B_TILE_BYTES + j * B_SUB_BYTES, wsel ? &tmBp : mapC, full,
                     kt * BK + 64 * j, cs);
#endif
      }
      TRACE(it == 0, 1);   // the first stage's loads issued
    };
    // The first stage goes out before the warpgroup hands its registers to the consumers
    // (setmaxnreg waits for all four warps: ~0.15 us that would delay the first load). With the
    // first item worked out before the barrier: +0.5 to +2.8 % at 1000-2048 (H100, same
    // process; gemm_probe_first_load_h100.json), nothing lost at 4096^3.
    uint32_t it = 0;   // k-tiles issued
    if (tid == 0) {
      TRACE(true, 17);
      TRACE(true, 18);   // (17 to 18 bracketed the descriptors' prefetch, now at entry)
      if (first) issue(it++, w0.kb, tm0, cs0, ws0);
    }
    __syncwarp();
    warpgroup::shrink_regs<PRODUCER_REGS>();
    if (tid == 0) {
      uint32_t done = it;   // k-tiles of the current item issued before the loop
      while (Sched::at(it - done, w, nitems, kt_n)) {
        int tm, tn, cs, wsel;
        place(w.tile, tiles_m, tiles_n, rc, tm, tn, cs, wsel);
        tm = tm * CLUSTER + crank;
        for (int kt = w.kb + (int)done; kt < w.ke; ++kt) issue(it++, kt, tm, cs, wsel);
        done = 0;
      }
      TRACE(true, 14);         // every load issued
#if CLUSTER > 1
      // every stage freed by every consumer of the cluster: nothing of the peers' reaches this
      // CTA any more, so it may leave without a cluster barrier (its consumers keep the CTA
      // while they store). A barrier at exit cost 1-5 % at K = 1000 (H100,
      // gemm_trace_exit_h100.json).
      ring.drain(it);
      TRACE(true, 24);
#endif
    }
  } else {
    // ------------------------------------------------------------------ consumers
    warpgroup::grow_regs<CONSUMER_REGS>();
    const int c = wg - 1;
    TRACE(tid == 0 && c == 0, 20);
    const int warp = tid / 32, lane = tid % 32;
    float acc[MT][BN / 2];
    const auto fence_acc = [&]() {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) wgmma::fence_regs<BN / 2>(acc[mt]);
    };
    uint32_t it = 0;
#if PINGPONG
    PingPong<3> turns;   // consumer c takes the CTA's items of parity c
#endif
    uint32_t ebox = 0;   // EPI=4: boxes this warp has stored (its slice ring's position)
    (void)ebox;
    int ntr = 0;         // DEV_TRACE: items this consumer has finished
    (void)ntr;
    // (this loop form, and not `while (at(...))`, is the one ptxas keeps the accumulators of
    // every configuration in registers for, without serializing the wgmmas)
    for (bool more = Sched::at(it, w, nitems, kt_n); more; more = Sched::at(it, w, nitems, kt_n)) {
#if PINGPONG
      if (!turns.take(c)) {   // the other's item: its k-tiles pass by (it frees their stages)
        it += w.ke - w.kb;
        continue;
      }
#endif
      int tm, tn, cs, wsel;
      place(w.tile, tiles_m, tiles_n, rc, tm, tn, cs, wsel);
      tm = tm * CLUSTER + crank;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[mt][i] = 0.f;
      fence_acc();

      Cursor<STAGES> prev;
      // the k-loop for the item's width: BN, or a re-cut piece's (one copy of the loop each)
      const auto kloop = [&](auto wdc) {
        constexpr int WD = decltype(wdc)::value;
        for (int kt = w.kb; kt < w.ke; ++kt, ++it) {
          const auto st = Cursor<STAGES>::at(it);
          ring.wait(st);
          TRACE(tid == 0 && kt == w.kb && c < 2 && ntr == 0, 2 + 3 * c);   // first data in
          TRACE(tid == 0 && kt == w.kb && c == 0, 15);                     // (of its last item)
          TRACE(tid == 0 && kt == w.kb + 1 && c == 0 && ntr == 0, 21);     // the second k-tile's
          TRACE(tid == 0 && kt == w.kb + STAGES && c == 0 && ntr == 0, 22);  // first refill's
          TRACE(tid == 0 && kt == w.ke - 1 && c == 0 && ntr == 0, 23);     // the last k-tile's
          wgmma::fence();
          const uint32_t a0 = sA + st.stage * A_TILE_BYTES + WROW(c) * 128;
          const uint32_t b0 = sB + st.stage * B_TILE_BYTES;
#if RELEASE
          // the k-tile's MMAs in two halves (its m64 tiles' halves, or with one tile its k16
          // steps' halves), the previous stage freed between them: once the first half is
          // queued, the wait is only for the previous k-tile's MMAs
          constexpr int HMT = MT >= 2 ? MT / 2 : 1;
          constexpr int HKS = MT >= 2 ? BK / 16 : BK / 32;
          constexpr uint32_t A2 = MT >= 2 ? HMT * 64 * 128 : (HKS / 4) * A_SUB_BYTES + (HKS % 4) * 32;
          constexpr uint32_t B2 = MT >= 2 ? 0 : (HKS / 4) * B_SUB_BYTES + (HKS % 4) * 32;
          wgmma::mma_ss_k_tiles<WD, HKS, HMT, Elem>(acc, a0, 64 * 128, A_SUB_BYTES, b0, B_SUB_BYTES);
#else
          wgmma::mma_ss_k_tiles<WD, BK / 16, MT, Elem>(acc, a0, 64 * 128, A_SUB_BYTES, b0,
                                                       B_SUB_BYTES);
#endif
          wgmma::commit();
          fence_acc();
          if (kt > w.kb) {   // the previous stage's MMAs have retired: free it
            wgmma::wait<1>();
            fence_acc();
            if (lane == 0) ring.release_cluster<CLUSTER>(prev);
          }
#if RELEASE
          wgmma::fence();
          wgmma::mma_ss_k_tiles<WD, HKS, HMT, Elem>(acc + (MT >= 2 ? HMT : 0), a0 + A2, 64 * 128,
                                                    A_SUB_BYTES, b0 + B2, B_SUB_BYTES);
          wgmma::commit();
          fence_acc();
#endif
          prev = st;
        }
      };
#if TAILW
      if (wsel == 1) kloop(IntC<TAILW>{});
      else if (wsel == 2) kloop(IntC<TAILW + 8>{});
      else
#endif
        kloop(IntC<BN>{});
#if PINGPONG
      {   // the next item, the other consumer's, may start its k-loop
        Work nx;
        PingPong<3>::pass(c, Sched::at(it, nx, nitems, kt_n));
      }
#endif
      wgmma::wait<0>();
      fence_acc();
      if (lane == 0) ring.release_cluster<CLUSTER>(prev);
      TRACE(tid == 0 && c < 2 && ntr == 0, 3 + 3 * c);   // k-loop done
      TRACE(tid == 0 && c == 0, 8);                      // (its last item's)

      const int col0 = cs + (lane % 4) * 2;
#if SPLITK > 1 || STREAMK
      const int parts = Sched::parts(w, ntiles, kt_n);
      if (parts > 1) {
        // a tile in parts (tile_reduce.cuh's fix_up): all but the part that counts in last
        // store theirs and go on to their next item
        using Reduce = TileReduce<MT, BN / 2, 128, 8, 128 * CONSUMERS>;
        uint32_t* counter = Reduce::counter(workspace, tm * tiles_n + tn);
        float4* slots = Reduce::slots(workspace, (size_t)tiles_m * CLUSTER * tiles_n);
        const size_t lane_off = (size_t)c * (MT * (BN / 8) * 128) + tid;   // float4 units
        const auto at = [&](int s) {   // this thread's first float4 in slot s
          return slots + (size_t)(s * CLUSTER + crank) * (BM * BN / 4) + lane_off;
        };
        if (!Reduce::fix_up<Sched>(counter, at, parts, w, ntiles, kt_n, acc, flag)) continue;
      }
#endif

      // -------------------------------------------------------------- epilogue
#if SWAP
      // tile rows are C's columns: element (r, col) of the tile is C[col][r]
      const int row0 = tm * BM + WROW(c);   // the consumer's first row
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int row = row0 + mt * 64 + warp * 16 + lane / 4;
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
          const int r = row + 8 * ((i / 2) % 2);
          const int col = col0 + (i / 4) * 8 + (i % 2);
          if (r < N && col < M) C[(size_t)col * N + r] = Elem::from_float(acc[mt][i]);
        }
      }
#elif EPI >= 2
      // Boxes of 64 rows x 64 columns (128 bytes, 16-byte chunk q of row r at (q ^ r % 8) * 16,
      // TMA's 128-byte swizzle). EPI=2: box (mt, b) of this consumer at its own offset; EPI=3:
      // EPI_W / 64 boxes reused, so each group waits for the previous group's stores to read;
      // EPI=5: as EPI=2, box i in this consumer's 64-row slab i % MT of the ring's A sub-tile
      // i / MT (stage by stage): rows only its own MMAs read, all retired (wait<0> above).
      // The item's width: BN, or a re-cut piece's. A width EPI_OVERLAP_MIN or more columns past
      // a multiple of 64 takes one more box, its last 64 columns (WD - 64 .. WD - 1): it
      // overlaps the box before it and writes the same values there again (thread stores of
      // 40-56 columns cost more than the extra bytes); fewer columns go from the registers.
      const auto epi = [&](auto wdc) {
        constexpr int WD = decltype(wdc)::value;
        constexpr int BOX = 64 * 64 * 2;
        constexpr int NB = NBOX_OF(WD);                           // boxes
        constexpr bool WHOLE = EPI == 2 || EPI == 5;              // the whole tile staged
        constexpr int GB = WHOLE ? NBOX : EPI_W / 64;             // boxes per group
        const uint32_t cbuf = sC + c * (WHOLE ? MT * NBOX * BOX : GB * BOX);
        const auto box_at = [&](int i) -> uint32_t {
          if constexpr (EPI == 5)
            return sA + (i / MT / KSUB) * A_TILE_BYTES + (i / MT % KSUB) * A_SUB_BYTES +
                   (WROW(c) + 64 * (i % MT)) * 128;
          return cbuf + i * BOX;
        };
        // stmatrix: this thread's row of matrix lane / 8 = (column block +lane/16, half lane/8%2)
        const int r = warp * 16 + 8 * ((lane / 8) % 2) + lane % 8;
        const int jsel = lane / 16;
        // box b's first column in the item: whole boxes, then the overlapping last one
        const auto bcol = [](int b) { return b < WD / 64 ? 64 * b : WD - 64; };
        // the last columns of slab mt that no box covers: from registers
        const auto last_cols = [&](int mt) {
          if constexpr (NB * 64 < WD)
            epi::store_cols<WD / 64 * 8, WD / 8, Elem>(
                acc[mt], C, tm * BM + WROW(c) + mt * 64 + warp * 16 + lane / 4, col0, M, N);
        };
#if EPI == 4
        // this warp's 16 rows of each box, 2 KB at warp * 2048 in a slice of the ring; its lane 0
        // waits for its own store from that slice GB boxes ago to have read it, and stores it
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int b = 0; b < NB; ++b, ++ebox) {
            const uint32_t slice = cbuf + (ebox % GB) * BOX;
            if (lane == 0) tma::store_wait_read<GB - 1>();
            __syncwarp();
            epi::stmatrix_box_sw128<Elem>(slice + r * 128, r, jsel, acc[mt], bcol(b) / 8);
            fence_proxy_async();      // visible to TMA
            __syncwarp();
            if (lane == 0) {
              tma::store_2d(&tmC, slice + warp * 2048, cs + bcol(b),
                            tm * BM + WROW(c) + mt * 64 + warp * 16);
              tma::store_commit();
            }
          }
          last_cols(mt);
        }
#else
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int g = 0; g < (NB + GB - 1) / GB; ++g) {
            if (EPI == 3 || (mt == 0 && g == 0)) {
              if (tid == 0) tma::store_wait_read();
              named_sync(1 + c, 128);   // buffer free
            }
#pragma unroll
            for (int bx = 0; bx < GB; ++bx) {
              if (g * GB + bx >= NB) continue;
              const int box = WHOLE ? mt * NBOX + g * GB + bx : bx;
              epi::stmatrix_box_sw128<Elem>(box_at(box) + r * 128, r, jsel, acc[mt],
                                            bcol(g * GB + bx) / 8);
            }
            fence_proxy_async();      // visible to TMA
            named_sync(1 + c, 128);   // buffer full
            if (tid == 0) {
#pragma unroll
              for (int bx = 0; bx < GB; ++bx) {
                if (g * GB + bx >= NB) continue;
                const int box = WHOLE ? mt * NBOX + g * GB + bx : bx;
                tma::store_2d(&tmC, box_at(box), cs + bcol(g * GB + bx),
                              tm * BM + WROW(c) + mt * 64);
              }
              tma::store_commit();
            }
          }
          last_cols(mt);
        }
#endif
      };
#if TAILW
      if (wsel == 1) epi(IntC<TAILW>{});
      else if (wsel == 2) epi(IntC<TAILW + 8>{});
      else
#endif
        epi(IntC<BN>{});
#else
      const int row0 = tm * BM + WROW(c);   // the consumer's first row
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int row = row0 + mt * 64 + warp * 16 + lane / 4;
        const bool full_tile = (tm + 1) * BM <= M && (tn + 1) * BN <= N && (N % 2 == 0);
#if EPI == 1
        if (full_tile && N % 8 == 0)
          epi::store_staged<EPI_W, BN, Elem>(acc[mt], C, sC + c * EPI_BUF_BYTES, 1 + c, tid,
                                             row0 + mt * 64, tn * BN, row, col0, M, N);
        else
#endif
        if (full_tile) epi::store_pairs<BN / 8, Elem>(acc[mt], C, row, col0, N);
        else epi::store_cols<0, BN / 8, Elem>(acc[mt], C, row, col0, M, N);   // all checked
      }
#endif
      TRACE(tid == 0 && c < 2 && ntr == 0, 4 + 3 * c);   // epilogue issued
      TRACE(tid == 0 && c == 0, 9);                      // (its last item's)
      ++ntr;
    }
    TRACE_VAL(tid == 0 && c == 0, 12, ntr);
  }
#if EPI >= 2
  // the staging smem must outlive the stores (EPI=4: every warp's lane 0 issued some)
  if (wg > 0 && (EPI == 4 ? tid % 32 == 0 : tid == 0)) tma::store_wait_all();
#endif
  TRACE(wg == 1 && tid == 0, 10);   // its stores done
  TRACE(threadIdx.x == 0, 11);
  TRACE_VAL(threadIdx.x == 0, 13, trace_smid());
  TRACE_FLUSH(tid == 0);
}
