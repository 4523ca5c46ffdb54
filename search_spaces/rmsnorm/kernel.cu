// RMSNorm over the last dimension of a bf16 matrix, fp32 accumulation.
//
//   y[r, c] = bf16(x[r, c] * rsqrt(mean_c(x[r, :]^2) + eps) * w[c])
//
// A block holds ROWS rows; THREADS threads (a whole number of warps) share one row. Each thread
// moves VEC bf16 per access (VEC=8: 16-byte, 4: 8-byte, 2: 4-byte vectors), so cols % VEC == 0.
//
// PER_THREAD > 0 (one pass): a thread keeps up to PER_THREAD vectors of its row in registers, so
// x is read from memory once and y written once. The row must fit:
// cols <= PER_THREAD * VEC * THREADS; vectors past the end of the row are skipped.
// PER_THREAD == 0 (two passes, any cols): the sum of squares is taken in one sweep and x is read
// again for the output, UNROLL vectors in flight per thread.
//
// Rows past the end (rows % ROWS != 0) are masked, never returned early: every thread reaches
// the block barrier of the reduction.
#include "porter.cuh"

#ifndef VEC
#define VEC 8
#endif
#ifndef THREADS
#define THREADS 256
#endif
#ifndef ROWS
#define ROWS 1
#endif
#ifndef PER_THREAD
#define PER_THREAD 2
#endif
#ifndef UNROLL
#define UNROLL 1
#endif

namespace {

// Compile-time configuration (an enum, so that -default-device emits no device variables).
enum : int {
  kVec = VEC,
  kThreads = THREADS,
  kRows = ROWS,
  kPerThread = PER_THREAD,
  kUnroll = UNROLL,
  kWords = kVec / 2,                  // 32-bit words per vector (two bf16 each)
  kWarpsPerRow = kThreads / 32,
  kStride = kThreads * kVec,          // elements between a thread's consecutive vectors
};

static_assert(kVec == 2 || kVec == 4 || kVec == 8, "VEC must be 2, 4 or 8");
static_assert(kThreads >= 32 && kThreads % 32 == 0 && kThreads <= 1024,
              "THREADS must be a whole number of warps, at most 1024");
static_assert(kRows >= 1 && kRows * kThreads <= 1024, "ROWS * THREADS must be at most 1024");
static_assert(kPerThread >= 0 && kPerThread * kVec <= 128,
              "PER_THREAD * VEC elements must fit the register budget (<= 128)");
static_assert(kUnroll >= 1, "UNROLL must be positive");

struct Vec {
  uint32_t w[kWords];
};

// x: read once, never reused by this block -> do not keep it in L1.
__device__ __forceinline__ Vec load_stream(const bf16_t* p) {
  Vec v;
  if constexpr (kWords == 4) {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "l"(p));
  } else if constexpr (kWords == 2) {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];"
                 : "=r"(v.w[0]), "=r"(v.w[1]) : "l"(p));
  } else {
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v.w[0]) : "l"(p));
  }
  return v;
}

// w: the same for every row -> read-only path, cached in L1.
__device__ __forceinline__ Vec load_cached(const bf16_t* p) {
  Vec v;
  if constexpr (kWords == 4) {
    asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "l"(p));
  } else if constexpr (kWords == 2) {
    asm("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(v.w[0]), "=r"(v.w[1]) : "l"(p));
  } else {
    asm("ld.global.nc.u32 %0, [%1];" : "=r"(v.w[0]) : "l"(p));
  }
  return v;
}

// y: written once -> streaming store.
__device__ __forceinline__ void store_stream(bf16_t* p, const Vec& v) {
  if constexpr (kWords == 4) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};"
                 :: "l"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3]) : "memory");
  } else if constexpr (kWords == 2) {
    asm volatile("st.global.cs.v2.u32 [%0], {%1,%2};"
                 :: "l"(p), "r"(v.w[0]), "r"(v.w[1]) : "memory");
  } else {
    asm volatile("st.global.cs.u32 [%0], %1;" :: "l"(p), "r"(v.w[0]) : "memory");
  }
}

