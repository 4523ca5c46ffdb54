// gemm_fp8: fp8 GEMM for Hopper (sm_90a). C[M,N] = (sa * A[M,K]) (sb * B[N,K])^T in bf16, A and B
// e4m3 (FP8_A / FP8_B = 1: e5m2), fp32 accumulation. Scales (fp32, `scaling` at run time):
//   1: per tensor, scale_a[0] * scale_b[0];  2: per row of A (scale_a[M]) and column of B
//   (scale_b[N]), applied to the fp32 accumulators before the conversion to bf16.
//
// The structure is gemm_wgmma's, on the same primitives (porter/include/hopper/): warpgroup 0
// produces (one thread issues TMA loads of A and B into a STAGES-deep ring of 128-byte-swizzled
// stages, pipeline.cuh), warpgroups 1..CONSUMERS each own BM / CONSUMERS rows of the BM x BN tile
// and issue wgmma.mma_async m64nBNk32 from shared memory (wgmma_fp8.cuh); setmaxnreg moves
// registers from the producer to the consumers; a persistent grid strides over the tiles in
// groups of GROUP_M rows (tile_scheduler.cuh), optionally sharing B in clusters of 2 by
// multicast, or dealing the ragged last waves out as runs of k-tiles (stream-K, tile_reduce.cuh).
// fp8 differs in three places:
//   - a 128-byte swizzle row holds 128 fp8, so a k-tile (one TMA box per operand) is 128 wide
//     and takes four k32 MMAs; the descriptors are bf16's K-major 128B ones (wgmma.cuh).
//   - promotion: fp8 wgmma adds its products into the accumulator with reduced precision, so
//     over a long K the error grows. PROMOTE = P > 0 runs the MMAs of P k-tiles into a second
//     set of registers (the first MMA overwriting it) and adds that set into the fp32
//     accumulators every P k-tiles (P * 128 products at a time). It costs the second set of
//     accumulators and a wait for the MMAs to retire every P k-tiles. PROMOTE = 0 accumulates
//     in the wgmma accumulator throughout (the counterpart of cuBLASLt's fast accumulation).
//     PSETS = 2 (with P = 1) keeps two such sets, two k-tiles in flight, and adds one while the
//     other's MMAs run, so that the pipe waits for one addition in four k-tiles, not every one.
//     PSPLIT = 2 makes the set half the tile's width: the MMAs of each interval's P k-tiles go
//     in two column halves, each waited for and added on its own, so that a 128 x 256 tile can
//     be promoted (128 + 64 accumulators a thread where a full set would need 256).
//   - the epilogue scales the accumulators (per tensor, or by row and column) before
//     converting them; EPI=3 then stores 64 x 64 boxes by TMA (stmatrix into TMA's swizzle),
//     EPI=0 straight from the registers. EARLY_SCALES=1 loads a tile's row and column scales
//     before its k-loop instead of after it.
// ORDERED=1 makes the two consumers issue each k-tile's MMAs in turn (named barriers 5 and 6),
// so that with promotion one adds its sums while the other's MMAs run.
// PINGPONG=1 (2 consumers): the consumers take a CTA's tiles in turn, each a whole BM x BN tile,
// so that one's epilogue runs beside the other's MMAs (gemm_wgmma's PINGPONG; named barriers 3
// and 4 start a consumer's k-loop only once the other has waited for every k-tile before).
#include "porter.cuh"
#include "hopper/hopper.cuh"

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
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
#ifndef CLUSTER
#define CLUSTER 1
#endif
#ifndef EPI
#define EPI 3          // 3: stmatrix into 64 x 64 smem boxes, TMA store; 0: stores from registers
#endif
#ifndef STREAMK
#define STREAMK 0      // 1: the last one to two waves shared out as runs of k-tiles; 2: the last
#endif                 // ragged wave only (partial tiles summed in the workspace)
#ifndef PROMOTE
#define PROMOTE 0      // > 0: k-tiles accumulated by the MMAs before they are added in fp32
#endif
#ifndef EARLY_SCALES
#define EARLY_SCALES 0 // 1: per-row/column scales loaded before the k-loop (their latency under the
#endif                 // MMAs, 2 + BN / 32 registers held through it); 0: in the epilogue
#ifndef ORDERED
#define ORDERED 0      // 1 (2 consumers): the consumers issue each k-tile's MMAs in turn, so with
#endif             // promotion one adds its sums while the other's MMAs run
#if ORDERED && CONSUMERS != 2
#error "ORDERED needs CONSUMERS=2"
#endif
#ifndef PINGPONG
#define PINGPONG 0     // 1 (2 consumers, no stream-K or ORDERED): each consumer takes every
#endif                 // other tile of the CTA, whole
#if PINGPONG && (CONSUMERS != 2 || STREAMK || ORDERED)
#error "PINGPONG needs CONSUMERS=2, STREAMK=0 and ORDERED=0"
#endif
#ifndef PSETS
#define PSETS 1        // 2 (PROMOTE=1): two sets of partial sums in turn, so that one k-tile's sums
#endif                 // are added while the next k-tile's MMAs run into the other
#if PSETS != 1 && (PSETS != 2 || PROMOTE != 1 || ORDERED)
#error "PSETS must be 1, or 2 with PROMOTE=1 and ORDERED=0"
#endif
#ifndef PSPLIT
#define PSPLIT 1       // 2 (PROMOTE > 0, PSETS=1): the promotion set holds half the tile's columns,
#endif                 // each interval's MMAs issued and added in two column halves
#if PSPLIT != 1 && (PSPLIT != 2 || !PROMOTE || PSETS != 1 || ORDERED || BN % 32 != 0 || \
                    STAGES <= PROMOTE)
