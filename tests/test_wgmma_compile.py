"""The gemm_wgmma template (Hopper sm_90a): it loads, refuses architectures without wgmma,
its constraints keep the accumulators and shared memory within bounds, and chosen
configurations compile with NVRTC for sm_90a with no spills and registers within the
setmaxnreg budget. No GPU needed."""
from __future__ import annotations

import pytest

from porter.spec.arch import ARCHS, check_features, get_arch
from porter.build.compile import compile_variant
from porter.errors import ArchError, PorterError
from porter.spec.template import find_template

SM90A = ARCHS["sm_90a"]

CONFIGS = [
    dict(BM=128, BN=128, BK=64, STAGES=4, CONSUMERS=1, GROUP_M=8, PERSIST=0, CLUSTER=1, EPI=0, SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=0, SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=256, BN=128, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=0, SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=128, BN=192, BK=64, STAGES=5, CONSUMERS=2, GROUP_M=8, PERSIST=0, CLUSTER=1, EPI=0, SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=2, EPI=1, SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=1, EPI=1,
         SPLITK=1, STREAMK=1, SWAP=0),
    dict(BM=64, BN=128, BK=64, STAGES=8, CONSUMERS=1, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=1,
         SPLITK=4, STREAMK=0, SWAP=0),
    dict(BM=64, BN=16, BK=64, STAGES=8, CONSUMERS=1, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=0,
         SPLITK=1, STREAMK=0, SWAP=1),
    dict(BM=64, BN=16, BK=128, STAGES=6, CONSUMERS=1, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=0,
         SPLITK=2, STREAMK=0, SWAP=1),
    # TMA-stored epilogues: the whole tile staged (3 stages fit beside it), or 64 x 128 at a time
    dict(BM=128, BN=256, BK=64, STAGES=3, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=1, EPI=2,
         SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=256, BN=128, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=2, EPI=3,
         SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=128, BN=192, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=3,
         SPLITK=1, STREAMK=1, SWAP=0),
    dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=1, EPI=3,
         SPLITK=1, STREAMK=2, SWAP=0),
    # BN = 200 / 224: the columns past the last 64-wide group stored from the registers
    dict(BM=128, BN=200, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=1, EPI=3,
         SPLITK=1, STREAMK=1, SWAP=0),
    dict(BM=128, BN=200, BK=64, STAGES=5, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=1, EPI=1,
         SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=128, BN=224, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=2, EPI=3,
         SPLITK=1, STREAMK=0, SWAP=0),
    # the last rows re-cut into pieces: a k-loop and an epilogue for each of three widths
    dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=1, EPI=3,
         SPLITK=1, STREAMK=0, SWAP=0, TAILW=224),
    dict(BM=128, BN=256, BK=64, STAGES=3, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=1, EPI=2,
         SPLITK=1, STREAMK=0, SWAP=0, TAILW=224),
    dict(BM=128, BN=224, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=3,
         SPLITK=1, STREAMK=0, SWAP=0, TAILW=192),
]
CONFIGS += [
    # 256 x 144-192 tiles (up to 192 accumulators a consumer thread, plain schedule only) and
    # 192-row tiles on three consumer warpgroups (152 registers each)
    dict(BM=256, BN=152, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=3,
         SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=256, BN=160, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=2, EPI=1,
         SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=256, BN=192, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=1, EPI=0,
         SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=256, BN=152, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=2, EPI=3,
         SPLITK=1, STREAMK=0, SWAP=0),          # B multicast in 80 + 72 rows (80 + 80 loaded)
    dict(BM=128, BN=200, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=0, CLUSTER=4, EPI=3,
         SPLITK=1, STREAMK=0, SWAP=0),          # 56 + 56 + 56 + 32 rows
    dict(BM=192, BN=192, BK=64, STAGES=4, CONSUMERS=3, GROUP_M=8, PERSIST=1, CLUSTER=2, EPI=3,
         SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=192, BN=128, BK=64, STAGES=4, CONSUMERS=3, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=1,
         SPLITK=1, STREAMK=1, SWAP=0),
    # consumers in turn, each on a whole tile: 128 x 192 (192 accumulators), 64 x 256 in twos
    dict(BM=128, BN=192, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=1, EPI=3,
         SPLITK=1, STREAMK=0, SWAP=0, PINGPONG=1),
    dict(BM=64, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=2, EPI=1,
         SPLITK=1, STREAMK=0, SWAP=0, PINGPONG=1),
    # the epilogue staged in the ring's A rows (one tile per CTA): 128x200 in clusters of 4 with
    # 5 stages (cuBLAS's tile at 1000x3000x1000), two m64 slabs a consumer, two sub-tiles a stage
    dict(BM=128, BN=200, BK=64, STAGES=5, CONSUMERS=2, GROUP_M=4, PERSIST=0, CLUSTER=4, EPI=5,
         SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=256, BN=152, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=0, CLUSTER=2, EPI=5,
         SPLITK=1, STREAMK=0, SWAP=0),
    dict(BM=128, BN=256, BK=128, STAGES=2, CONSUMERS=2, GROUP_M=8, PERSIST=0, CLUSTER=1, EPI=5,
         SPLITK=1, STREAMK=0, SWAP=0),
]
CONFIGS = [{**c, "TAILW": c.get("TAILW", 0), "PINGPONG": c.get("PINGPONG", 0)} for c in CONFIGS]
SMALL = (16, 8192, 8192)


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
    assert [tm.buffer for tm in tpl.tensor_maps] == ["A", "B", "C", "B"]
    assert all(tm.swizzle == 128 for tm in tpl.tensor_maps)
    cfg = CONFIGS[1]
    env = tpl.env(cfg, SM90A, (4096, 4096, 4096))
    boxes = [[int(e(env)) for e in tm.box] for tm in tpl.tensor_maps]
    # innermost first: {K, rows}; C and the pieces' B: not used
    assert boxes == [[64, 128], [64, 256], [0, 0], [0, 0]]
    env = tpl.env(CONFIGS[9], SM90A, (4096, 4096, 4096))
    assert [int(e(env)) for e in tpl.tensor_maps[2].box] == [64, 64]   # EPI=2: C by TMA
    env = tpl.env(CONFIGS[16], SM90A, (4096, 4096, 4096))                # TAILW = 224
    assert [int(e(env)) for e in tpl.tensor_maps[3].box] == [64, 232]
    assert all(x <= 256 for b in boxes for x in b)
    L = tpl.launch(cfg, SM90A, (4096, 4096, 4096))
    assert L.block == (384, 1, 1) and L.grid == (132, 1, 1)
    assert L.smem <= SM90A.smem_per_block
    L = tpl.launch(CONFIGS[0], SM90A, (4096, 4096, 4096))
    assert L.block == (256, 1, 1) and L.grid == (32 * 32, 1, 1)
    assert tpl.workspace_bytes(CONFIGS[1], SM90A, (4096, 4096, 4096)) == 0
    # EPI=2 stages whole 64-column boxes: 232 columns take 4 (the last overlaps the third)
    odd = {**CONFIGS[9], "BN": 232}
    ring = odd["STAGES"] * (128 + 232) * 64 * 2 + 1024 + 16 * odd["STAGES"] + 144
    assert tpl.launch(odd, SM90A, (4096, 4096, 4096)).smem == ring + 128 * 4 * 64 * 2 + 1024


