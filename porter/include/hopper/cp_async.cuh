// hopper/cp_async.cuh: tiles loaded by threads instead of TMA: 16-byte cp.async copies from
// global into shared memory in TMA's 128-byte swizzle, completing on a stage's mbarrier.
//
// The same smem image as a TMA box of {64 elements of 2 bytes, ROWS}: row r's 16-byte chunk q
// lands at r * 128 + (q ^ r % 8) * 16 (tile base 1024-aligned), so wgmma's 128B-swizzle
// descriptors read it unchanged. Chunks past the matrix (rows >= nrows, columns >= ncols) are
// zero-filled, as TMA's out-of-bounds elements are; ncols % 8 == 0 (whole chunks).
// A kernel uses it when its rows' pitch is not a multiple of 128 bytes: a TMA box row then
// straddles two 128-byte lines. Completion: each loading thread's `arrive_on` counts as one
// arrival once its copies have landed, so the stage's full barrier expects one arrival per
// loading thread (Pipeline::init's `producers`) and no transaction bytes. The copies are
// generic-proxy writes: a consumer fences (fence_proxy_async) after its wait and before wgmma
// reads the stage through the async proxy.
#pragma once
#include "porter.cuh"

namespace hopper {
namespace cp_async {

// 16 bytes from global `src` to shared `dst`, or 16 zero bytes where `bytes` is 0.
__device__ __forceinline__ void copy16(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}

// One arrival on `bar` once all of this thread's earlier copies have landed (the barrier's
// expected count includes it: .noinc).
__device__ __forceinline__ void arrive_on(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
}

// Rows row0 .. row0 + ROWS - 1, columns col0 .. col0 + 63 of a row-major 2-byte matrix
// (nrows x ncols, `pitch` elements apart) into the swizzled tile at `dst`, by `kThreads`
// threads (thread t of them: chunk t % 8 of rows t / 8, t / 8 + kThreads / 8, ...).
template <int ROWS, int kThreads>
__device__ __forceinline__ void load_tile_sw128(uint32_t dst, const uint16_t* src, int row0,
                                                int nrows, int col0, int ncols, size_t pitch,
                                                int t) {
  static_assert(kThreads % 8 == 0, "whole rows of 8 chunks per pass");
  constexpr int kRowsPerPass = kThreads / 8;
  const int q = t % 8, r0 = t / 8;
  const int col = col0 + q * 8;
  static_assert(kRowsPerPass % 8 == 0, "the swizzle phase must repeat every pass");
  // r0 + i * kRowsPerPass has r0's row phase: one swizzled offset for every pass
  uint32_t d = dst + (uint32_t)r0 * 128u + (uint32_t)((q ^ (r0 % 8)) * 16);
  const uint16_t* p = src + (size_t)(row0 + r0) * pitch + col;
  const size_t step = (size_t)kRowsPerPass * pitch;
  int left = min(nrows - row0 - r0, ROWS - r0);   // rows of this thread's that exist
  const bool col_in = col < ncols;
#pragma unroll 1
  for (int i = 0; i < (ROWS + kRowsPerPass - 1) / kRowsPerPass; ++i) {
    if (ROWS % kRowsPerPass != 0 && r0 + i * kRowsPerPass >= ROWS) break;
    const bool in = col_in && left > 0;   // else 16 zeros, nothing read
    copy16(d, in ? (const void*)p : (const void*)src, in ? 16u : 0u);
    d += kRowsPerPass * 128u;
    p += step;
    left -= kRowsPerPass;
  }
}

}  // namespace cp_async
}  // namespace hopper