#error "PSPLIT must be 1, or 2 with PROMOTE > 0, PSETS=1, ORDERED=0, BN % 32 == 0, STAGES > PROMOTE"
#endif
#define PART_N (BN / PSPLIT)           // the promotion set's columns
#ifndef FP8_A
#define FP8_A 0        // 0: e4m3, 1: e5m2
#endif
#ifndef FP8_B
#define FP8_B 0
#endif
#if CLUSTER != 1 && CLUSTER != 2
#error "CLUSTER must be 1 or 2"
#endif
#if EPI != 0 && EPI != 3
#error "EPI must be 0 or 3"
#endif

#define BK 128                        // fp8 along K per stage: one 128-byte swizzle row
#define THREADS (128 * (CONSUMERS + 1))
#define WM (PINGPONG ? BM : BM / CONSUMERS)   // rows per consumer warpgroup (of its own tile)
#define WROW(c) (PINGPONG ? 0 : (c) * WM)     // its first row in the tile
#define MT (WM / 64)                  // m64 wgmma tiles per consumer
#define A_TILE_BYTES (BM * BK)
#define B_TILE_BYTES (BN * BK)
#define STAGE_BYTES (A_TILE_BYTES + B_TILE_BYTES)
#if WM % 64 != 0
#error "BM / CONSUMERS must be a multiple of 64"
#endif
#if BN % 16 != 0
#error "BN must be a multiple of 16"
#endif
#if EPI == 3 && BN < 64
#error "EPI=3 stores 64-column boxes: BN must be at least 64 (EPI=0 takes any BN)"
#endif
#define SBV ((BN + 31) / 32)           // per-column scales: one per lane and 32-column block

#if CONSUMERS == 1
#define CONSUMER_REGS 240
#define PRODUCER_REGS 40
#elif PSETS == 2
#define CONSUMER_REGS 240             // three accumulator sets: the producer keeps only 24
#define PRODUCER_REGS 24              // (128 x 24 + 256 x 240 = 168 x 384, the launch's)
#else
#define CONSUMER_REGS 232
#define PRODUCER_REGS 40
#endif

// EPI=3: each consumer stages 64 rows x EPI_W columns (EPI_W / 64 boxes) at a time
#define EPI_W ((BN % 128 == 0) ? 128 : 64)
// EPI=3 with BN not a multiple of 64: a remainder of EPI_OVERLAP_MIN or more columns is stored
// in one more box placed at the tile's last 64 columns (it overlaps the box before it and writes
// the same values there again); a smaller one from the registers (gemm_wgmma's rule, from its
// H200 probes: 2-5 % faster at 40-56 columns, ~1 % slower at 8-16)
#ifndef EPI_OVERLAP_MIN
#define EPI_OVERLAP_MIN 24
#endif
#define NBOX (BN % 64 >= EPI_OVERLAP_MIN ? (BN + 63) / 64 : BN / 64)

