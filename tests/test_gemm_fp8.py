"""The gemm_fp8 template and op without a GPU: the space loads and refuses other architectures
(one line from the CLI), its constraints keep accumulators, shared memory and TMA rules within
bounds, chosen configurations compile for sm_90a with NVRTC with no spills and no serialized
wgmma, the e4m3 conversions are exact, the op's tensor maps are bytes for A and B and bf16 for C,
and the generated fp8 wgmma header is what its generator writes."""
from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from porter.build.compile import compile_variant
from porter.errors import ArchError, PorterError, TemplateError
from porter.measure import tma
from porter.measure.ops import get_op, validate_template
from porter.measure.ops.gemm_fp8 import (E4M3, E5M2, check_size, dequantize, from_e4m3,
                                         from_fp8, quantize, to_e4m3, to_fp8)
from porter.spec.arch import ARCHS, check_features, get_arch
from porter.spec.template import INCLUDE_DIR, find_template
from fp8_configs import BASE

ROOT = Path(__file__).resolve().parents[1]
SM90A = ARCHS["sm_90a"]
BIG = (8192, 8192, 8192, 1, 1)
CONFIGS = [
    BASE,
    {**BASE, "EPI": 0},
    {**BASE, "STREAMK": 1},
    {**BASE, "STREAMK": 2, "GROUP_M": 8},
    {**BASE, "CLUSTER": 2},
    {**BASE, "BM": 256, "BN": 128},
    {**BASE, "BM": 64, "BN": 128, "CONSUMERS": 1, "STAGES": 8},
    # promoted: 2 x 96 accumulators rewritten every k-tile, or 2 x 64 over longer intervals
    {**BASE, "BN": 192, "STAGES": 5, "PROMOTE": 1},
    {**BASE, "BN": 192, "STAGES": 5, "PROMOTE": 1, "CLUSTER": 2},
    {**BASE, "BN": 128, "STAGES": 6, "PROMOTE": 2},
    {**BASE, "BN": 128, "STAGES": 6, "PROMOTE": 4, "STREAMK": 1},
    # the consumers issuing their MMAs in turn (named barriers)
    {**BASE, "BN": 192, "STAGES": 5, "PROMOTE": 1, "ORDERED": 1, "STREAMK": 1},
    {**BASE, "ORDERED": 1, "CLUSTER": 2},
    # per-row/column scales loaded before the k-loop
    {**BASE, "EARLY_SCALES": 1, "STREAMK": 1},
    {**BASE, "BN": 192, "STAGES": 5, "PROMOTE": 1, "EARLY_SCALES": 1},
    # widths that are not whole 64-column boxes (stored from the registers): 128 x 144 promoted
    # in clusters of 2 (cuBLASLt's promoted tile on the H100), over longer intervals, with
    # stream-K and early scales (5 column blocks of scales for 144 columns), 160 fast
    {**BASE, "BN": 144, "STAGES": 6, "PROMOTE": 1, "CLUSTER": 2, "EPI": 0},
    {**BASE, "BN": 144, "STAGES": 6, "PROMOTE": 2, "EPI": 0},
    {**BASE, "BN": 144, "STAGES": 6, "PROMOTE": 1, "STREAMK": 1, "EARLY_SCALES": 1, "EPI": 0},
    {**BASE, "BN": 160, "STAGES": 5, "EPI": 0, "CLUSTER": 2},
    # ping-pong: each consumer a whole 128 x 128 tile (2 x 64 accumulators), in clusters of 2
    # with per-row/column scales loaded early, 64-row tiles 256 wide, promoted 128 x 96
    {**BASE, "BN": 128, "STAGES": 6, "PINGPONG": 1},
    {**BASE, "BN": 128, "STAGES": 6, "PINGPONG": 1, "CLUSTER": 2, "EARLY_SCALES": 1},
    {**BASE, "BN": 128, "STAGES": 6, "PINGPONG": 1, "EPI": 0},
    {**BASE, "BN": 96, "STAGES": 6, "PINGPONG": 1, "PROMOTE": 1, "EPI": 0},
    # ping-pong 128 x 192 (2 x 96 accumulators a consumer thread) in clusters of 2, with early
    # per-row/column scales
    {**BASE, "BN": 192, "STAGES": 5, "PINGPONG": 1, "CLUSTER": 2},
    {**BASE, "BN": 192, "STAGES": 5, "PINGPONG": 1, "CLUSTER": 2, "EARLY_SCALES": 1},
    # two partial sets in turn (3 x 64 or 3 x 72 accumulators, the consumers at 240 registers):
    # 128 x 128 alone, in clusters of 2 with early scales from the registers, with stream-K;
    # 128 x 144 (cuBLASLt's promoted tile); ping-pong 128 x 64; 64 x 128 on one consumer
    {**BASE, "BN": 128, "STAGES": 6, "PROMOTE": 1, "PSETS": 2},
    {**BASE, "BN": 128, "STAGES": 6, "PROMOTE": 1, "PSETS": 2, "CLUSTER": 2, "EARLY_SCALES": 1,
     "EPI": 0},
    {**BASE, "BN": 128, "STAGES": 6, "PROMOTE": 1, "PSETS": 2, "STREAMK": 1},
    {**BASE, "BN": 144, "STAGES": 6, "PROMOTE": 1, "PSETS": 2, "CLUSTER": 2, "EPI": 0},
    {**BASE, "BN": 144, "STAGES": 6, "PROMOTE": 1, "PSETS": 2, "STREAMK": 2, "EARLY_SCALES": 1,
     "EPI": 0},
    {**BASE, "BN": 64, "STAGES": 8, "PINGPONG": 1, "PROMOTE": 1, "PSETS": 2},
    {**BASE, "BM": 64, "CONSUMERS": 1, "BN": 128, "STAGES": 8, "PROMOTE": 1, "PSETS": 2},
    # TMA-stored widths that are not whole 64-column boxes: 144 (two boxes, 16 columns from the
    # registers), 160 (an overlapping third box), 96 on ping-pong
    {**BASE, "BN": 144, "STAGES": 6, "PROMOTE": 1, "PSETS": 2, "CLUSTER": 2},
    {**BASE, "BN": 160, "STAGES": 5, "CLUSTER": 2},
    {**BASE, "BN": 96, "STAGES": 6, "PINGPONG": 1, "PROMOTE": 1},
    # a half-width promotion set (128 + 64 accumulators): 128 x 256 promoted alone, in clusters
    # of 2 with early scales, with stream-K from the registers; ping-pong 128 x 128 promoted
    {**BASE, "PROMOTE": 1, "PSPLIT": 2},
    {**BASE, "PROMOTE": 1, "PSPLIT": 2, "CLUSTER": 2, "EARLY_SCALES": 1},
    {**BASE, "PROMOTE": 1, "PSPLIT": 2, "STREAMK": 1, "EPI": 0},
    {**BASE, "BN": 128, "STAGES": 6, "PINGPONG": 1, "PROMOTE": 1, "PSPLIT": 2},
    # ... over intervals of 2 and 4 k-tiles (the interval's stages all held)
    {**BASE, "PROMOTE": 2, "PSPLIT": 2},
    {**BASE, "PROMOTE": 2, "PSPLIT": 2, "CLUSTER": 2, "STREAMK": 2},
    {**BASE, "BN": 192, "STAGES": 5, "PROMOTE": 4, "PSPLIT": 2},
    {**BASE, "BN": 192, "STAGES": 5, "PROMOTE": 2, "PSPLIT": 2, "STREAMK": 1},
]


