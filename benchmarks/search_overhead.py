"""The search's own cost: seconds spent in Searcher.ask/tell for one job's worth of trials,
with made-up objectives (no compiling, no GPU), for each template's space at a size it is
tuned for. On the GPU machine this is time the GPU waits; a gemm_wgmma port's 80 trials took
43-64 s of wall time on the H200 host with a GPU share of 0.07-0.15, and this is where it went.

    .venv/bin/python benchmarks/search_overhead.py [--trials 80] [--out FILE]

Adds a run (its commit, date and figures) to benchmarks/results/search_overhead.json (or --out),
keeping the runs already there: run it before and after a change to the search or the static
check to have both side by side.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from porter.spec.arch import ARCHS  # noqa: E402
from porter.build.check import search_space  # noqa: E402
from porter.search.searcher import Searcher  # noqa: E402
from porter.spec.template import find_template  # noqa: E402

CASES = [("gemm_wgmma", "sm_90a", (4096, 28672, 8192)), ("gemm_mma", "sm_90a", (4096, 4096, 4096)),
         ("rmsnorm", "sm_90a", (32768, 8192))]


def one(name: str, arch_name: str, size, trials: int) -> dict:
    tpl, arch = find_template(name), ARCHS[arch_name]
    space = search_space(tpl, arch, [size])
    searcher = Searcher(space, "auto", 0, warm_start=tpl.start_configs())
    rng = random.Random(0)
    ask = tell = 0.0
    n = 0
    for _ in range(trials):
        t0 = time.perf_counter()
        p = searcher.ask()
        ask += time.perf_counter() - t0
        if p is None:
            break
        t0 = time.perf_counter()
        searcher.tell(p[0], rng.uniform(1.0, 3.0))
        tell += time.perf_counter() - t0
        n += 1
    return {"template": name, "arch": arch_name, "size": list(size), "space": space.size(),
            "trials": n, "ask_s": round(ask, 3), "tell_s": round(tell, 3),
            "per_trial_ms": round(1e3 * (ask + tell) / max(n, 1), 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=80)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "search_overhead.json"))
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    rows = []
    for case in CASES:
        rows.append(one(*case, args.trials))
        print(rows[-1], flush=True)
    out = Path(args.out)
    runs = json.loads(out.read_text()).get("runs", []) if out.exists() else []
    runs.append({"date": datetime.datetime.now().isoformat(timespec="seconds"),
                 "commit": commit, "host": platform.node(),
                 "python": platform.python_version(), "cases": rows})
    out.write_text(json.dumps({
        "benchmark": "search overhead: Searcher.ask + tell, auto sampler, made-up objectives",
        "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
