"""Device tests of the Hopper tile primitives (porter/include/hopper/), each on its own:

- TMA: a 2-D box into 128B-swizzled shared memory through an mbarrier holds the source tile at
  the swizzled places and zeros past the tensor's edge; the attention op's rank-3 map reads
  zeros past S inside one head (never the next head's rows);
- wgmma: one 64x64 tile S = A B^T (SS, K-major, 4 k16 steps) and O = P V with P = bf16(S) from
  the registers (RS, V MN-major), both exact on small integers, written out through the
  accumulator layout of fragment.cuh;
- Pipeline: a producer thread streams 16 TMA tiles through a 3-stage ring (acquire / commit /
  advance) to four consumer warps (wait / release at Cursor::at(n)); every tile arrives intact;
- TileScheduler: every (tile, k-tile) of a GEMM covered exactly once, plain, persistent,
  split-K and stream-K (also checked here on the CPU, the header compiled for the host).

The kernels compile with porter's NVRTC wrapper on any machine (`test_kernels_compile`); the
device tests are marked `gpu` and skip without CuPy and an sm_90 GPU. A kernel that does not
finish within 30 s fails its test instead of hanging the run.
"""
from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
import time

import numpy as np
import pytest

from porter.build.compile import BASE_OPTIONS, INCLUDE_DIR, _nvrtc_compile

HEAD = """#include "porter.cuh"
#include "hopper/hopper.cuh"
using namespace hopper;
"""

KERNELS = {
    # one box (64 x 64 bf16) by TMA, 2-D or 3-D map, copied out as it lies in shared memory
    "tma_box": HEAD + """
extern "C" __global__ void tma_box(uint16_t* out, const __grid_constant__ CUtensorMap map,
                                   int rank3, int c0, int c1, int c2) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t bar = base + 64 * 128;
  if (threadIdx.x == 0) { mbar_init(bar, 1); fence_barrier_init(); }
  __syncthreads();
  if (threadIdx.x == 0) {
    tma::prefetch_desc(&map);
    mbar_expect_tx(bar, 64 * 128);      // the whole box counts, zero-filled parts too
    if (rank3) tma::load_3d(base, &map, bar, c0, c1, c2);
    else tma::load_2d(base, &map, bar, c0, c1);
  }
  mbar_wait(bar, 0);
  const uint16_t* tile = reinterpret_cast<const uint16_t*>(smem_raw + (base - smem_u32(smem_raw)));
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) out[i] = tile[i];
}
""",
    # S = A B^T by SS wgmma, then O = bf16(S) V by RS wgmma; one warpgroup
    "wgmma_tiles": HEAD + """
extern "C" __global__ void __launch_bounds__(128, 1)
wgmma_tiles(float* s_out, float* o_out, const __grid_constant__ CUtensorMap mA,
            const __grid_constant__ CUtensorMap mB, const __grid_constant__ CUtensorMap mV) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sA = base, sB = base + 8192, sV = base + 16384, bar = base + 24576;
  if (threadIdx.x == 0) { mbar_init(bar, 1); fence_barrier_init(); }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_expect_tx(bar, 3 * 8192);
    tma::load_2d(sA, &mA, bar, 0, 0);
    tma::load_2d(sB, &mB, bar, 0, 0);
    tma::load_2d(sV, &mV, bar, 0, 0);
  }
  mbar_wait(bar, 0);
  float s[32], o[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) { s[i] = 0.f; o[i] = 0.f; }
  wgmma::fence();
  wgmma::mma_ss_k<64, 4>(s, sA, 8192, sB, 8192, false);
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_regs<32>(s);
  uint32_t p[16];
  frag::acc_to_a_bf16<64>(s, p);
  wgmma::fence();
  wgmma::mma_rs_mn<64, 4>(o, p, sV, 8192);
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_regs<32>(o);
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    s_out[frag::acc_row(i) * 64 + frag::acc_col(i)] = s[i];
    o_out[frag::acc_row(i) * 64 + frag::acc_col(i)] = o[i];
  }
}
""",
    # a 3-stage ring: thread 0 produces `items` boxes of 8 x 64 bf16 (rows 8n..8n+7), warps
    # 1..4 consume (each copies two rows of the stage, its lane 0 releases)
    "pipeline_ring": HEAD + """
#define RING 3
#define STAGE_BYTES (8 * 128)
extern "C" __global__ void pipeline_ring(uint16_t* out, const __grid_constant__ CUtensorMap map,
                                         int items) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint8_t* stages = smem_raw + (base - smem_u32(smem_raw));
  const Pipeline<RING> pipe(base + RING * STAGE_BYTES);
  if (threadIdx.x == 0) { pipe.init(4); fence_barrier_init(); }
  __syncthreads();
  if (threadIdx.x == 0) {
    Cursor<RING> c;
    for (int n = 0; n < items; ++n) {
      pipe.acquire(c);
      const uint32_t bar = pipe.commit(c, STAGE_BYTES);
      tma::load_2d(base + c.stage * STAGE_BYTES, &map, bar, 0, 8 * n);
      c.advance();
    }
  } else if (threadIdx.x >= 32) {
    const int w = threadIdx.x / 32 - 1, lane = threadIdx.x % 32;
    for (int n = 0; n < items; ++n) {
      const auto c = Cursor<RING>::at(n);
      pipe.wait(c);
      const uint16_t* st = reinterpret_cast<const uint16_t*>(stages + c.stage * STAGE_BYTES);
      for (int i = lane; i < 128; i += 32) out[n * 512 + w * 128 + i] = st[w * 128 + i];
      __syncwarp();
      if (lane == 0) pipe.release(c);
    }
  }
}
""",
    # how often each (tile, k-tile) is handed out; one thread per CTA (the cluster's rank 0)
    "cover": HEAD + """
template <int kC, int kP, int kS, int kK>
__device__ __forceinline__ void cover(int* n, int ntiles, int kt_n) {
  if (blockIdx.x % kC || threadIdx.x) return;
  Work w;
  for (int it = 0; TileScheduler<kC, kP, kS, kK>::at(it, w, ntiles, kt_n); it += w.ke - w.kb)
    for (int k = w.kb; k < w.ke; ++k) atomicAdd(&n[w.tile * kt_n + k], 1);
}
extern "C" __global__ void cover_plain(int* n, int t, int k) { cover<1, 0, 1, 0>(n, t, k); }
extern "C" __global__ void cover_persist(int* n, int t, int k) { cover<1, 1, 1, 0>(n, t, k); }
extern "C" __global__ void cover_splitk(int* n, int t, int k) { cover<1, 1, 2, 0>(n, t, k); }
extern "C" __global__ void cover_streamk(int* n, int t, int k) { cover<1, 1, 1, 1>(n, t, k); }
extern "C" __global__ void cover_streamk2(int* n, int t, int k) { cover<1, 1, 1, 2>(n, t, k); }
extern "C" __global__ void cover_cluster(int* n, int t, int k) { cover<2, 1, 1, 0>(n, t, k); }
""",
}

