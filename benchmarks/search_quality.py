"""Search quality on brute-forced Kernel Tuner caches, scored with the methodology of
Willemsen, van Nieuwpoort & van Werkhoven (2024, "A methodology for comparing optimization
algorithms for auto-tuning", FGCS), in its evaluation-count form.

Per space (one cache):
- countable configurations: every cached configuration except InvalidConfig. A compile or
  runtime failure costs an evaluation; its objective counts as the worst valid time (it never
  improves the best found).
- budget B: the smallest k at which the expected best of k draws of random search without
  replacement closes 95% of the gap between the median and the optimum:
  median - E_rand(k) >= 0.95 * (median - optimum)   (capped at BUDGET_CAP).
- curve of a run: best objective after k counted evaluations, k = 1..B (a run that stops early
  keeps its last best).
- score: mean over k of (E_rand(k) - best(k)) / (E_rand(k) - optimum): 0 = calculated random
  search without replacement, 1 = the optimum from the first evaluation. Mean and std over seeds.

Accounting is the same for porter's samplers and Kernel Tuner's strategies: only distinct
countable configurations count, in the order first evaluated. Porter: porter.search.Searcher
with is_feasible = countable; a configuration it proposes outside that set (Optuna samplers do)
is told as failed and not counted. Kernel Tuner: tune_cache(..., simulation_mode) with
strategy_options max_fevals = B; its results are read in order.

    python benchmarks/search_quality.py [--seeds 20] [--quick]
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from scipy.special import gammaln

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from porter.kt import KTCache, kt_space, load_cache  # noqa: E402
from porter.search import Searcher, SearchSpace     # noqa: E402

REPLAY = ROOT.parent / "shared" / "replay"
OUT = ROOT / "benchmarks" / "results" / "search_quality.json"
BUDGET_CAP = 400
OURS = ("auto", "random", "tpe")
KT_STRATEGIES = ("genetic_algorithm", "simulated_annealing", "random_sample", "diff_evo", "pso",
                 "mls", "greedy_ils", "dual_annealing", "firefly_algorithm", "greedy_mls",
                 "basinhopping")


class Space:
    def __init__(self, path: Path):
        self.path = path
        self.cache: KTCache = load_cache(path)
        self.name = path.name.replace(".json.gz", "").replace(".json", "")
        self.params, self.countable = kt_space(self.cache)
        times = {c: self.cache.time(c) for c in self.countable}
        valid = [t for t in times.values() if isinstance(t, float)]
        self.worst = max(valid)
        self.value = {c: (t if isinstance(t, float) else self.worst) for c, t in times.items()}
        self.opt = min(valid)
        v = np.sort(np.array(list(self.value.values())))
        self.n = len(v)
        self.median = float(np.median(v))
        self.erand = expected_random_best(v)           # index k-1 -> E[best of k]
        gap = self.median - self.opt
        ok = np.nonzero(self.median - self.erand >= 0.95 * gap)[0]
        self.budget_uncapped = int(ok[0]) + 1 if len(ok) else self.n
        self.budget = min(self.budget_uncapped, BUDGET_CAP)

    def score(self, values: list[float]) -> float:
        best = np.minimum.accumulate(np.array(values[:self.budget] or [self.worst], float))
        if len(best) < self.budget:
            best = np.concatenate([best, np.full(self.budget - len(best), best[-1])])
        e = self.erand[:self.budget]
        return float(np.mean((e - best) / np.maximum(e - self.opt, 1e-12)))


def expected_random_best(sorted_vals: np.ndarray) -> np.ndarray:
    """E[min of k draws without replacement] for k = 1..N over the sorted values."""
    n = len(sorted_vals)
    out = np.empty(n)
    i = np.arange(1, n + 1)               # rank of each value
    for k in range(1, n + 1):
        # P(min = v_i) = C(n-i, k-1) / C(n, k)
        m = n - i >= k - 1
        logp = np.full(n, -np.inf)
        ii = i[m]
        logp[m] = (gammaln(n - ii + 1) - gammaln(k) - gammaln(n - ii - k + 2)
                   - (gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)))
        out[k - 1] = float(np.sum(np.exp(logp) * sorted_vals))
    return out


def run_ours(space: Space, sampler: str, seed: int, warm_start=(), budget=None) -> list[float]:
    budget = budget or space.budget
    names = tuple(space.params)
    countable = space.countable
    s = Searcher(SearchSpace(space.params, lambda cfg: tuple(cfg[n] for n in names) in countable),
                 sampler, seed, warm_start=warm_start)
    values: list[float] = []
    asks = 0
    while len(values) < budget and asks < 20 * budget:
        got = s.ask()
        asks += 1
        if got is None:
            break
        number, cfg = got
        key = tuple(cfg[n] for n in names)
        if key not in countable:
            s.tell(number, None)
            continue
        t = space.cache.time(key)
        s.tell(number, t if isinstance(t, float) else None)
        values.append(space.value[key])
    return values


def run_kt(space: Space, strategy: str, seed: int, json_path: Path, budget=None) -> list[float]:
    from kernel_tuner.interface import tune_cache
    budget = budget or space.budget
    np.random.seed(seed)
    random.seed(seed)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res, _ = tune_cache(str(json_path), strategy=strategy,
                            strategy_options={"max_fevals": budget}, quiet=True, verbose=False)
    names = tuple(space.params)
    seen, values = set(), []
    for r in res:
        key = tuple(r[n] for n in names)
        if key in seen or key not in space.countable:
            continue
        seen.add(key)
        values.append(space.value[key])
        if len(values) >= budget:
            break
    return values


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--ours", default=",".join(OURS))
    ap.add_argument("--kt", default=",".join(KT_STRATEGIES))
    ap.add_argument("--spaces", default="")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    t0 = time.time()
    paths = sorted(REPLAY.glob("*.json.gz"))
    if args.spaces:
        paths = [p for p in paths if any(s in p.name for s in args.spaces.split(","))]
    tmp = Path(tempfile.mkdtemp(prefix="sq-"))
    result = {"method": __doc__.split("    python")[0].strip(), "seeds": args.seeds,
              "spaces": {}, "failed": {}}
    ours = [s for s in args.ours.split(",") if s]
    kts = [s for s in args.kt.split(",") if s]
    try:
        for p in paths:
            sp = Space(p)
            plain = tmp / p.name.replace(".gz", "")
            with gzip.open(p, "rb") as fi, open(plain, "wb") as fo:
                shutil.copyfileobj(fi, fo)
            row = {"device": sp.cache.device, "countable": sp.n, "budget": sp.budget,
                   "budget_uncapped": sp.budget_uncapped, "optimum_ms": sp.opt,
                   "median_ms": sp.median, "scores": {}}
            for name in ours + [f"kt:{s}" for s in kts]:
                t1 = time.time()
                scores = []
                try:
                    for seed in range(args.seeds):
                        vals = run_ours(sp, name, seed) if not name.startswith("kt:") else \
                            run_kt(sp, name[3:], seed, plain)
                        scores.append(sp.score(vals))
                except Exception as e:  # a strategy that cannot run here is noted, not fatal
                    result["failed"].setdefault(name, f"{type(e).__name__}: {e}"[:300])
                    print(f"  {sp.name:28s} {name:24s} FAILED {e!r}"[:200], flush=True)
                    continue
                row["scores"][name] = {"mean": float(np.mean(scores)),
                                       "std": float(np.std(scores)), "n": len(scores),
                                       "seconds": round(time.time() - t1, 1)}
                print(f"  {sp.name:28s} {name:24s} {np.mean(scores):+.3f} ± {np.std(scores):.3f}"
                      f"  ({time.time() - t1:.1f}s)", flush=True)
            result["spaces"][sp.name] = row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summarise(result)
    result["seconds"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} in {result['seconds']}s")


def summarise(result):
    names = sorted({n for r in result["spaces"].values() for n in r["scores"]})
    spaces = list(result["spaces"])
    print(f"\n{'strategy':26s}" + "".join(f"{s[:22]:>24s}" for s in spaces) + f"{'mean':>8s}")
    means = {}
    for n in names:
        cells, vals = [], []
        for s in spaces:
            sc = result["spaces"][s]["scores"].get(n)
            cells.append(f"{sc['mean']:+.3f}±{sc['std']:.3f}" if sc else "-")
            if sc:
                vals.append(sc["mean"])
        means[n] = float(np.mean(vals)) if len(vals) == len(spaces) else None
        print(f"{n:26s}" + "".join(f"{c:>24s}" for c in cells) +
              (f"{means[n]:+8.3f}" if means[n] is not None else ""))
    kt = {n: m for n, m in means.items() if n.startswith("kt:") and m is not None}
    goal = {}
    if kt and means.get("auto") is not None:
        best_kt = max(kt, key=kt.get)
        below_median = []
        for s in spaces:
            sc = result["spaces"][s]["scores"]
            med = float(np.median([v["mean"] for k, v in sc.items() if k.startswith("kt:")]))
            if sc["auto"]["mean"] < med:
                below_median.append(s)
        goal = {"auto_mean": means["auto"], "best_kt": best_kt, "best_kt_mean": kt[best_kt],
                "auto_beats_best_kt_mean": means["auto"] >= kt[best_kt],
                "spaces_where_auto_below_kt_median": below_median,
                "met": means["auto"] >= kt[best_kt] and not below_median}
        print(f"\ngoal: {goal}")
    result["mean_over_spaces"] = means
    result["goal"] = goal


if __name__ == "__main__":
    main()
