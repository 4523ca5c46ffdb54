"""Search over a template's space with Optuna's ask/tell.

Every proposal is an Optuna trial of the study (in memory, or in a database shared by several
workers), so dashboards plot it and an interrupted job resumes where it stopped: trials already
COMPLETE or FAIL in the study count as seen, and trials RUNNING in other workers are not proposed
again. Parameters are recorded as categorical with their real values.

Proposals come from a Proposer (porter.search.base), picked by name from the registry:

- "tpe", "random", "cmaes", "gp", "grid": the Optuna sampler of that name, seeded, on a private
  study over value indices (porter.search._optuna). A repeat or a statically infeasible proposal
  is answered there and costs the caller nothing.
- "auto" (the default): enumerates the feasible set (up to MAX_ENUMERATE candidates left after
  the space's pruning, `SearchSpace.candidates`), never proposes a configuration twice and only
  proposes feasible ones: a model-guided climber (`porter.search.auto.Auto`).
- anything registered with `register_sampler` or installed under the entry-point group
  `porter.samplers`.

Warm-start configurations (feasible ones only) are proposed first, in the order given. A prior
(objectives of the same configurations measured elsewhere, e.g. on another GPU) guides "auto"
(see `porter.search.auto.Auto`); the Optuna samplers ignore it.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from porter.search._rdb import rows_for
from porter.search.base import SAMPLER_NAMES, get_sampler

SAMPLERS = SAMPLER_NAMES      # live: built-ins, registered samplers and entry points
MAX_ENUMERATE = 1_000_000     # the auto sampler enumerates up to this many candidates (left
                              # after pruning, where the space can prune)

Key = tuple   # a configuration as its values in parameter order


@dataclass(frozen=True)
class SearchSpace:
    params: Mapping[str, tuple]          # ordered name -> values (numbers or strings)
    is_feasible: Callable[[dict], bool]  # static check (constraints); cheap
    # optional, for enumerating: prefix_ok(k, prefix) is False where the first k + 1 parameters
    # (in order, as a dict) already break a constraint, so no completion is feasible
    prefix_ok: Callable[[int, dict], bool] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.params)

    def size(self) -> int:
        return math.prod(len(v) for v in self.params.values())

    def contains(self, config: Mapping[str, Any]) -> bool:
        return set(config) == set(self.params) and \
            all(config[n] in vals for n, vals in self.params.items())

    def candidates(self) -> Iterator[Key]:
        """Every configuration, in itertools.product order, less the subtrees prefix_ok cuts
        (what is left still needs is_feasible)."""
        values = [tuple(v) for v in self.params.values()]
        if self.prefix_ok is None:
            yield from itertools.product(*values)
            return
        names, last = self.names, len(values) - 1

        def walk(k: int, prefix: dict, key: tuple):
            for v in values[k]:
                prefix[names[k]] = v
                if not self.prefix_ok(k, prefix):
                    continue
                if k == last:
                    yield key + (v,)
                else:
                    yield from walk(k + 1, prefix, key + (v,))
            del prefix[names[k]]
        yield from walk(0, {}, ())


class _Pinned(optuna.samplers.BaseSampler):
    """The recorded study's sampler: it returns the configuration the searcher chose."""

    def __init__(self):
        self.next: dict[str, Any] = {}

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.next[param_name]


