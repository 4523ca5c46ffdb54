// hopper/fragment.cuh: register fragments of wgmma m64nNk16 and conversions between them.
//
// Accumulator (N / 2 floats per thread): warp w of the warpgroup holds rows 16w..16w+15;
// with g = lane / 4 and q = lane % 4, d[4j + e] is row 16w + g + 8 * (e / 2), column
// 8j + 2q + (e % 2). So each thread holds two rows, and a row is spread over the 4 threads of
// a quad (lanes 4g..4g+3).
// A operand from registers (per k16 step, 4 x bf16x2): a0 = (row g, k 2q..2q+1), a1 = (row
// g + 8, same k), a2 = (row g, k 2q + 8..), a3 = (row g + 8, k 2q + 8..) -- the accumulator's
// columns 16kk..16kk+15 in the same order, so a P = softmax(S) fragment is S's registers packed
// pairwise into bf16, with no data movement between threads.
#pragma once
#include "porter.cuh"

namespace hopper {
namespace frag {

__device__ __forceinline__ int acc_row(int i) { return (threadIdx.x % 128) / 32 * 16 + (threadIdx.x % 32) / 4 + 8 * ((i / 2) % 2); }
__device__ __forceinline__ int acc_col(int i) { return 8 * (i / 4) + 2 * (threadIdx.x % 4) + (i % 2); }

// Accumulator of kN columns (kN / 2 floats) -> A fragments of kN / 16 k16 steps (kN / 4 words).
template <int kN>
__device__ __forceinline__ void acc_to_a_bf16(const float* d, uint32_t* a) {
#pragma unroll
  for (int i = 0; i < kN / 4; ++i) a[i] = pack_bf16x2(d[2 * i], d[2 * i + 1]);
}

// Four 8x8 b16 matrices to shared memory: lane t gives the address of row t % 8 of matrix
// t / 8; register i holds this thread's pair of matrix i in the accumulator layout (so an
// m64 accumulator's columns 16j..16j+15 of a warp's 16 rows are one call).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
               :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

// Reductions across the quad that shares a row.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace frag
}  // namespace hopper
