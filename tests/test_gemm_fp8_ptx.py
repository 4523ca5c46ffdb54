"""gemm_fp8's instruction order in the PTX, where it decides what overlaps what: per-row and
column scales loaded before the k-loop (EARLY_SCALES) and, with two partial sets (PSETS=2),
each set's additions under the other set's MMAs."""
from __future__ import annotations

from porter.build.compile import _nvrtc_compile, options_for
from porter.spec.arch import ARCHS
from porter.spec.template import find_template
from fp8_configs import BASE

SM90A = ARCHS["sm_90a"]


def test_early_scales_are_loaded_before_the_mmas():
    """EARLY_SCALES=1: the row and column scale loads come before the k-loop's first wgmma in
    the PTX (their latency under the MMAs); 0: after its last, in the epilogue."""
    tpl = find_template("gemm_fp8")

    def where(early):
        ok, log, ptx = _nvrtc_compile(tpl.source, "gemm_fp8.cu", options_for(
            tpl, {**BASE, "EARLY_SCALES": early}, SM90A), output="ptx")
        assert ok, log[-2000:]
        lines = ptx.decode().splitlines()
        mma = [i for i, x in enumerate(lines) if "wgmma.mma_async" in x]
        # the two per-tensor scale loads come first; the rest are the per-row/column ones
        loads = [i for i, x in enumerate(lines) if "ld.global.nc" in x][2:]
        return loads, mma[0], mma[-1]
    loads, first, _ = where(1)
    assert loads and max(loads) < first
    loads, _, last = where(0)
    assert loads and min(loads) > last


def test_two_sets_add_one_while_the_other_runs():
    """PSETS=2: in the PTX of a round of four k-tiles, each set's additions into acc come after
    the wait that retires its MMAs and before the next issue or wait (under the other set's
    MMAs; sunk past the next wait they would run with the pipe idle), and only the round's last
    addition waits for wait_group 0. PSETS=1 waits for all MMAs (wait_group 0) before adding."""
    tpl = find_template("gemm_fp8")

    def events(cfg):
        ok, log, ptx = _nvrtc_compile(tpl.source, "gemm_fp8.cu", options_for(tpl, cfg, SM90A),
                                      output="ptx")
        assert ok, log[-2000:]
        out = []   # wgmma commits and waits, and runs of fp32 adds, in program order
        for x in ptx.decode().splitlines():
            x = x.strip()
            ev = ("commit" if x.startswith("wgmma.commit_group") else
                  "wait1" if x.startswith("wgmma.wait_group.sync.aligned 1") else
                  "wait0" if x.startswith("wgmma.wait_group.sync.aligned 0") else
                  "add" if x.startswith("add.ftz.f32") else None)
            if ev and not (ev == "add" and out and out[-1][0] == "add"):
                out.append([ev, 0])
            if ev:
                out[-1][1] += 1
        return out

    two = {**BASE, "BN": 144, "STAGES": 6, "PROMOTE": 1, "PSETS": 2, "CLUSTER": 2, "EPI": 0}
    ev = [e for e, _ in events(two)]
    adds = {e[1] for e in events(two) if e[0] == "add"}
    assert 72 in adds                               # a set: 64 x 144 / 128 threads
    # the round of four: issue, issue, wait 1, add, issue, wait 1, add, issue, wait 1, add,
    # wait 0, add
    round4 = ["commit", "commit", "wait1", "add", "commit", "wait1", "add", "commit", "wait1",
              "add", "wait0", "add"]
    assert any(ev[i:i + len(round4)] == round4 for i in range(len(ev)))
    one = [e for e, _ in events({**two, "PSETS": 1})]
    assert "wait0" in one and not any(a == "wait1" and b == "add" for a, b in zip(one, one[1:]))
