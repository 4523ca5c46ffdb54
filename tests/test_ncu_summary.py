"""benchmarks/ncu_summary.py: the figures it keeps from an ncu details page, and which
variant each of our kernels was (ncu names them all gemm_wgmma)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_KERNEL = """  {name} ({grid}, 1, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    SM Frequency                    Ghz         1.59
    Elapsed Cycles                cycle      {cycles}
    Duration                         us       {us}
    L2 Cache Throughput               %        52.15
    SM Active Cycles              cycle   267,415.15
    ----------------------- ----------- ------------
    OPT   {pipe} is the highest-utilized pipeline ({pct}%) based on elapsed cycles in the workload
    Section: Launch Statistics
    Cluster Size                                                   {cluster}
    Registers Per Thread             register/thread             168
"""


def _load():
    spec = importlib.util.spec_from_file_location("ncu_summary", ROOT / "benchmarks" / "ncu_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ncu_summary_names_our_kernels_and_keeps_the_figures(tmp_path):
    details = "[518] python3.12@127.0.0.1\n" + "".join([
        _KERNEL.format(name="gemm_wgmma", grid=132, cycles="284,256", us="177.57",
                       pipe="Shared", pct="90.3", cluster=0),
        _KERNEL.format(name="nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", grid=2,
                       cycles="284,027", us="176.77", pipe="Tensor", pct="90.4", cluster=2),
        _KERNEL.format(name="gemm_wgmma", grid=132, cycles="297,654", us="184.35",
                       pipe="Tensor", pct="86.6", cluster=0),
    ])
    (tmp_path / "details.txt").write_text(details)
    prof = {"gpu": "NVIDIA H200", "date": "2026-12-04", "results": [
        {"name": "v6_e3", "status": "profiled"},
        {"name": "too_big", "status": "infeasible"},   # not launched: no kernel of its own
        {"name": "v6_e3_sk2", "status": "profiled"}]}
    (tmp_path / "prof.json").write_text(json.dumps(prof))
    out = tmp_path / "summary.json"
    _load().ncu_summary(tmp_path / "details.txt", tmp_path / "prof.json", out)
    rec = json.loads(out.read_text())
    assert rec["gpu"] == "NVIDIA H200" and "results" not in rec
    ks = rec["kernels"]
    assert [k["variant"] for k in ks] == ["v6_e3", "cuBLAS", "v6_e3_sk2"]
    assert ks[0]["Elapsed Cycles"] == 284256.0 and ks[2]["Duration"] == 184.35
    assert ks[0]["SM Active Cycles"] == 267415.15 and ks[0]["SM Frequency unit"] == "Ghz"
    assert ks[1]["grid"] == [2, 1, 1] and ks[1]["Cluster Size"] == 2.0
    assert ks[1]["busiest pipeline"] == "Tensor" and ks[1]["busiest pipeline %"] == 90.4
    assert ks[2]["busiest pipeline %"] == 86.6