def _feasible(tpl, config, size=BIG) -> bool:
    env = tpl.env(config, SM90A, size)
    return all(bool(c(env)) for c in tpl.constraints)


def test_space_loads_and_matches_the_op():
    tpl = find_template("gemm_fp8")
    assert tpl.op == "gemm_fp8" and tpl.kernel == "gemm_fp8"
    assert set(tpl.requires) == {"wgmma", "tma", "setmaxnreg"}
    assert tpl.supported_archs() == ("sm_90a",)
    assert tpl.size_names == ("M", "N", "K", "SCALING", "ACCUM")
    validate_template(tpl)            # the kernel's parameters against the op's arguments
    env = tpl.env(BASE, SM90A, BIG)
    # fp8: 128 elements (one 128-byte swizzle row) along K per box; C in 64 x 64 bf16 boxes
    assert [[int(e(env)) for e in tm.box] for tm in tpl.tensor_maps] == [[128, 128], [128, 256],
                                                                          [64, 64]]
    env = tpl.env({**BASE, "CLUSTER": 2, "EPI": 0}, SM90A, BIG)
    assert [[int(e(env)) for e in tm.box] for tm in tpl.tensor_maps] == [[128, 128], [128, 128],
                                                                          [0, 0]]
    L = tpl.launch(BASE, SM90A, BIG)
    assert L.block == (384, 1, 1) and L.grid == (132, 1, 1) and L.smem <= SM90A.smem_per_block
    assert tpl.launch(BASE, SM90A, (256, 512, 1024, 1, 1)).grid == (4, 1, 1)
    assert tpl.workspace_bytes(BASE, SM90A, BIG) == 0
    sk = {**BASE, "STREAMK": 1}
    assert tpl.workspace_bytes(sk, SM90A, BIG) == 2048 * 4 + 2 * 132 * 128 * 256 * 4
    assert tpl.workspace_clean_bytes(sk, SM90A, BIG) == 2048 * 4
    assert all(_feasible(tpl, c, BIG[:4] + ((2,) if c["PROMOTE"] else (1,))) for c in CONFIGS)


