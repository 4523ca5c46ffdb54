"""Transfer between GPUs: how many evaluations on the target GPU until a configuration within 3%
of the target's optimum, searching cold (the auto sampler from scratch), warm-started (the
source GPU's k fastest configurations proposed first, through Searcher(warm_start=...)), or
warm-started with a prior (the same, plus every timed configuration of the source with its time,
through Searcher(prior=...)). Goal: warm fewer evaluations than cold, on average over the seeds,
on at least 4 of the 6 convolution pairs (reported for both warm modes).

Pairs: every ordered pair of caches of the same kernel in shared/replay (convolution on A100,
A4000, A6000: 6 pairs; dedispersion on A100, A4000: 2 pairs). Accounting as in
search_quality.py: an evaluation is a distinct countable configuration (warm-start ones
included); failures count. A run that has not got there after MAX_EVALS counts as MAX_EVALS
and as a miss. For reference each row also has random search without replacement, exactly:
(N + 1) / (g + 1) expected draws with g configurations within 3% of N, and how many of the
source's top k are within 3% on the target.

    python benchmarks/transfer.py [--seeds 50] [--top 10] [--sampler auto] [--kernels conv]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import islice, permutations
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from porter.search.searcher import Searcher, SearchSpace    # noqa: E402
from search_quality import REPLAY, Space, evaluations   # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "transfer.json"
WITHIN = 0.03
MAX_EVALS = 1000


def evals_to_goal(space: Space, sampler: str, seed: int, warm_start=(), prior=()) -> int | None:
    """Evaluations until one is within WITHIN of the optimum; None after MAX_EVALS."""
    goal = space.opt * (1 + WITHIN)
    s = Searcher(SearchSpace(space.params, space.is_feasible), sampler, seed,
                 warm_start=warm_start, prior=prior)
    for n, value in enumerate(islice(evaluations(space, s), MAX_EVALS), start=1):
        if value <= goal:
            return n
    return None


def source_prior(s: Space) -> list[tuple[dict, float]]:
    """Every timed configuration of the source GPU with its time (its full ranking)."""
    out = []
    for key in s.countable:
        t = s.cache.time(key)
        if isinstance(t, float):
            out.append((dict(zip(s.names, key)), t))
    return out


def summary(counts: list[int | None]) -> dict:
    n = np.array([MAX_EVALS if c is None else c for c in counts], float)
    return {"mean": float(n.mean()), "median": float(np.median(n)), "std": float(n.std()),
            "misses": sum(c is None for c in counts)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--sampler", default="auto")
    ap.add_argument("--kernels", default="", help="substrings of cache names to keep")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    t0 = time.time()
    paths = sorted(REPLAY.glob("*.json.gz"))
    if args.kernels:
        paths = [p for p in paths if any(k in p.name for k in args.kernels.split(","))]
    spaces = {sp.name: sp for sp in (Space(p) for p in paths)}
    kernels: dict[str, list[str]] = {}
    for name in spaces:
        kernels.setdefault(name.rsplit("_", 1)[0], []).append(name)
    out = {"method": __doc__.split("    python")[0].strip(), "seeds": args.seeds,
           "sampler": args.sampler, "top": args.top, "within": WITHIN,
           "max_evals": MAX_EVALS, "date": time.strftime("%Y-%m-%d"), "pairs": []}
    cold: dict[str, dict] = {}      # per target: the same seeds whatever the source
    print(f"{'source -> target':48s}{'random':>8s}{'cold':>13s}{'warm':>13s}{'warm+prior':>13s}"
          f"  top{args.top} within 3%")
    for names in kernels.values():
        for src, dst in permutations(names, 2):
            s, d = spaces[src], spaces[dst]
            warm = s.cache.top(args.top)
            prior = source_prior(s)
            goal = d.opt * (1 + WITHIN)
            good = sum(1 for v in d.value.values() if v <= goal)
            hits = sum(1 for w in warm if d.value.get(d.cache.config(d.cache.key(w)), 1e300)
                       <= goal)
            row = {"source": src, "target": dst, "target_countable": d.n,
                   "random_expected": (d.n + 1) / (good + 1), "source_top_within": hits,
                   "cold": cold.setdefault(dst, summary([evals_to_goal(d, args.sampler, k)
                                                         for k in range(args.seeds)])),
                   "warm": summary([evals_to_goal(d, args.sampler, k, warm)
                                    for k in range(args.seeds)]),
                   "warm_prior": summary([evals_to_goal(d, args.sampler, k, warm, prior)
                                          for k in range(args.seeds)])}
            row["speedup_mean"] = row["cold"]["mean"] / row["warm"]["mean"]
            row["speedup_mean_prior"] = row["cold"]["mean"] / row["warm_prior"]["mean"]
            out["pairs"].append(row)
            print(f"{src + ' -> ' + dst:48s}{row['random_expected']:>8.0f}" + "".join(
                f"{row[m]['mean']:>8.1f} ±{row[m]['std']:<3.0f}"
                for m in ("cold", "warm", "warm_prior")) + f"  {hits}", flush=True)
    # the goal: warm start needs fewer evaluations than cold on >= 4 of the 6 convolution pairs
    conv = [r for r in out["pairs"] if r["target"].startswith("convolution")]
    out["goal"] = {"convolution_pairs": len(conv)}
    for mode in ("warm", "warm_prior"):
        wins = [f"{r['source']} -> {r['target']}" for r in conv
                if r[mode]["mean"] < r["cold"]["mean"]]
        out["goal"][mode] = {"fewer_than_cold": len(wins), "pairs": wins,
                             "met": len(wins) >= 4}
    print(f"goal: {json.dumps(out['goal'])}")
    out["seconds"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} in {out['seconds']} s")
    return out


if __name__ == "__main__":
    main()