using namespace hopper;
using Sched = TileScheduler<CLUSTER, 1, 1, STREAMK>;

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_fp8(const uint8_t* __restrict__ A, const uint8_t* __restrict__ B, bf16_t* __restrict__ C,
         const float* __restrict__ scale_a, const float* __restrict__ scale_b, int M, int N,
         int K, int scaling, void* workspace,
         const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
         const __grid_constant__ CUtensorMap tmC) {   // tmC: used by EPI=3 only
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sA = base;
  const uint32_t sB = base + STAGES * A_TILE_BYTES;
  const uint32_t bars = sB + STAGES * B_TILE_BYTES;   // full[STAGES], empty[STAGES]
  const uint32_t flag = bars + 16 * STAGES;            // split tiles: "this part came last"
  const uint32_t sC = (flag + 4 + 1023u) & ~1023u;     // EPI=3 boxes, per consumer
  (void)A;
  (void)B;
  (void)flag;
  (void)sC;
  (void)workspace;
  const Pipeline<STAGES> ring(bars);

  // read from lane 0 so that ptxas knows it warp-uniform (the MMA descriptors stay uniform)
  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
  const int tid = threadIdx.x % 128;
  TRACE_START(threadIdx.x == 0);   // DEV_TRACE=1 only (hopper/trace.cuh, gemm_trace.py's slots)

  if (threadIdx.x == 0) {
    // every consumer warp of the cluster frees a stage (PINGPONG: those of the one reading it)
    ring.init((PINGPONG ? 1 : CONSUMERS) * 4 * CLUSTER);
    fence_barrier_init();
  }
#if CLUSTER > 1
  cluster_sync_relaxed();   // only the barriers' initialization to publish (fenced above)
  const uint32_t crank = cluster_rank();   // CTAs of a cluster: adjacent tile rows, one B tile
#else
  __syncthreads();
  const uint32_t crank = 0;
#endif
  TRACE(threadIdx.x == 0, 16);   // barriers ready

  const int tiles_m = (M + BM * CLUSTER - 1) / (BM * CLUSTER);   // in cluster units
  const int tiles_n = (N + BN - 1) / BN;
  const int ntiles = tiles_m * tiles_n;
  const int kt_n = (K + BK - 1) / BK;
  Work w;

  if (wg == 0) {
    // ------------------------------------------------------------------ producer
    // (gemm_wgmma issues its first stage before setmaxnreg, with the first item worked out
    // before the start barrier; here that measured 2 % slower on the promoted stream-K picks
    // and level elsewhere, gemm_fp8_ab_h100.json, so the producer starts as before)
    warpgroup::shrink_regs<PRODUCER_REGS>();
    if (tid == 0) {
      tma::prefetch_desc(&tmA);
      tma::prefetch_desc(&tmB);
      if (EPI == 3) tma::prefetch_desc(&tmC);
      uint32_t it = 0;   // k-tiles issued
      while (Sched::at(it, w, ntiles, kt_n)) {
        int tm, tn;
        raster_grouped<GROUP_M>(w.tile, tiles_m, tiles_n, tm, tn);
        tm = tm * CLUSTER + crank;
        for (int kt = w.kb; kt < w.ke; ++kt, ++it) {
          const auto st = Cursor<STAGES>::at(it);
          ring.acquire(st);
          const uint32_t full = ring.commit(st, STAGE_BYTES);
          tma::load_2d(sA + st.stage * A_TILE_BYTES, &tmA, full, kt * BK, tm * BM);
#if CLUSTER > 1
          tma::load_2d_mc(sB + st.stage * B_TILE_BYTES + crank * (B_TILE_BYTES / CLUSTER), &tmB,
                          full, kt * BK, tn * BN + crank * (BN / CLUSTER),
                          (uint16_t)((1 << CLUSTER) - 1));
#else
          tma::load_2d(sB + st.stage * B_TILE_BYTES, &tmB, full, kt * BK, tn * BN);
#endif
          TRACE(it == 0, 1);   // the first stage's loads issued
        }
      }
      TRACE(true, 14);         // every load issued
#if CLUSTER > 1
      // every stage freed by every consumer of the cluster: nothing of the peers' reaches this
      // CTA any more, so it may leave without a cluster barrier (its consumers keep the CTA
      // while they store)
      ring.drain(it);
      TRACE(true, 24);
#endif
    }
  } else {
    // ------------------------------------------------------------------ consumers
    warpgroup::grow_regs<CONSUMER_REGS>();
    const int c = wg - 1;
    const int warp = tid / 32, lane = tid % 32;
    const float s_tensor = scaling == 2 ? 1.f : __ldg(scale_a) * __ldg(scale_b);
    float acc[MT][BN / 2];
#if PROMOTE
    float part[MT][PART_N / 2];   // the MMAs' accumulators, added into acc every PROMOTE k-tiles
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < PART_N / 2; ++i) part[mt][i] = 0.f;
#define MMA_D part
#else
#define MMA_D acc
#endif
    const auto fence_set = [&](auto& d) {   // a set of MT rows of accumulators
      constexpr int R = sizeof(d[0]) / sizeof(float);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) wgmma::fence_regs<R>(d[mt]);
    };
    const auto fence_d = [&]() { fence_set(MMA_D); };