def test_constraints_reject_what_cannot_work():
    tpl = find_template("gemm_fp8")
    promoted = (8192, 8192, 8192, 2, 2)
    assert _feasible(tpl, BASE)
    assert not _feasible(tpl, BASE, promoted)                            # promotion asked for
    assert not _feasible(tpl, {**BASE, "PROMOTE": 1})                    # ... and only then
    assert not _feasible(tpl, {**BASE, "PROMOTE": 1}, promoted)          # 2 x 128 accumulators
    assert _feasible(tpl, {**BASE, "BN": 192, "STAGES": 5, "PROMOTE": 1}, promoted)
    assert not _feasible(tpl, {**BASE, "BN": 192, "STAGES": 5, "PROMOTE": 2}, promoted)  # spills
    assert not _feasible(tpl, {**BASE, "STAGES": 5})                     # 241 KB of smem
    assert not _feasible(tpl, {**BASE, "CONSUMERS": 1})                  # 256 accumulators
    assert not _feasible(tpl, BASE, (8192, 8192, 8200, 1, 1))            # K pitch: 16 bytes
    assert not _feasible(tpl, BASE, (8192, 8188, 8192, 1, 1))            # C's TMA pitch
    assert _feasible(tpl, {**BASE, "EPI": 0}, (8192, 8188, 8192, 1, 1))
    assert not _feasible(tpl, BASE, (8192, 8192, 8192, 3, 1))            # no such scaling
    assert not _feasible(tpl, {**BASE, "STREAMK": 1}, (128 * 132, 256, 4096, 1, 1))  # 1 wave
    assert not _feasible(tpl, {**BASE, "BM": 64, "CONSUMERS": 1, "BN": 128, "ORDERED": 1})
    pp = {**BASE, "BN": 128, "STAGES": 6, "PINGPONG": 1}
    assert _feasible(tpl, pp)
    assert not _feasible(tpl, {**pp, "BN": 256, "STAGES": 4})            # 2 x 128 a consumer
    assert _feasible(tpl, {**pp, "BN": 192, "STAGES": 5})                # 2 x 96
    assert not _feasible(tpl, {**pp, "BN": 192, "STAGES": 5, "PROMOTE": 1}, promoted)
    assert not _feasible(tpl, {**pp, "STREAMK": 1})
    assert not _feasible(tpl, {**pp, "ORDERED": 1})
    assert not _feasible(tpl, pp, (1024, 1024, 8192, 1, 1))              # 64 tiles: < 2 a CTA
    two = {**BASE, "BN": 128, "STAGES": 6, "PROMOTE": 1, "PSETS": 2}
    assert _feasible(tpl, two, promoted)
    assert _feasible(tpl, {**two, "BN": 144, "EPI": 0, "CLUSTER": 2}, promoted)   # 3 x 72
    assert not _feasible(tpl, {**two, "BN": 160, "EPI": 0}, promoted)   # 3 x 80 spills
    assert not _feasible(tpl, {**two, "PROMOTE": 2}, promoted)           # sets of one k-tile
    assert not _feasible(tpl, {**two, "ORDERED": 1}, promoted)
    assert not _feasible(tpl, {**two, "PROMOTE": 0}, BIG)                # nothing to promote
    half = {**BASE, "PROMOTE": 1, "PSPLIT": 2}                          # 128 + 64 a thread
    assert _feasible(tpl, half, promoted)
    assert not _feasible(tpl, half, BIG)                                 # fast: no set at all
    assert not _feasible(tpl, {**half, "PSETS": 2}, promoted)            # 2 x 64 + 128
    assert _feasible(tpl, {**half, "PROMOTE": 2}, promoted)              # 128 + 64 still
    assert not _feasible(tpl, {**half, "PROMOTE": 4}, promoted)          # 4 stages held: none free
    assert _feasible(tpl, {**half, "BN": 192, "STAGES": 5, "PROMOTE": 4}, promoted)
    assert not _feasible(tpl, {**half, "ORDERED": 1}, promoted)
    assert not _feasible(tpl, {**pp, "BN": 192, "STAGES": 5, "PROMOTE": 1, "PSPLIT": 2},
                         promoted)                                       # 192 + 96
    assert _feasible(tpl, {**pp, "PROMOTE": 1, "PSPLIT": 2}, promoted)   # ping-pong 128 + 64
    assert not _feasible(tpl, {**pp, "PROMOTE": 1}, promoted)            # ... a full set: 256


