// hopper/warpgroup.cuh: warpgroups (4 consecutive warps, 128 threads) and register moves.
//
// setmaxnreg takes effect only when the kernel has a register cap at entry
// (__launch_bounds__(threads, 1)) and each warpgroup's role is one branch of an if/else;
// otherwise ptxas ignores it and says so (warning C7508). The counts are multiples of 8 in
// 24..256, and all warpgroups together must fit the SM's 64K registers.
#pragma once
#include "porter.cuh"

namespace hopper {
namespace warpgroup {

__device__ __forceinline__ int index() { return threadIdx.x / 128; }
__device__ __forceinline__ int thread() { return threadIdx.x % 128; }   // 0..127 inside it
__device__ __forceinline__ int warp() { return (threadIdx.x / 32) % 4; }  // 0..3 inside it

template <int kRegs>
__device__ __forceinline__ void grow_regs() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: 24..256, step 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(kRegs));
}

template <int kRegs>
__device__ __forceinline__ void shrink_regs() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: 24..256, step 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(kRegs));
}

// All 128 threads of this warpgroup, on a named barrier of its own (id: 1 + its index, so
// ids 1..4 are taken by warpgroups 0..3 when used this way).
__device__ __forceinline__ void sync() {
  asm volatile("bar.sync %0, 128;" :: "r"(1 + index()) : "memory");
}

}  // namespace warpgroup
}  // namespace hopper
