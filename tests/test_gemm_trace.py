"""The development timeline (porter/include/hopper/trace.cuh, benchmarks/gemm_trace.py): a
DEV_TRACE=1 build of gemm_wgmma or gemm_fp8 compiles for sm_90a without spills and carries the
trace table, a plain build carries none of it, and the phases are worked out from the stamped
slots. No GPU."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from porter.build.compile import compile_variant
from porter.spec.arch import get_arch
from porter.spec.template import find_template

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gemm_trace  # noqa: E402

CFG = dict(BN=200, CLUSTER=4, PERSIST=0, GROUP_M=4, EPI=3)


# gemm_fp8: ping-pong 128 x 128 in clusters of 2 (cuBLASLt's row-wise tile), and promoted
FP8_CFGS = [dict(BN=128, STAGES=6, CLUSTER=2, PINGPONG=1), dict(BN=192, STAGES=5, PROMOTE=1)]


@pytest.mark.parametrize("trace", [0, 1])
@pytest.mark.parametrize("template,cfg", [("gemm_wgmma", CFG)] +
                         [("gemm_fp8", c) for c in FP8_CFGS])
def test_trace_build_only_with_dev_trace(trace, template, cfg):
    tpl = find_template(template)
    cfg = {**tpl.complete(cfg), **({"DEV_TRACE": 1} if trace else {})}
    res = compile_variant(tpl, cfg, get_arch("sm_90a").with_sms(132), use_cache=False)
    assert res.ok, res.log
    assert res.resources.spill_stores == 0 and res.resources.spill_loads == 0
    if template == "gemm_fp8":   # its builds are warning-free (tests/test_gemm_fp8.py)
        assert "warning" not in (res.log or "").lower(), res.log
    cubin = Path(res.cubin_path).read_bytes()
    assert (b"porter_trace" in cubin) == bool(trace)


def _row(entry, **slots):
    r = [0] * gemm_trace.SLOTS
    r[gemm_trace.ENTRY] = entry
    for name, v in slots.items():
        r[getattr(gemm_trace, name.upper())] = v
    return r


def test_phases_from_slots():
    us = 1000
    rows = [
        # the producer (exit slot) leaves before the consumer's stores are drained: the CTA
        # ends at the later of the two
        _row(10 * us, c0_data=13 * us, c0_kend=20 * us, c0_drained=25 * us, exit=22 * us,
             c0_items=1, smid=4),
        _row(11 * us, c0_data=15 * us, c0_kend=24 * us, c0_drained=26 * us, exit=30 * us,
             c0_items=2, smid=7),
        [0] * gemm_trace.SLOTS,   # a CTA that never ran (grid larger than the table's users)
    ]
    ph = gemm_trace.phases([v for r in rows for v in r], 3)
    assert ph["ctas"] == 2
    assert ph["span_us"] == pytest.approx(20.0)          # first entry 10 us, last end 30 us
    assert ph["items_max"] == 2 and ph["items_min"] == 1
    p = ph["phases_us"]
    assert p["first_data"] == {"median": 3.5, "max": 4.0, "min": 3.0}
    assert p["kloop_first"]["max"] == pytest.approx(9.0)
    assert p["launch_skew"]["max"] == pytest.approx(1.0)
    assert p["cta_total"]["min"] == pytest.approx(15.0)   # ends at drained (25), not exit (22)
    assert "epi_first" not in p                           # a phase no CTA stamped is left out
    assert ph["raw"][0][gemm_trace.SMID] == 4             # values are not shifted like times
    assert ph["raw"][1][gemm_trace.ENTRY] == us


@pytest.mark.parametrize("probes", ["gemm_trace_256.json", "gemm_trace_pingpong.json",
                                    "gemm_trace_fp8.json"])
def test_every_traced_configuration_is_feasible_at_its_shape(probes):
    """The probe files `device_runs.sh trace` takes (TRACE_PROBES): each configuration passes
    the space's static checks at its shape on 132 SMs, so none is dropped on the device; the
    ping-pong file holds both schedules at each shape."""
    import json
    from gemm_probe import configs
    from porter.build.check import static_check
    template = "gemm_fp8" if "fp8" in probes else "gemm_wgmma"
    tpl, arch = find_template(template), get_arch("sm_90a").with_sms(132)
    items = configs(json.loads((Path(gemm_trace.__file__).parent / probes).read_text()),
                    template)
    assert items and all(len(shape) == len(tpl.size_names) for shape, _ in items)
    for shape, cfg in items:
        assert static_check(tpl, arch, cfg, [shape]) is None, (shape, cfg)
    if "pingpong" in probes or "fp8" in probes:
        for shape in {s for s, _ in items if s[-1] == 1}:   # (fp8: fast accumulation)
            assert {c["PINGPONG"] for s, c in items if s == shape} == {0, 1}, shape
