"""Search quality on brute-forced Kernel Tuner caches: porter's samplers against Kernel Tuner's
strategies, scored with the methodology of Willemsen et al. ("A methodology for comparing
optimization algorithms for auto-tuning", FGCS 2024; the FAIR auto-tuning benchmark hub), in
its function-evaluation form.

Exact definitions used here, per space (one cache file):

- Countable configurations: every cached configuration except InvalidConfig (none of the shared
  caches has any: they hold exactly the configurations that satisfy the T1 conditions). A
  compilation or runtime failure costs an evaluation like a timed one; for scoring its value is
  the worst valid time of the space (it never improves the best found).
- Evaluation: a distinct countable configuration, counted in the order a strategy first
  evaluates it. Repeats and statically infeasible proposals cost nothing (porter's Searcher
  never hands them out for "auto"; an Optuna sampler's are answered inside the Searcher; Kernel
  Tuner's repeats are cache hits and are dropped from its result list here).
- Random-search baseline: E_k, the expected best value of k draws without replacement from the
  N countable values, computed exactly (no sampling).
- Budget B: the methodology's cutoff point. With median m and optimum o of the values, the
  target is o + (1 - 0.95) * (m - o); with g configurations at or below the target, B is the
  expected number of draws random search without replacement needs to hit one,
  ceil((N + 1) / (g + 1)). Not capped by default (--cap N caps it, for quick runs; reported as
  budget_uncapped / budget).
- Score of one run: mean over k = 1..B of (E_k - best_k) / (E_k - o), where best_k is the best
  value among the run's first k evaluations (a run that stops early keeps its last best): 0 is
  random search without replacement, 1 is the optimum from the first evaluation. Reported as
  mean and standard deviation over seeds 0..S-1 (the same seeds for every strategy).

Porter's samplers run through porter.search.searcher.Searcher with is_feasible = "is a countable
configuration". Kernel Tuner's strategies run through kernel_tuner.tune_kernel in simulation
mode on the cache (a dummy kernel string; tune_params from the cache; restrictions from the
kernel's T1 Conditions when its T1 file is beside the cache), with strategy_options
max_fevals = B and otherwise their defaults, numpy/random seeded with the seed.

    python benchmarks/search_quality.py [--seeds 20] [--jobs 1] [--ours auto,random,tpe]
                                        [--kt genetic_algorithm,...] [--spaces A100,...]
"""
from __future__ import annotations

import argparse
from itertools import islice
import contextlib
import gzip
import io
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")   # one core per worker on a shared machine
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from porter.interop.kt import KTCache, kt_space, load_cache, load_t1  # noqa: E402
from porter.search.searcher import Searcher, SearchSpace               # noqa: E402

REPLAY = ROOT.parent / "shared" / "replay"
OUT = ROOT / "benchmarks" / "results" / "search_quality.json"
CUTOFF = 0.95
BUDGET_CAP = 0     # 0: the methodology's budget as it is
OURS = ("auto", "random", "tpe")
OURS_SLOW = {"tpe": "about 10 ms per Optuna trial (and 3-4 trials per evaluation on these "
                    "spaces): ~40 min for 20 seeds on one core",
             "gp": "needs PyTorch, not installed", "cmaes": "as slow as tpe"}
KT_STRATEGIES = ("genetic_algorithm", "simulated_annealing", "random_sample", "diff_evo", "pso",
                 "mls", "greedy_mls", "greedy_ils", "firefly_algorithm", "dual_annealing",
                 "basinhopping", "bayes_opt")


