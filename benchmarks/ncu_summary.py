"""The figures worth keeping from Nsight Compute output (the `*_ncu_*` results files).

  python benchmarks/ncu_summary.py DETAILS.txt PROFILED.json OUT.json
  python benchmarks/ncu_summary.py --metrics RAW.csv PROBES.json OUT.json

DETAILS.txt is the text of `ncu --import REP --page details`. Per kernel: its launch, the
speed-of-light figures and the busiest pipeline; each of ours (ncu names them all after the
kernel) is named after the variant it ran, in the order PROFILED.json's "results" list the
entries with status "profiled" (its other keys are copied). The profiled runs came from the
development harness benchmarks/dev_wgmma.py, now in git history (docs/notes/gemm_wgmma.md).

--metrics: RAW.csv is `ncu --csv --page raw --metrics ...` of `gemm_probe.py --ncu --probes
PROBES.json`: per shape (in the probe file's order; each shape's launches start with the fp32
reference GEMM), cuBLAS's kernel, its tile and cluster, and the medians of duration, grid,
L2 sectors per request and L2 throughput for cuBLAS and for each of ours (told apart by
cluster size).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

METRICS = {"Duration", "SM Frequency", "Elapsed Cycles", "SM Active Cycles",
           "Compute (SM) Throughput", "L2 Cache Throughput", "L2 Hit Rate", "DRAM Throughput",
           "Registers Per Thread", "Dynamic Shared Memory Per Block", "Cluster Size", "Grid Size"}
_HEAD = re.compile(r"^  (\S+) \((\d+), (\d+), (\d+)\)x\((\d+), 1, 1\), Context")
_ROW = re.compile(r"^    (\S.*?)\s{2,}(?:(\S+)\s+)?([\d,.]+)$")
_PIPE = re.compile(r"(\w+) is the highest-utilized pipeline \(([\d.]+)%\)")


def ncu_summary(details: Path, prof_json: Path, out: Path, ours: str = "gemm_wgmma") -> None:
    record = json.loads(prof_json.read_text())
    names = iter([r["name"] for r in record.pop("results", []) if r.get("status") == "profiled"])
    kernels, cur = [], None
    for line in details.read_text().splitlines():
        head = _HEAD.match(line)
        if head:
            cur = {"kernel": head.group(1), "grid": [int(head.group(i)) for i in (2, 3, 4)],
                   "block": int(head.group(5)),
                   "variant": next(names, None) if head.group(1) == ours else "cuBLAS"}
            kernels.append(cur)
            continue
        if cur is None:
            continue
        row = _ROW.match(line)
        if row and row.group(1) in METRICS and row.group(1) not in cur:
            cur[row.group(1)] = float(row.group(3).replace(",", ""))
            if row.group(2):
                cur[row.group(1) + " unit"] = row.group(2)
        pipe = _PIPE.search(line)
        if pipe and "busiest pipeline" not in cur:
            cur["busiest pipeline"] = pipe.group(1)
            cur["busiest pipeline %"] = float(pipe.group(2))
    record.update(tool="ncu --clock-control none --set full (one launch each)", kernels=kernels)
    out.write_text(json.dumps(record, indent=1))
    for k in kernels:
        print(f"{k['variant']:18s} {k['kernel'][:48]:48s} {k.get('Duration', 0):8.2f} us "
              f"{k.get('SM Frequency', 0):.2f} GHz active {k.get('SM Active Cycles', 0):9.0f}/"
              f"{k.get('Elapsed Cycles', 0):9.0f} {k.get('busiest pipeline')} "
              f"{k.get('busiest pipeline %')}% L2 {k.get('L2 Cache Throughput')}%")


def _num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def metrics_summary(raw: Path, probes: Path, out: Path) -> None:
    import csv
    import statistics
    rows = list(csv.reader(raw.read_text().splitlines()))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    names, data = rows[head], rows[head + 2:]
    col = {n: i for i, n in enumerate(names)}
    blocks: list[list[dict]] = []
    ref = False
    for r in data:
        k = {n: r[i] for n, i in col.items() if i < len(r)}
        # the fp32 reference (one or more launches) starts a new shape
        if k["Kernel Name"].startswith("sm80_xmma_gemm_f32"):
            if not ref:
                blocks.append([])
            ref = True
        elif blocks:
            ref = False
            blocks[-1].append(k)
    shapes = json.loads(probes.read_text())
    records = []
    for (shape, configs), ks in zip(shapes.items(), blocks):
        groups: dict[str, list[dict]] = {}
        for k in ks:
            ours = k["Kernel Name"].startswith("gemm_wgmma")
            cl = int(_num(k.get("launch__cluster_dim_x", "0"))) or 1
            groups.setdefault(f"ours CLUSTER={cl}" if ours else k["Kernel Name"], []).append(k)
        rec = {"shape": [int(x) for x in shape.split("x")], "probed": configs, "kernels": []}
        for name, g in groups.items():
            med = lambda m: statistics.median(_num(k.get(m, "0")) for k in g)  # noqa: E731
            rec["kernels"].append({
                "kernel": name, "launches": len(g), "duration_us": med("gpu__time_duration.sum") / 1e3,
                "grid": int(med("launch__grid_size")),
                "cluster": int(med("launch__cluster_dim_x")) or 1,
                "l2_sectors_per_request": round(
                    med("lts__t_sectors_srcunit_tex.sum") / max(1.0, med("lts__t_requests_srcunit_tex.sum")), 2),
                "l2_throughput_pct": med("lts__throughput.avg.pct_of_peak_sustained_elapsed"),
                "dram_read_mb": round(med("dram__bytes_read.sum") / 1e6, 1)})
        records.append(rec)
        for k in rec["kernels"]:
            print(f"{shape:>16s} {k['kernel'][:52]:52s} {k['duration_us']:8.1f} us grid "
                  f"{k['grid']:4d} cl {k['cluster']} sec/req {k['l2_sectors_per_request']:.2f}")
    out.write_text(json.dumps({"tool": "ncu --clock-control none --csv --page raw --metrics",
                               "probes": probes.name, "records": records}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--metrics":
        metrics_summary(*(Path(a) for a in sys.argv[2:]))
    elif len(sys.argv) == 4:
        ncu_summary(*(Path(a) for a in sys.argv[1:]))
    else:
        sys.exit("\n".join(__doc__.strip().splitlines()[2:4]))