#if PSETS == 2
    float part2[MT][BN / 2];  // PSETS=2: the other set (odd k-tiles of a tile)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) part2[mt][i] = 0.f;
    const auto add_set = [&](float (&d)[MT][BN / 2]) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[mt][i] += d[mt][i];
    };
#endif
    // ORDERED: named barrier 5 says "consumer 2 has issued its MMAs of the previous k-tile"
    // (once ahead of the first), 6 "consumer 1 has issued this k-tile's"; the two alternate
    // strictly, so neither can be counted twice
    if (ORDERED && c == 1) named_arrive(5, 256);
    // per row of A and column of B (zero past the edges). Lane l holds the scales of the tile's
    // columns 32 u + l and passes them to the lanes that own them (a load per lane and column
    // block instead of BN / 4 loads a thread, which ptxas hoists into spills); sav[mt] the rows
    // r and r + 8 of this thread's accumulators
    const auto col_scales = [&](float* sb, int tn) {
#pragma unroll
      for (int u = 0; u < SBV; ++u) {
        const int col = tn * BN + 32 * u + lane;
        sb[u] = col < N ? __ldg(scale_b + col) : 0.f;
      }
    };
    const auto row_scales = [&](float* sa, int row0, int mt) {
      const int row = row0 + mt * 64 + warp * 16 + lane / 4;
      sa[0] = row < M ? __ldg(scale_a + row) : 0.f;
      sa[1] = row + 8 < M ? __ldg(scale_a + row + 8) : 0.f;
    };
    uint32_t it = 0;
#if DEV_TRACE
    int ntr = 0;   // items this consumer has finished
#endif
#if PINGPONG
    PingPong<3> turns;   // consumer c takes the CTA's tiles of parity c
#endif
    for (bool more = Sched::at(it, w, ntiles, kt_n); more; more = Sched::at(it, w, ntiles, kt_n)) {
#if PINGPONG
      if (!turns.take(c)) {   // the other's tile: its k-tiles pass by (it frees their stages)
        it += w.ke - w.kb;
        continue;
      }
#endif
      int tm, tn;
      raster_grouped<GROUP_M>(w.tile, tiles_m, tiles_n, tm, tn);
      tm = tm * CLUSTER + crank;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[mt][i] = 0.f;
      fence_d();
#if EARLY_SCALES
      float sbv[SBV], sav[MT][2];
      if (scaling == 2) {
        col_scales(sbv, tn);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) row_scales(sav[mt], tm * BM + WROW(c), mt);
      }
#endif

