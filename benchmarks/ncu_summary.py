"""The figures worth keeping from an Nsight Compute details page (the `*_ncu_*` results files).

  python benchmarks/ncu_summary.py DETAILS.txt PROFILED.json OUT.json

DETAILS.txt is the text of `ncu --import REP --page details`. Per kernel: its launch, the
speed-of-light figures and the busiest pipeline; each of ours (ncu names them all after the
kernel) is named after the variant it ran, in the order PROFILED.json's "results" list the
entries with status "profiled" (its other keys are copied). The profiled runs came from the
development harness benchmarks/dev_wgmma.py, now in git history (docs/notes/gemm_wgmma.md).
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


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    ncu_summary(*(Path(a) for a in sys.argv[1:]))
