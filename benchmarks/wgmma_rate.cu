// wgmma_rate: how fast the tensor pipe runs gemm_wgmma's k-loop for one tile shape, with no GEMM
// around it (benchmarks/wgmma_rate.py). A CTA of WGS consumer warpgroups, each owning MT m64
// tiles of A (BM = WGS x MT x 64 rows) against one B of BN rows, issues `iters` k-tiles of 64
// (four k16 steps, the MT MMAs of a step back to back: wgmma::mma_ss_k_tiles, the kernel's own;
// FP8=1: four k32 steps of e4m3, gemm_fp8's mma_fp8_k_tiles, a k-tile of 128)
// from a STAGES-deep ring of 128-byte-swizzled stages, committing a k-tile and waiting for the
// one before, as gemm_wgmma's consumers do.
//   LOADS=0: the stages are filled once; nothing but the MMAs runs (the pipe's own rate); the
//            producer warpgroup is there only to give its registers up, as in the GEMM.
//   LOADS=1: a producer warpgroup refills every stage before it is read, through two bulk copies
//            (A's and B's bytes) from a small global buffer that stays in L2, on the ring's
//            full / empty barriers (hopper/pipeline.cuh): the MMAs' shared-memory reads then
//            share the pipe with the writes, as in the GEMM (without its DRAM traffic).
// Each consumer writes its k-loop's clock64 cycles to out[block * WGS + consumer].
#include "porter.cuh"
#include "hopper/hopper.cuh"

#ifndef BN
#define BN 256
#endif
#ifndef MT
#define MT 1
#endif
#ifndef WGS
#define WGS 2
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef LOADS
#define LOADS 0
#endif
#ifndef FP8
#define FP8 0          // 1: e4m3 MMAs (gemm_fp8's m64nNk32), a k-tile of 128 along K
#endif
#define BM (WGS * MT * 64)
#define A_BYTES (BM * 128)
#define B_BYTES (BN * 128)
#define STAGE_BYTES (A_BYTES + B_BYTES)
#define THREADS (128 * (WGS + 1))   // warpgroup 0 the producer (idle with LOADS=0)
// setmaxnreg as in gemm_wgmma: the producer gives its registers to the consumers
#if WGS == 1
#define CONSUMER_REGS 240
#elif WGS == 2
#define CONSUMER_REGS 232
#else
#define CONSUMER_REGS 152
#endif
#if BN % 8 != 0 || BN > 256 || MT * BN / 2 > 200 || WGS < 1 || WGS > 3
#error "BN: a multiple of 8 up to 256, MT * BN / 2 accumulators at most 200, WGS 1-3"
#endif

using namespace hopper;

__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"((uint64_t)src), "r"(bytes), "r"(bar) : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
wgmma_rate(const uint8_t* __restrict__ src, long long* __restrict__ out, int iters) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t bars = base + STAGES * STAGE_BYTES;
  const Pipeline<STAGES> ring(bars);
  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
  const int tid = threadIdx.x % 128;

  // finite bf16 everywhere (values in [-1, 1): the pipe's rate, not zeros' power)
  for (uint32_t i = threadIdx.x; i < STAGES * STAGE_BYTES / 4; i += THREADS) {
    const uint32_t h = i * 2654435761u;
    const uint32_t v = (0x3c00u | ((h >> 7) & 0x83ffu)) | ((0x3c00u | ((h >> 19) & 0x83ffu)) << 16);
    asm volatile("st.shared.u32 [%0], %1;" :: "r"(base + 4 * i), "r"(v) : "memory");
  }
  if (threadIdx.x == 0) {
    ring.init(WGS * 4);
    fence_barrier_init();
  }
  fence_proxy_async();
  __syncthreads();

  if (wg == 0) {
    warpgroup::shrink_regs<40>();
    if (LOADS && tid == 0) {
      for (int it = 0; it < iters; ++it) {
        const auto st = Cursor<STAGES>::at(it);
        ring.acquire(st);
        const uint32_t full = ring.commit(st, STAGE_BYTES);
        const uint8_t* s = src + (size_t)(it % 8) * STAGE_BYTES;
        bulk_load(base + st.stage * STAGE_BYTES, s, A_BYTES, full);
        bulk_load(base + st.stage * STAGE_BYTES + A_BYTES, s + A_BYTES, B_BYTES, full);
      }
    }
    return;
  }
  warpgroup::grow_regs<CONSUMER_REGS>();
  const int c = wg - 1;
  const int lane = tid % 32;
  float acc[MT][BN / 2];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[t][i] = 0.f;
  const auto fence_acc = [&]() {
#pragma unroll
    for (int t = 0; t < MT; ++t) wgmma::fence_regs<BN / 2>(acc[t]);
  };
  fence_acc();
  const long long t0 = clock64();
  Cursor<STAGES> prev;
  for (int it = 0; it < iters; ++it) {
    const auto st = Cursor<STAGES>::at(it);
    if (LOADS) ring.wait(st);
    wgmma::fence();
    const uint32_t a0 = base + st.stage * STAGE_BYTES + c * (MT * 64 * 128);
    const uint32_t b0 = base + st.stage * STAGE_BYTES + A_BYTES;
#if FP8
    wgmma::mma_fp8_k_tiles<BN, 4, MT, 0, 0>(acc, a0, 64 * 128, 0, b0, 0, 1);
#else
    wgmma::mma_ss_k_tiles<BN, 4, MT, bf16_elem>(acc, a0, 64 * 128, 0, b0, 0);
#endif
    wgmma::commit();
    fence_acc();
    if (it > 0) {
      wgmma::wait<1>();
      fence_acc();
      if (LOADS && lane == 0) ring.release(prev);
    }
    prev = st;
  }
  wgmma::wait<0>();
  fence_acc();
  if (LOADS && lane == 0) ring.release(prev);
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) s += acc[t][i];
  if (tid == 0) out[blockIdx.x * WGS + c] = (s == 1.2345e-30f) ? -1 : (t1 - t0);
}
