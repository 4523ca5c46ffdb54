"""The "auto" search: a climber with a cheap surrogate over the enumerated feasible set (see
`Auto`). porter.search.searcher.Searcher owns the study and the bookkeeping; this proposes."""
from __future__ import annotations

import bisect
import itertools
import math
import random

import numpy as np

Key = tuple   # a configuration as its values in parameter order


class Auto:
    """The default proposer, on the enumerated feasible set; only unseen feasible configurations.

    After N_INIT random configurations, each proposal is one of
    - a close unseen neighbour (one parameter one or two places along its value order) of one
      of the three best configurations (P_CLIMB of the time), else
    - a child of the best configurations so far (rank-weighted parents, uniform crossover
      and/or mutation that mostly steps along a value order, sometimes jumps anywhere),
    and for P_SURROGATE of the proposals, the best of up to N_CANDIDATES such candidates as
    predicted by an additive model (ridge regression of log objective on one-hot parameter
    values: cheap, and enough to skip children that repeat a known-bad value). P_RANDOM of the
    proposals are random restarts. Tuned on the Kernel Tuner caches of shared/replay with
    benchmarks/search_quality.py.

    Warm-start results are ordinary results (the model learns from them), but only the best
    WARM_ELITES of them may be parents of the climb. A prior (the same template measured on
    another GPU) adds its standardised log objective as one more column of the model, whose
    weight the fit learns from the results here, puts the prior's N_PRIOR best configurations
    not yet proposed among the candidates, and makes the model pick P_SURROGATE_PRIOR of the
    proposals (benchmarks/transfer.py)."""

    N_INIT = 5
    P_RANDOM = 0.03
    P_CLIMB = 0.3
    P_SURROGATE = 0.4
    N_CANDIDATES = 16
    SURROGATE_AFTER = 12      # told results before the model is used
    RIDGE = 1.0
    WARM_ELITES = 1           # warm-start results that may be climb parents (the best ones)
    N_PRIOR = 8               # with a prior: its best unproposed configurations are candidates
    P_SURROGATE_PRIOR = 0.9   # P_SURROGATE when there is a prior
    POP_MIN, POP_MAX, POP_FRAC = 4, 12, 0.2   # parents: the best max(MIN, min(MAX, FRAC * n))
    P_CROSS = 0.5             # uniform crossover of two parents (then a mutation), else mutation
    P_STEP = 0.8              # a mutation steps along the value order, else jumps anywhere

    def __init__(self, s: Searcher, seed: int):
        self.s = s
        self.rng = random.Random(seed)
        self.sizes = [len(v) for v in s.space.params.values()]
        self.pos = [{v: i for i, v in enumerate(vals)} for vals in s.space.params.values()]
        self.values = [tuple(v) for v in s.space.params.values()]
        self.offsets = list(itertools.accumulate([1] + self.sizes))[:-1]   # one-hot columns
        self.feasible: list[Key] | None = None
        self.complete = False
        self.fset: set[Key] = set()
        self.ranked: list[tuple[float, Key]] = []   # told results, best first
        self.failed = 0
        self.own: list[tuple[float, Key]] = []      # results of our own proposals, best first
        self.warm: list[tuple[float, Key]] = []     # warm-start results, best first
        # the prior: its log objective, standardised, as one more feature of the surrogate
        # (the ridge fit learns how far to trust it); its ranking supplies candidates
        self.prior: dict[Key, float] = {}
        self.prior_order: list[Key] = []
        self.prior_next = 0
        if s._prior:
            logs = {k: math.log(v) for k, v in s._prior.items()}
            mu = sum(logs.values()) / len(logs)
            sd = math.sqrt(sum((x - mu) ** 2 for x in logs.values()) / len(logs)) or 1.0
            self.prior = {k: (x - mu) / sd for k, x in logs.items()}
            self.prior_order = sorted(self.prior, key=self.prior.get)

    # ---- bookkeeping -------------------------------------------------------------------
    def _enumerate(self) -> None:
        s = self.s
        if self.feasible is not None:
            return
        listed = s._feasible_list()
        self.complete = listed is not None     # every feasible configuration is in the list
        self.feasible = listed or []
        self.fset = set(self.feasible)

    def proposed(self, key: Key) -> None:
        pass

    def told(self, key: Key, value: float | None) -> None:
        if value is None:
            self.failed += 1
            return
        bisect.insort(self.ranked, (value, key), key=lambda r: r[0])
        bisect.insort(self.warm if key in self.s._warm_keys else self.own, (value, key),
                      key=lambda r: r[0])

    def _elites(self, n: int) -> list[tuple[float, Key]]:
        """The n best results that may be parents of the climb: our own, and only the best
        WARM_ELITES of the warm start. The source GPU's best often sit together in a basin
        that is not the target's best one, and a climb seeded with all of them stays there
        (on the convolution caches: 600+ evaluations to within 3% on the A100, cold 161)."""
        return sorted(self.own[:n] + self.warm[:min(n, self.WARM_ELITES)],
                      key=lambda r: r[0])[:n]

    def _ok(self, key: Key) -> bool:
        if self.s._is_seen(key):
            return False
        return key in self.fset if self.fset else self.s._feasible(key)

    def _index(self, key: Key) -> list[int]:
        return [p[v] for p, v in zip(self.pos, key)]

    def _key(self, ix: Sequence[int]) -> Key:
        return tuple(vals[i] for vals, i in zip(self.values, ix))

    # ---- proposals ---------------------------------------------------------------------
    def propose(self) -> Key | None:
        self._enumerate()
        n_told = len(self.ranked) + self.failed
        if len(self._elites(2)) < 2 or n_told < self.N_INIT or \
                self.rng.random() < self.P_RANDOM:
            return self._random()
        p_surrogate = self.P_SURROGATE_PRIOR if self.prior else self.P_SURROGATE
        if len(self.ranked) >= self.SURROGATE_AFTER and self.rng.random() < p_surrogate:
            key = self._best_predicted()
        else:
            key = self._candidate(self._close())
        return key or self._random()

    def _candidate(self, close: list[Key]) -> Key | None:
        if close and self.rng.random() < self.P_CLIMB:
            return self.rng.choice(close)
        return self._breed()

    def _random(self) -> Key | None:
        s = self.s
        if self.feasible:
            for _ in range(64):
                k = self.feasible[self.rng.randrange(len(self.feasible))]
                if not s._is_seen(k):
                    return k
            unseen = [k for k in self.feasible if not s._is_seen(k)]
            return self.rng.choice(unseen) if unseen else None
        if self.feasible is not None and self.complete:
            return None   # enumerated and empty
        for _ in range(10_000):
            k = tuple(self.rng.choice(v) for v in self.values)
            if self._ok(k):
                return k
        return None

    def _close(self) -> list[Key]:
        """Unseen feasible neighbours (one parameter one place along its order) of the three
        best configurations, or two places where those are used up."""
        top = [k for _, k in self._elites(3)]
        for reach in (1, 2):
            out = []
            for k in top:
                ix = self._index(k)
                for g, n in enumerate(self.sizes):
                    for j in (ix[g] - reach, ix[g] + reach):
                        if 0 <= j < n:
                            c = self._key(ix[:g] + [j] + ix[g + 1:])
                            if self._ok(c):
                                out.append(c)
            if out:
                return out
        return []

    def _breed(self) -> Key | None:
        n_pop = int(max(self.POP_MIN, min(self.POP_MAX, len(self.ranked) * self.POP_FRAC)))
        elites = [k for _, k in self._elites(n_pop)]
        weights = [len(elites) - i for i in range(len(elites))]
        for _ in range(200):
            a = self._index(self.rng.choices(elites, weights)[0])
            if len(elites) > 1 and self.rng.random() < self.P_CROSS:
                b = self._index(self.rng.choices(elites, weights)[0])
                a = [x if self.rng.random() < 0.5 else y for x, y in zip(a, b)]
            k = self._key(self._mutate(a))
            if self._ok(k):
                return k
        return None

    def _mutate(self, ix: list[int]) -> list[int]:
        """Changes one parameter (60%), two (30%) or three: a step of one or two places along
        its value order, or any other value."""
        free = [g for g, n in enumerate(self.sizes) if n > 1]
        if not free:
            return ix
        r = self.rng.random()
        count = 1 if r < 0.6 else (2 if r < 0.9 else 3)
        for g in self.rng.sample(free, min(count, len(free))):
            if self.rng.random() < self.P_STEP:
                ix[g] = min(self.sizes[g] - 1, max(0, ix[g] + self.rng.choice((-2, -1, 1, 2))))
            else:
                ix[g] = self.rng.randrange(self.sizes[g])
        return ix

    def _best_predicted(self) -> Key | None:
        close = self._close()
        cands = {c for c in (self._candidate(close) for _ in range(self.N_CANDIDATES)) if c}
        cands |= set(self._prior_best(self.N_PRIOR))
        if len(cands) < 2:
            return next(iter(cands), None)
        cands_l = sorted(cands, key=self._index)   # a fixed order: determinism under a seed
        data = self.ranked
        values = np.array([v for v, _ in data], float)
        y = np.log(values) if values.min() > 0 else values
        x = self._one_hot([k for _, k in data])
        w = np.linalg.solve(x.T @ x + self.RIDGE * np.eye(x.shape[1]), x.T @ (y - y.mean()))
        return cands_l[int(np.argmin(self._one_hot(cands_l) @ w))]

    def _prior_best(self, n: int) -> list[Key]:
        """The prior's n best configurations not yet proposed (feasible here)."""
        out = []
        i = self.prior_next
        while i < len(self.prior_order) and len(out) < n:
            k = self.prior_order[i]
            if self._ok(k):
                out.append(k)
            elif not out:
                self.prior_next = i + 1    # seen or infeasible: never a candidate again
            i += 1
        return out

    def _one_hot(self, keys: Sequence[Key]) -> np.ndarray:
        if self.prior:
            return np.hstack([self._one_hot_plain(keys),
                              np.array([[self.prior.get(k, 0.0)] for k in keys])])
        return self._one_hot_plain(keys)

    def _one_hot_plain(self, keys: Sequence[Key]) -> np.ndarray:
        out = np.zeros((len(keys), self.offsets[-1] + self.sizes[-1]))
        rows = np.arange(len(keys))
        for g, (p, off) in enumerate(zip(self.pos, self.offsets)):
            out[rows, [off + p[k[g]] for k in keys]] = 1.0
        return out
