// hopper/pipeline.cuh: a ring of shared-memory stages between a TMA producer and consumers
// (Pipeline; Ring is the same with a constant member, kept for flash_attention_fwd).
//
// Each stage has a "full" mbarrier (one producer arrival that announces the stage's bytes; the
// TMA completes it) and an "empty" mbarrier (`consumers` arrivals once they are done reading).
// Both sides walk the ring with a Cursor: stage index and phase parity, flipped on wrap.
//   producer: acquire(c) -> commit(c, bytes) -> issue TMA loads on full_bar(c) -> c.advance();
//             drain(count) after the last load
//   consumer: wait(c) -> read (MMAs) -> release(c) once the reads are done -> c.advance()
// A kernel that counts its stages anyway can take Cursor::at(count) instead of keeping a
// cursor live across its loops. Clusters whose producers multicast into every CTA free a
// stage in all of them (release_cluster).
#pragma once
#include "porter.cuh"
#include "hopper/sync.cuh"

namespace hopper {

template <int kStages>
struct Cursor {
  uint32_t stage = 0, phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) { stage = 0; phase ^= 1; }
  }
  // The position after n stages from the start.
  static __device__ __forceinline__ Cursor at(uint32_t n) {
    Cursor c;
    c.stage = n % kStages;
    c.phase = (n / kStages) & 1;
    return c;
  }
};

template <int kStages>
struct Pipeline {
  uint32_t full, empty;   // shared addresses of kStages barriers each (8 bytes apart)

  __device__ __forceinline__ Pipeline(uint32_t bars) : full(bars), empty(bars + 8 * kStages) {}
  static constexpr __device__ __host__ uint32_t barrier_bytes() { return 16 * kStages; }

  // By one thread, before the block-wide barrier that precedes any use.
  __device__ __forceinline__ void init(uint32_t consumers) const {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, consumers);
    }
  }
  __device__ __forceinline__ uint32_t full_bar(const Cursor<kStages>& c) const {
    return full + 8 * c.stage;
  }
  __device__ __forceinline__ void acquire(const Cursor<kStages>& c) const {
    mbar_wait(empty + 8 * c.stage, c.phase ^ 1);
  }
  // Returns the barrier the stage's TMA loads complete on.
  __device__ __forceinline__ uint32_t commit(const Cursor<kStages>& c, uint32_t bytes) const {
    mbar_expect_tx(full + 8 * c.stage, bytes);
    return full + 8 * c.stage;
  }
  __device__ __forceinline__ void wait(const Cursor<kStages>& c) const {
    mbar_wait(full + 8 * c.stage, c.phase);
  }
  __device__ __forceinline__ void release(const Cursor<kStages>& c) const {
    mbar_arrive(empty + 8 * c.stage);
  }
  // By the producer after its last load (`filled` stages so far): waits until each stage it
  // filled has been freed, in a cluster by every consumer of every CTA. After it no peer still
  // reads this CTA's multicast or arrives on its barriers, so a cluster needs no barrier at exit.
  __device__ __forceinline__ void drain(uint32_t filled) const {
#pragma unroll 1
    for (uint32_t i = 0; i < kStages; ++i) acquire(Cursor<kStages>::at(filled + i));
  }
  // One arrival on the stage's empty barrier in each of the kCtas CTAs of this cluster (their
  // producers multicast into this CTA; init() counts kCtas arrivals per consumer).
  template <int kCtas>
  __device__ __forceinline__ void release_cluster(const Cursor<kStages>& c) const {
    if constexpr (kCtas == 1) {
      mbar_arrive(empty + 8 * c.stage);
    } else {
#pragma unroll
      for (uint32_t r = 0; r < kCtas; ++r) mbar_arrive_cluster(empty + 8 * c.stage, r);
    }
  }
};

// Pipeline with its barriers' bytes as a constant member. NVRTC emits such a member as a 4-byte
// global in the cubin wherever the class is instantiated, used or not; barrier_bytes() does not.
template <int kStages>
struct Ring : Pipeline<kStages> {
  using Pipeline<kStages>::Pipeline;
  static constexpr uint32_t BARRIER_BYTES = 16 * kStages;
};

}  // namespace hopper