def test_split_geometry_and_workspace():
    tpl = find_template("gemm_wgmma")
    sk, split = CONFIGS[5], CONFIGS[6]
    # stream-K takes every SM; its workspace is two partial tiles per CTA plus a counter per tile
    L = tpl.launch(sk, SM90A, (4096, 4096, 4096))
    assert L.grid == (132, 1, 1)
    assert tpl.workspace_bytes(sk, SM90A, (4096, 4096, 4096)) == 2 * 132 * 128 * 256 * 4 + 512 * 4
    # only the counters (first, padded to 256 bytes) must be left zeroed; the slots are scratch
    assert tpl.workspace_clean_bytes(sk, SM90A, (4096, 4096, 4096)) == 512 * 4
    assert tpl.workspace_clean_bytes(sk, SM90A, (3000, 4000, 4104)) == 24 * 16 * 4
    assert tpl.workspace_clean_bytes(sk, SM90A, (1000, 1000, 4096)) == 256    # 32 counters, padded
    assert tpl.workspace_clean_bytes(CONFIGS[1], SM90A, (4096, 4096, 4096)) == 0
    # split-K multiplies the work units (64 tiles x 4 parts), the persistent grid caps them
    L = tpl.launch(split, SM90A, SMALL)
    assert L.grid == (132, 1, 1)
    assert tpl.launch({**split, "PERSIST": 0}, SM90A, SMALL).grid == (64 * 4, 1, 1)
    assert tpl.workspace_bytes(split, SM90A, SMALL) == 64 * 4 * 64 * 128 * 4 + 64 * 4
    assert tpl.workspace_clean_bytes(split, SM90A, SMALL) == 256          # 64 counters
    # swapped: tiles run over N (rows, BM) and M (columns, BN); A's box spans BN rows, B's BM
    swap = CONFIGS[7]
    assert tpl.launch(swap, SM90A, SMALL).grid == (128, 1, 1)           # 8192 / 64 x 16 / 16
    env = tpl.env(swap, SM90A, SMALL)
    assert [[int(e(env)) for e in tm.box] for tm in tpl.tensor_maps] == [[64, 16], [64, 64],
                                                                   [0, 0], [0, 0]]


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
    base = dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=1, EPI=0,
                SPLITK=1, STREAMK=0, SWAP=0, TAILW=0, PINGPONG=0)
    assert _feasible(tpl, {**base, "EPI": 1})                    # 4 stages + 2 x 16 KB staging
    assert _feasible(tpl, base)
    assert not _feasible(tpl, {**base, "STAGES": 5})             # 240 KB of smem
    assert not _feasible(tpl, {**base, "CONSUMERS": 1})          # 256 accumulators / thread
    assert not _feasible(tpl, {**base, "BM": 64})                # 32 rows per consumer
    assert not _feasible(tpl, base, size=(4096, 4096, 4100))     # K pitch not 16-byte aligned
    # split-K only where the tiles cannot fill the SMs, and K must divide into the splits
    assert not _feasible(tpl, {**base, "SPLITK": 2})                     # 512 tiles at 4096^3
    small = {**base, "BM": 64, "BN": 128, "CONSUMERS": 1, "SPLITK": 4}
    assert _feasible(tpl, small, size=SMALL)
    assert not _feasible(tpl, small, size=(16, 8192, 8192 + 64))         # K % (64 * 4) != 0
    # stream-K: persistent only, never with split-K, and not where the tiles fill whole waves
    assert _feasible(tpl, {**base, "STREAMK": 1})                        # 512 tiles, 132 SMs
    assert not _feasible(tpl, {**base, "STREAMK": 1, "PERSIST": 0})
    assert not _feasible(tpl, {**small, "STREAMK": 1}, size=SMALL)
    assert not _feasible(tpl, {**base, "STREAMK": 1}, size=(128 * 132, 256, 4096))
    assert not _feasible(tpl, {**base, "STREAMK": 1, "CLUSTER": 2})     # it spills
    # stream-K of the last wave alone: 512 tiles leave 116 of 132 SMs busy (taken); 3584 tiles
    # (4096 x 28672) leave 20 (a tile would be summed from 7 runs: refused)
    assert _feasible(tpl, {**base, "STREAMK": 2})
    assert not _feasible(tpl, {**base, "STREAMK": 2}, size=(4096, 28672, 8192))
    # swapped operands (C^T = B A^T): small M only, plain epilogue, no cluster; BN < 64 only so
    swap = {**base, "BM": 64, "BN": 16, "CONSUMERS": 1, "SWAP": 1}
    assert _feasible(tpl, swap, size=SMALL)
    assert not _feasible(tpl, swap)                                      # M = 4096
    assert not _feasible(tpl, {**swap, "EPI": 1}, size=SMALL)
    assert not _feasible(tpl, {**swap, "SWAP": 0}, size=SMALL)          # BN = 16 unswapped
    # TMA-stored epilogue: the whole staged tile leaves room for 3 stages of 128x256, not 4;
    # 64 x 128 at a time fits beside 4; C's pitch must be 16-byte aligned
    assert _feasible(tpl, {**base, "EPI": 2, "STAGES": 3})
    assert not _feasible(tpl, {**base, "EPI": 2})
    assert _feasible(tpl, {**base, "EPI": 3})
    assert not _feasible(tpl, {**base, "EPI": 3}, size=(4096, 4001, 4096))
    assert _feasible(tpl, {**base, "EPI": 1}, size=(4096, 4001, 4096))
    # a cluster multicasts BN / CLUSTER rows of B from each CTA: whole 8-row swizzle atoms
    assert _feasible(tpl, {**base, "BN": 224, "CLUSTER": 2})
    # (rounded up to whole 8-row atoms: BN = 200 in twos, 104 + 96 rows, the B tile padded to
    # 208 rows; the last CTA's share must not be empty)
    assert _feasible(tpl, {**base, "BN": 200, "CLUSTER": 2})
    assert not _feasible(tpl, {**base, "BN": 16, "CLUSTER": 4, "PERSIST": 0})   # 8+8+8+0 rows
    assert _feasible(tpl, {**base, "BN": 200, "EPI": 3, "STAGES": 5})   # 223 KB of 227
    assert not _feasible(tpl, {**base, "BN": 224, "EPI": 3, "STAGES": 5})
    # EPI=5 stages the epilogue in the ring: no smem of its own, so a stage more, but only with
    # one whole-K tile per CTA and a ring with a box of A rows for each of a slab's boxes
    ring5 = {**base, "BN": 224, "EPI": 5, "STAGES": 5, "PERSIST": 0}
    assert _feasible(tpl, ring5)
    assert not _feasible(tpl, {**ring5, "PERSIST": 1})
    assert not _feasible(tpl, {**ring5, "BM": 64, "BN": 128, "CONSUMERS": 1, "SPLITK": 4},
                         size=SMALL)
    assert not _feasible(tpl, {**ring5, "BN": 256, "STAGES": 3})       # 4 boxes, 3 stages
    assert _feasible(tpl, {**ring5, "BN": 256, "STAGES": 2, "BK": 128})
    assert (tpl.launch({**base, "BN": 200, "EPI": 3, "PERSIST": 0}, SM90A, (4096,) * 3).smem -
            tpl.launch({**base, "BN": 200, "EPI": 5, "PERSIST": 0}, SM90A, (4096,) * 3).smem
            == 2 * 64 * 64 * 2 + 1024)
    # the last rows re-cut into pieces: at 4096^3 (512 tiles of 128x256, 3.88 waves) 8 rows in 18
    # pieces of 224-232 fill the last wave; 21 pieces of 192-200 a row need more rows than the
    # last wave holds; whole waves (1056 tiles) leave nothing to re-cut
    tail = {**base, "EPI": 3, "TAILW": 224}
    assert _feasible(tpl, tail)
    assert not _feasible(tpl, {**tail, "TAILW": 192})
    assert _feasible(tpl, {**tail, "BN": 224, "TAILW": 192})             # 608 tiles, 21 pieces
    assert not _feasible(tpl, {**tail, "BN": 224, "TAILW": 224})         # pieces as wide as tiles
    assert not _feasible(tpl, tail, size=(4224, 8192, 4096))
    assert _feasible(tpl, {**tail, "BN": 224, "TAILW": 192}, size=(3000, 4040, 4104))
    assert not _feasible(tpl, {**tail, "EPI": 1})                        # TMA-stored epilogue only
    assert not _feasible(tpl, {**tail, "STREAMK": 2})
    assert not _feasible(tpl, {**tail, "PERSIST": 0})
    # more than 128 accumulators a thread (256 x 144-192) only on the plain schedule; three
    # consumer warpgroups (152 registers each) hold at most BN = 192 columns
    wide = {**base, "BM": 256, "BN": 160, "EPI": 3}
    assert _feasible(tpl, wide) and _feasible(tpl, {**wide, "BN": 192, "EPI": 0})
    assert not _feasible(tpl, {**wide, "STREAMK": 1})
    assert not _feasible(tpl, {**wide, "BN": 200})                      # 200 accumulators
    three = {**base, "BM": 192, "BN": 192, "CONSUMERS": 3, "EPI": 3}
    assert _feasible(tpl, three)
    assert not _feasible(tpl, {**three, "BN": 224})
    assert not _feasible(tpl, {**three, "BM": 128})                     # 64 rows each
    # consumers in turn: persistent whole tiles (64 or 128 rows, at most 192 accumulators), each
    # consumer its own epilogue buffer, and more tiles than CTAs
    pp = {**base, "BN": 128, "EPI": 3, "PINGPONG": 1}
    assert _feasible(tpl, pp) and _feasible(tpl, {**pp, "BM": 64, "BN": 256})
    assert _feasible(tpl, {**pp, "BN": 192}) and not _feasible(tpl, {**pp, "BN": 256})
    assert not _feasible(tpl, {**pp, "BM": 256})
    assert not _feasible(tpl, {**pp, "PERSIST": 0})
    assert not _feasible(tpl, {**pp, "EPI": 2, "STAGES": 3})
    assert not _feasible(tpl, {**pp, "CONSUMERS": 1})
    assert not _feasible(tpl, pp, size=(1024, 1024, 4096))               # 64 tiles, 132 CTAs
    # some of the space is feasible at 4096^3, not all of it: counted on the pruned walk the
    # search takes (test_search checks that walk against the full product on a sub-space; the
    # full product, 1.3e8 configurations, took minutes)
    from porter.build.check import prefix_check
    from porter.search.searcher import SearchSpace
    def ok(k):
        return _feasible(tpl, dict(zip(tpl.param_names, k)))
    walk = SearchSpace(tpl.params, ok, prefix_check(tpl, SM90A, [(4096, 4096, 4096)]))
    n = sum(1 for k in walk.candidates() if ok(k))
    assert 20 <= n < tpl.space_size()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(map(str, c.values())))