# ---- one space -----------------------------------------------------------------------------
class Space:
    """A brute-forced space: values of the countable configurations, optimum, budget and the
    random-search baseline."""

    def __init__(self, path: Path, cap: int = BUDGET_CAP):
        self.path = Path(path)
        self.name = self.path.name.split(".json")[0]
        self.cache: KTCache = load_cache(self.path)
        self.params, self.countable = kt_space(self.cache)
        self.names = tuple(self.params)
        valid = [t for t in self.cache.entries.values() if isinstance(t, float)]
        self.worst = max(valid)
        self.value: dict[tuple, float] = {}
        for c in self.countable:
            t = self.cache.time(c)
            self.value[c] = t if isinstance(t, float) else self.worst
        v = np.sort(np.fromiter(self.value.values(), float))
        self.n = len(v)
        self.opt = float(v[0])
        self.median = float(np.median(v))
        target = self.opt + (1 - CUTOFF) * (self.median - self.opt)
        good = int(np.count_nonzero(v <= target))
        self.budget_uncapped = math.ceil((self.n + 1) / (good + 1))
        self.budget = min(self.budget_uncapped, cap) if cap else self.budget_uncapped
        self.erand = expected_best_of_random(v, self.budget)
        t1 = self.path.parent / (self.name.rsplit("_", 1)[0] + ".T1.json")
        self.t1 = t1 if t1.is_file() else None

    def is_feasible(self, cfg: dict) -> bool:
        return tuple(cfg[n] for n in self.names) in self.countable

    def score(self, values: list[float]) -> float:
        """Mean over k = 1..B of (E_k - best_k) / (E_k - optimum)."""
        best = np.minimum.accumulate(np.asarray(values[:self.budget] or [self.worst], float))
        if len(best) < self.budget:
            best = np.concatenate([best, np.full(self.budget - len(best), best[-1])])
        gap = np.maximum(self.erand - self.opt, 1e-12 * max(abs(self.opt), 1.0))
        return float(np.mean((self.erand - best) / gap))

    def evals_to(self, values: list[float], within: float) -> int | None:
        """Evaluations until a value within `within` (relative) of the optimum, or None."""
        for i, v in enumerate(values):
            if v <= self.opt * (1 + within):
                return i + 1
        return None


def expected_best_of_random(sorted_values: np.ndarray, kmax: int) -> np.ndarray:
    """E[min of k draws without replacement], k = 1..kmax, from ascending `sorted_values`.

    E[min] = v_1 + sum_{i >= 2} (v_i - v_{i-1}) * P(all k draws rank >= i), and
    P(all k draws rank >= i) = C(N - i + 1, k) / C(N, k)."""
    v = np.asarray(sorted_values, float)
    n = len(v)
    steps = np.diff(v)                                  # v_i - v_{i-1}, i = 2..N
    rest = n - np.arange(1, n)                          # N - i + 1 for i = 2..N
    out = np.empty(kmax)
    log_p = np.zeros(n - 1)                             # log P(rank >= i) for k draws
    for k in range(1, kmax + 1):
        # going from k-1 to k draws multiplies P by (rest - k + 1) / (N - k + 1)
        with np.errstate(divide="ignore"):
            log_p = log_p + np.log(np.maximum(rest - k + 1, 0)) - math.log(n - k + 1)
        out[k - 1] = v[0] + float(np.sum(steps * np.exp(log_p)))
    return out


# ---- runs ------------------------------------------------------------------------------------
def run_porter(space: Space, sampler: str, seed: int, budget: int | None = None,
               warm_start=()) -> list[float]:
    """Values of the distinct countable configurations a porter Searcher evaluates, in order."""
    budget = budget or space.budget
    s = Searcher(SearchSpace(space.params, space.is_feasible), sampler, seed,
                 warm_start=warm_start)
    return list(islice(evaluations(space, s), budget))


def evaluations(space: Space, s: Searcher):
    """Asks s and answers from the cache; yields the value of each distinct countable
    configuration as it is evaluated (repeats and uncountable ones cost nothing)."""
    seen: set[tuple] = set()
    while (got := s.ask()) is not None:
        number, cfg = got
        key = tuple(cfg[n] for n in space.names)
        t = space.cache.time(key) if key in space.countable else None
        s.tell(number, t if isinstance(t, float) else None)
        if key in space.countable and key not in seen:
            seen.add(key)
            yield space.value[key]


_PLAIN: dict[str, str] = {}
_TMP: list[Path] = []     # one folder for the unpacked caches, made by main() before forking