def test_every_seed_is_feasible_somewhere():
    tpl = find_template("gemm_fp8")
    for seed in tpl.seeds:
        cfg = {**{k: v[0] for k, v in tpl.params.items()}, **seed}
        acc = 2 if cfg["PROMOTE"] else 1
        assert _feasible(tpl, cfg, (8192, 8192, 8192, 1, acc)), seed


def test_every_pick_of_the_final_is_feasible_at_its_size():
    """benchmarks/gemm_fp8_picks.json (the final's hand-picked and ported candidates): each
    passes the space's static checks at its size and accumulation, so none is dropped there
    unseen, and each shape and accumulation has both tile schedules among its candidates."""
    import json
    from porter.build.check import static_check
    tpl = find_template("gemm_fp8")
    picks = json.loads((ROOT / "benchmarks" / "gemm_fp8_picks.json").read_text())
    schedules: dict = {}
    for x in picks:
        cfg = tpl.complete(x["params"])
        assert static_check(tpl, SM90A, cfg, [tuple(x["size"])]) is None, x
        schedules.setdefault(tuple(x["size"][:3]) + (x["size"][4],), set()).add(
            (cfg["PINGPONG"], cfg["EPI"]))
    assert len(schedules) == 10       # five shapes, both accumulations
    assert all({p for p, _ in s} == {0, 1} for s in schedules.values()), schedules


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(
    f"{k}{v}" for k, v in c.items() if BASE[k] != v) or "base")
def test_compiles_for_sm90a_without_spills(config, cache):
    tpl = find_template("gemm_fp8")
    res = compile_variant(tpl, config, SM90A, use_cache=False)
    assert res.ok, res.log[-2000:]
    r = res.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, res.log[-2000:]
    assert r.registers <= (240 if config["CONSUMERS"] == 1 else 168)
    # C7514: wgmma serialized; C7508: setmaxnreg ignored
    assert "C7514" not in res.log and "C7508" not in res.log and "warning" not in res.log.lower()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100a"])
