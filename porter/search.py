"""Search over a template's space with Optuna's ask/tell.

Optuna's samplers ("tpe", "random", "cmaes", "gp", "grid") are used as they are. The default,
"auto", knows the feasible set, never proposes a configuration twice and uses the order of the
values in each parameter: after a few random starts it runs a steady-state genetic search over
value indices (rank-weighted parents among the best so far, uniform crossover, mutations that
step along a parameter's value order or jump to any value), proposing only unseen feasible
configurations, with some random restarts.
Every proposal is an Optuna trial, so a study in the database is shared by several workers and
an interrupted job resumes where it stopped.
"""
from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import optuna

from .errors import SpecError

MAX_ENUMERATE = 2_000_000


@dataclass(frozen=True)
class SearchSpace:
    params: Mapping[str, tuple]
    is_feasible: Callable[[dict], bool]


def _sampler(name: str, seed: int, space: SearchSpace):
    s = optuna.samplers
    if name == "tpe":
        return s.TPESampler(seed=seed, constant_liar=True, multivariate=True)
    if name == "random":
        return s.RandomSampler(seed=seed)
    if name == "cmaes":
        return s.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "gp":
        try:
            import torch  # noqa: F401  (Optuna's GP sampler needs it)
        except ImportError:
            raise SpecError("the gp sampler needs PyTorch: pip install torch "
                            "(or pick --sampler auto/tpe)") from None
        return s.GPSampler(seed=seed)
    if name == "grid":
        return s.GridSampler({k: list(v) for k, v in space.params.items()}, seed=seed)
    if name == "auto":
        return s.RandomSampler(seed=seed)   # only fills what enqueue_trial leaves open
    raise SpecError(f"unknown sampler {name!r}")


