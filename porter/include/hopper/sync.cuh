// hopper/sync.cuh: mbarriers, named barriers and proxy fences (sm_90).
//
// Addresses are 32-bit shared-memory addresses (smem_u32). An mbarrier is 8 bytes; its phase
// parity flips each time its expected arrivals (and transaction bytes) complete.
#pragma once
#include "porter.cuh"

namespace hopper {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}

// Makes barrier initialisation visible to the async proxy (TMA) and the cluster.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` of transactions (TMA) still to land.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}

// Arrive on the barrier at the same offset in CTA `rank` of the cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  asm volatile("{\n.reg .b32 ra;\n"
               "mapa.shared::cluster.u32 ra, %0, %1;\n"
               "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n"
               :: "r"(bar), "r"(rank) : "memory");
}

// Spins until the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}

// Named barriers (ids 1..15; 0 is __syncthreads). `threads` counts every thread taking part,
// arrivals and waiters together, a multiple of 32.
__device__ __forceinline__ void named_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

// Ping-pong: two consumer warpgroups (128 threads each) take a CTA's work items in turn, item
// i going to consumer i % 2. take() says whether the item is consumer c's and, if so, returns
// once the other consumer has waited for every k-tile of the item before (a full barrier's
// parity tells a phase from the next lap's, not from later ones); pass() after c's k-loop lets
// the other start its next item. Named barriers kBar and kBar + 1.
template <uint32_t kBar = 3>
struct PingPong {
  uint32_t item = 0;   // items seen so far
  __device__ __forceinline__ bool take(int c) {
    if ((item++ & 1u) != (uint32_t)c) return false;
    if (item > 1) named_sync(kBar + c, 256);
    return true;
  }
  __device__ __forceinline__ static void pass(int c, bool next) {
    if (next) named_arrive(kBar + (1 - c), 256);
  }
};

// Generic-proxy writes to shared memory (st.shared, stmatrix) become visible to the async
// proxy (wgmma operands, TMA stores): each writing thread fences before the barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
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

// The start's cluster barrier where the only writes to publish are mbarrier initializations,
// which fence_barrier_init (fence.mbarrier_init.release.cluster) has already released: the
// arrive need not be a release.
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

}  // namespace hopper
