"""benchmarks/wgmma_rate.py's CPU side: its probe kernel compiles with NVRTC for the tiles it
times (the k-loop's MMAs in registers: no spills, no serialized wgmma), and each case's ring
fits the shared memory of a block."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import wgmma_rate as wr  # noqa: E402


def test_every_case_names_a_tile_its_warpgroups_cover():
    got = list(wr.cases())
    assert len(got) == 2 * (len(wr.CASES) + len(wr.CASES_FP8))
    assert {c["FP8"] for c in got} == {0, 1}
    for c in got:
        bm, bn = map(int, c["tile"].split("x"))
        assert bm == 64 * c["MT"] * c["WGS"] and bn == c["BN"]
        # the ring and its barriers fit a block's shared memory
        assert c["STAGES"] * (bm + bn) * 128 + 1024 + 16 * c["STAGES"] <= wr.SMEM_LIMIT


def test_stages_shrink_to_what_fits():
    assert wr.stages_for(128, 256) == 4
    assert wr.stages_for(256, 192) == 4        # 4 x 56 KB + alignment fits 227 KB
    assert wr.stages_for(256, 256) == 3        # 4 x 64 KB does not


@pytest.mark.parametrize("tile,mt,wgs,loads,fp8", [("256x152", 2, 2, 1, 0), ("128x256", 1, 2, 0, 0),
                                                   ("192x192", 1, 3, 1, 0),
                                                   ("128x144", 1, 2, 1, 1),
                                                   ("128x128", 2, 1, 1, 1)])
def test_probe_kernel_compiles_without_spills(tile, mt, wgs, loads, fp8):
    bm, bn = map(int, tile.split("x"))
    case = dict(tile=tile, BN=bn, MT=mt, WGS=wgs, LOADS=loads, STAGES=wr.stages_for(bm, bn),
                FP8=fp8)
    ok, log, cubin, regs, spills = wr.compile_case(case)
    assert ok, log[-500:]
    assert cubin[:4] == b"\x7fELF"
    assert spills == 0
    # setmaxnreg hands the producer's registers on (one consumer: 240, as gemm_fp8's)
    assert regs == {1: 240, 2: 168, 3: 128}[wgs]


def test_a_case_the_registers_cannot_hold_is_refused_in_one_line():
    ok, log, _, _, _ = wr.compile_case(dict(tile="256x256", BN=256, MT=2, WGS=2, LOADS=0,
                                            STAGES=3))
    assert not ok and "accumulators at most 200" in log
