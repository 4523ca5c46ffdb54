// bf16 GEMM with fp32 accumulation on the tensor cores through mma.sync (sm_80 and later).
//
//   C[M, N] = A[M, K] · B[N, K]^T      A, B, C row-major bf16
//
// A block computes a BM x BN tile of C with (BM/WM) x (BN/WN) warps, each owning a WM x WN warp
// tile of m16n8k16 MMAs. Tiles of A (BM x BK) and B (BN x BK) stream into a STAGES-deep ring of
// dynamic shared memory with cp.async; fragments come out with ldmatrix (B is stored N x K, which
// is the "col" operand of mma .row.col as is, so no transpose is needed). Fragments for the next
// k16 step are loaded while the current one multiplies.
//
// Shared memory layout: each stage holds A's tile then B's, every row BK bf16 = BK/8 chunks of 16
// bytes. Chunks are XOR-swizzled inside each 128-byte line (8 chunks): chunk j of line l is kept
// at position j ^ (l % 8). Eight rows read at the same logical chunk (one ldmatrix phase) and eight
// consecutive chunks written by cp.async then fall in eight different bank groups.
//
// Raster: blockIdx.x enumerates output tiles in groups of GROUP_M tile-rows (column-major inside
// a group) so that blocks running together share tiles of A and B in L2.
//
// SPLITK > 1 (serial split-K): blockIdx.z takes K/SPLITK of the reduction. Every split adds its
// fp32 partial tile into `workspace` (fp32 M*N, then one u32 counter per output tile), then
// increments the tile's counter; the split that arrives last reads the complete sum, writes C,
// and puts zeros back into its partial tile and counter, leaving the workspace as it found it.
//
// Epilogue: the finished tile is staged through the (then idle) shared memory as bf16 and
// written out in coalesced 16-byte stores; dynamic shared memory is therefore
// max(STAGES * (BM + BN) * BK * 2, BM * (BN * 2 + 16)) bytes.
//
// Requirements (checked by the space file): M % BM == 0, N % BN == 0, K % (BK * SPLITK) == 0.
#include "porter.cuh"

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 32
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 64
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef SPLITK
#define SPLITK 1
#endif

