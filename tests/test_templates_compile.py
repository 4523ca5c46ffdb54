"""The built-in rmsnorm and gemm_mma templates: they load, their constraints pick sensible
configurations for the default sizes, and chosen configurations compile with NVRTC for sm_80,
sm_90a and sm_100a without spills, with the registers and static shared memory expected.
No GPU needed."""
from __future__ import annotations

import time

import pytest

from porter.spec.arch import ARCHS
from porter.build.compile import compile_variant
from porter.spec.template import find_template

COMPILE_ARCHS = ("sm_80", "sm_90a", "sm_100a")


def _feasible(tpl, config, arch, size) -> bool:
    env = tpl.env(config, arch, size)
    return all(bool(c(env)) for c in tpl.constraints)


def _feasible_configs(tpl, arch, size):
    return [c for c in tpl.iter_configs() if _feasible(tpl, c, arch, size)]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _compile(tpl, config, arch_name):
    arch = ARCHS[arch_name]
    t0 = time.perf_counter()
    res = compile_variant(tpl, config, arch, use_cache=False)
    wall = time.perf_counter() - t0
    print(f"{tpl.name} {arch_name} {tpl.config_key(config)}: {wall:.2f} s "
          f"(nvrtc {res.seconds:.2f} s), {res.resources.registers} regs, "
          f"{res.resources.smem_static} B static smem, "
          f"{res.resources.spill_stores}/{res.resources.spill_loads} B spilled")
    assert res.ok, res.log
    return res


# ---- rmsnorm ---------------------------------------------------------------------------------

RMS_CONFIGS = [
    # (config, size it is meant for)
    (dict(VEC=8, THREADS=256, ROWS=1, PER_THREAD=2, UNROLL=1), (16384, 4096)),
    (dict(VEC=8, THREADS=128, ROWS=2, PER_THREAD=4, UNROLL=1), (16384, 4096)),
    (dict(VEC=8, THREADS=256, ROWS=1, PER_THREAD=4, UNROLL=1), (32768, 8192)),
    (dict(VEC=8, THREADS=512, ROWS=1, PER_THREAD=4, UNROLL=1), (4096, 16384)),
    (dict(VEC=8, THREADS=128, ROWS=1, PER_THREAD=16, UNROLL=1), (4096, 16384)),
    (dict(VEC=4, THREADS=32, ROWS=4, PER_THREAD=0, UNROLL=4), (16384, 4096)),
]


def test_rmsnorm_space():
    tpl = find_template("rmsnorm")
    assert tpl.op == "rmsnorm" and tpl.kernel == "rmsnorm"
    assert tpl.size_names == ("rows", "cols")
    assert tpl.default_sizes == ((16384, 4096), (32768, 8192), (4096, 16384))
    assert set(COMPILE_ARCHS) <= set(tpl.supported_archs())
    assert tpl.space_size() <= 5000
    arch = ARCHS["sm_90a"]
    for size in tpl.default_sizes:
        feasible = _feasible_configs(tpl, arch, size)
        assert len(feasible) > 20, size
        for cfg in feasible:
            rows, cols = size
            assert cols % cfg["VEC"] == 0
            if cfg["PER_THREAD"]:
                # the row fits the registers of its threads
                assert cfg["PER_THREAD"] * cfg["VEC"] * cfg["THREADS"] >= cols
                assert cfg["UNROLL"] == 1
            assert cfg["THREADS"] * cfg["ROWS"] <= 1024
            launch = tpl.launch(cfg, arch, size)
            assert launch.grid[0] * cfg["ROWS"] >= rows
            assert launch.threads == cfg["THREADS"] * cfg["ROWS"] and launch.smem == 0
        # a one-pass, 16-byte-vector configuration exists for every default size
        assert any(c["VEC"] == 8 and c["PER_THREAD"] > 0 for c in feasible), size
    for cfg, size in RMS_CONFIGS:
        assert _feasible(tpl, cfg, arch, size), (cfg, size)
    # rejected: a row that does not fit the registers, odd widths, too many threads
    assert not _feasible(tpl, dict(VEC=8, THREADS=128, ROWS=1, PER_THREAD=2, UNROLL=1),
                         arch, (16384, 4096))
    assert not _feasible(tpl, dict(VEC=8, THREADS=128, ROWS=1, PER_THREAD=0, UNROLL=1),
                         arch, (16, 4100))
    assert not _feasible(tpl, dict(VEC=8, THREADS=512, ROWS=4, PER_THREAD=1, UNROLL=1),
                         arch, (16384, 4096))
    m = tpl.metric("bytes", RMS_CONFIGS[0][0], arch, (16384, 4096))
    assert m == 2 * 16384 * 4096 * 2 + 2 * 4096
    assert tpl.metric("flops", RMS_CONFIGS[0][0], arch, (16384, 4096)) == 3 * 16384 * 4096


@pytest.mark.parametrize("arch_name", COMPILE_ARCHS)
def test_rmsnorm_compiles(cache, arch_name):
    tpl = find_template("rmsnorm")
    for cfg, _size in RMS_CONFIGS:
        res = _compile(tpl, cfg, arch_name)
        r = res.resources
        assert 0 < r.registers <= 255
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, r
        warps_per_row = cfg["THREADS"] // 32
        expected_smem = cfg["ROWS"] * warps_per_row * 4 if warps_per_row > 1 else 0
        assert r.smem_static == expected_smem, (cfg, r)
        # registers stay within the space's estimate (PER_THREAD * VEC * 3/2 + 40)
        assert r.registers <= cfg["PER_THREAD"] * cfg["VEC"] * 3 // 2 + 40, (cfg, r)


# ---- gemm_mma --------------------------------------------------------------------------------