def _plain_cache(space: Space) -> str:
    """Kernel Tuner reads its cache as plain JSON: one unpacked copy per process."""
    if space.name not in _PLAIN:
        if not _TMP:
            _TMP.append(Path(tempfile.mkdtemp(prefix="porter-sq-")))
        out = _TMP[0] / f"{space.name}.{os.getpid()}.json"
        opener = gzip.open if space.path.suffix == ".gz" else open
        with opener(space.path, "rb") as fi, open(out, "wb") as fo:
            shutil.copyfileobj(fi, fo)
        _PLAIN[space.name] = str(out)
    return _PLAIN[space.name]


def run_kt(space: Space, strategy: str, seed: int, budget: int | None = None) -> list[float]:
    """Values of the distinct configurations a Kernel Tuner strategy evaluates, in order."""
    from kernel_tuner import tune_kernel
    budget = budget or space.budget
    restrictions = [c.text for c in load_t1(space.t1).conditions] if space.t1 else \
        space.is_feasible
    np.random.seed(seed)
    random.seed(seed)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res, _ = tune_kernel(space.cache.kernel_name or "kernel",
                             "__global__ void kernel() {}",
                             tuple(space.cache.problem_size) or (1,), [],
                             {n: list(v) for n, v in space.params.items()},
                             restrictions=restrictions, cache=_plain_cache(space),
                             simulation_mode=True, strategy=strategy,
                             strategy_options={"max_fevals": budget}, quiet=True, seed=seed)
    seen: set[tuple] = set()
    values: list[float] = []
    for r in res:
        key = tuple(r[n] for n in space.names)
        if key in seen or key not in space.countable:
            continue
        seen.add(key)
        values.append(space.value[key])
        if len(values) >= budget:
            break
    return values


# ---- driver ----------------------------------------------------------------------------------
_SPACES: dict[str, Space] = {}


def _space(path: str, cap: int) -> Space:
    if path not in _SPACES:
        _SPACES[path] = Space(Path(path), cap)
    return _SPACES[path]


