"""The "auto" search: a climber with a cheap surrogate over the enumerated feasible set, restarted
when it stalls (see `Auto`). porter.search.searcher.Searcher owns the study and the bookkeeping;
this proposes."""
from __future__ import annotations

import bisect
import itertools
import math
import random
from typing import Sequence

import numpy as np

from porter.search.base import Key, Proposer


class Auto(Proposer):
    """The default proposer, on the enumerated feasible set; only unseen feasible configurations.

    The first proposal is the feasible configuration nearest the middle of every parameter's
    value order (START = "center"; "random" draws it), then N_INIT - 1 random ones (none by
    default: the climb starts from the first result). After that, each proposal is one of
    - a close unseen neighbour (one parameter one or two places along its value order) of one
      of the three best configurations of the current climb (P_CLIMB of the time), else
    - a child of the climb's best configurations (rank-weighted parents, uniform crossover
      and/or mutation that mostly steps along a value order, sometimes jumps anywhere),
    and for P_SURROGATE of the proposals, the best of up to N_CANDIDATES such candidates (plus
    N_GLOBAL random unseen ones) as predicted by an additive model (ridge regression of log
    objective on one-hot parameter values, updated in place: cheap, and enough to skip
    children that repeat a known-bad value). P_RANDOM of the proposals are random.

    Restarts: when the climb's best has not improved for max(STALL_MIN, STALL * n) of the n
    evaluations so far, a new climb starts from the model's best guess among N_RESTART random
    unseen configurations; only results of the current climb are its parents (the model keeps
    everything). This bounds the time spent in one basin, which is what gave the old climber
    its heavy tail. The constants were chosen by leave-one-space-out over ten brute-forced
    Kernel Tuner spaces (benchmarks/search_quality.py, docs/notes/search.md).

    Warm-start results are ordinary results (the model learns from them), but only the best
    WARM_ELITES of them may be parents of the climb. A prior (the same template measured on
    another GPU) adds its standardised log objective as one more column of the model, whose
    weight the fit learns from the results here, puts the prior's N_PRIOR best configurations
    not yet proposed among the candidates, and makes the model pick P_SURROGATE_PRIOR of the
    proposals (benchmarks/transfer.py)."""

    START = "center"
    N_INIT = 1
    P_RANDOM = 0.03
    P_CLIMB = 0.3
    P_SURROGATE = 0.4
    N_CANDIDATES = 16
    N_GLOBAL = 0              # random unseen configurations among the model's candidates
    SURROGATE_AFTER = 12      # told results before the model is used
    RIDGE = 1.0
    STALL, STALL_MIN = 0.5, 30   # restart after max(STALL_MIN, STALL * n) without progress
    N_RESTART = 64            # random candidates the model picks a restart from
    WARM_ELITES = 1           # warm-start results that may be climb parents (the best ones)
    N_PRIOR = 8               # with a prior: its best unproposed configurations are candidates
    P_SURROGATE_PRIOR = 0.9   # P_SURROGATE when there is a prior
    POP_MIN, POP_MAX, POP_FRAC = 4, 12, 0.2   # parents: the best max(MIN, min(MAX, FRAC * n))
    P_CROSS = 0.5             # uniform crossover of two parents (then a mutation), else mutation
    P_STEP = 0.8              # a mutation steps along the value order, else jumps anywhere
    BREED_TRIES = 50          # children tried before giving up (all seen: the basin is used up)

    def __init__(self, s, seed: int):
        super().__init__(s, seed)
        self.rng = random.Random(seed)
        params = s.space.params
        self.sizes = [len(v) for v in params.values()]
        self.pos = [{v: i for i, v in enumerate(vals)} for vals in params.values()]
        self.values = [tuple(v) for v in params.values()]
        self.offsets = list(itertools.accumulate([0] + self.sizes))[:-1]   # one-hot columns
        self.feasible: list[Key] | None = None
        self.complete = False
        self.fset: set[Key] = set()
        self.ranked: list[tuple[float, Key]] = []   # told results, best first
        self.failed = 0
        self.own: list[tuple[float, Key]] = []      # this climb's own results, best first
        self.warm: list[tuple[float, Key]] = []     # warm-start results, best first
        self.climb_best, self.since = math.inf, 0   # the climb's best; evaluations since
        self.restart_next = False
        # the prior: its log objective, standardised, as one more feature of the surrogate
        # (the ridge fit learns how far to trust it); its ranking supplies candidates
        self.prior_z: dict[Key, float] = {}
        self.prior_order: list[Key] = []
        self.prior_next = 0
        if self.prior:
            logs = {k: math.log(v) for k, v in self.prior.items()}
            mu = sum(logs.values()) / len(logs)
            sd = math.sqrt(sum((x - mu) ** 2 for x in logs.values()) / len(logs)) or 1.0
            self.prior_z = {k: (x - mu) / sd for k, x in logs.items()}
            self.prior_order = sorted(self.prior_z, key=self.prior_z.get)
        self.model = _Ridge(sum(self.sizes), bool(self.prior_z), self.RIDGE)

    # ---- bookkeeping -------------------------------------------------------------------
    def _enumerate(self) -> None:
        if self.feasible is not None:
            return
        listed = self.feasible_list()
        self.complete = listed is not None     # every feasible configuration is in the list
        self.feasible = listed or []
        self.fset = set(self.feasible)

    def told(self, key: Key, value: float | None) -> None:
        self.since += 1
        if value is None:
            self.failed += 1
        else:
            bisect.insort(self.ranked, (value, key), key=lambda r: r[0])
            bisect.insort(self.warm if key in self.warm_keys else self.own, (value, key),
                          key=lambda r: r[0])
            self.model.add(self._features(key), value)
            if value < self.climb_best:
                self.climb_best, self.since = value, 0
        n = len(self.ranked) + self.failed
        if self.STALL and n >= self.N_INIT and self.since >= max(self.STALL_MIN, self.STALL * n):
            self.restart_next = True

    def _elites(self, n: int) -> list[tuple[float, Key]]:
        """The n best results that may be parents of the climb: the climb's own, and only the
        best WARM_ELITES of the warm start. The source GPU's best often sit together in a basin
        that is not the target's best one, and a climb seeded with all of them stays there
        (on the convolution caches: 600+ evaluations to within 3% on the A100, cold 161)."""
        return sorted(self.own[:n] + self.warm[:min(n, self.WARM_ELITES)],
                      key=lambda r: r[0])[:n]

    def _ok(self, key: Key) -> bool:
        if self.seen(key):
            return False
        return key in self.fset if self.fset else self.feasible(key)

    def _index(self, key: Key) -> list[int]:
        return [p[v] for p, v in zip(self.pos, key)]

    def _key(self, ix: Sequence[int]) -> Key:
        return tuple(vals[i] for vals, i in zip(self.values, ix))

    # ---- proposals ---------------------------------------------------------------------
    def propose(self) -> Key | None:
        self._enumerate()
        n_told = len(self.ranked) + self.failed
        if self.restart_next:
            self._restart()
            key = self._best_of(self._randoms(self.N_RESTART)) if self.model.n >= \
                self.SURROGATE_AFTER else None
            return key or self._random()
        if n_told == 0 and self.START == "center" and not self.warm_keys:
            return self._center() or self._random()
        if not self._elites(1) or n_told < self.N_INIT or self.rng.random() < self.P_RANDOM:
            return self._random()
        p_surrogate = self.P_SURROGATE_PRIOR if self.prior_z else self.P_SURROGATE
        if self.model.n >= self.SURROGATE_AFTER and self.rng.random() < p_surrogate:
            key = self._best_predicted()
        else:
            key = self._candidate(self._close())
        return key or self._random()

    def _restart(self) -> None:
        """A new climb: its parents are its own results from here on."""
        self.restart_next = False
        self.own, self.warm = [], []
        self.climb_best, self.since = math.inf, 0

    def _candidate(self, close: list[Key]) -> Key | None:
        if close and self.rng.random() < self.P_CLIMB:
            return self.rng.choice(close)
        return self._breed()

    def _center(self) -> Key | None:
        """The unseen feasible configuration nearest (in value-order steps) to the middle of
        every parameter's order (the lower middle of an even count); ties drawn at random."""
        mid = [(n - 1) // 2 for n in self.sizes]
        unseen = [k for k in self.feasible or () if not self.seen(k)]
        if not unseen:
            return None
        dist = [sum(abs(i - m) for i, m in zip(self._index(k), mid)) for k in unseen]
        low = min(dist)
        return self.rng.choice([k for k, d in zip(unseen, dist) if d == low])

    def _random(self) -> Key | None:
        if self.feasible:
            for _ in range(64):
                k = self.feasible[self.rng.randrange(len(self.feasible))]
                if not self.seen(k):
                    return k
            unseen = [k for k in self.feasible if not self.seen(k)]
            return self.rng.choice(unseen) if unseen else None
        if self.feasible is not None and self.complete:
            return None   # enumerated and empty
        for _ in range(10_000):
            k = tuple(self.rng.choice(v) for v in self.values)
            if self._ok(k):
                return k
        return None

    def _randoms(self, n: int) -> list[Key]:
        return [k for k in (self._random() for _ in range(n)) if k is not None]

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
        n_pop = int(max(self.POP_MIN, min(self.POP_MAX, len(self.own) * self.POP_FRAC)))
        elites = [k for _, k in self._elites(n_pop)]
        if not elites:
            return None
        weights = [len(elites) - i for i in range(len(elites))]
        for _ in range(self.BREED_TRIES):
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
        if self.N_GLOBAL:
            cands |= set(self._randoms(self.N_GLOBAL))
        return self._best_of(cands)

    def _best_of(self, cands) -> Key | None:
        """The candidate the model predicts fastest (a fixed order first: determinism)."""
        if len(cands) < 2:
            return next(iter(cands), None)
        cands_l = sorted(set(cands), key=self._index)
        pred = self.model.predict([self._features(k) for k in cands_l])
        return cands_l[int(np.argmin(pred))]

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

    def _features(self, key: Key) -> tuple[list[int], float]:
        """The one-hot columns set for key, and its prior column's value (0 without one)."""
        return ([off + p[v] for off, p, v in zip(self.offsets, self.pos, key)],
                self.prior_z.get(key, 0.0))


class _Ridge:
    """Ridge regression of log objective on one-hot columns (plus an optional prior column),
    kept as running sums so that each result costs O(columns^2) at most:
    w = (X'X + ridge I)^-1 X'(y - mean y)."""

    def __init__(self, onehot: int, prior: bool, ridge: float):
        self.onehot, self.prior, self.ridge = onehot, prior, ridge
        self.d = d = onehot + (1 if prior else 0)
        self.xtx = np.zeros((d, d))
        self.xty = np.zeros(d)
        self.xsum = np.zeros(d)
        self.ysum = 0.0
        self.n = 0
        self.rows: list[tuple[list[int], float, float]] = []
        self.log = True          # log objective while every objective is positive
        self.w: np.ndarray | None = None

    def add(self, feat: tuple[list[int], float], value: float) -> None:
        self.rows.append((feat[0], feat[1], value))
        if self.log and value <= 0:
            self.log = False
            self._rebuild()
            return
        self._add(feat[0], feat[1], value)

    def _add(self, cols: list[int], z: float, value: float) -> None:
        y = math.log(value) if self.log else value
        ix = np.asarray(cols)
        self.xtx[np.ix_(ix, ix)] += 1.0
        self.xty[ix] += y
        self.xsum[ix] += 1.0
        if self.prior and z:                       # the prior column is the last one
            last = self.d - 1
            self.xtx[ix, last] += z
            self.xtx[last, ix] += z
            self.xtx[last, last] += z * z
            self.xty[last] += z * y
            self.xsum[last] += z
        self.ysum += y
        self.n += 1
        self.w = None

    def _rebuild(self) -> None:
        rows = self.rows
        self.__init__(self.onehot, self.prior, self.ridge)
        self.log = False
        for cols, z, v in rows:
            self.rows.append((cols, z, v))
            self._add(cols, z, v)

    def predict(self, feats: list[tuple[list[int], float]]) -> np.ndarray:
        if self.w is None:
            rhs = self.xty - (self.ysum / max(self.n, 1)) * self.xsum
            self.w = np.linalg.solve(self.xtx + self.ridge * np.eye(self.d), rhs)
        w = self.w
        last = self.d - 1
        return np.array([w[cols].sum() + (w[last] * z if z else 0.0) for cols, z in feats])