def test_compiles_for_sm90a_without_spills(cache, config):
    tpl = find_template("gemm_wgmma")
    small = config["SPLITK"] > 1 or config["SWAP"]
    assert _feasible(tpl, config, size=SMALL if small else (4096, 4096, 4096))
    res = compile_variant(tpl, config, SM90A, use_cache=False)
    assert res.ok, res.log
    r = res.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, res.log
    threads = 128 * (config["CONSUMERS"] + 1)
    # the kernel's entry register count must fit the block on one SM, and the consumers'
    # setmaxnreg target (232 with two consumer warpgroups, 240 with one) must fit what the
    # producer gives back (it drops to 40)
    assert r.registers * threads <= SM90A.regs_per_sm
    consumer = {1: 240, 2: 232, 3: 152}[config["CONSUMERS"]]
    assert 40 * 128 + consumer * 128 * config["CONSUMERS"] <= SM90A.regs_per_sm
    assert r.registers <= consumer
    assert "C7508" not in res.log and "ignored" not in res.log.lower(), res.log
    assert "serialized" not in res.log, res.log      # ptxas's wgmma serialization warning
    assert res.cubin_path and open(res.cubin_path, "rb").read(4) == b"\x7fELF"


def test_descriptors_are_prefetched_before_the_start_barrier():
    """The tensor maps' descriptor prefetches come before the barriers' initialization and the
    cluster's start barrier in the PTX (their fetch under the set-up, not before the first
    load: benchmarks/gemm_probe_early_prefetch.json), one a map the kernel reads: A and B, C
    with a TMA epilogue, B's re-cut tail with TAILW."""
    from porter.build.compile import _nvrtc_compile, options_for
    tpl = find_template("gemm_wgmma")

    def order(**kw):
        cfg = tpl.complete({**dict(BM=128, BN=200, STAGES=4, CONSUMERS=2, GROUP_M=4, PERSIST=0,
                                   CLUSTER=4, EPI=3), **kw})
        ok, log, ptx = _nvrtc_compile(tpl.source, "gemm_wgmma.cu", options_for(tpl, cfg, SM90A),
                                      output="ptx")
        assert ok, log[-2000:]
        lines = ptx.decode().splitlines()
        first = lambda s: next(i for i, x in enumerate(lines) if s in x)  # noqa: E731
        pre = [i for i, x in enumerate(lines) if "prefetch.tensormap" in x]
        return pre, first("mbarrier.init"), first("barrier.cluster.arrive")
    pre, init, sync = order()
    assert len(pre) == 3 and max(pre) < init < sync          # A, B and C (EPI 3)
    pre, init, sync = order(EPI=0)
    assert len(pre) == 2 and max(pre) < init < sync          # no C map read
