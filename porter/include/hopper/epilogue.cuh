// hopper/epilogue.cuh: wgmma accumulators (fp32, the layout of fragment.cuh) to a row-major
// 16-bit matrix C (ld = N), one m64 slab of a consumer warpgroup at a time. Every store takes
// the element type E (porter.cuh's bf16_elem, the default, or f16_elem) for the conversion.
//
//   store_cols     straight from registers, bounds-checked (partial tiles, ragged columns)
//   store_pairs    straight from registers, 32-bit stores, the slab wholly inside C
//   store_staged   through a swizzled shared buffer of 64 x kW, 16-byte coalesced stores
//   stmatrix_box_sw128  a 64 x 64 box of a slab into shared memory in TMA's 128-byte swizzle
//                  (then stored by tma::store_2d)
// `row` is this thread's first row of the slab (warp * 16 + lane / 4 below its first row) and
// `col0` its first column (2 * (lane % 4) past the tile's first). `bar` names the warpgroup's
// own named barrier (128 threads); `tid` is the thread's index in the warpgroup (0..127).
#pragma once
#include "porter.cuh"
#include "hopper/sync.cuh"
#include "hopper/tma.cuh"
#include "hopper/fragment.cuh"

namespace hopper {
namespace epi {

// Column blocks kJB .. kJE - 1 (8 columns each) of a slab, every store checked against M and N.
template <int kJB, int kJE, typename E = bf16_elem>
__device__ __forceinline__ void store_cols(const float* a, uint16_t* __restrict__ C, int row,
                                           int col0, int M, int N) {
#pragma unroll
  for (int j = kJB; j < kJE; ++j) {
    const int col = col0 + j * 8;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;
      if (r >= M) continue;
      const float v0 = a[4 * j + 2 * h], v1 = a[4 * j + 2 * h + 1];
      if (col + 1 < N && (N % 2 == 0)) {
        *reinterpret_cast<uint32_t*>(C + (size_t)r * N + col) = E::pack(v0, v1);
      } else {
        if (col < N) C[(size_t)r * N + col] = E::from_float(v0);
        if (col + 1 < N) C[(size_t)r * N + col + 1] = E::from_float(v1);
      }
    }
  }
}

// kJN column blocks, the slab inside C and N even.
template <int kJN, typename E = bf16_elem>
__device__ __forceinline__ void store_pairs(const float* a, uint16_t* C, int row,
                                            int col0, int N) {
  uint32_t* p0 = reinterpret_cast<uint32_t*>(C + (size_t)row * N + col0);
  uint32_t* p1 = reinterpret_cast<uint32_t*>(C + (size_t)(row + 8) * N + col0);
#pragma unroll
  for (int j = 0; j < kJN; ++j) {
    p0[j * 4] = E::pack(a[4 * j + 0], a[4 * j + 1]);
    p1[j * 4] = E::pack(a[4 * j + 2], a[4 * j + 3]);
  }
}

// kN columns, kW (64 or 128) at a time through buf (64 x kW values, 16-byte chunks XOR-swizzled
// by row: the fragment writes and the 16-byte reads are free of bank conflicts); the columns
// past the last whole kW from the registers. The slab lies inside C, N % 8 == 0; grow0 / gcol0:
// the slab's first row and column in C.
template <int kW, int kN, typename E = bf16_elem>
__device__ __forceinline__ void store_staged(const float* a, uint16_t* C, uint32_t buf,
                                             uint32_t bar, int tid, int grow0, int gcol0,
                                             int row, int col0, int M, int N) {
  const int warp = tid / 32, lane = tid % 32;
  const int r0 = warp * 16 + lane / 4;
#pragma unroll
  for (int h = 0; h < kN / kW; ++h) {
    named_sync(bar, 128);   // buffer free
#pragma unroll
    for (int jj = 0; jj < kW / 8; ++jj) {
      const int j = h * (kW / 8) + jj;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = r0 + 8 * hr;
        const uint32_t addr = buf + r * (kW * 2) + ((jj ^ (r % 8)) * 16) + 4 * (lane % 4);
        const uint32_t v = E::pack(a[4 * j + 2 * hr], a[4 * j + 2 * hr + 1]);
        asm volatile("st.shared.b32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
      }
    }
    named_sync(bar, 128);   // buffer full
    constexpr int QPR = kW / 8;   // chunks per row
#pragma unroll
    for (int i = 0; i < 64 * QPR / 128; ++i) {
      const int idx = tid + 128 * i;
      const int r = idx / QPR, q = idx % QPR;
      uint32_t x, y, z, w;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                   : "r"(buf + r * (kW * 2) + ((q ^ (r % 8)) * 16)) : "memory");
      const int grow = grow0 + r;
      const int gcol = gcol0 + h * kW + q * 8;
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                   :: "l"(C + (size_t)grow * N + gcol), "r"(x), "r"(y), "r"(z), "r"(w)
                   : "memory");
    }
  }
  if (kN % kW != 0) store_cols<kN / kW * kW / 8, kN / 8, E>(a, C, row, col0, M, N);
}

// One 64 x 64 box (row r of it at bb_row = box + r * 128) from the slab's column blocks
// jb .. jb + 7: lane / 16 picks the block of a pair, (lane / 8) % 2 the 8-row half.
template <typename E = bf16_elem>
__device__ __forceinline__ void stmatrix_box_sw128(uint32_t bb_row, int r, int jsel,
                                                   const float* a, int jb) {
#pragma unroll
  for (int jp = 0; jp < 4; ++jp) {          // pairs of 8-column blocks in the box
    const int j = jb + 2 * jp;              // column block in the tile
    const int q = 2 * jp + jsel;            // 16-byte chunk in the box row
    frag::stmatrix_x4(bb_row + ((q ^ (r % 8)) * 16), E::pack(a[4 * j], a[4 * j + 1]),
                      E::pack(a[4 * j + 2], a[4 * j + 3]), E::pack(a[4 * j + 4], a[4 * j + 5]),
                      E::pack(a[4 * j + 6], a[4 * j + 7]));
  }
}

}  // namespace epi
}  // namespace hopper