#if PSETS == 2
      // PSETS=2: the k-tiles' MMAs go into part and part2 in turn (each overwritten), two
      // k-tiles in flight: once the older has retired (wait<1>) its set is added into acc while
      // the newer one's MMAs run, then the next k-tile is issued into the set just added. The
      // k-tiles go in rounds of four that end with wait<0> and the last set's addition, the
      // only one the pipe waits for (one in four k-tiles; with one set every k-tile waits).
      // (A round must end with no MMAs in flight: reading a set carried across the loop's back
      // edge while MMAs run makes ptxas insert a wait_group before the read, C7517.)
      const auto issue = [&](float (&cur)[MT][BN / 2]) {
        const auto st = Cursor<STAGES>::at(it++);
        ring.wait(st);
        wgmma::fence();
        wgmma::mma_fp8_k_tiles<BN, BK / 32, MT, FP8_A, FP8_B>(
            cur, sA + st.stage * A_TILE_BYTES + WROW(c) * BK, 64 * BK, 0,
            sB + st.stage * B_TILE_BYTES, 0, 0);
        wgmma::commit();
        fence_set(cur);
        return st;
      };
      // the older set retired: its stage freed, the set added into acc (acc fenced after it:
      // the additions are pure register arithmetic that the compiler would otherwise sink
      // past the next wait, out from under the MMAs they are meant to overlap)
      const auto retire = [&](float (&d)[MT][BN / 2], const Cursor<STAGES>& st) {
        fence_set(d);
        if (lane == 0) ring.release_cluster<CLUSTER>(st);
        add_set(d);
        fence_set(acc);
      };
      // a round of R k-tiles (k-tile j into part for even j, part2 for odd j)
      const auto round = [&](auto rc) {
        constexpr int R = decltype(rc)::value;
        Cursor<STAGES> older = issue(part);
#pragma unroll
        for (int j = 1; j < R; ++j) {
          if (j % 2) {
            const auto st = issue(part2);
            wgmma::wait<1>();
            retire(part, older);
            older = st;
          } else {
            const auto st = issue(part);
            wgmma::wait<1>();
            retire(part2, older);
            older = st;
          }
        }
        wgmma::wait<0>();
        if (R % 2) retire(part, older);
        else retire(part2, older);
      };
      int kt = w.kb;
      for (; kt + 3 < w.ke; kt += 4) round(IntC<4>{});
      if (kt + 1 < w.ke) {              // 2 or 3 k-tiles left
        round(IntC<2>{});
        kt += 2;
      }
      if (kt < w.ke) round(IntC<1>{});
#elif PSPLIT > 1
      // PSPLIT: an interval of G (= PROMOTE, fewer at the end) k-tiles, column half by column
      // half: the G k-tiles' MMAs of half h into the half-width set (the first overwriting it),
      // waited for and added into its columns of acc (an m64nNk32 thread's registers 4j..4j+3
      // are columns 8j..8j+7, so half h's are acc[mt][h * PART_N / 2 + i]); the interval's
      // stages are freed after the last half (STAGES > PROMOTE keeps the producer ahead)
      const auto interval = [&](auto gc) {
        constexpr int G = decltype(gc)::value;
        Cursor<STAGES> sts[G];
#pragma unroll
        for (int h = 0; h < PSPLIT; ++h) {
#pragma unroll
          for (int j = 0; j < G; ++j) {
            if (h == 0) {
              sts[j] = Cursor<STAGES>::at(it + j);
              ring.wait(sts[j]);
            }
            wgmma::fence();
            wgmma::mma_fp8_k_tiles<PART_N, BK / 32, MT, FP8_A, FP8_B>(
                part, sA + sts[j].stage * A_TILE_BYTES + WROW(c) * BK, 64 * BK, 0,
                sB + sts[j].stage * B_TILE_BYTES + h * PART_N * BK, 0, j > 0 ? 1 : 0);
            wgmma::commit();
          }
          fence_d();
          wgmma::wait<0>();
          fence_d();
          if (h == PSPLIT - 1 && lane == 0) {
#pragma unroll
            for (int j = 0; j < G; ++j) ring.release_cluster<CLUSTER>(sts[j]);
          }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < PART_N / 2; ++i) acc[mt][h * (PART_N / 2) + i] += part[mt][i];
        }
        it += G;
      };
      int kt = w.kb;
      for (; kt + PROMOTE <= w.ke; kt += PROMOTE) interval(IntC<PROMOTE>{});
      if constexpr (PROMOTE > 1)
        for (; kt < w.ke; ++kt) interval(IntC<1>{});