__device__ __forceinline__ void zero(Vec& v) {
#pragma unroll
  for (int k = 0; k < kWords; ++k) v.w[k] = 0u;
}

__device__ __forceinline__ float sum_squares(const Vec& v, float acc) {
#pragma unroll
  for (int k = 0; k < kWords; ++k) {
    const float2 f = unpack_bf16x2(v.w[k]);
    acc = fmaf(f.x, f.x, acc);
    acc = fmaf(f.y, f.y, acc);
  }
  return acc;
}

__device__ __forceinline__ Vec normalize(const Vec& xv, const Vec& wv, float rstd) {
  Vec out;
#pragma unroll
  for (int k = 0; k < kWords; ++k) {
    const float2 xf = unpack_bf16x2(xv.w[k]);
    const float2 wf = unpack_bf16x2(wv.w[k]);
    out.w[k] = pack_bf16x2((xf.x * rstd) * wf.x, (xf.y * rstd) * wf.y);
  }
  return out;
}

// Sum over the THREADS threads of one row; every thread of the block must call it.
__device__ __forceinline__ float row_sum(float v, int row_in_block, int thread_in_row) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if constexpr (kWarpsPerRow == 1) {
    return v;
  } else {
    __shared__ float partial[kRows][kWarpsPerRow];
    if ((thread_in_row & 31) == 0) partial[row_in_block][thread_in_row >> 5] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kWarpsPerRow; ++k) s += partial[row_in_block][k];
    return s;
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads * kRows, 1)
rmsnorm(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, bf16_t* __restrict__ y,
        int rows, int cols, float eps) {
  const int row_in_block = (kRows == 1) ? 0 : (int)(threadIdx.x / kThreads);
  const int thread_in_row = (kRows == 1) ? (int)threadIdx.x : (int)(threadIdx.x % kThreads);
  const int row = (int)blockIdx.x * kRows + row_in_block;
  const bool valid = row < rows;
  const size_t base = (size_t)(valid ? row : 0) * (size_t)cols;
  const bf16_t* xr = x + base;
  bf16_t* yr = y + base;
  const int c0 = thread_in_row * kVec;
  const float inv_cols = 1.0f / (float)cols;

  if constexpr (kPerThread > 0) {
    // One pass: the row stays in registers between the reduction and the output.
    Vec buf[kPerThread > 0 ? kPerThread : 1];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = c0 + i * kStride;
      if (valid && c < cols) buf[i] = load_stream(xr + c);
      else zero(buf[i]);
    }
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) ss = sum_squares(buf[i], ss);
    const float rstd = rsqrtf(row_sum(ss, row_in_block, thread_in_row) * inv_cols + eps);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = c0 + i * kStride;
      if (valid && c < cols) store_stream(yr + c, normalize(buf[i], load_cached(w + c), rstd));
    }
  } else {
    // Two passes over x; UNROLL vectors in flight per thread in each.
    constexpr int kStep = kStride * kUnroll;
    float ss = 0.f;
    if (valid) {
      for (int cb = c0; cb < cols; cb += kStep) {
        Vec t[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int c = cb + u * kStride;
          if (c < cols) t[u] = load_cached(xr + c);   // kept in L1 for the second pass
          else zero(t[u]);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) ss = sum_squares(t[u], ss);
      }
    }
    const float rstd = rsqrtf(row_sum(ss, row_in_block, thread_in_row) * inv_cols + eps);
    if (valid) {
      for (int cb = c0; cb < cols; cb += kStep) {
        Vec t[kUnroll], wv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int c = cb + u * kStride;
          if (c < cols) {
            t[u] = load_cached(xr + c);   // second read: mostly an L1/L2 hit
            wv[u] = load_cached(w + c);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int c = cb + u * kStride;
          if (c < cols) store_stream(yr + c, normalize(t[u], wv[u], rstd));
        }
      }
    }
  }
}
