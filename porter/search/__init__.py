"""Search: what to try next. This package owns the search space (`SearchSpace`: parameters, the
static feasibility check, enumeration with prefix pruning), the `Searcher` that records every
proposal as a trial of an Optuna study (shared by workers, resumable) and answers ask/tell, and
the samplers behind it: the `Proposer` base, the registry of samplers by name
(`register_sampler`, `get_sampler`, `sampler_names`; third-party ones through the entry-point
group `porter.samplers`), the default model-guided climber "auto" and Optuna's samplers. It
knows nothing of compiling or measuring: an objective is a number, lower is better.

`Searcher` and `SearchSpace` load Optuna on first use; the registry does not."""
from porter.search.base import (ENTRY_POINT_GROUP, SAMPLER_NAMES, Proposer, get_sampler,
                                register_sampler, sampler_names, unregister_sampler)

__all__ = ["ENTRY_POINT_GROUP", "SAMPLER_NAMES", "Proposer", "SearchSpace", "Searcher",
           "get_sampler", "register_sampler", "sampler_names", "unregister_sampler"]


def __getattr__(name):
    if name in ("Searcher", "SearchSpace"):
        from porter.search import searcher
        return getattr(searcher, name)
    raise AttributeError(f"module 'porter.search' has no attribute {name!r}")
