// Kernel Porter's device helpers for templates compiled by NVRTC without the CUDA toolkit's
// headers (and, exported, by nvcc): fixed-width integers, bf16 and fp16 storage and conversions,
// and small PTX wrappers.
#pragma once

// NVRTC (from PyPI) has no C library headers, so the fixed-width integers are declared here;
// under nvcc or any host compiler they come from <cstdint>, which already declares them (with
// int64_t as `long` on Linux: declaring it again as `long long` is an error there).
#ifdef __CUDACC_RTC__
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef long long int64_t;
#else
#include <cstdint>
#endif

// bf16 is stored as its 16 bits; arithmetic happens in fp32.
typedef uint16_t bf16_t;

__device__ __forceinline__ float bf16_to_float(bf16_t v) {
  return __uint_as_float(((uint32_t)v) << 16);
}

__device__ __forceinline__ bf16_t float_to_bf16(float f) {
  uint16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

// Two floats -> one 32-bit register holding (lo, hi) as bf16, round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// fp16 (IEEE half) is stored as its 16 bits too; conversions round to nearest even.
typedef uint16_t f16_t;

__device__ __forceinline__ float f16_to_float(f16_t v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
  return f;
}

__device__ __forceinline__ f16_t float_to_f16(float f) {
  uint16_t r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

// Two floats -> one 32-bit register holding (lo, hi) as fp16.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The 16-bit float types as tags for code built for either (bf16_t and f16_t are the same
// uint16_t, so the storage type cannot choose): E::from_float(f) one value, E::pack(lo, hi)
// two in a 32-bit word. hopper/wgmma.cuh picks the MMA by the same tag.
struct bf16_elem {
  static __device__ __forceinline__ uint16_t from_float(float f) { return float_to_bf16(f); }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    return pack_bf16x2(lo, hi);
  }
};
struct f16_elem {
  static __device__ __forceinline__ uint16_t from_float(float f) { return float_to_f16(f); }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    return pack_f16x2(lo, hi);
  }
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

#define PORTER_CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// A compile-time int as a type: a generic lambda given IntC<V>{} is instantiated for V (one copy
// of a k-loop or epilogue per tile width, a promotion round per length).
template <int V> struct IntC { enum { value = V }; };
