// hopper/tma.cuh: bulk tensor copies (TMA) between global and shared memory (sm_90).
//
// A tensor map is the 128-byte CUtensorMap the host encodes (cuTensorMapEncodeTiled) and passes
// by value as `const __grid_constant__ CUtensorMap`; coordinates go innermost first, in
// elements. Loads complete on an mbarrier (complete_tx); out-of-bounds elements read as zero,
// and stores clip at the tensor's edges, so ragged tiles need no special code.
#pragma once
#include "porter.cuh"

#ifndef PORTER_CUTENSORMAP
#define PORTER_CUTENSORMAP
struct alignas(64) CUtensorMap { uint64_t opaque[16]; };
#endif

namespace hopper {
namespace tma {

__device__ __forceinline__ void prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" :: "l"((uint64_t)map) : "memory");
}

__device__ __forceinline__ void load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                        int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];"
      :: "r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

__device__ __forceinline__ void load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                        int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];"
      :: "r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}

// Multicast: the box lands at the same offset in every CTA of `mask` (cluster ranks), and each
// of their mbarriers at `bar`'s offset receives the bytes.
__device__ __forceinline__ void load_2d_mc(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                           int c0, int c1, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;"
      :: "r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
}

__device__ __forceinline__ void store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"((uint64_t)map), "r"(src), "r"(c0), "r"(c1) : "memory");
}

__device__ __forceinline__ void store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                         int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
      :: "l"((uint64_t)map), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

// Closes this thread's stores issued so far into one bulk group.
__device__ __forceinline__ void store_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Until at most kPending of this thread's most recent store groups are still reading their
// shared memory (what the older ones read may be written again).
template <int kPending = 0>
__device__ __forceinline__ void store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(kPending) : "memory");
}

// Until this thread's store groups have completed (the CTA may exit).
__device__ __forceinline__ void store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

}  // namespace tma
}  // namespace hopper
