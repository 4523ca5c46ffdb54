// hopper/wgmma.cuh: warpgroup MMAs on swizzled shared-memory tiles (sm_90a).
//
// Tiles are stored as TMA writes them with a 128-byte swizzle: rows of 64 bf16 / fp16 (128 bytes),
// 16-byte chunk q of row r at (q ^ r % 8) * 16, atoms of 8 rows (1024 bytes, 1024-aligned).
// A tile wider than 64 elements along its contiguous dimension is several such boxes.
//   K-major operand (Q, K: rows are M / N, the 64 contiguous elements are K): one box covers
//     k = 0..63; the k16 step kk starts 32 * kk bytes into it.
//   MN-major operand (V in P V: rows are K, the contiguous elements are N): boxes of 64
//     columns lie `box_bytes` apart (the leading byte offset); the k16 step starts 16 rows
//     (2048 bytes) further.
// fp8 (wgmma_fp8.cuh) is K-major only; its k32 step reads the same 32 bytes of a swizzle row as
// bf16's k16 step, so a 128-byte box holds 128 fp8 along K and the descriptors are the same.
// Protocol per batch of MMAs: fence() (orders register accesses before the async reads),
// the MMAs, commit(), then wait<N>() until at most N batches are still in flight.
#pragma once
#include "porter.cuh"
#include "hopper/wgmma_bf16.cuh"
#include "hopper/wgmma_f16.cuh"
#include "hopper/wgmma_fp8.cuh"

namespace hopper {

// The m64nNk16 MMAs by 16-bit operand type (porter.cuh's tags): bf16 or fp16, same operands,
// same fp32 accumulators.
template <typename E, int kN, int kTB> struct wgmma_16;
template <int kN, int kTB> struct wgmma_16<bf16_elem, kN, kTB> : wgmma_bf16<kN, kTB> {};
template <int kN, int kTB> struct wgmma_16<f16_elem, kN, kTB> : wgmma_f16<kN, kTB> {};

namespace wgmma {

// K-major, 128B swizzle: 8-row groups 1024 bytes apart (stride byte offset); the leading byte
// offset is unused for swizzled K-major layouts (1).
__device__ __forceinline__ uint64_t desc_k_sw128(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}

// MN-major, 128B swizzle: 64-element column blocks `box_bytes` apart (leading byte offset),
// 8-row groups along K 1024 bytes apart (stride byte offset).
__device__ __forceinline__ uint64_t desc_mn_sw128(uint32_t addr, uint32_t box_bytes) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((box_bytes & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kN>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(kN) : "memory");
}

// Keeps the compiler from moving accesses to these registers across an issue / wait point
// (the MMAs read and write them asynchronously).
template <int kRegs>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
template <int kRegs>
__device__ __forceinline__ void fence_regs(uint32_t* d) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) asm volatile("" : "+r"(d[i]) :: "memory");
}

// D[64 x N] (+)= A[64 x 16*kSteps] B, A and B K-major 128B-swizzled boxes of 64 along K:
// a0 / b0 address the first box, the next boxes lie a_box / b_box bytes further. E: the operands'
// type (bf16_elem, f16_elem).
template <int kN, int kSteps, typename E = bf16_elem>
__device__ __forceinline__ void mma_ss_k(float* d, uint32_t a0, uint32_t a_box, uint32_t b0,
                                         uint32_t b_box, bool accumulate) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint32_t off = (kk % 4) * 32;
    wgmma_16<E, kN, 0>::ss(d, desc_k_sw128(a0 + (kk / 4) * a_box + off),
                         desc_k_sw128(b0 + (kk / 4) * b_box + off), (accumulate || kk > 0) ? 1 : 0);
  }
}

// A descriptor `bytes` further on: its start address field (bits 0-13, 16-byte units) grows by
// bytes / 16 and never carries out while the address stays inside shared memory (< 256 KB).
// The MMA loops below make two descriptors a call and step them by compile-time offsets, so
// ptxas keeps them in uniform registers and moves them with one add each (a descriptor rebuilt
// from an address per MMA took ~8 instructions and a register-to-uniform move before each).
__device__ __forceinline__ uint64_t desc_at(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }

// kMT m64 tiles of A (a_tile bytes apart) against one B: D[t][64 x N] += A_t B, the MMAs of
// each k16 step issued back to back for every tile. Always accumulates (zero D first).
// E: the operands' type (bf16_elem, f16_elem).
template <int kN, int kSteps, int kMT, typename E = bf16_elem, int kRegs>
__device__ __forceinline__ void mma_ss_k_tiles(float (*d)[kRegs], uint32_t a0, uint32_t a_tile,
                                               uint32_t a_box, uint32_t b0, uint32_t b_box) {
  static_assert(kN / 2 <= kRegs, "the accumulator rows hold N / 2 floats");
  const uint64_t da0 = desc_k_sw128(a0), db0 = desc_k_sw128(b0);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint32_t off = (kk % 4) * 32;
    const uint64_t db = desc_at(db0, (kk / 4) * b_box + off);
#pragma unroll
    for (int t = 0; t < kMT; ++t)
      wgmma_16<E, kN, 0>::ss_acc(d[t], desc_at(da0, (kk / 4) * a_box + t * a_tile + off), db);
  }
}

// D[64 x N] += A B with A in registers (4 words per k16 step, fragment.cuh) and B MN-major:
// b0 addresses row 0 of the first 64-column box, boxes b_box bytes apart.
template <int kN, int kSteps>
__device__ __forceinline__ void mma_rs_mn(float* d, const uint32_t* a, uint32_t b0,
                                          uint32_t b_box) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    wgmma_bf16<kN, 1>::rs(d, a + 4 * kk, desc_mn_sw128(b0 + kk * 2048, b_box), 1);
}

// fp8 (operand types kA, kB: 0 = e4m3, 1 = e5m2): kMT m64 tiles of A (a_tile bytes apart)
// against one B over kSteps k32 steps, boxes of 128 along K a_box / b_box bytes apart. The first
// step's scale_d is `scale_first` (0: D is overwritten, a fresh promotion interval), the rest
// accumulate.
template <int kN, int kSteps, int kMT, int kA, int kB, int kRegs>
__device__ __forceinline__ void mma_fp8_k_tiles(float (*d)[kRegs], uint32_t a0, uint32_t a_tile,
                                                uint32_t a_box, uint32_t b0, uint32_t b_box,
                                                int scale_first) {
  static_assert(kN / 2 <= kRegs, "the accumulator rows hold N / 2 floats");
  const uint64_t da0 = desc_k_sw128(a0), db0 = desc_k_sw128(b0);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint32_t off = (kk % 4) * 32;
    const uint64_t db = desc_at(db0, (kk / 4) * b_box + off);
#pragma unroll
    for (int t = 0; t < kMT; ++t) {
      const uint64_t da = desc_at(da0, (kk / 4) * a_box + t * a_tile + off);
      if (kk == 0) wgmma_fp8<kN, kA, kB>::ss(d[t], da, db, scale_first);
      else wgmma_fp8<kN, kA, kB>::ss_acc(d[t], da, db);
    }
  }
}

}  // namespace wgmma
}  // namespace hopper