GEMM_MAIN = [
    dict(BM=128, BN=256, BK=32, WM=64, WN=64, STAGES=4, GROUP_M=8, SPLITK=1),
    dict(BM=128, BN=128, BK=32, WM=64, WN=32, STAGES=4, GROUP_M=8, SPLITK=1),
    dict(BM=256, BN=128, BK=64, WM=64, WN=64, STAGES=3, GROUP_M=8, SPLITK=1),
    dict(BM=128, BN=128, BK=64, WM=64, WN=64, STAGES=3, GROUP_M=4, SPLITK=2),
    dict(BM=64, BN=64, BK=32, WM=32, WN=32, STAGES=5, GROUP_M=1, SPLITK=4),
]


def _gemm_smem(cfg):
    # the cp.async ring, reused by the epilogue for the C tile (rows padded by 16 bytes)
    ring = cfg["STAGES"] * (cfg["BM"] + cfg["BN"]) * cfg["BK"] * 2
    return max(ring, cfg["BM"] * (cfg["BN"] * 2 + 16))


def test_gemm_space():
    tpl = find_template("gemm_mma")
    assert tpl.op == "gemm" and tpl.kernel == "gemm_mma"
    assert tpl.size_names == ("M", "N", "K")
    assert set(tpl.requires) == {"mma.sync", "cp.async", "ldmatrix", "bf16"}
    assert set(COMPILE_ARCHS) <= set(tpl.supported_archs())
    assert tpl.space_size() <= 5000
    for arch_name in ("sm_80", "sm_90a"):
        arch = ARCHS[arch_name]
        for size in ((4096, 4096, 4096), (8192, 8192, 8192)):
            feasible = _feasible_configs(tpl, arch, size)
            assert len(feasible) > 100, (arch_name, size)
            for cfg in feasible:
                launch = tpl.launch(cfg, arch, size)
                warps = (cfg["BM"] // cfg["WM"]) * (cfg["BN"] // cfg["WN"])
                assert 64 <= launch.threads == warps * 32 <= 1024
                assert launch.smem == _gemm_smem(cfg) <= arch.smem_per_block
                M, N, K = size
                assert launch.grid == ((M // cfg["BM"]) * (N // cfg["BN"]), 1, cfg["SPLITK"])
                ws = tpl.workspace_bytes(cfg, arch, size)
                if cfg["SPLITK"] == 1:
                    assert ws == 0
                else:
                    assert ws == M * N * 4 + (M // cfg["BM"]) * (N // cfg["BN"]) * 4
            for cfg in GEMM_MAIN[:3]:
                assert _feasible(tpl, cfg, arch, size), (arch_name, cfg, size)
    arch = ARCHS["sm_90a"]
    # whole tiles only; too much shared memory or too many registers is infeasible
    assert not _feasible(tpl, GEMM_MAIN[0], arch, (4096, 4096 + 64, 4096))
    assert not _feasible(tpl, GEMM_MAIN[0], arch, (4096, 4096, 4096 + 16))
    assert not _feasible(tpl, dict(GEMM_MAIN[3], SPLITK=4), arch, (4096, 4096, 4096 + 128))
    assert not _feasible(tpl, dict(GEMM_MAIN[0], BK=64, STAGES=5), arch, (4096, 4096, 4096))
    assert not _feasible(tpl, dict(GEMM_MAIN[0], BM=256, BN=256), arch, (4096, 4096, 4096))
    assert not _feasible(tpl, dict(GEMM_MAIN[0], BM=64, BN=64, WM=64, WN=64), arch,
                         (4096, 4096, 4096))
    # sm_80 has less shared memory per block than Hopper
    big = dict(GEMM_MAIN[0], BK=64, STAGES=4)
    assert _feasible(tpl, big, arch, (4096, 4096, 4096))
    assert not _feasible(tpl, big, ARCHS["sm_80"], (4096, 4096, 4096))
    assert tpl.metric("flops", GEMM_MAIN[0], arch, (4096, 4096, 4096)) == 2 * 4096 ** 3


@pytest.mark.parametrize("arch_name", COMPILE_ARCHS)
def test_gemm_compiles(cache, arch_name):
    tpl = find_template("gemm_mma")
    for cfg in GEMM_MAIN:
        res = _compile(tpl, cfg, arch_name)
        r = res.resources
        assert 0 < r.registers <= 255
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, (cfg, r)
        assert r.smem_static == 0, (cfg, r)          # dynamic shared memory only
        threads = (cfg["BM"] // cfg["WM"]) * (cfg["BN"] // cfg["WN"]) * 32
        assert r.registers * threads <= ARCHS[arch_name].regs_per_sm
        # at least the accumulators live in registers
        assert r.registers >= cfg["WM"] * cfg["WN"] // 32


def test_gemm_largest_tiles_do_not_spill(cache):
    """Every feasible 8-warp configuration with a 64x64 warp tile (the heaviest on registers)
    compiles spill-free for sm_90a."""
    tpl = find_template("gemm_mma")
    arch = ARCHS["sm_90a"]
    seen = set()
    for cfg in _feasible_configs(tpl, arch, (8192, 8192, 8192)):
        if (cfg["WM"], cfg["WN"], cfg["GROUP_M"], cfg["SPLITK"]) != (64, 64, 8, 1):
            continue
        if (cfg["BM"] // 64) * (cfg["BN"] // 64) != 8:
            continue
        key = (cfg["BM"], cfg["BN"], cfg["BK"])
        if key in seen:      # stages change shared memory, not registers
            continue
        seen.add(key)
        r = _compile(tpl, cfg, "sm_90a").resources
        assert r.spill_stores == 0 and r.spill_loads == 0, (cfg, r)
    assert {(128, 256, 32), (256, 128, 32)} <= seen