#else
#if PROMOTE
      bool held = false;   // prev's stage is still read by MMAs in flight
#endif
      Cursor<STAGES> prev;
      for (int kt = w.kb; kt < w.ke; ++kt, ++it) {
        const auto st = Cursor<STAGES>::at(it);
        ring.wait(st);
        TRACE(tid == 0 && kt == w.kb && c < 2 && ntr == 0, 2 + 3 * c);   // first data in
        TRACE(tid == 0 && kt == w.kb && c == 0, 15);                     // (of its last item)
        TRACE(tid == 0 && kt == w.kb + 1 && c == 0 && ntr == 0, 21);     // the second k-tile's
        TRACE(tid == 0 && kt == w.kb + STAGES && c == 0 && ntr == 0, 22);  // first refill's
        TRACE(tid == 0 && kt == w.ke - 1 && c == 0 && ntr == 0, 23);     // the last k-tile's
        wgmma::fence();
#if PROMOTE
        // into the partial sums, the first MMA of an interval overwriting them; the previous
        // stage is freed once its MMAs retire (as without promotion); at the end of an
        // interval wait for all of them, free this stage and add the sums into acc
        if (ORDERED) named_sync(c == 0 ? 5 : 6, 256);
        wgmma::mma_fp8_k_tiles<BN, BK / 32, MT, FP8_A, FP8_B>(
            part, sA + st.stage * A_TILE_BYTES + WROW(c) * BK, 64 * BK, 0,
            sB + st.stage * B_TILE_BYTES, 0, (kt - w.kb) % PROMOTE);
        wgmma::commit();
        if (ORDERED) named_arrive(c == 0 ? 6 : 5, 256);
        fence_d();
        if (held) {
          wgmma::wait<1>();
          fence_d();
          if (lane == 0) ring.release_cluster<CLUSTER>(prev);
        }
        held = true;
        prev = st;
        if ((kt - w.kb + 1) % PROMOTE == 0 || kt + 1 == w.ke) {
          wgmma::wait<0>();
          fence_d();
          if (lane == 0) ring.release_cluster<CLUSTER>(st);
          held = false;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) acc[mt][i] += part[mt][i];
        }
#else
        if (ORDERED) named_sync(c == 0 ? 5 : 6, 256);
        wgmma::mma_fp8_k_tiles<BN, BK / 32, MT, FP8_A, FP8_B>(
            acc, sA + st.stage * A_TILE_BYTES + WROW(c) * BK, 64 * BK, 0,
            sB + st.stage * B_TILE_BYTES, 0, 1);
        wgmma::commit();
        if (ORDERED) named_arrive(c == 0 ? 6 : 5, 256);
        fence_d();
        if (kt > w.kb) {   // the previous stage's MMAs have retired: free it
          wgmma::wait<1>();
          fence_d();
          if (lane == 0) ring.release_cluster<CLUSTER>(prev);
        }
        prev = st;
#endif
      }
#endif
#if PINGPONG
      {   // the next tile, the other consumer's, may start its k-loop
        Work nx;
        PingPong<3>::pass(c, Sched::at(it, nx, ntiles, kt_n));
      }
#endif
#if !PROMOTE
      wgmma::wait<0>();
      fence_d();
      if (lane == 0) ring.release_cluster<CLUSTER>(prev);
#endif
      TRACE(tid == 0 && c < 2 && ntr == 0, 3 + 3 * c);   // k-loop done
      TRACE(tid == 0 && c == 0, 8);                      // (its last item's)