namespace {

// Compile-time configuration (an enum, so that -default-device emits no device variables).
enum : int {
  kBM = BM, kBN = BN, kBK = BK, kWM = WM, kWN = WN,
  kStages = STAGES, kGroupM = GROUP_M, kSplitK = SPLITK,
  kWarpsM = kBM / kWM,
  kWarpsN = kBN / kWN,
  kThreads = kWarpsM * kWarpsN * 32,
  kMI = kWM / 16,                     // m16 MMA tiles per warp
  kNI = kWN / 8,                      // n8 MMA tiles per warp
  kKSteps = kBK / 16,                 // k16 steps per smem tile
  kCPR = kBK / 8,                     // 16-byte chunks per smem row
  kRowBytes = kBK * 2,
  kATileBytes = kBM * kRowBytes,
  kBTileBytes = kBN * kRowBytes,
  kStageBytes = kATileBytes + kBTileBytes,
  kAChunks = kBM * kCPR,
  kBChunks = kBN * kCPR,
  kAIters = (kAChunks + kThreads - 1) / kThreads,
  kBIters = (kBChunks + kThreads - 1) / kThreads,
  kRowsPerIter = kThreads / kCPR,     // smem rows covered by one sweep of the block
  kAccPerThread = kMI * kNI * 4,
  kCStride = kBN * 2 + 16,            // bytes per row of the epilogue's C tile in smem
  kOutChunks = kBM * (kBN / 8),       // 16-byte chunks of the C tile
};

static_assert(kBK == 32 || kBK == 64, "BK must be 32 or 64");
static_assert(kWM % 16 == 0 && kWN % 16 == 0, "warp tile must be a multiple of 16x16");
static_assert(kBM % kWM == 0 && kBN % kWN == 0, "block tile must be a multiple of the warp tile");
static_assert(kThreads >= 64 && kThreads <= 1024, "2 to 32 warps");
static_assert((kThreads & (kThreads - 1)) == 0, "a power-of-two number of warps");
static_assert(kStages >= 2, "at least two stages");
static_assert(kSplitK >= 1 && kGroupM >= 1, "SPLITK and GROUP_M must be positive");
static_assert(kAccPerThread * kThreads == kBM * kBN, "accumulators cover the tile");

// Byte offset of 16-byte chunk `chunk` of smem row `row` inside one operand tile.
// Linear chunk index L = row * kCPR + chunk; inside each line of 8 chunks, swizzle by line % 8.
// Adding a multiple of 64 to L (16 rows when kCPR == 4, 8 rows when kCPR == 8) adds the same
// multiple of 16 bytes to the result, which lets callers split offsets into per-lane parts and
// compile-time parts.
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  const int lin = row * kCPR + chunk;
  const int phys = (lin & ~7) | ((lin ^ (lin >> 3)) & 7);
  return (uint32_t)phys * 16u;
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float ld_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_cg(float* p, float v) {
  asm volatile("st.global.cg.f32 [%0], %1;" :: "l"(p), "f"(v) : "memory");
}
__device__ __forceinline__ uint32_t atomic_add_acq_rel(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
               : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
gemm_mma(const bf16_t* __restrict__ A, const bf16_t* __restrict__ B, bf16_t* __restrict__ C,
         int M, int N, int K, void* workspace) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_base = smem_u32(smem);

  const int tid = (int)threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp / kWarpsN;
  const int warp_n = warp % kWarpsN;

  // ---- which output tile: grouped raster over blockIdx.x ------------------------------------
  const int grid_m = M / kBM;
  const int grid_n = N / kBN;
  const int pid = (int)blockIdx.x;
  const int per_group = kGroupM * grid_n;
  const int group = pid / per_group;
  const int first_m = group * kGroupM;
  const int group_rows = min(grid_m - first_m, kGroupM);
  const int in_group = pid - group * per_group;
  const int tile_m = first_m + in_group % group_rows;
  const int tile_n = in_group / group_rows;
  const int m0 = tile_m * kBM;
  const int n0 = tile_n * kBN;

  // ---- this split's share of K ---------------------------------------------------------------
  const int k_len = K / kSplitK;
  const int k_begin = (kSplitK > 1 ? (int)blockIdx.z : 0) * k_len;
  const int k_tiles = k_len / kBK;

  // ---- global -> shared copies: thread t moves chunks t, t + kThreads, ... of each tile -------
  const int ld_row = tid / kCPR;
  const int ld_chunk = tid % kCPR;
  const uint32_t st_off = swizzle(ld_row, ld_chunk);  // + i * kThreads * 16 for sweep i
  const bf16_t* a_src = A + (size_t)(m0 + ld_row) * K + k_begin + ld_chunk * 8;
  const bf16_t* b_src = B + (size_t)(n0 + ld_row) * K + k_begin + ld_chunk * 8;
  // elements between sweeps; i * src_step < max(BM, BN) * K < 2^31 (a constraint)
  const int src_step = kRowsPerIter * K;

  // Copies the next k tile (a_src, b_src) into the stage at smem address `stage`, then moves
  // the sources on by BK.
  auto load_tile = [&](uint32_t stage) {
    const uint32_t sa = stage + st_off;
    const uint32_t sb = sa + kATileBytes;
#pragma unroll
    for (int i = 0; i < kAIters; ++i) {
      if (kAChunks % kThreads == 0 || tid + i * kThreads < kAChunks)
        cp_async16(sa + i * kThreads * 16, a_src + i * src_step);
    }
#pragma unroll
    for (int i = 0; i < kBIters; ++i) {
      if (kBChunks % kThreads == 0 || tid + i * kThreads < kBChunks)
        cp_async16(sb + i * kThreads * 16, b_src + i * src_step);
    }
    a_src += kBK;
    b_src += kBK;
  };

  // ---- shared -> registers: per-lane ldmatrix offsets for each k16 step ----------------------
  // A (x4 = one m16k16 fragment): lanes 0-15 address rows 0-15 at chunk 2kk, lanes 16-31 the
  // same rows at chunk 2kk+1 -> registers a0 (rows 0-7, k 0-7), a1 (rows 8-15, k 0-7),
  // a2 (rows 0-7, k 8-15), a3 (rows 8-15, k 8-15): the m16n8k16 A fragment order.
  // B (x4 = two n8k16 fragments): lanes 0-7 rows n 0-7 chunk 2kk, lanes 8-15 rows n 0-7 chunk
  // 2kk+1, lanes 16-23 rows n 8-15 chunk 2kk, lanes 24-31 rows n 8-15 chunk 2kk+1
  // -> {b0, b1} of n-tile 0, then {b0, b1} of n-tile 1.
  // With the swizzle above, moving to k16 step kk flips bit 5 and 6 of a lane's offset:
  // offset(kk) = offset(0) ^ (kk * 32) (chunk 2kk + c sits at (2kk + c) ^ s, and 2kk only touches
  // bits the row-dependent part s and c leave to the XOR).
  // The warp's offset (a multiple of 1024 bytes) leaves those bits alone too.
  const uint32_t a_off = (uint32_t)(warp_m * kWM * kRowBytes) + swizzle(lane & 15, lane >> 4);
  const uint32_t b_off = (uint32_t)(kATileBytes + warp_n * kWN * kRowBytes) +
                         swizzle((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);

  uint32_t fa[2][kMI][4];
  uint32_t fb[2][kNI][2];
  float acc[kMI][kNI][4];
#pragma unroll
  for (int i = 0; i < kMI; ++i)
#pragma unroll
    for (int j = 0; j < kNI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

  auto load_frags = [&](int buf, uint32_t st, int kk) {
#pragma unroll
    for (int i = 0; i < kMI; ++i)
      ldmatrix_x4(fa[buf][i], st + (a_off ^ (uint32_t)(kk * 32)) + i * 16 * kRowBytes);
#pragma unroll
    for (int j = 0; j < kNI; j += 2) {
      uint32_t r[4];
      ldmatrix_x4(r, st + (b_off ^ (uint32_t)(kk * 32)) + j * 8 * kRowBytes);
      fb[buf][j][0] = r[0];
      fb[buf][j][1] = r[1];
      fb[buf][j + 1][0] = r[2];
      fb[buf][j + 1][1] = r[3];
    }
  };

  // ---- prologue: STAGES-1 tiles in flight ----------------------------------------------------
  const uint32_t ring_end = smem_base + kStages * kStageBytes;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_tile(smem_base + s * kStageBytes);
    cp_async_commit();
  }
  cp_async_wait<kStages - 2>();
  __syncthreads();

  uint32_t read_stage = smem_base;                              // holds tile kt
  uint32_t write_stage = smem_base + (kStages - 1) * kStageBytes;  // gets tile kt + STAGES - 1
  load_frags(0, read_stage, 0);

  // ---- main loop -----------------------------------------------------------------------------
  // Per k tile: one commit group (possibly empty), so before the last k16 step of tile kt the
  // groups of tiles <= kt + STAGES - 1 are committed and waiting for all but STAGES - 2 of them
  // means tile kt + 1 has landed. The barrier after that wait also tells every warp that the
  // stage of tile kt has been read for the last time, so the copy issued at the first k16 step
  // of tile kt + 1 may overwrite it.
  for (int kt = 0; kt < k_tiles; ++kt) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      if (kk == kKSteps - 1) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        read_stage += kStageBytes;
        if (read_stage == ring_end) read_stage = smem_base;
      }
      // fragments of the next k16 step (the first one of the next tile after the last step;
      // on the very last step this reads a stale stage and is never used)
      load_frags((kk + 1) & 1, read_stage, (kk + 1) % kKSteps);
      if (kk == 0) {
        if (kt + kStages - 1 < k_tiles) load_tile(write_stage);
        cp_async_commit();
        write_stage += kStageBytes;
        if (write_stage == ring_end) write_stage = smem_base;
      }
#pragma unroll
      for (int i = 0; i < kMI; ++i)
#pragma unroll
        for (int j = 0; j < kNI; ++j) mma_bf16(acc[i][j], fa[kk & 1][i], fb[kk & 1][j]);
    }
  }
  cp_async_wait<0>();

  // ---- serial split-K: accumulate in the workspace, the last split finishes the tile ---------
  if constexpr (kSplitK > 1) {
    const int tile = tile_m * grid_n + tile_n;
    float* part = reinterpret_cast<float*>(workspace) + (size_t)tile * (kBM * kBN) + tid;
    uint32_t* counter = reinterpret_cast<uint32_t*>(
        reinterpret_cast<uint8_t*>(workspace) + (size_t)M * (size_t)N * 4u) + tile;
    // thread-major layout: register r of thread t lives at part[r * kThreads] (coalesced)
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
      for (int j = 0; j < kNI; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          atomicAdd(part + ((i * kNI + j) * 4 + q) * kThreads, acc[i][j][q]);
    __threadfence();
    __syncthreads();
    uint32_t arrived = 0;
    if (tid == 0) arrived = atomic_add_acq_rel(counter, 1u);
    const int last = __syncthreads_or(tid == 0 && arrived == (uint32_t)(kSplitK - 1));
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
      for (int j = 0; j < kNI; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          float* p = part + ((i * kNI + j) * 4 + q) * kThreads;
          acc[i][j][q] = ld_cg(p);
          st_cg(p, 0.f);
        }
    if (tid == 0) atomicExch(counter, 0u);
  }

  // ---- epilogue: the tile goes through shared memory (rows padded by 16 bytes, so that the
  // fragment writes and the row reads are free of bank conflicts) and out in 16-byte stores.
  // c0,c1 sit at (row g, cols 2t, 2t+1), c2,c3 at row g + 8, with g = lane / 4, t = lane % 4.
  __syncthreads();  // every warp is done with the pipeline's shared memory
  {
    const int r0 = warp_m * kWM + (lane >> 2);
    const int cb = warp_n * kWN + 2 * (lane & 3);
#pragma unroll
    for (int i = 0; i < kMI; ++i) {
#pragma unroll
      for (int j = 0; j < kNI; ++j) {
        const uint32_t p = smem_base + (uint32_t)((r0 + i * 16) * kCStride + (cb + j * 8) * 2);
        st_shared_u32(p, pack_bf16x2(acc[i][j][0], acc[i][j][1]));
        st_shared_u32(p + 8 * kCStride, pack_bf16x2(acc[i][j][2], acc[i][j][3]));
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < (kOutChunks + kThreads - 1) / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    if (kOutChunks % kThreads == 0 || idx < kOutChunks) {
      const int r = idx / (kBN / 8);
      const int ch = idx % (kBN / 8);
      const uint4 v = ld_shared_v4(smem_base + (uint32_t)(r * kCStride + ch * 16));
      *reinterpret_cast<uint4*>(C + (size_t)(m0 + r) * N + n0 + ch * 8) = v;
    }
  }
}
