"""The gemm_wgmma template (Hopper sm_90a): it loads, refuses architectures without wgmma,
its constraints keep the accumulators and shared memory within bounds, and chosen
configurations compile with NVRTC for sm_90a with no spills and registers within the
setmaxnreg budget. No GPU needed."""
from __future__ import annotations

import pytest

from porter.arch import ARCHS, check_features, get_arch
from porter.compile import compile_variant
from porter.errors import ArchError, PorterError
from porter.template import find_template

SM90A = ARCHS["sm_90a"]

CONFIGS = [
    dict(BM=128, BN=128, BK=64, STAGES=4, CONSUMERS=1, GROUP_M=8, PERSIST=0, CLUSTER=1, EPI=0),
    dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=0),
    dict(BM=256, BN=128, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=0),
    dict(BM=128, BN=192, BK=64, STAGES=5, CONSUMERS=2, GROUP_M=8, PERSIST=0, CLUSTER=1, EPI=0),
    dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=2, EPI=1),
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _feasible(tpl, config, size=(4096, 4096, 4096)) -> bool:
    env = tpl.env(config, SM90A, size)
    return all(bool(c(env)) for c in tpl.constraints)


def test_space_loads_and_declares_hopper_features():
    tpl = find_template("gemm_wgmma")
    assert tpl.op == "gemm" and tpl.kernel == "gemm_wgmma"
    assert set(tpl.requires) == {"wgmma", "tma", "setmaxnreg"}
    assert tpl.supported_archs() == ("sm_90a",)
    assert [tm.buffer for tm in tpl.tensor_maps] == ["A", "B"]
    assert all(tm.swizzle == 128 for tm in tpl.tensor_maps)
    cfg = CONFIGS[1]
    env = tpl.env(cfg, SM90A, (4096, 4096, 4096))
    boxes = [[int(e(env)) for e in tm.box] for tm in tpl.tensor_maps]
    assert boxes == [[64, 128], [64, 256]]          # innermost first: {K, rows}
    assert all(x <= 256 for b in boxes for x in b)
    L = tpl.launch(cfg, SM90A, (4096, 4096, 4096))
    assert L.block == (384, 1, 1) and L.grid == (132, 1, 1)
    assert L.smem <= SM90A.smem_per_block
    L = tpl.launch(CONFIGS[0], SM90A, (4096, 4096, 4096))
    assert L.block == (256, 1, 1) and L.grid == (32 * 32, 1, 1)


@pytest.mark.parametrize("arch", ["sm_80", "sm_100a", "sm_90"])
def test_refuses_architectures_without_wgmma(arch):
    tpl = find_template("gemm_wgmma")
    with pytest.raises(ArchError, match="wgmma"):
        check_features(get_arch(arch), tpl.requires, tpl.name)
    with pytest.raises(PorterError):
        tpl.check_arch(get_arch(arch))
    tpl.check_arch(SM90A)   # no error


def test_constraints_reject_oversized_configs():
    tpl = find_template("gemm_wgmma")
    base = dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=0)
    assert _feasible(tpl, {**base, "EPI": 1})                    # 4 stages + 2 x 16 KB staging
    assert _feasible(tpl, base)
    assert not _feasible(tpl, {**base, "STAGES": 5})             # 240 KB of smem
    assert not _feasible(tpl, {**base, "CONSUMERS": 1})          # 256 accumulators / thread
    assert not _feasible(tpl, {**base, "BM": 64})                # 32 rows per consumer
    assert not _feasible(tpl, base, size=(4096, 4096, 4100))     # K pitch not 16-byte aligned
    n = sum(1 for c in tpl.iter_configs() if _feasible(tpl, c))
    assert 20 <= n < tpl.space_size()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(map(str, c.values())))
def test_compiles_for_sm90a_without_spills(cache, config):
    tpl = find_template("gemm_wgmma")
    assert _feasible(tpl, config)
    res = compile_variant(tpl, config, SM90A, use_cache=False)
    assert res.ok, res.log
    r = res.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, res.log
    threads = 128 * (config["CONSUMERS"] + 1)
    # the kernel's entry register count must fit the block on one SM, and the consumers'
    # setmaxnreg target (232 with two consumer warpgroups, 240 with one) must fit what the
    # producer gives back (it drops to 40)
    assert r.registers * threads <= SM90A.regs_per_sm
    consumer = 232 if config["CONSUMERS"] == 2 else 240
    assert 40 * 128 + consumer * 128 * config["CONSUMERS"] <= SM90A.regs_per_sm
    assert r.registers <= consumer
    assert "C7508" not in res.log and "ignored" not in res.log.lower(), res.log
    assert "serialized" not in res.log, res.log      # ptxas's wgmma serialization warning
    assert res.cubin_path and open(res.cubin_path, "rb").read(4) == b"\x7fELF"