def test_refuses_architectures_without_wgmma(arch):
    tpl = find_template("gemm_fp8")
    with pytest.raises(ArchError, match="wgmma"):
        check_features(get_arch(arch), tpl.requires, tpl.name)
    with pytest.raises(PorterError):
        tpl.check_arch(get_arch(arch))


def test_cli_refuses_sm80_in_one_line(tmp_path):
    env = dict(os.environ, COLUMNS="200", PORTER_DB_URL=f"sqlite:///{tmp_path / 'p.db'}",
               PORTER_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run([sys.executable, "-m", "porter.cli", "port", "gemm_fp8", "--arch", "sm_80",
                        "--backend", "compile-only"], capture_output=True, text=True, env=env,
                       timeout=120, cwd=ROOT)
    lines = (p.stdout + p.stderr).strip().splitlines()
    assert p.returncode != 0 and len(lines) == 1 and "wgmma" in lines[0], lines


def test_sizes_are_checked_in_one_line():
    assert check_size((64, 64, 128, 2, 1)) == (64, 64, 128, 2, 1)
    for bad in [(64, 64, 128, 3, 1), (64, 64, 128, 1, 0), (64, 64, 120, 1, 1), (64, 64, 128)]:
        with pytest.raises(TemplateError) as e:
            check_size(bad)
        assert "\n" not in str(e.value)


def test_e4m3_conversions_are_exact():
    finite = np.array([c for c in range(256) if c not in (0x7F, 0xFF, 0x80)], np.uint8)
    assert np.array_equal(to_e4m3(from_e4m3(finite)), finite)        # every value round-trips
    assert E4M3[0x7E] == 448 and E4M3[0x01] == 2.0 ** -9 and E4M3[0x38] == 1.0
    assert np.isnan(E4M3[0x7F]) and np.isnan(E4M3[0xFF])
    x = np.array([1.0625, 1.1875, 2.0 ** -10, 3 * 2.0 ** -10, 460.0, 1e9, -1e9, -1.3],
                 np.float32)
    # ties go to the even code; magnitudes past 448 saturate; the sign is kept
    assert list(to_e4m3(x)) == [0x38, 0x3A, 0x00, 0x02, 0x7E, 0x7E, 0xFE, 0xBA]
    rng = np.random.default_rng(0)
    v = np.clip(rng.standard_normal(20000) * 50, -440, 440).astype(np.float32)
    q = from_e4m3(to_e4m3(v))
    # nearest: no code lies closer than the chosen one
    d = np.abs(E4M3[None, :0x7F] - np.abs(v)[:, None]).min(axis=1)
    assert np.array_equal(np.abs(q - v), d) and np.all(np.sign(q) * np.sign(v) >= 0)


def test_e5m2_conversions_are_exact():
    # e5m2 is the top byte of an IEEE half: every code's value is that half's
    half = (np.arange(256, dtype=np.uint16) << 8).view(np.float16).astype(np.float32)
    assert np.array_equal(E5M2, half, equal_nan=True)
    assert E5M2[0x7B] == 57344 and E5M2[0x3C] == 1.0 and E5M2[0x01] == 2.0 ** -16
    finite = np.array([c for c in range(256) if c & 0x7F < 0x7C and c != 0x80], np.uint8)
    assert np.array_equal(to_fp8(from_fp8(finite, "e5m2"), "e5m2"), finite)   # round trips
    # ties to the even code (1.125 between 1.0 and 1.25; 1.375 between 1.25 and 1.5), the
    # smallest subnormal's half to zero, saturation at 57344 (never infinity), the sign kept
    x = np.array([1.125, 1.375, 2.0 ** -17, 6e4, 1e9, -1e9, -3.3], np.float32)
    assert list(to_fp8(x, "e5m2")) == [0x3C, 0x3E, 0x00, 0x7B, 0x7B, 0xFB, 0xC3]
    # nearest against the half rounding of values a half holds exactly (fp32 -> half is exact
    # for them, so the half's own round-to-nearest-even to 8 bits is the answer)
    rng = np.random.default_rng(2)
    h = (rng.standard_normal(20000) * 1000).clip(-57344, 57344).astype(np.float16)
    bits = h.view(np.uint16).astype(np.uint32)
    low, top = bits & 0xFF, bits >> 8
    up = (low > 0x80) | ((low == 0x80) & (top % 2 == 1))
    want = np.where(up & ((top & 0x7F) < 0x7B), top + 1, top).astype(np.uint8)
    assert np.array_equal(to_fp8(h.astype(np.float32), "e5m2"), want)


def test_e5m2_variant_quantizes_a_in_e5m2_and_compiles(cache):
    tpl = find_template("gemm_fp8_e5m2")
    assert tpl.op == "gemm_fp8_e5m2" and "-DFP8_A=1" in tpl.options
    op = get_op("gemm_fp8_e5m2")
    assert op.formats == {"A": "e5m2", "B": "e4m3"} and get_op("gemm_fp8").formats["A"] == "e4m3"
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((4, 64)) * 1000).astype(np.float32)
    q, s = quantize(x, True, "e5m2")
    assert np.all(np.abs(from_fp8(q, "e5m2")).max(axis=1) == 57344)
    # e5m2 keeps 2 mantissa bits: within 1/8 of a value's magnitude (e4m3: 1/16)
    assert np.all(np.abs(dequantize(q, s, True, "e5m2") - x) <= np.abs(x) / 8 + s[:, None] * 2 ** -16)
    from porter.export.opargs import op_args
    assert op_args(tpl).dtype("A") == "e5m2" and op_args(tpl).dtype("B") == "e4m3"
    res = compile_variant(tpl, BASE, SM90A, use_cache=False)
    assert res.ok and res.resources.spill_stores == 0, res.log[-2000:]
    base = compile_variant(find_template("gemm_fp8"), BASE, SM90A, use_cache=False)
    # another MMA: e5m2 x e4m3
    assert Path(res.cubin_path).read_bytes() != Path(base.cubin_path).read_bytes()


