"""The flash_attention_fwd template and the Hopper tile primitives (porter/include/hopper/):
the space loads, its constraints keep the configurations measured on the H200, the winners and
a spread of others compile for sm_90a without spills, sm_100a is refused for want of wgmma, and
the attention op states the kernel's signature. No GPU needed (the GPU checks are
benchmarks/attention.py)."""
from __future__ import annotations

import pytest

from porter.build.compile import compile_variant
from porter.errors import PorterError
from porter.spec.arch import ARCHS
from porter.spec.template import find_template

BASE = dict(HD=128, BN=128, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=0, PERSIST=1, EPI=1,
            CAUSAL_SKIP=1)
CONFIGS = [   # the H200 winners (docs/notes/attention.md), then the other code paths
    (BASE, "8x16x16x4096x128x2"),
    (dict(BASE, BN=176, EPI=0), "2x16x16x16384x128x1"),
    (dict(BASE, HD=64, CONSUMERS=3, PINGPONG=1), "8x16x16x4096x64x1"),
    (dict(BASE, INTRA=0, PERSIST=0, EPI=0, CAUSAL_SKIP=0), "2x4x4x1000x128x2"),
    (dict(BASE, CONSUMERS=1, BN=96, STAGES=4), "1x4x2x777x128x1"),
    (dict(BASE, BN=64, PINGPONG=1, PERSIST=0), "8x32x8x4096x128x1"),
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))


def _feasible(tpl, cfg, size):
    env = tpl.env(cfg, ARCHS["sm_90a"], tpl.parse_size(size))
    return all(bool(c(env)) for c in tpl.constraints)


def test_attention_space():
    tpl = find_template("flash_attention_fwd")
    assert tpl.op == "attention" and tpl.supported_archs() == ("sm_90a",)
    assert tpl.size_names == ("B", "H", "HKV", "S", "D", "MASK")
    for cfg, size in CONFIGS:
        assert _feasible(tpl, cfg, size), (cfg, size)
    # rejected: the head dim differs from D, smem over the limit, ping-pong without overlap,
    # three consumers whose S, P and O do not fit 160 registers
    assert not _feasible(tpl, dict(BASE, HD=64), "8x16x16x4096x128x1")
    assert not _feasible(tpl, dict(BASE, BN=176, STAGES=3), "8x16x16x4096x128x1")
    assert not _feasible(tpl, dict(BASE, INTRA=0, PINGPONG=1), "8x16x16x4096x128x1")
    assert not _feasible(tpl, dict(BASE, CONSUMERS=3), "8x16x16x4096x128x1")
    size = tpl.parse_size("8x16x16x4096x128x2")
    assert tpl.metric("flops", BASE, ARCHS["sm_90a"], size) == 4 * 8 * 16 * 4096 ** 2 * 128 // 2


def test_attention_compiles(cache):
    tpl = find_template("flash_attention_fwd")
    for cfg, _size in CONFIGS:
        res = compile_variant(tpl, cfg, ARCHS["sm_90a"], use_cache=False)
        assert res.ok, res.log
        r = res.resources
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, (cfg, r)


def test_attention_refused_without_wgmma():
    tpl = find_template("flash_attention_fwd")
    with pytest.raises(PorterError, match="wgmma"):
        tpl.check_arch(ARCHS["sm_100a"])


def test_attention_op_signature():
    from porter.measure.ops import get_op
    op = get_op("attention")
    assert op.dims == ("B", "H", "HKV", "S", "D", "MASK")
    # Q K V O LSE, B H HKV S causal scale, workspace (tensor maps follow)
    assert op.signature == ("p",) * 5 + ("s",) * 6 + ("p",)
