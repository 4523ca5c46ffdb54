"""The proposer plug-in point: `Proposer`, the base every sampler implements, and the registry of
samplers by name.

A proposer is made for one Searcher as `cls(searcher, seed)`. The Searcher owns the study, the
warm start and the bookkeeping (what was proposed, what was told, feasibility); the proposer only
picks the next configuration, from what it was told. Built-in names are listed here and imported
when first used; others come from `register_sampler(name, cls)` or from the entry-point group
`porter.samplers` of an installed package (`name = "package.module:ProposerClass"`).

This module imports nothing heavy (no Optuna, no NumPy): the CLI validates a sampler name with
it before any search starts.
"""
from __future__ import annotations

import abc
import importlib
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from porter.errors import SpecError

if TYPE_CHECKING:   # pragma: no cover
    from porter.search.searcher import Searcher, SearchSpace

Key = tuple   # a configuration as its values in parameter order
ENTRY_POINT_GROUP = "porter.samplers"


class Proposer(abc.ABC):
    """Proposes configurations of one Searcher's space; lower objectives are better.

    propose() -> an unseen feasible configuration (a Key: values in parameter order), or None
    when nothing is left to propose. The Searcher may also answer repeats and infeasible keys
    itself, but a proposer that returns them wastes a call. told(key, value) reports a result:
    the objective, or None for a failed configuration; results of warm starts and of other
    workers sharing the study arrive here too. proposed(key) is a hook: the Searcher opened a
    trial for key (a warm start, an enqueued trial, or this proposer's own proposal)."""

    def __init__(self, searcher: "Searcher", seed: int):
        self.s = searcher
        self.seed = seed

    @abc.abstractmethod
    def propose(self) -> Key | None:
        """The next configuration to try, or None when none is left."""

    @abc.abstractmethod
    def told(self, key: Key, value: float | None) -> None:
        """A result: objective (lower is better), or None for a failure."""

    def proposed(self, key: Key) -> None:
        """A trial was opened for `key`; nothing by default."""

    # ---- helpers on the Searcher's bookkeeping ---------------------------------------------
    @property
    def space(self) -> "SearchSpace":
        return self.s.space

    @property
    def prior(self) -> Mapping[Key, float]:
        """Objectives measured elsewhere (positive, finite), by key; empty without a prior."""
        return self.s._prior

    @property
    def warm_keys(self) -> frozenset:
        return self.s._warm_keys

    def seen(self, key: Key) -> bool:
        """Proposed already (told or still open), here or by a worker sharing the study."""
        return self.s._is_seen(key)

    def feasible(self, key: Key) -> bool:
        return self.s._feasible(key)

    def feasible_list(self) -> list[Key] | None:
        """Every feasible configuration in product order, or None where there are too many
        to list (see porter.search.searcher.MAX_ENUMERATE)."""
        return self.s._feasible_list()

    def result(self, key: Key) -> float | None:
        return self.s._results.get(key)


# ---- the registry --------------------------------------------------------------------------
Factory = Callable[["Searcher", int], Proposer]
_BUILTIN = {
    "auto": "porter.search.auto:Auto",
    "tpe": "porter.search._optuna:TpeProposer",
    "random": "porter.search._optuna:RandomProposer",
    "cmaes": "porter.search._optuna:CmaEsProposer",
    "gp": "porter.search._optuna:GpProposer",
    "grid": "porter.search._optuna:GridProposer",
}
_REGISTERED: dict[str, Factory] = {}


def register_sampler(name: str, factory: Factory) -> None:
    """Makes `factory(searcher, seed)` (a Proposer subclass, usually) the sampler `name`, for
    this process. A name already taken is an error (built-ins cannot be replaced)."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise SpecError(f"a sampler name must be a non-empty word, not {name!r}")
    if name in _BUILTIN or name in _REGISTERED:
        raise SpecError(f"sampler {name!r} is already registered")
    _REGISTERED[name] = factory


def unregister_sampler(name: str) -> None:
    """Removes a sampler registered with register_sampler (not built-ins or entry points)."""
    _REGISTERED.pop(name, None)


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def sampler_names() -> tuple[str, ...]:
    """Built-ins first, then registered samplers, then installed entry points."""
    names = list(_BUILTIN) + [n for n in _REGISTERED if n not in _BUILTIN]
    return tuple(names + [n for n in _entry_points() if n not in names])


def get_sampler(name: str) -> Factory:
    """The factory of sampler `name`; an unknown name is one SpecError that lists the known."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTIN:
        module, attr = _BUILTIN[name].split(":")
        return getattr(importlib.import_module(module), attr)
    ep = _entry_points().get(name) if isinstance(name, str) else None
    if ep is None:
        raise SpecError(f"unknown sampler {name!r}; pick one of {', '.join(sampler_names())}")
    try:
        return ep.load()
    except Exception as e:   # a broken plug-in is the user's to fix, said in one line
        raise SpecError(f"sampler {name!r} ({ep.value}) cannot be loaded: "
                        f"{type(e).__name__}: {e}") from e


class _Names(Sequence):
    """The sampler names as a live, read-only sequence (what `porter.records.SAMPLERS` is):
    membership and listing always reflect the registry."""

    def __getitem__(self, i):
        return sampler_names()[i]

    def __len__(self) -> int:
        return len(sampler_names())

    def __contains__(self, name) -> bool:
        return name in _BUILTIN or name in _REGISTERED or \
            (isinstance(name, str) and name in _entry_points())

    def __iter__(self) -> Iterator[str]:
        return iter(sampler_names())

    def __repr__(self) -> str:
        return repr(sampler_names())


SAMPLER_NAMES: Sequence[str] = _Names()