# (kernel, CTAs, units (tiles; clusters of 2 for cover_cluster), k-tiles a unit; split-K: the
# split counted into the grid of the plain kernels)
COVER_CASES = [
    ("cover_plain", 37, 37, 13),
    ("cover_persist", 8, 37, 13),
    ("cover_splitk", 8, 37, 12),
    ("cover_streamk", 8, 37, 13),
    ("cover_streamk", 132, 300, 64),
    ("cover_streamk", 8, 16, 5),          # a whole number of waves: no stream-K part
    ("cover_streamk2", 8, 37, 13),
    ("cover_cluster", 16, 37, 13),        # 8 clusters of 2
]


@functools.lru_cache(maxsize=None)
def _compile(name: str) -> bytes:
    opts = [*BASE_OPTIONS, "--gpu-architecture=sm_90a", f"-I{INCLUDE_DIR}"]
    ok, log, cubin = _nvrtc_compile(KERNELS[name], f"{name}.cu", opts)
    assert ok, log
    assert cubin and "warning" not in log.replace("Remark", ""), log
    return cubin


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernels_compile(name):
    """No GPU needed: what the device tests below launch compiles for sm_90a."""
    _compile(name)


# ---- the scheduler on the host (CPU) ----------------------------------------------------------
HOST_SCHED = """
#include <algorithm>
#include <cstdio>
#include <vector>
using std::max; using std::min;
struct Dim { unsigned x, y, z; };
static Dim gridDim, blockIdx;
#include "hopper/tile_scheduler.cuh"
template <int kC, int kP, int kS, int kK>
static std::vector<int> cover(int ctas, int ntiles, int kt_n) {
  std::vector<int> n(ntiles * kt_n);
  gridDim.x = ctas;
  for (int b = 0; b < ctas; b += kC) {
    blockIdx.x = b;
    hopper::Work w;
    for (int it = 0; hopper::TileScheduler<kC, kP, kS, kK>::at(it, w, ntiles, kt_n);
         it += w.ke - w.kb)
      for (int k = w.kb; k < w.ke; ++k) ++n[w.tile * kt_n + k];
  }
  return n;
}
int main() {
  int bad = 0;
  auto check = [&](const char* what, const std::vector<int>& n) {
    for (int v : n) if (v != 1) { std::printf("%s: a k-tile covered %d times\\n", what, v); ++bad; return; }
  };
  check("plain", cover<1, 0, 1, 0>(37, 37, 13));
  check("persist", cover<1, 1, 1, 0>(8, 37, 13));
  check("splitk", cover<1, 1, 2, 0>(8, 37, 12));
  check("splitk4", cover<1, 1, 4, 0>(132, 64, 64));
  for (int ctas : {1, 7, 8, 132})
    for (int nt : {1, 5, 16, 37, 300})
      for (int kt : {1, 5, 13, 64}) {
        check("streamk", cover<1, 1, 1, 1>(ctas, nt, kt));
        check("streamk2", cover<1, 1, 1, 2>(ctas, nt, kt));
        check("persist", cover<1, 1, 1, 0>(ctas, nt, kt));
      }
  check("cluster", cover<2, 1, 1, 0>(16, 37, 13));
  check("cluster_streamk", cover<2, 1, 1, 1>(16, 37, 13));
  return bad != 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
def test_tile_scheduler_covers_every_k_tile_once_host(tmp_path):
    """tile_scheduler.cuh is integer logic over gridDim / blockIdx: compiled for the host with
    those as globals (porter.cuh stubbed), every configuration hands each k-tile out once."""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "porter.cuh").write_text("#pragma once\n#define __device__\n"
                                     "#define __forceinline__ inline\n")
    (tmp_path / "sched.cpp").write_text(HOST_SCHED)
    build = subprocess.run(["g++", "-std=c++17", "-O1", f"-I{stub}", f"-I{INCLUDE_DIR}",
                            "-o", str(tmp_path / "sched"), str(tmp_path / "sched.cpp")],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(tmp_path / "sched")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout


# ---- on the device ----------------------------------------------------------------------------
def _has_sm90():
    try:
        from porter.measure.backends.gpu import gpu_available
        import cupy
    except ImportError:
        return False
    return gpu_available() and cupy.cuda.Device().compute_capability == "90"


def _launch(name: str, kernel: str, grid, block, smem: int, args) -> None:
    """Loads the cubin in CuPy's context, launches by cuLaunchKernelEx and waits at most 30 s."""
    import cupy
    from porter.measure import tma
    cupy.zeros(1)           # CuPy's primary context current on this thread
    cupy.cuda.Device().synchronize()
    mod, func = tma.load_function(_compile(name), kernel)
    tma.launch(func, grid, block, smem, (1, 1, 1), args)
    done = cupy.cuda.Event()
    done.record()
    deadline = time.monotonic() + 30
    while not done.done:
        if time.monotonic() > deadline:
            pytest.fail(f"{kernel} did not finish within 30 s (a hang)")
        time.sleep(0.01)
    cupy.cuda.Device().synchronize()   # raises a launch error, if any
    del mod