def _task(args):
    path, cap, name, seed = args
    sp = _space(path, cap)
    t0 = time.time()
    try:
        vals = run_kt(sp, name[3:], seed) if name.startswith("kt:") else \
            run_porter(sp, name, seed)
    except Exception as e:  # a strategy that cannot run here is reported, not fatal
        return path, name, seed, None, f"{type(e).__name__}: {e}"[:300], time.time() - t0
    return path, name, seed, sp.score(vals), len(vals), time.time() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--ours", default=",".join(OURS))
    ap.add_argument("--kt", default=",".join(KT_STRATEGIES))
    ap.add_argument("--spaces", default="", help="substrings of cache names to keep")
    ap.add_argument("--cap", type=int, default=BUDGET_CAP)
    ap.add_argument("--reuse", default="", help="take scores of strategies not run from this "
                    "earlier results file (for developing a sampler)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    t0 = time.time()
    paths = sorted(REPLAY.glob("*.json.gz"))
    if args.spaces:
        paths = [p for p in paths if any(s in p.name for s in args.spaces.split(","))]
    names = [s for s in args.ours.split(",") if s] + \
        [f"kt:{s}" for s in args.kt.split(",") if s]
    tasks = [(str(p), args.cap, n, seed) for p in paths for n in names
             for seed in range(args.seeds)]
    spaces = {str(p): _space(str(p), args.cap) for p in paths}
    result = {
        "method": __doc__.split("    python")[0].strip(), "cutoff": CUTOFF,
        "budget_cap": args.cap, "seeds": args.seeds, "date": time.strftime("%Y-%m-%d"),
        "failed": {}, "spaces": {},
    }
    for p, sp in spaces.items():
        result["spaces"][sp.name] = {
            "device": sp.cache.device, "countable": sp.n, "optimum_ms": sp.opt,
            "median_ms": sp.median, "budget_uncapped": sp.budget_uncapped,
            "budget": sp.budget, "scores": {}}
    raw: dict[tuple, list] = {}
    _TMP.append(Path(tempfile.mkdtemp(prefix="porter-sq-")))
    ctx = mp.get_context("fork")
    with ctx.Pool(args.jobs) as pool:
        for path, name, seed, score, n, secs in pool.imap_unordered(_task, tasks):
            sp = spaces[path]
            if score is None:
                result["failed"].setdefault(name, n)
                continue
            raw.setdefault((sp.name, name), []).append((seed, score, n, secs))
    for (sname, name), rows in sorted(raw.items()):
        rows.sort()
        scores = [r[1] for r in rows]
        result["spaces"][sname]["scores"][name] = {
            "mean": float(np.mean(scores)), "std": float(np.std(scores)), "n": len(scores),
            "evals_mean": float(np.mean([r[2] for r in rows])),
            "seconds": round(sum(r[3] for r in rows), 1)}
    if args.reuse and Path(args.reuse).is_file():
        old = json.loads(Path(args.reuse).read_text())
        for sname, row in result["spaces"].items():
            for name, sc in old.get("spaces", {}).get(sname, {}).get("scores", {}).items():
                row["scores"].setdefault(name, dict(sc, reused=True))
    ran = {n for r in result["spaces"].values() for n in r["scores"]}
    result["skipped"] = {k: v for k, v in OURS_SLOW.items() if k not in ran}
    summarise(result)
    result["table"] = table(result).splitlines()
    for d in _TMP:
        shutil.rmtree(d, ignore_errors=True)
    result["seconds"] = round(time.time() - t0, 1)
    print(table(result))
    print(f"goal: {json.dumps(result['goal'])}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['seconds']} s")
    return result


def summarise(result: dict) -> None:
    """Mean over spaces per strategy, and the goal: auto's mean at least Kernel Tuner's best
    strategy's, and auto at or above Kernel Tuner's median strategy on every space."""
    spaces = result["spaces"]
    names = sorted({n for r in spaces.values() for n in r["scores"]})
    means = {}
    for n in names:
        vals = [r["scores"][n]["mean"] for r in spaces.values() if n in r["scores"]]
        if len(vals) == len(spaces):
            means[n] = float(np.mean(vals))
    result["mean_over_spaces"] = means
    kt = {n: m for n, m in means.items() if n.startswith("kt:")}
    if not kt or "auto" not in means:
        result["goal"] = {}
        return
    best = max(kt, key=kt.get)
    below = {}
    for sname, r in spaces.items():
        med = float(np.median([v["mean"] for k, v in r["scores"].items()
                               if k.startswith("kt:")]))
        if r["scores"]["auto"]["mean"] < med:
            below[sname] = {"auto": r["scores"]["auto"]["mean"], "kt_median": med}
    result["goal"] = {"auto_mean": means["auto"], "best_kt": best, "best_kt_mean": kt[best],
                      "auto_at_least_best_kt": means["auto"] >= kt[best],
                      "spaces_below_kt_median": below,
                      "met": means["auto"] >= kt[best] and not below}


def table(result: dict) -> str:
    spaces = list(result["spaces"])
    short = [s.replace("convolution_milo_", "conv ").replace("dedispersion_milo_", "dedisp ")
             for s in spaces]
    head = f"{'strategy':24s}" + "".join(f"{s:>17s}" for s in short) + f"{'mean':>8s}"
    lines = [head, "-" * len(head)]
    means = result.get("mean_over_spaces", {})
    order = sorted({n for r in result["spaces"].values() for n in r["scores"]},
                   key=lambda n: -means.get(n, -9))
    for n in order:
        cells = []
        for s in spaces:
            sc = result["spaces"][s]["scores"].get(n)
            cells.append(f"{sc['mean']:+.3f} ±{sc['std']:.3f}" if sc else "-")
        m = means.get(n)
        lines.append(f"{n:24s}" + "".join(f"{c:>17s}" for c in cells) +
                     (f"{m:+8.3f}" if m is not None else ""))
    budgets = "".join(f"{result['spaces'][s]['budget']:>17d}" for s in spaces)
    lines.append(f"{'budget B (evaluations)':24s}" + budgets)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
