// hopper/tile_reduce.cuh: an output tile computed in parts (split-K, stream-K) summed through a
// global workspace, without a second kernel.
//
// Workspace: a u32 counter per tile (zero between launches: the template's workspace_clean),
// padded to 256 bytes, then fp32 partial-tile slots (scratch, always written before read).
// Protocol, per part: count in first (low 16 bits of the counter); the part that counts last
// keeps its accumulators; the others store theirs into their slots and count themselves as
// stored (high 16 bits) and leave; the last waits for those stores (their CTAs have counted in,
// so they are running and never wait), adds the slots to its accumulators, writes the tile and
// zeroes the counter. Slots hold each consumer thread's accumulators as float4s 128 apart (one
// per thread of a warpgroup: coalesced 16-byte stores).
//   kMT x kRegs: the accumulators of one thread (kMT m64 tiles of kRegs floats)
//   kLeader: the thread (threadIdx.x) that talks to the counter; kBar / kThreads: a named
//   barrier over every consumer thread of the CTA
// A kernel calls fix_up after the k-loop of an item whose tile has parts > 1; the steps it is
// made of (count_in, store, wait_stored, add) stay public for kernels that reduce otherwise.
#pragma once
#include "porter.cuh"
#include "hopper/sync.cuh"
#include "hopper/tile_scheduler.cuh"

namespace hopper {

template <int kMT, int kRegs, int kLeader, int kBar, int kThreads>
struct TileReduce {
  static __device__ __forceinline__ uint32_t* counter(void* ws, int tile) {
    return reinterpret_cast<uint32_t*>(ws) + tile;
  }
  static __device__ __forceinline__ float4* slots(void* ws, size_t tiles) {
    const size_t cbytes = (tiles * 4 + 255) & ~(size_t)255;
    return reinterpret_cast<float4*>(reinterpret_cast<char*>(ws) + cbytes);
  }

  // Every part counts itself in; true for the one that counted last. flag: a shared u32.
  static __device__ __forceinline__ bool count_in(uint32_t* ctr, int parts, uint32_t flag) {
    if (threadIdx.x == kLeader) {
      const uint32_t arrived = atomicAdd(ctr, 1u) & 0xFFFFu;
      const uint32_t last = arrived == (uint32_t)(parts - 1);
      asm volatile("st.shared.u32 [%0], %1;" :: "r"(flag), "r"(last) : "memory");
    }
    named_sync(kBar, kThreads);
    uint32_t last;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(last) : "r"(flag) : "memory");
    return last;
  }

  // Not last: this thread's accumulators into its slot (dst: its first float4), then "stored".
  static __device__ __forceinline__ void store(float4* dst, const float (*acc)[kRegs],
                                               uint32_t* ctr) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int j = 0; j < kRegs / 4; ++j)
        __stcg(dst + (size_t)(mt * (kRegs / 4) + j) * 128,
               make_float4(acc[mt][4 * j], acc[mt][4 * j + 1], acc[mt][4 * j + 2],
                           acc[mt][4 * j + 3]));
    __threadfence();
    named_sync(kBar, kThreads);   // also: nobody reads the flag any more
    if (threadIdx.x == kLeader) atomicAdd(ctr, 0x10000u);
  }

  // Last: until the other parts have stored; the tile is then done with its counter.
  static __device__ __forceinline__ void wait_stored(uint32_t* ctr, int parts) {
    if (threadIdx.x == kLeader) {
      uint32_t v;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
      } while ((v >> 16) != (uint32_t)(parts - 1));
      *ctr = 0u;
    }
    named_sync(kBar, kThreads);
  }

  // Last: adds another part's slot (src: this thread's first float4 in it).
  static __device__ __forceinline__ void add(const float4* src, float (*acc)[kRegs]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int j = 0; j < kRegs / 4; ++j) {
        const float4 v = __ldcg(src + (size_t)(mt * (kRegs / 4) + j) * 128);
        acc[mt][4 * j] += v.x;
        acc[mt][4 * j + 1] += v.y;
        acc[mt][4 * j + 2] += v.z;
        acc[mt][4 * j + 3] += v.w;
      }
  }

  // The fix-up of one part of a tile (parts > 1), after its k-loop: true where this part
  // counted in last and acc now holds the whole tile (on to the epilogue), false where it
  // stored acc in its slot (done with the tile). Sched: w's TileScheduler, whose first / me /
  // slot say which parts the tile has and which slot each fills; at(s): this thread's first
  // float4 in slot s (the kernel's layout: cluster rank, consumer warpgroup). me and first are
  // asked for where they are used rather than passed in: as arguments NVVM computed me once
  // before count_in and kept it across the barrier, and every split cubin changed.
  template <class Sched, class At>
  static __device__ __forceinline__ bool fix_up(uint32_t* ctr, const At& at, int parts,
                                                const Work& w, int ntiles, int kt_n,
                                                float (*acc)[kRegs], uint32_t flag) {
    const auto slot = [&](int q) { return at(Sched::slot(w, q, ntiles, kt_n)); };
    if (!count_in(ctr, parts, flag)) {
      store(slot(Sched::me(w, kt_n)), acc, ctr);
      return false;
    }
    wait_stored(ctr, parts);
    const int me = Sched::me(w, kt_n);
    const int first = Sched::first(w, ntiles, kt_n);
    for (int q = first; q < first + parts; ++q)
      if (q != me) add(slot(q), acc);
    return true;
  }
};

}  // namespace hopper
