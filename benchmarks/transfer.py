"""Transfer between GPUs: evaluations needed to get within 3% of the target GPU's optimum,
cold (auto sampler from scratch) vs warm-started (Searcher(warm_start=top-10 configurations of
the source GPU's cache)), for every ordered pair of caches of the same kernel. Same accounting
as search_quality.py: countable = every cached configuration except InvalidConfig; failures
count. A run that does not get there within MAX_EVALS counts as MAX_EVALS (reported as misses).

    python benchmarks/transfer.py [--seeds 20]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import permutations
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from search_quality import REPLAY, Space, run_ours  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "transfer.json"
MAX_EVALS = 1000
WITHIN = 0.03


def evals_to_target(space: Space, values: list[float]) -> int | None:
    goal = space.opt * (1 + WITHIN)
    for i, v in enumerate(values):
        if v <= goal:
            return i + 1
    return None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--sampler", default="auto")
    args = ap.parse_args(argv)
    t0 = time.time()
    spaces = {p.name.split(".")[0]: Space(p) for p in sorted(REPLAY.glob("*.json.gz"))}
    kernels: dict[str, list[str]] = {}
    for name in spaces:
        kernels.setdefault(name.rsplit("_", 1)[0], []).append(name)
    out = {"method": __doc__.split("    python")[0].strip(), "seeds": args.seeds,
           "sampler": args.sampler, "within": WITHIN, "max_evals": MAX_EVALS, "pairs": []}
    print(f"{'source -> target':52s}{'cold':>14s}{'warm':>14s}{'speedup':>9s}  top10 in 3%")
    for kernel, names in kernels.items():
        for src, dst in permutations(names, 2):
            s, d = spaces[src], spaces[dst]
            warm = s.cache.top(10)
            goal = d.opt * (1 + WITHIN)
            hits = sum(1 for w in warm if (t := d.cache.time(w)) is not None and
                       isinstance(t, float) and t <= goal)
            row = {"source": src, "target": dst}
            for mode, ws in (("cold", ()), ("warm", warm)):
                n, miss = [], 0
                for seed in range(args.seeds):
                    vals = run_ours(d, args.sampler, seed, warm_start=ws, budget=MAX_EVALS)
                    k = evals_to_target(d, vals)
                    if k is None:
                        miss += 1
                        k = MAX_EVALS
                    n.append(k)
                row[mode] = {"mean": float(np.mean(n)), "median": float(np.median(n)),
                             "std": float(np.std(n)), "misses": miss}
            row["source_top10_within_3pct_on_target"] = hits
            row["speedup_mean"] = row["cold"]["mean"] / row["warm"]["mean"]
            out["pairs"].append(row)
            print(f"{src + ' -> ' + dst:52s}{row['cold']['mean']:>8.1f}±{row['cold']['std']:<5.0f}"
                  f"{row['warm']['mean']:>8.1f}±{row['warm']['std']:<5.0f}"
                  f"{row['speedup_mean']:>8.1f}x  {hits}", flush=True)
    out["seconds"] = round(time.time() - t0, 1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1))
    print(f"wrote {OUT} in {out['seconds']}s")


if __name__ == "__main__":
    main()