#if STREAMK
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
      const int row0 = tm * BM + WROW(c);          // the consumer's first row
      if (scaling == 2) {
#if !EARLY_SCALES
        float sbv[SBV], sav[MT][2];
        col_scales(sbv, tn);
#endif
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#if !EARLY_SCALES
          row_scales(sav[mt], row0, mt);
#endif
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            const int src = 8 * (j % 4) + 2 * (lane % 4);
            const float sb0 = __shfl_sync(0xffffffffu, sbv[j / 4], src);
            const float sb1 = __shfl_sync(0xffffffffu, sbv[j / 4], src + 1);
            acc[mt][4 * j] *= sav[mt][0] * sb0;
            acc[mt][4 * j + 1] *= sav[mt][0] * sb1;
            acc[mt][4 * j + 2] *= sav[mt][1] * sb0;
            acc[mt][4 * j + 3] *= sav[mt][1] * sb1;
          }
        }
      } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int i = 0; i < BN / 2; ++i) acc[mt][i] *= s_tensor;
      }
#if EPI == 3
      {
        // 64 x 64 boxes (16-byte chunk q of row r at (q ^ r % 8) * 16, TMA's 128-byte swizzle),
        // EPI_W / 64 of them per consumer, reused: each group waits until TMA has read the last.
        constexpr int BOX = 64 * 64 * 2;
        constexpr int GB = EPI_W / 64;
        const uint32_t cbuf = sC + c * (GB * BOX);
        const int r = warp * 16 + 8 * ((lane / 8) % 2) + lane % 8;   // stmatrix: this lane's row
        const int jsel = lane / 16;
        // box b's first column in the tile: whole boxes, then the overlapping last one
        const auto bcol = [](int b) { return b < BN / 64 ? 64 * b : BN - 64; };
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int g = 0; g < (NBOX + GB - 1) / GB; ++g) {
            if (tid == 0) tma::store_wait_read();
            named_sync(1 + c, 128);   // buffer free
#pragma unroll
            for (int bx = 0; bx < GB; ++bx)
              if (g * GB + bx < NBOX)
                epi::stmatrix_box_sw128(cbuf + bx * BOX + r * 128, r, jsel, acc[mt],
                                        bcol(g * GB + bx) / 8);
            fence_proxy_async();      // visible to TMA
            named_sync(1 + c, 128);   // buffer full
            if (tid == 0) {
#pragma unroll
              for (int bx = 0; bx < GB; ++bx)
                if (g * GB + bx < NBOX)
                  tma::store_2d(&tmC, cbuf + bx * BOX, tn * BN + bcol(g * GB + bx), row0 + mt * 64);
              tma::store_commit();
            }
          }
          // the last columns no box covers (fewer than EPI_OVERLAP_MIN): from the registers
          if constexpr (NBOX * 64 < BN)
            epi::store_cols<BN / 64 * 8, BN / 8>(acc[mt], C, row0 + mt * 64 + warp * 16 + lane / 4,
                                                 tn * BN + (lane % 4) * 2, M, N);
        }
      }
#else
      const int col0 = tn * BN + (lane % 4) * 2;   // this thread's first column
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int row = row0 + mt * 64 + warp * 16 + lane / 4;
        const bool full_tile = (tm + 1) * BM <= M && (tn + 1) * BN <= N && (N % 2 == 0);
        if (full_tile) epi::store_pairs<BN / 8>(acc[mt], C, row, col0, N);
        else epi::store_cols<0, BN / 8>(acc[mt], C, row, col0, M, N);   // every column checked
      }
#endif
      TRACE(tid == 0 && c < 2 && ntr == 0, 4 + 3 * c);   // epilogue issued
      TRACE(tid == 0 && c == 0, 9);                      // (its last item's)
#if DEV_TRACE
      ++ntr;
#endif
    }
#if DEV_TRACE
    TRACE_VAL(tid == 0 && c == 0, 12, ntr);
#endif
  }
#if EPI == 3
  if (wg > 0 && tid == 0) tma::store_wait_all();   // the staging smem must outlive the stores
#endif
  TRACE(wg == 1 && tid == 0, 10);   // its stores done
  TRACE(threadIdx.x == 0, 11);
  TRACE_VAL(threadIdx.x == 0, 13, trace_smid());
  TRACE_FLUSH(tid == 0);
  // (no cluster barrier at exit: the producer's drain above waited for the peers)
}
