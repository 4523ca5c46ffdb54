"""The pieces of benchmarks/search_quality.py that run one strategy on one space: the space
(values, optimum, budget, random-search baseline), porter's samplers and Kernel Tuner's
strategies (with default options, or scaled to spend the whole budget), and the file that keeps
Kernel Tuner's runs so that re-scoring porter's samplers does not re-run them.

A run is kept as its best-so-far trajectory: the (evaluation number, value) pairs where the best
improved, plus the number of evaluations it made. The score and the evaluations to within 5% of
the optimum both follow from it."""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import random
import shutil
import tempfile
import warnings
from itertools import islice
from pathlib import Path

import numpy as np

from porter.interop.kt import KTCache, kt_space, load_cache, load_t1
from porter.interop.kt_cache import t1_beside
from porter.search import Searcher, SearchSpace

CUTOFF = 0.95
WITHIN = 0.05          # "within 5% of the optimum": value <= optimum * 1.05
KT_STRATEGIES = ("genetic_algorithm", "simulated_annealing", "random_sample", "diff_evo", "pso",
                 "mls", "greedy_mls", "greedy_ils", "firefly_algorithm", "dual_annealing",
                 "basinhopping", "bayes_opt")
# Kernel Tuner's own options scaled so that a run can spend the whole budget B: generations or
# iterations sized so that population x iterations = 2 B (their defaults end after a fixed
# number, and a converged population mostly repeats itself), and every strategy listed here is
# restarted with a fresh seed while distinct evaluations are left (annealing schedules and
# scipy's basinhopping / dual_annealing end on their own). The strategies not listed spend B
# with their defaults, so their "full" run is their default run.
FULL = {"genetic_algorithm": lambda b: {"maxiter": -(-2 * b // 26)},      # popsize 26
        "pso": lambda b: {"maxiter": -(-2 * b // 50)},                    # popsize 50
        "firefly_algorithm": lambda b: {"maxiter": -(-2 * b // 20)},      # popsize 20
        "simulated_annealing": lambda b: {},
        "dual_annealing": lambda b: {},
        "basinhopping": lambda b: {}}
MAX_RESTARTS = 100
# strategies also run full-budget from the middle of the space (their x0 option): the start
# porter's auto uses, so that its advantage there is not only where it starts
MIDDLE = ("genetic_algorithm", "pso", "simulated_annealing", "diff_evo")


class Space:
    """A brute-forced space: values of the countable configurations, optimum, budget and the
    random-search baseline."""

    def __init__(self, path: Path, cap: int = 0):
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
        self.within = int(np.count_nonzero(v <= self.opt * (1 + WITHIN)))
        self.t1 = t1_beside(self.path)

    def middle(self) -> tuple:
        """The countable configuration nearest the lower middle of every value order (auto's
        first proposal; ties: the first in product order)."""
        mid = [(len(self.params[n]) - 1) // 2 for n in self.names]
        return min(sorted(self.countable), key=lambda k: sum(
            abs(self.params[n].index(v) - m) for n, v, m in zip(self.names, k, mid)))

    def is_feasible(self, cfg: dict) -> bool:
        return tuple(cfg[n] for n in self.names) in self.countable

    def best_curve(self, traj: list) -> np.ndarray:
        """best_k for k = 1..B from a trajectory [(k, value), ...] (k 1-based, improving)."""
        out = np.full(self.budget, self.worst)
        for (k, v), nxt in zip(traj, list(traj[1:]) + [(self.budget + 1, None)]):
            if k > self.budget:
                break
            out[k - 1:min(nxt[0], self.budget + 1) - 1] = v
        return out

    def score(self, traj: list) -> float:
        """Mean over k = 1..B of (E_k - best_k) / (E_k - optimum); a run that stopped early
        keeps its last best."""
        best = self.best_curve(traj)
        gap = np.maximum(self.erand - self.opt, 1e-12 * max(abs(self.opt), 1.0))
        return float(np.mean((self.erand - best) / gap))

    def evals_to(self, traj: list) -> int | None:
        """Evaluations until a value within WITHIN of the optimum, or None."""
        for k, v in traj:
            if v <= self.opt * (1 + WITHIN):
                return k
        return None

    def random_evals_to(self) -> float:
        """Expected draws random search without replacement needs to reach within WITHIN."""
        return (self.n + 1) / (self.within + 1)


def trajectory(values) -> list:
    """[(k, value)] where the best so far improves (k 1-based)."""
    out, best = [], math.inf
    for k, v in enumerate(values, 1):
        if v < best:
            best = v
            out.append((k, float(v)))
    return out


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


# ---- porter ----------------------------------------------------------------------------------
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


# ---- Kernel Tuner ----------------------------------------------------------------------------
_PLAIN: dict[str, str] = {}
_TMP: list[Path] = []


def _plain_cache(space: Space) -> str:
    """Kernel Tuner reads its cache as plain JSON, at every call: one unpacked copy per
    process, without each entry's list of repeat times (which the simulation does not use;
    it is most of the file, and a run restarted 20 times reads it 20 times)."""
    if space.name not in _PLAIN:
        if not _TMP:
            _TMP.append(Path(tempfile.mkdtemp(prefix="porter-sq-")))
        out = _TMP[0] / f"{space.name}.{os.getpid()}.json"
        opener = gzip.open if space.path.suffix == ".gz" else open
        with opener(space.path, "rt") as fi:
            data = json.load(fi)
        for e in data.get("cache", {}).values():
            if isinstance(e, dict):
                e.pop("times", None)
        out.write_text(json.dumps(data))
        _PLAIN[space.name] = str(out)
    return _PLAIN[space.name]


def cleanup() -> None:
    for d in _TMP:
        shutil.rmtree(d, ignore_errors=True)
    _TMP.clear()
    _PLAIN.clear()


def _tune(space: Space, strategy: str, seed: int, options: dict) -> list:
    from kernel_tuner import tune_kernel
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
                             strategy_options=options, quiet=True, seed=seed)
    return res


def run_kt(space: Space, strategy: str, seed: int, full: bool = False,
           middle: bool = False) -> tuple[list, int]:
    """Values of the distinct configurations a Kernel Tuner strategy evaluates, in order (at
    most B), and the number of restarts. full: FULL's options, restarted while the budget is
    not spent (three restarts in a row without a new configuration end it). middle: the
    first run starts from Space.middle() (Kernel Tuner's x0 option)."""
    budget = space.budget
    seen: set[tuple] = set()
    values: list[float] = []
    restarts = idle = 0
    while True:
        left = budget - len(values)
        opts = {"max_fevals": left}
        if full:
            opts.update(FULL.get(strategy, lambda b: {})(budget))
        if middle and restarts == 0:
            opts["x0"] = list(space.middle())
        try:
            res = _tune(space, strategy, seed + 7919 * restarts, opts)
        except Exception as e:   # simulated_annealing evaluates its start outside its own
            if type(e).__name__ != "StopCriterionReached":   # budget check: a restart
                raise                                        # with 1 left can raise
            res = []
        before = len(values)
        for r in res:
            key = tuple(r[n] for n in space.names)
            if key in seen or key not in space.countable:
                continue
            seen.add(key)
            values.append(space.value[key])
            if len(values) >= budget:
                break
        idle = idle + 1 if len(values) == before else 0
        if not full or len(values) >= budget or idle >= 3 or restarts >= MAX_RESTARTS:
            return values, restarts
        restarts += 1


# ---- the file of Kernel Tuner runs -------------------------------------------------------------
def run_key(space: str, strategy: str, options: str, seed: int, budget: int) -> str:
    return f"{space}|{strategy}|{options}|{seed}|{budget}"


def read_runs(path: Path) -> dict[str, dict]:
    """Runs kept in `path` (gzip, one JSON object a line, members appended), by run_key."""
    out: dict[str, dict] = {}
    if not Path(path).is_file():
        return out
    with gzip.open(path, "rt") as f:
        try:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    out[run_key(r["space"], r["strategy"], r["options"], r["seed"],
                                r["budget"])] = r
        except (EOFError, OSError, ValueError):
            pass   # a member cut short by an interrupted run: what came before it stands
    return out


def append_run(path: Path, run: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "at") as f:
        f.write(json.dumps(run, separators=(",", ":")) + "\n")
