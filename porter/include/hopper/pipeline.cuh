// hopper/pipeline.cuh: a ring of shared-memory stages between a TMA producer and consumers.
//
// Each stage has a "full" mbarrier (one producer arrival that announces the stage's bytes; the
// TMA completes it) and an "empty" mbarrier (`consumers` arrivals once they are done reading).
// Both sides walk the ring with a Cursor: stage index and phase parity, flipped on wrap.
//   producer: acquire(c) -> commit(c, bytes) -> issue TMA loads on full_bar(c) -> c.advance()
//   consumer: wait(c) -> read (MMAs) -> release(c) once the reads are done -> c.advance()
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
};

template <int kStages>
struct Ring {
  uint32_t full, empty;   // shared addresses of kStages barriers each (8 bytes apart)

  __device__ __forceinline__ Ring(uint32_t bars) : full(bars), empty(bars + 8 * kStages) {}
  static constexpr uint32_t BARRIER_BYTES = 16 * kStages;

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
};

}  // namespace hopper
