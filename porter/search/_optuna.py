"""Optuna's samplers as porter proposers ("tpe", "random", "cmaes", "gp", "grid"): each runs on
a private in-memory study in which every numeric parameter is the integer index of its value in
the declared order (so TPE, CMA-ES and GP see the order; strings stay categorical). A repeat or
a statically infeasible proposal is answered there (with the earlier result, or the worst result
so far) and costs the caller nothing."""
from __future__ import annotations

import random
from typing import Mapping

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from porter.errors import SpecError
from porter.search.base import Key, Proposer

_MAX_INNER = 64               # proposals an Optuna sampler may waste per ask (repeats, infeasible)


def _numeric(values: tuple) -> bool:
    return all(isinstance(v, (int, float)) for v in values)


def _need(module: str, package: str, what: str) -> None:
    """Optional dependencies fail at use, with what to install."""
    try:
        __import__(module)
    except ImportError:
        raise SpecError(f"{what} needs the {package!r} package: pip install {package} "
                        "(or pick --sampler auto)") from None


class _Grid(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its stop request at the end of the grid (that is only
    allowed inside `optimize`; here ask() returns None instead)."""

    def after_trial(self, study, trial, state, values):
        pass


class OptunaProposer(Proposer):
    """An Optuna sampler on a private study over value indices (numeric parameters) and values
    (string parameters). Repeats and infeasible proposals are answered there, not counted."""

    kind = ""

    def __init__(self, s, seed: int):
        super().__init__(s, seed)
        self.dists = {}
        for n, vals in s.space.params.items():
            self.dists[n] = IntDistribution(0, len(vals) - 1) \
                if _numeric(vals) and len(vals) > 1 else CategoricalDistribution(list(vals))
        self.study = optuna.create_study(sampler=self._make_sampler(seed), direction="minimize")
        self.worst: float | None = None
        self.rng = random.Random(seed)
        self.enumerated: list[Key] | None = None
        self._open: dict[Key, int] = {}    # proposed here: key -> trial of the private study

    def _make_sampler(self, seed: int):
        smp = optuna.samplers
        if self.kind == "tpe":
            return smp.TPESampler(seed=seed, multivariate=True, constant_liar=True)
        if self.kind == "random":
            return smp.RandomSampler(seed=seed)
        if self.kind == "cmaes":
            _need("cmaes", "cmaes", "the cmaes sampler")
            return smp.CmaEsSampler(seed=seed, warn_independent_sampling=False)
        if self.kind == "gp":
            _need("torch", "torch", "the gp sampler")
            return smp.GPSampler(seed=seed)
        grid = {n: (list(range(d.high + 1)) if isinstance(d, IntDistribution) else d.choices)
                for n, d in self.dists.items()}
        return _Grid(grid, seed=seed)

    def _to_inner(self, key: Key) -> dict:
        out = {}
        for (n, vals), v in zip(self.space.params.items(), key):
            out[n] = vals.index(v) if isinstance(self.dists[n], IntDistribution) else v
        return out

    def _from_inner(self, params: Mapping) -> Key:
        return tuple(vals[params[n]] if isinstance(self.dists[n], IntDistribution)
                     else params[n] for n, vals in self.space.params.items())

    def _penalty(self) -> float | None:
        return self.worst

    def propose(self) -> Key | None:
        if self.kind == "grid" and len(self.study.trials) >= self.space.size():
            return self._leftover()
        for _ in range(_MAX_INNER):
            trial = self.study.ask(self.dists)
            key = self._from_inner(trial.params)
            if not self.seen(key) and self.feasible(key):
                self._open[key] = trial.number
                return key
            # a repeat answers with the earlier result; an infeasible one with the worst so far
            value = self.result(key) if self.seen(key) else None
            value = value if value is not None else self._penalty()
            if value is None:
                self.study.tell(trial, state=TrialState.FAIL)
            else:
                self.study.tell(trial, value)
            if self.kind == "grid" and len(self.study.trials) >= self.space.size():
                return self._leftover()
        return self._leftover(random_ok=True)

    def _leftover(self, random_ok: bool = False) -> Key | None:
        """A feasible configuration never proposed (the grid is used up, or the sampler keeps
        repeating itself), from the enumerated space; None when there is none."""
        if self.enumerated is None:
            self.enumerated = self.feasible_list()
        if self.enumerated is None:
            return None
        unseen = [k for k in self.enumerated if not self.seen(k)]
        if not unseen:
            return None
        return self.rng.choice(unseen) if random_ok or self.kind != "grid" else unseen[0]

    def told(self, key: Key, value: float | None) -> None:
        if value is not None:
            self.worst = value if self.worst is None else max(self.worst, value)
        number = self._open.pop(key, None)
        if number is not None:
            inner_value = value if value is not None else self._penalty()
            if inner_value is None:
                self.study.tell(number, state=TrialState.FAIL)
            else:
                self.study.tell(number, inner_value)
        else:   # a warm start or another worker's result: the sampler learns from it too
            params = self._to_inner(key)
            v = value if value is not None else self._penalty()
            self.study.add_trial(optuna.trial.create_trial(
                params=params, distributions=self.dists, value=v,
                state=TrialState.COMPLETE if v is not None else TrialState.FAIL))


class TpeProposer(OptunaProposer):
    kind = "tpe"


class RandomProposer(OptunaProposer):
    kind = "random"


class CmaEsProposer(OptunaProposer):
    kind = "cmaes"


class GpProposer(OptunaProposer):
    kind = "gp"


class GridProposer(OptunaProposer):
    kind = "grid"