def test_quantize_uses_the_whole_range_per_tensor_and_per_row():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((6, 64)) * np.exp(rng.uniform(-2, 2, (6, 1)))).astype(np.float32)
    for rowwise in (False, True):
        q, s = quantize(x, rowwise)
        assert q.dtype == np.uint8 and s.shape == ((6,) if rowwise else (1,))
        top = from_e4m3(q).__abs__().max(axis=1 if rowwise else None)
        assert np.all(top == 448)
        assert np.abs(dequantize(q, s, rowwise) - x).max() <= np.abs(x).max() / 16


class _FakeDriver:
    """Just enough of cuda.bindings.driver for tma.encode_tiled; records each call."""

    def __init__(self):
        ns = types.SimpleNamespace
        self.calls = []
        self.cuuint64_t = self.cuuint32_t = int
        self.CUresult = ns(CUDA_SUCCESS=0)
        self.CUtensorMapDataType = ns(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16="bf16",
                                      CU_TENSOR_MAP_DATA_TYPE_UINT8="u8")
        self.CUtensorMapInterleave = ns(CU_TENSOR_MAP_INTERLEAVE_NONE="none")
        self.CUtensorMapSwizzle = ns(CU_TENSOR_MAP_SWIZZLE_128B="128B")
        self.CUtensorMapL2promotion = ns(CU_TENSOR_MAP_L2_PROMOTION_L2_256B="l2",
                                         CU_TENSOR_MAP_L2_PROMOTION_NONE="l2_none")
        self.CUtensorMapFloatOOBfill = ns(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE="zero")

    def cuTensorMapEncodeTiled(self, *args):
        self.calls.append(args)
        return 0, types.SimpleNamespace(opaque=list(range(16)))


class _Arr:
    def __init__(self, shape, dtype, ptr):
        self.shape, self.dtype, self.data = shape, np.dtype(dtype), types.SimpleNamespace(ptr=ptr)