def _ptr(a):
    return ctypes.c_void_p(a.data.ptr)


def _unswizzle128(box: np.ndarray) -> np.ndarray:
    """A 64 x 64 bf16 box as TMA's 128-byte swizzle lays it out -> row-major: 16-byte chunk q
    of row r sits at chunk q ^ (r % 8)."""
    rows = box.reshape(64, 8, 8)
    out = np.empty_like(rows)
    for r in range(64):
        for q in range(8):
            out[r, q] = rows[r, q ^ (r % 8)]
    return out.reshape(64, 64)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_sm90(), reason="needs CuPy and an sm_90 GPU")
def test_tma_2d_box_swizzled_and_zero_past_the_edge():
    import cupy
    from porter.measure import tma
    rows, cols = 100, 128
    src = np.arange(rows * cols, dtype=np.uint16).reshape(rows, cols)   # all distinct, 0 only at [0, 0]
    a = cupy.asarray(src)
    out = cupy.full(64 * 64, 0xFFFF, dtype=cupy.uint16)
    m = tma.encode_tiled_2d(a.data.ptr, rows, cols, cols * 2, 64, 64, 128)
    # the box at column 64, row 64: rows 100..127 lie past the edge
    _launch("tma_box", "tma_box", (1,), (128,), 1024 + 8192 + 64,
            [_ptr(out), m, ctypes.c_int(0), ctypes.c_int(64), ctypes.c_int(64), ctypes.c_int(0)])
    got = _unswizzle128(cupy.asnumpy(out))
    want = np.zeros((64, 64), dtype=np.uint16)
    want[:rows - 64] = src[64:, 64:]
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_sm90(), reason="needs CuPy and an sm_90 GPU")
@pytest.mark.parametrize("head", [0, 1])
def test_tma_attention_rank3_map_stays_inside_its_head(head):
    """AttentionOp.tensor_map (what the GPU child passes): {D, S, B * heads}; a box of 64
    rows at row 0 of a head with S = 40 holds its 40 rows, then zeros (not the next head)."""
    import cupy
    from porter.measure.ops import get_op
    B, H, S, D = 1, 2, 40, 64
    src = np.arange(B * H * S * D, dtype=np.uint16).reshape(B, H, S, D) + 1
    state = {"Q": cupy.asarray(src)}
    m = get_op("attention").tensor_map(state, "Q", (64, 64, 1), 128)
    out = cupy.full(64 * 64, 0xFFFF, dtype=cupy.uint16)
    _launch("tma_box", "tma_box", (1,), (128,), 1024 + 8192 + 64,
            [_ptr(out), m, ctypes.c_int(1), ctypes.c_int(0), ctypes.c_int(0),
             ctypes.c_int(head)])
    got = _unswizzle128(cupy.asnumpy(out))
    want = np.zeros((64, 64), dtype=np.uint16)
    want[:S] = src[0, head]
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_sm90(), reason="needs CuPy and an sm_90 GPU")
def test_wgmma_ss_and_rs_tile_products():
    """Small integers (exact in bf16 and in the fp32 accumulators): S = A B^T over K = 64 from
    swizzled shared memory, then O = P V with P = S converted in the registers."""
    import cupy
    from porter.measure import tma
    rng = np.random.default_rng(22)
    A = rng.integers(-1, 2, (64, 64)).astype(np.float32)     # [m, k]
    Bm = rng.integers(-1, 2, (64, 64)).astype(np.float32)    # [n, k]
    V = rng.integers(-2, 3, (64, 64)).astype(np.float32)     # [k, n]: MN-major

    def bf16(x):    # exact for these integers: the high half of the fp32 bits
        return cupy.asarray((x.view(np.uint32) >> 16).astype(np.uint16))

    a, b, v = bf16(A), bf16(Bm), bf16(V)
    maps = [tma.encode_tiled_2d(t.data.ptr, 64, 64, 128, 64, 64, 128) for t in (a, b, v)]
    s_out = cupy.full(64 * 64, np.nan, dtype=cupy.float32)
    o_out = cupy.full(64 * 64, np.nan, dtype=cupy.float32)
    _launch("wgmma_tiles", "wgmma_tiles", (1,), (128,), 1024 + 3 * 8192 + 64,
            [_ptr(s_out), _ptr(o_out), *maps])
    S = A @ Bm.T                    # |S| <= 64: exact in bf16
    np.testing.assert_allclose(cupy.asnumpy(s_out).reshape(64, 64), S, rtol=0, atol=1e-3)
    np.testing.assert_allclose(cupy.asnumpy(o_out).reshape(64, 64), S @ V, rtol=0, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_sm90(), reason="needs CuPy and an sm_90 GPU")
