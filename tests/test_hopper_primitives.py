"""The Hopper tile primitives (porter/include/hopper/) compile on their own: each header, included
alone in a tiny kernel that uses it, compiles with NVRTC for sm_90a; the generated wgmma header
is what its generator writes. No GPU needed (the templates built on them are compiled by
test_wgmma_compile.py and test_attention_compile.py; docs/notes/hopper_primitives.md)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from porter.build.compile import BASE_OPTIONS, INCLUDE_DIR, _nvrtc_compile

HOPPER = INCLUDE_DIR / "hopper"

# header -> a kernel body that uses it (smem: a 1024-aligned shared buffer; acc: accumulators)
USES = {
    "sync.cuh": """
        const uint32_t bar = smem;
        if (threadIdx.x == 0) { hopper::mbar_init(bar, 1); hopper::fence_barrier_init(); }
        __syncthreads();
        if (threadIdx.x == 0) { hopper::mbar_expect_tx(bar, 0); hopper::mbar_arrive(bar); }
        hopper::mbar_wait(bar, 0);
        hopper::named_sync(1, 128);
        hopper::fence_proxy_async();
        out[0] = hopper::cluster_rank();""",
    "tma.cuh": """
        hopper::tma::prefetch_desc(&map);
        hopper::tma::load_2d(smem, &map, smem + 8192, 0, 0);
        hopper::tma::load_2d_mc(smem, &map, smem + 8192, 0, 0, 3);
        hopper::tma::load_3d(smem, &map, smem + 8192, 0, 0, 0);
        hopper::tma::store_2d(&map, smem, 0, 0);
        hopper::tma::store_commit();
        hopper::tma::store_wait_read();
        hopper::tma::store_wait_all();""",
    "pipeline.cuh": """
        const hopper::Pipeline<3> pipe(smem);
        if (threadIdx.x == 0) pipe.init(4);
        __syncthreads();
        const auto c = hopper::Cursor<3>::at(out[1]);
        pipe.acquire(c);
        out[0] = pipe.commit(c, 1024) + hopper::Pipeline<3>::barrier_bytes();
        pipe.wait(c);
        pipe.release_cluster<1>(c);
        pipe.release_cluster<2>(c);
        hopper::Ring<3> ring(smem);
        hopper::Cursor<3> d;
        d.advance();
        ring.release(d);
        if (threadIdx.x == 0) pipe.drain(out[2]);""",
    "wgmma_bf16.cuh": """
        // operands from memory, as in a kernel (NVRTC 13.0's compiler crashes on descriptors
        // and accumulators that are all compile-time zeros)
        const uint64_t da = out[0] | (uint64_t)out[1] << 32, db = out[2];
        float d[116], e[4], f[100];
        for (int i = 0; i < 116; ++i) d[i] = __uint_as_float(out[i]);
        for (int i = 0; i < 4; ++i) e[i] = d[i];
        for (int i = 0; i < 100; ++i) f[i] = d[i + 16];
        uint32_t a[4];
        for (int i = 0; i < 4; ++i) a[i] = out[200 + i];
        hopper::wgmma_bf16<232, 0>::ss_acc(d, da, db);
        hopper::wgmma_bf16<8, 0>::ss(e, da, db, (int)out[3]);
        hopper::wgmma_bf16<200, 1>::rs(f, a, db, (int)out[4]);
        for (int i = 0; i < 4; ++i) d[i] += e[i];
        for (int i = 0; i < 100; ++i) d[i] += f[i];
        for (int i = 0; i < 116; ++i) out[i] = __float_as_uint(d[i]);""",
    "wgmma_f16.cuh": """
        // the fp16 twin of wgmma_bf16.cuh (the same generator): operands from memory
        const uint64_t da = out[0] | (uint64_t)out[1] << 32, db = out[2];
        float d[128], e[4];
        for (int i = 0; i < 128; ++i) d[i] = __uint_as_float(out[i]);
        for (int i = 0; i < 4; ++i) e[i] = d[i + 8];
        uint32_t a[4];
        for (int i = 0; i < 4; ++i) a[i] = out[200 + i];
        hopper::wgmma_f16<256, 0>::ss_acc(d, da, db);
        hopper::wgmma_f16<8, 1>::rs(e, a, db, (int)out[4]);
        for (int i = 0; i < 4; ++i) d[i] += e[i];
        for (int i = 0; i < 128; ++i) out[i] = __float_as_uint(d[i]);""",
    "wgmma_fp8.cuh": """
        // operands from memory, as in a kernel (see wgmma_bf16.cuh's use)
        const uint64_t da = out[0] | (uint64_t)out[1] << 32, db = out[2];
        float d[128], e[8];
        for (int i = 0; i < 128; ++i) d[i] = __uint_as_float(out[i]);
        for (int i = 0; i < 8; ++i) e[i] = d[i + 64];
        hopper::wgmma_fp8<256, 0, 0>::ss_acc(d, da, db);
        hopper::wgmma_fp8<16, 0, 1>::ss(e, da, db, (int)out[3]);
        for (int i = 0; i < 8; ++i) d[i] += e[i];
        for (int i = 0; i < 128; ++i) out[i] = __float_as_uint(d[i]);""",
    "wgmma.cuh": """
        float acc[2][112] = {};
        hopper::wgmma::fence();
        hopper::wgmma::mma_ss_k_tiles<224, 8, 2>(acc, smem, 8192, 16384, smem + 32768, 32768);
        hopper::wgmma::mma_ss_k<64, 4>(acc[0], smem, 8192, smem + 16384, 8192, false);
        const uint32_t p[16] = {};
        hopper::wgmma::mma_rs_mn<64, 4>(acc[1], p, smem, 8192);
        hopper::wgmma::commit();
        hopper::wgmma::wait<0>();
        hopper::wgmma::fence_regs<112>(acc[0]);
        for (int i = 0; i < 112; ++i) out[i] = acc[0][i] + acc[1][i];""",
    "fragment.cuh": """
        float d[16];
        for (int i = 0; i < 16; ++i) d[i] = hopper::frag::quad_max(i) + hopper::frag::quad_sum(i);
        uint32_t a[8];
        hopper::frag::acc_to_a_bf16<32>(d, a);
        hopper::frag::stmatrix_x4(smem, a[0], a[1], a[2], a[3]);
        out[0] = hopper::frag::acc_row(3) + hopper::frag::acc_col(5);""",
    "warpgroup.cuh": """
        if (hopper::warpgroup::index() == 0) {
          hopper::warpgroup::shrink_regs<40>();
        } else {
          hopper::warpgroup::grow_regs<232>();
          hopper::warpgroup::sync();
          out[hopper::warpgroup::thread()] = hopper::warpgroup::warp();
        }""",
    "epilogue.cuh": """
        float a[100];
        for (int i = 0; i < 100; ++i) a[i] = i;
        bf16_t* C = reinterpret_cast<bf16_t*>(out);
        const int tid = threadIdx.x % 128;
        hopper::epi::store_cols<0, 25>(a, C, 0, 0, 64, 200);
        hopper::epi::store_pairs<25>(a, C, 0, 0, 200);
        hopper::epi::store_staged<64, 200>(a, C, smem, 1, tid, 0, 0, 0, 0, 64, 200);
        hopper::epi::stmatrix_box_sw128(smem + tid * 128, tid % 64, tid / 16 % 2, a, 8);""",
    "tile_scheduler.cuh": """
        hopper::Work w;
        int n = 0, tm, tn;
        for (int it = 0; hopper::TileScheduler<1, 1, 1, 1>::at(it, w, 512, 64); it += w.ke - w.kb) {
          hopper::raster_grouped<16>(w.tile, 32, 16, tm, tn);
          n += tm + tn + hopper::TileScheduler<1, 1, 1, 1>::parts(w, 512, 64) +
               hopper::TileScheduler<1, 1, 1, 1>::slot(w, 0, 512, 64);
        }
        for (int it = 0; hopper::TileScheduler<2, 0, 4, 0>::at(it, w, 64, 64); it += 16)
          n += hopper::TileScheduler<2, 0, 4, 0>::me(w, 64);
        out[0] = n;""",
    "tile_reduce.cuh": """
        using R = hopper::TileReduce<1, 64, 128, 8, 128>;
        float acc[1][64] = {};
        uint32_t* ctr = R::counter(out, 3);
        float4* slots = R::slots(out, 16);
        if (threadIdx.x >= 128) {
          if (!R::count_in(ctr, 2, smem)) {
            R::store(slots + threadIdx.x % 128, acc, ctr);
          } else {
            R::wait_stored(ctr, 2);
            R::add(slots + 128 * 16 + threadIdx.x % 128, acc);
            out[threadIdx.x] = acc[0][5];
          }
          // the whole fix-up: split-K in 2 parts, slots of 128 * 16 float4s
          const hopper::Work w{1, 32, 64};
          const auto at = [&](int s) { return slots + (size_t)s * (128 * 16) + threadIdx.x % 128; };
          if (R::fix_up<hopper::TileScheduler<1, 1, 2, 0>>(ctr, at, 2, w, 4, 64, acc, smem))
            out[threadIdx.x] += acc[0][7];
        }""",
    # compiled out here (DEV_TRACE=0); tests/test_gemm_trace.py builds a kernel with it on
    "trace.cuh": """
        TRACE_START(threadIdx.x == 0);
        TRACE(threadIdx.x == 32, 1);
        TRACE_VAL(threadIdx.x == 0, 2, out[1]);
        TRACE_FLUSH(threadIdx.x % 128 == 0);
        out[0] = 1;""",
    "hopper.cuh": """
        out[0] = hopper::Pipeline<4>::barrier_bytes() + hopper::warpgroup::index();""",
}

KERNEL = """#include "porter.cuh"
#include "hopper/{header}"
#ifndef PORTER_CUTENSORMAP
struct alignas(64) CUtensorMap {{ uint64_t opaque[16]; }};
#endif
extern "C" __global__ void __launch_bounds__(256, 1)
use(uint32_t* out, const __grid_constant__ CUtensorMap map) {{
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t smem = (smem_u32(smem_raw) + 1023u) & ~1023u;
  (void)map; (void)smem;
  {body}
}}
"""


def test_every_header_is_exercised():
    assert {p.name for p in HOPPER.glob("*.cuh")} == set(USES)


@pytest.mark.parametrize("header", sorted(USES))
def test_header_compiles_alone_for_sm90a(header):
    src = KERNEL.format(header=header, body=USES[header])
    opts = [*BASE_OPTIONS, "--gpu-architecture=sm_90a", f"-I{INCLUDE_DIR}"]
    ok, log, cubin = _nvrtc_compile(src, f"use_{header}.cu", opts)
    assert ok, log
    assert cubin and "warning" not in log.replace("Remark", ""), log


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_generated_wgmma_header_matches_its_generator(tmp_path, dtype):
    # one generator writes both 16-bit headers (its argument names the operand type)
    text = (HOPPER / f"wgmma_{dtype}.cuh").read_text()
    marker = f"// The generator (python3 gen.py {dtype} > wgmma_{dtype}.cuh):\n"
    assert marker in text
    gen = "".join(line[3:] if line.startswith("// ") else line[2:]
                  for line in text.split(marker, 1)[1].splitlines(keepends=True))
    (tmp_path / "gen.py").write_text(gen.rstrip("\n") + "\n")
    out = subprocess.run([sys.executable, "gen.py", dtype], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    assert out.rstrip("\n") == text.rstrip("\n")


def test_wgmma_headers_share_one_generator():
    gens = [(HOPPER / f"wgmma_{t}.cuh").read_text().split("// The generator", 1)[1]
            .split("\n", 1)[1] for t in ("bf16", "f16")]
    assert gens[0] == gens[1]