class Searcher:
    """Proposes configurations of `space` and records each as a trial of an Optuna study.

    ask() -> (trial number, config), or None once every feasible configuration was proposed
    (for "auto" and "grid"; the other samplers cannot know). tell(number, objective) with
    objective lower-is-better, or None for a failed configuration.

    warm_start: configurations proposed first, in the order given (feasible ones only).
    prior: (configuration, objective) pairs measured elsewhere (the same template on another
    GPU); "auto" uses them as a hint of where to look (see `porter.search.auto.Auto`), the
    others ignore them."""

    def __init__(self, space: SearchSpace, sampler: str = "auto", seed: int = 0,
                 storage=None, study_name: str | None = None, warm_start: Sequence[dict] = (),
                 prior: Sequence[tuple[Mapping[str, Any], float]] = ()):
        factory = get_sampler(sampler)     # an unknown name: one SpecError
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space = space
        self.names = space.names
        self.kind = sampler
        self.seed = seed
        self._pinned = _Pinned()
        self._study = optuna.create_study(storage=storage, study_name=study_name,
                                          load_if_exists=True, sampler=self._pinned,
                                          direction="minimize")
        self._shared = storage is not None
        self._dists = {n: CategoricalDistribution(list(v)) for n, v in space.params.items()}
        # a study in a database: open, finish and read trials in one round trip each
        self._rows = rows_for(self._study, self._dists) if self._shared else None
        self._ids: dict[int, int] = {}                # our open trial numbers -> trial ids
        self._results: dict[Key, float | None] = {}   # told (here or by another worker)
        self._pending: set[Key] = set()               # proposed, not told yet
        self._own: dict[int, Key] = {}                # our open trial numbers
        self._synced: dict[int, bool] = {}            # trial number -> finished when read
        self._feasible_cache: dict[Key, bool] = {}
        self._waiting = False                         # the study holds enqueued trials
        self.enqueued: set[int] = set()               # our trials taken from the study's queue
        self._warm = [self._key(w) for w in warm_start
                      if space.contains(w) and self._feasible(self._key(w))]
        self._warm_keys = frozenset(self._warm)
        self._prior = {self._key(c): float(v) for c, v in prior
                       if space.contains(c) and v is not None and math.isfinite(v) and v > 0}
        self._engine = factory(self, seed)
        self.sync()

    # ---- public ------------------------------------------------------------------------
    @property
    def study(self) -> optuna.Study:
        return self._study

    def seen(self, config: Mapping[str, Any]) -> bool:
        k = self._key(config)
        return k in self._results or k in self._pending

    def ask(self, sync: bool = True) -> tuple[int, dict] | None:
        """The next configuration and its trial number; None once nothing is left to try.
        sync=False: the caller has just called sync()."""
        if self._shared and sync:
            self.sync()
        while self._warm:
            key = self._warm.pop(0)
            if not self._is_seen(key):
                return self._record(key)
        key = self._engine.propose()
        return None if key is None else self._record(key)

    def tell(self, number: int, objective: float | None) -> None:
        """Records the result of trial `number`: lower is better; None means it failed."""
        if objective is not None and not math.isfinite(objective):
            objective = None
        key = self._own.pop(number, None)
        if key is not None:
            self._pending.discard(key)
            self._results[key] = objective
            self._engine.told(key, objective)
        trial_id = self._ids.pop(number, None)
        if trial_id is not None:
            self._rows.finish(trial_id, objective)   # a no-op where already finished
        else:
            state = TrialState.COMPLETE if objective is not None else TrialState.FAIL
            try:
                self._study.tell(number, objective, state=state)
            except (ValueError, RuntimeError):
                pass  # already finished (by another worker, or a resumed job)
        self._synced[number] = True

    # ---- helpers -----------------------------------------------------------------------
    def _key(self, config: Mapping[str, Any]) -> Key:
        return tuple(config[n] for n in self.names)

    def _config(self, key: Key) -> dict:
        return dict(zip(self.names, key))

    def _is_seen(self, key: Key) -> bool:
        return key in self._results or key in self._pending

    def _feasible_list(self) -> list[Key] | None:
        """The feasible configurations in product order; None where more than MAX_ENUMERATE
        candidates are left to check (after the space's pruning, if it has any)."""
        if self.space.prefix_ok is None and self.space.size() > MAX_ENUMERATE:
            return None
        out = []
        for n, key in enumerate(self.space.candidates()):
            if n >= MAX_ENUMERATE:
                return None
            if self._feasible(key):
                out.append(key)
        return out

    def _feasible(self, key: Key) -> bool:
        ok = self._feasible_cache.get(key)
        if ok is None:
            ok = self._feasible_cache[key] = bool(self.space.is_feasible(self._config(key)))
        return ok

    def _open_trial(self, cfg: dict) -> int | None:
        """A RUNNING trial with cfg's parameters, written at once; its number. (study.ask writes
        each parameter in a transaction of its own: 8 commits, ~70 ms a trial on PostgreSQL,
        inside the service's serialised ask.) None where the study does not allow it."""
        if self._rows is not None:
            trial_id, number = self._rows.open(cfg)
            self._ids[number] = trial_id
            return number
        storage = getattr(self._study, "_storage", None)
        study_id = getattr(self._study, "_study_id", None)
        if storage is None or study_id is None:
            return None
        trial = optuna.trial.create_trial(state=TrialState.RUNNING, params=cfg,
                                          distributions=self._dists)
        return storage.get_trial_number_from_id(
            storage.create_new_trial(study_id, template_trial=trial))

    def _record(self, key: Key) -> tuple[int, dict]:
        """Opens a trial for `key` in the recorded study. A trial someone enqueued in the study
        is taken first by Optuna: if it is new and feasible it becomes this proposal."""
        cfg = self._config(key)
        number = self._open_trial(cfg) if self._shared and not self._waiting else None
        if number is not None:
            return self._opened(number, key), cfg
        self._pinned.next = cfg
        while True:
            trial = self._study.ask(self._dists)
            got = self._key(trial.params) if set(trial.params) == set(self.names) else None
            if got == key:
                break
            if got is not None and self.space.contains(trial.params) and \
                    not self._is_seen(got) and self._feasible(got):
                self._warm.insert(0, key)
                key, cfg = got, self._config(got)
                self.enqueued.add(trial.number)
                break
            self._study.tell(trial, state=TrialState.PRUNED)
        return self._opened(trial.number, key), cfg

    def _opened(self, number: int, key: Key) -> int:
        """Bookkeeping for trial `number`, just opened for `key` by this searcher."""
        self._pending.add(key)
        self._own[number] = key
        self._synced[number] = False
        self._engine.proposed(key)
        return number

    def sync(self) -> list:
        """Reads the shared study's trials this searcher has not seen finished: results of other
        workers (or of an earlier run) become seen; their running trials become pending.
        Returns the study's running trials (with .number and .datetime_start), ours included."""
        states = (TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING)
        self._waiting = False
        running = []
        trials = self._rows.changed() if self._rows is not None else \
            self._study.get_trials(deepcopy=False, states=states)
        for t in trials:
            if t.state not in states:
                continue
            if t.state == TrialState.WAITING:   # enqueued: study.ask must take it up
                self._waiting = True
                continue
            if t.state == TrialState.RUNNING:
                running.append(t)
            if self._synced.get(t.number) or t.number in self._own:
                continue
            if set(t.params) != set(self.names):
                continue
            key = self._key(t.params)
            if t.state == TrialState.RUNNING:
                if key not in self._results:
                    self._pending.add(key)
                    self._synced[t.number] = False
                continue
            self._synced[t.number] = True
            self._pending.discard(key)
            value = t.value if t.state == TrialState.COMPLETE else None
            if key not in self._results or (value is not None and self._results[key] is None):
                self._results[key] = value
                self._engine.told(key, value)
        return running