def test_tensor_maps_are_bytes_for_fp8_and_bf16_for_c(monkeypatch):
    drv = _FakeDriver()
    monkeypatch.setattr(tma, "_driver", lambda: drv)
    op = get_op("gemm_fp8")
    M, N, K = 1000, 776, 2064
    state = {"A": _Arr((M, K), np.uint8, 0x7f0000000000), "B": _Arr((N, K), np.uint8, 0x7f0000100000),
             "C": _Arr((M, N), np.uint16, 0x7f0000200000)}
    assert len(op.tensor_map(state, "A", (128, 128), 128)) == 128
    op.tensor_map(state, "B", (128, 256), 128)
    op.tensor_map(state, "C", (64, 64), 128)
    assert op.tensor_map(state, "C", (0, 0), 128) == bytes(128)       # unused: no driver call
    a, b, c = drv.calls
    assert a[:6] == ("u8", 2, 0x7f0000000000, [K, M], [K], [128, 128])
    assert b[0] == "u8" and b[3:6] == ([K, N], [K], [128, 256])
    assert c[0] == "bf16" and c[3:6] == ([N, M], [N * 2], [64, 64])
    state["A"] = _Arr((M, 2056), np.uint8, 0x7f0000000000)            # pitch not 16 bytes
    with pytest.raises(TemplateError, match="over A"):
        op.tensor_map(state, "A", (128, 128), 128)


def test_l2_promotion_follows_the_row_pitch_unless_the_probe_knob_names_another(monkeypatch):
    drv = _FakeDriver()
    monkeypatch.setattr(tma, "_driver", lambda: drv)
    op = get_op("gemm_fp8")
    monkeypatch.delenv("PORTER_TMA_L2_PROMOTION", raising=False)
    # pitches 1024 and 2016 bytes (on 32-byte sectors): 256 bytes; 1040 (16 off them): none
    for k in (1024, 2016, 1040):
        op.tensor_map({"A": _Arr((256, k), np.uint8, 0x7f0000000000)}, "A", (128, 128), 128)
    monkeypatch.setenv("PORTER_TMA_L2_PROMOTION", "none")
    op.tensor_map({"A": _Arr((256, 1024), np.uint8, 0x7f0000000000)}, "A", (128, 128), 128)
    monkeypatch.setenv("PORTER_TMA_L2_PROMOTION", "L2_256B")
    op.tensor_map({"A": _Arr((256, 1040), np.uint8, 0x7f0000000000)}, "A", (128, 128), 128)
    assert [c[9] for c in drv.calls] == ["l2", "l2", "l2_none", "l2_none", "l2"]
    monkeypatch.setenv("PORTER_TMA_L2_PROMOTION", "512B")
    with pytest.raises(ValueError, match="must be one of NONE, L2_64B, L2_128B, L2_256B"):
        tma.encode_tiled(0x7f0000000000, [1024, 256], [1024], [128, 128], elem_bytes=1)


def test_generated_fp8_wgmma_header_matches_its_generator(tmp_path):
    path = INCLUDE_DIR / "hopper" / "wgmma_fp8.cuh"
    text = path.read_text()
    marker = "// The generator (python3 gen.py > wgmma_fp8.cuh):\n"
    assert marker in text
    gen = "".join(line[3:] if line.startswith("// ") else line[2:]
                  for line in text.split(marker, 1)[1].splitlines(keepends=True))
    (tmp_path / "gen.py").write_text(gen.rstrip("\n") + "\n")
    out = subprocess.run([sys.executable, "gen.py"], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    assert out.rstrip("\n") == text.rstrip("\n")
    assert "m64n256k32.f32.e4m3.e4m3" in text and "m64n16k32.f32.e5m2.e4m3" in text


def test_final_results_file_is_named_after_the_gpu():
    """A final run on an H100 must not write a file named for the H200 (the issue's figures)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.gemm_fp8 import gpu_tag
    assert gpu_tag("NVIDIA H200") == "h200"
    assert gpu_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_tag("NVIDIA A100-SXM4-80GB") == "a100"
    assert gpu_tag("Some GPU") == "some_gpu"