def test_pipeline_ring_passes_every_stage():
    """16 boxes through 3 stages (the ring wraps five times, phases flip): each consumer warp
    sees stage n's data only after the producer's TMA landed, and the producer overwrites a
    stage only after all four consumer warps released it."""
    import cupy
    from porter.measure import tma
    items = 16
    src = np.arange(items * 8 * 64, dtype=np.uint16).reshape(items * 8, 64)
    a = cupy.asarray(src)
    out = cupy.full(items * 512, 0xFFFF, dtype=cupy.uint16)
    m = tma.encode_tiled_2d(a.data.ptr, items * 8, 64, 128, 64, 8, 0)   # no swizzle: rows as is
    _launch("pipeline_ring", "pipeline_ring", (1,), (160,), 1024 + 3 * 1024 + 64,
            [_ptr(out), m, ctypes.c_int(items)])
    np.testing.assert_array_equal(cupy.asnumpy(out).reshape(items * 8, 64), src)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_sm90(), reason="needs CuPy and an sm_90 GPU")
@pytest.mark.parametrize("kernel,ctas,ntiles,kt_n", COVER_CASES)
def test_tile_scheduler_covers_every_k_tile_once(kernel, ctas, ntiles, kt_n):
    import cupy
    n = cupy.zeros(ntiles * kt_n, dtype=cupy.int32)
    _launch("cover", kernel, (ctas,), (32,), 0,
            [_ptr(n), ctypes.c_int(ntiles), ctypes.c_int(kt_n)])
    counts = cupy.asnumpy(n)
    assert (counts == 1).all(), np.flatnonzero(counts != 1)[:20]