class Searcher:
    PATIENCE = 60    # auto: results without a new best before a restart
    def __init__(self, space: SearchSpace, sampler: str = "auto", seed: int = 0,
                 storage=None, study_name: str | None = None, warm_start: Sequence[dict] = ()):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space = space
        self.names = tuple(space.params)
        self.kind = sampler
        self.rng = random.Random(seed)
        self.study = optuna.create_study(
            storage=storage, study_name=study_name, load_if_exists=True,
            sampler=_sampler(sampler, seed, space), direction="minimize")
        self._feasible: list[tuple] | None = None
        self._warm = [dict(w) for w in warm_start
                      if set(w) == set(self.names) and self._valid(w)]
        self._own: dict[int, tuple] = {}
        self._seen: set[tuple] = set()
        self._done: dict[tuple, float] = {}
        self._synced = -1e9

    # ---- helpers -------------------------------------------------------------------------
    def _valid(self, cfg: Mapping) -> bool:
        return all(cfg[n] in self.space.params[n] for n in self.names) and \
            self.space.is_feasible(dict(cfg))

    def _key(self, cfg: Mapping) -> tuple:
        return tuple(cfg[n] for n in self.names)

    def feasible(self) -> list[tuple]:
        if self._feasible is None:
            total = 1
            for v in self.space.params.values():
                total *= len(v)
            if total > MAX_ENUMERATE:
                raise SpecError(f"the space has {total} configurations; the auto sampler "
                                f"enumerates at most {MAX_ENUMERATE}: pick --sampler tpe")
            self._feasible = [vals for vals in itertools.product(*self.space.params.values())
                              if self.space.is_feasible(dict(zip(self.names, vals)))]
        return self._feasible

    def _history(self, max_age: float = 2.0):
        """Configurations already proposed (by any worker sharing the study) and the results.
        Kept here and merged from the storage at most every `max_age` seconds."""
        now = time.monotonic()
        if now - self._synced > max_age:
            self._synced = now
            for t in self.study.get_trials(deepcopy=False):
                if set(t.params) != set(self.names):
                    continue
                key = self._key(t.params)
                self._seen.add(key)
                if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None:
                    self._done[key] = t.value
        return self._seen, sorted((v, k) for k, v in self._done.items())

    def _index(self, key: tuple) -> tuple:
        if not hasattr(self, "_pos"):
            self._pos = [{v: i for i, v in enumerate(self.space.params[n])} for n in self.names]
        return tuple(p[v] for p, v in zip(self._pos, key))

    # ---- proposals ---------------------------------------------------------------------
    def _feasible_set(self) -> set[tuple]:
        if getattr(self, "_fset", None) is None:
            self._fset = set(self.feasible())
        return self._fset

    def _random_unseen(self, seen) -> tuple | None:
        feas = self.feasible()
        for _ in range(64):
            c = feas[self.rng.randrange(len(feas))]
            if c not in seen:
                return c
        unseen = [c for c in feas if c not in seen]
        return self.rng.choice(unseen) if unseen else None

    def _mutate(self, ix: list[int]) -> list[int]:
        """Changes one to three parameters: a step of one or two positions in the value order,
        or (half the time) any other value."""
        sizes = self._sizes
        free = [i for i, n in enumerate(sizes) if n > 1]
        if not free:
            return ix
        r = self.rng.random()
        k = 1 if r < 0.7 else (2 if r < 0.9 else 3)
        for g in self.rng.sample(free, min(k, len(free))):
            if self.rng.random() < 0.5:
                step = self.rng.choice((-2, -1, 1, 2))
                ix[g] = min(sizes[g] - 1, max(0, ix[g] + step))
            else:
                ix[g] = self.rng.choice([v for v in range(sizes[g]) if v != ix[g]])
        return ix

    def _child(self, elites: list[tuple]) -> tuple:
        """A steady-state genetic step over index vectors: rank-weighted parents, uniform
        crossover (half the time), then mutation."""
        weights = [len(elites) - i for i in range(len(elites))]
        a = list(self._index(self.rng.choices(elites, weights)[0]))
        if len(elites) > 1 and self.rng.random() < 0.5:
            b = self._index(self.rng.choices(elites, weights)[0])
            a = [x if self.rng.random() < 0.5 else y for x, y in zip(a, b)]
            if self.rng.random() < 0.5:
                a = self._mutate(a)
        else:
            a = self._mutate(a)
        return tuple(self.space.params[n][i] for n, i in zip(self.names, a))

    def _auto_proposal(self) -> tuple | None:
        """Warm-start configurations first, then a few random ones, then children of the best
        configurations so far (a steady-state genetic search over the parameters' value
        orders), with occasional random restarts; only unseen feasible configurations."""
        seen, done = self._history()
        while self._warm:
            w = self._key(self._warm.pop(0))
            if w not in seen:
                return w
        feas = self.feasible()
        fset = self._feasible_set()
        if not feas or sum(1 for k in seen if k in fset) >= len(feas):
            return None
        if not hasattr(self, "_sizes"):
            self._sizes = [len(self.space.params[n]) for n in self.names]
        n_init = min(10, max(3, len(feas) // 50))
        # restarts: after PATIENCE results without a new best, the search starts a fresh
        # population (random starts, elites only from results since the restart)
        if not hasattr(self, "_best"):
            self._best, self._best_at, self._island, self._island_n = float("inf"), 0, set(), 0
        if done and done[0][0] < self._best:
            self._best, self._best_at = done[0][0], len(done)
        if len(done) - self._best_at > self.PATIENCE and len(done) - self._island_n > \
                self.PATIENCE:
            self._island = {k for _, k in done}
            self._island_n = self._best_at = len(done)
        local = [(v, k) for v, k in done if k not in self._island] if self._island else done
        if len(local) < n_init or self.rng.random() < 0.05:
            return self._random_unseen(seen)
        n_pop = max(4, min(12, len(local) // 5))
        elites = [k for _, k in local[:n_pop]]
        for _ in range(100):
            c = self._child(elites)
            if c not in seen and c in fset:
                return c
        # every nearby child was tried: the unseen configuration fewest changes from an elite
        centre = self.rng.choice(elites)
        unseen = [c for c in feas if c not in seen]
        if not unseen:
            return None
        def changes(c):
            return sum(a != b for a, b in zip(c, centre))
        best = min(changes(c) for c in unseen)
        return self.rng.choice([c for c in unseen if changes(c) == best])

    def ask(self) -> tuple[int, dict] | None:
        """The next configuration and its trial number; None once nothing is left to try."""
        if self.kind == "auto":
            key = self._auto_proposal()
            if key is None:
                return None
            self.study.enqueue_trial(dict(zip(self.names, key)), skip_if_exists=False)
        if self.kind != "auto":
            self._history()
        for _ in range(1000 if self.kind != "auto" else 1):
            trial = self.study.ask()
            cfg = {n: trial.suggest_categorical(n, list(v))
                   for n, v in self.space.params.items()}
            key = self._key(cfg)
            seen = self._seen
            if self.kind == "auto" or key not in seen:
                self._seen.add(key)
                self._own[trial.number] = key
                return trial.number, cfg
            # an Optuna sampler repeated itself: that costs no evaluation
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            if self.kind == "grid" and len(seen) >= self._grid_size():
                return None
        return None

    def _grid_size(self) -> int:
        n = 1
        for v in self.space.params.values():
            n *= len(v)
        return n

    def tell(self, number: int, objective: float | None) -> None:
        state = optuna.trial.TrialState.COMPLETE if objective is not None else \
            optuna.trial.TrialState.FAIL
        key = self._own.pop(number, None)
        if key is not None and objective is not None:
            self._done[key] = objective
        try:
            self.study.tell(number, objective if objective is not None else None, state=state)
        except (ValueError, RuntimeError):
            pass  # already finished (another worker, or a resumed job)
