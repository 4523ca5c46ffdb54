"""porter.search.searcher: the Searcher's contract for every sampler."""
from __future__ import annotations

import importlib.util
import math

import optuna
import pytest

from porter.errors import SpecError
from porter.search.searcher import SAMPLERS, Searcher, SearchSpace

PARAMS = {"bx": (16, 32, 64, 128, 256), "ty": (1, 2, 4, 8), "mode": ("a", "b")}


def feasible(cfg) -> bool:
    return cfg["bx"] * cfg["ty"] <= 512


def objective(cfg) -> float | None:
    if cfg["bx"] == 16 and cfg["ty"] == 8:
        return None                                     # a "compile failure"
    return abs(cfg["bx"] - 64) / 64 + abs(cfg["ty"] - 4) + (cfg["mode"] == "b") * 0.5


SPACE = SearchSpace(PARAMS, feasible)
N_FEASIBLE = sum(feasible(dict(zip(PARAMS, v)))
                 for v in __import__("itertools").product(*PARAMS.values()))
OPTIONAL = {"gp": "torch", "cmaes": "cmaes"}


def available(sampler: str) -> bool:
    mod = OPTIONAL.get(sampler)
    return mod is None or importlib.util.find_spec(mod) is not None


def drive(searcher: Searcher, n: int | None = None) -> list[dict]:
    out = []
    while n is None or len(out) < n:
        got = searcher.ask()
        if got is None:
            break
        number, cfg = got
        out.append(cfg)
        searcher.tell(number, objective(cfg) if feasible(cfg) else None)
    return out


def keys(cfgs):
    return [tuple(c[k] for k in PARAMS) for c in cfgs]


@pytest.mark.parametrize("sampler", ["auto", "grid", "random"])
def test_exhaustion_without_repeats(sampler):
    cfgs = drive(Searcher(SPACE, sampler, seed=3), n=500)
    assert len(set(keys(cfgs))) == len(cfgs)
    feasible_seen = [c for c in cfgs if feasible(c)]
    assert len(feasible_seen) == N_FEASIBLE
    if sampler == "auto":
        assert len(cfgs) == N_FEASIBLE                 # auto never proposes an infeasible one


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_each_sampler_runs_without_repeats(sampler):
    if not available(sampler):
        with pytest.raises(SpecError, match="pip install"):
            Searcher(SPACE, sampler, seed=0)
        return
    s = Searcher(SPACE, sampler, seed=0)
    cfgs = drive(s, n=12)
    assert len(cfgs) == 12 and len(set(keys(cfgs))) == 12
    assert all(set(c) == set(PARAMS) and all(c[k] in PARAMS[k] for k in PARAMS) for c in cfgs)
    states = [t.state for t in s.study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) + \
        states.count(optuna.trial.TrialState.FAIL) == 12
    assert [t.params for t in s.study.trials
            if t.state != optuna.trial.TrialState.PRUNED] == cfgs


def test_unknown_sampler():
    with pytest.raises(SpecError, match="unknown sampler"):
        Searcher(SPACE, "annealing")


@pytest.mark.parametrize("sampler", ["auto", "tpe", "random"])
def test_seeded_determinism(sampler):
    a = keys(drive(Searcher(SPACE, sampler, seed=7), n=15))
    b = keys(drive(Searcher(SPACE, sampler, seed=7), n=15))
    assert a == b


def test_auto_never_proposes_infeasible_and_finds_the_optimum():
    cfgs = drive(Searcher(SPACE, "auto", seed=1), n=N_FEASIBLE)
    assert all(feasible(c) for c in cfgs)
    assert {"bx": 64, "ty": 4, "mode": "a"} in cfgs


def test_warm_start_first_and_only_feasible():
    warm = [{"bx": 256, "ty": 8, "mode": "a"},       # infeasible: dropped
            {"bx": 32, "ty": 2, "mode": "b"}, {"bx": 64, "ty": 1, "mode": "a"}]
    for sampler in ("auto", "tpe"):
        cfgs = drive(Searcher(SPACE, sampler, seed=0, warm_start=warm), n=4)
        assert cfgs[:2] == warm[1:]
        assert warm[0] not in cfgs


def test_empty_feasible_set():
    s = Searcher(SearchSpace(PARAMS, lambda c: False), "auto")
    assert s.ask() is None


def test_failed_and_nonfinite_results_are_fail_trials():
    s = Searcher(SPACE, "auto", seed=0)
    n1, _ = s.ask()
    n2, _ = s.ask()
    s.tell(n1, None)
    s.tell(n2, float("inf"))
    assert [t.state for t in s.study.trials] == [optuna.trial.TrialState.FAIL] * 2


@pytest.mark.parametrize("sampler", ["auto", "tpe"])
def test_shared_study_on_sqlite(tmp_path, sampler):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    a = Searcher(SPACE, sampler, seed=1, storage=url, study_name="job-1")
    b = Searcher(SPACE, sampler, seed=2, storage=url, study_name="job-1")
    proposed = []
    open_ = []
    for _ in range(10):               # interleaved, with one trial of each still running
        for s in (a, b):
            got = s.ask()
            assert got is not None
            proposed.append(got[1])
            open_.append((s, got))
        for s, (number, cfg) in open_[:-2]:
            s.tell(number, objective(cfg) if feasible(cfg) else None)
        open_ = open_[-2:]
    assert len(set(keys(proposed))) == len(proposed)
    study = optuna.load_study(study_name="job-1", storage=url)
    assert len(study.trials) == 20

    # a third searcher resumes: it proposes none of the finished or running ones
    c = Searcher(SPACE, sampler, seed=3, storage=url, study_name="job-1")
    more = drive(c, n=5)
    assert not set(keys(more)) & set(keys(proposed))


def test_resume_exhausts_only_the_rest(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = drive(Searcher(SPACE, "auto", seed=0, storage=url, study_name="s"), n=10)
    rest = drive(Searcher(SPACE, "auto", seed=0, storage=url, study_name="s"))
    assert len(first) + len(rest) == N_FEASIBLE
    assert not set(keys(first)) & set(keys(rest))


def _rugged(n_params: int = 3, n_values: int = 8, seed: int = 0):
    """A space whose objective has no structure a climb could follow (a random value per
    configuration), so only a prior can point at the optimum."""
    import itertools
    import random
    params = {f"p{i}": tuple(range(n_values)) for i in range(n_params)}
    rng = random.Random(seed)
    value = {k: rng.uniform(1.0, 10.0) for k in itertools.product(*params.values())}
    return SearchSpace(params, lambda c: True), value


def _evals_to_optimum(space, value, seed, prior=()) -> int:
    s = Searcher(space, "auto", seed=seed, prior=prior)
    best = min(value, key=value.get)
    for n in range(1, len(value) + 1):
        number, cfg = s.ask()
        key = tuple(cfg[p] for p in space.params)
        s.tell(number, value[key])
        if key == best:
            return n
    raise AssertionError("auto ended without proposing every configuration")


def test_prior_ranking_guides_auto():
    space, value = _rugged()
    # "another GPU": the same ranking, other times
    prior = [(dict(zip(space.params, k)), 0.5 * v + 0.1) for k, v in value.items()]
    cold = [_evals_to_optimum(space, value, seed) for seed in range(5)]
    warm = [_evals_to_optimum(space, value, seed, prior) for seed in range(5)]
    assert max(warm) <= 40 < sum(cold) / len(cold)


def test_prior_outside_the_space_is_ignored():
    prior = [({"bx": 999, "ty": 1, "mode": "a"}, 1.0), ({"bx": 64, "ty": 4, "mode": "a"}, None),
             ({"bx": 64, "ty": 2, "mode": "a"}, float("nan")), ({"bx": 32}, 1.0),
             ({"bx": 64, "ty": 4, "mode": "b"}, 2.0)]
    s = Searcher(SPACE, "auto", seed=0, prior=prior)
    cfgs = drive(s)
    assert len(cfgs) == N_FEASIBLE and len(set(keys(cfgs))) == N_FEASIBLE


@pytest.mark.parametrize("name,size", [("gemm_wgmma", (4096, 28672, 8192)),
                                       ("gemm_wgmma", (16, 8192, 8200)),
                                       ("gemm_mma", (4096, 4096, 4096)),
                                       ("rmsnorm", (4096, 16384))])
def test_pruned_enumeration_finds_the_same_feasible_set_in_the_same_order(name, size):
    """The space's candidates skip subtrees a constraint already rules out; what they leave,
    checked in full, is exactly the feasible part of the whole product, in product order."""
    import itertools

    from porter.spec.arch import ARCHS
    from porter.build.check import prefix_check, static_check
    from porter.spec.template import find_template
    tpl, arch = find_template(name), ARCHS["sm_90a"]
    # a sub-space keeps the full product small enough to check: one GROUP_M and one RELEASE (in
    # no constraint), every other BN and STAGES (a sub-space's pruning must hold all the same)
    cut = {"GROUP_M": slice(0, 1), "RELEASE": slice(0, 1), "BN": slice(None, None, 2),
           "STAGES": slice(None, None, 2)}
    params = {n: tuple(v)[cut.get(n, slice(None))] for n, v in tpl.params.items()}

    def ok(k):
        return static_check(tpl, arch, dict(zip(tpl.param_names, k)), [size]) is None
    pruned = SearchSpace(params, ok, prefix_check(tpl, arch, [size]))
    fast = [k for k in pruned.candidates() if ok(k)]
    full = [k for k in itertools.product(*params.values()) if ok(k)]
    assert fast == full and fast
    assert sum(1 for _ in pruned.candidates()) < math.prod(len(v) for v in params.values())


def test_enumeration_limit_counts_candidates_left_after_pruning(monkeypatch):
    import porter.search.searcher as search
    monkeypatch.setattr(search, "MAX_ENUMERATE", 50)
    params = {"A": tuple(range(10)), "B": tuple(range(10)), "C": tuple(range(10))}

    def ok(c):
        return c["A"] == 0 and c["B"] == 0 and c["C"] % 2 == 0

    # 1,000 configurations: without a pruning rule, too many to list
    assert Searcher(SearchSpace(params, ok), "auto")._feasible_list() is None
    # a rule on (A, B) leaves 10 candidates: listed, feasible ones only, in order
    tight = SearchSpace(params, ok, lambda k, p: k == 0 and p["A"] == 0 or
                        k == 1 and p["B"] == 0 or k == 2)
    assert Searcher(tight, "auto")._feasible_list() == [(0, 0, c) for c in range(0, 10, 2)]
    # a rule on A alone leaves 100: over the limit again
    loose = SearchSpace(params, ok, lambda k, p: k != 0 or p["A"] == 0)
    assert Searcher(loose, "auto")._feasible_list() is None
    s = Searcher(tight, "auto")
    got = {tuple(s.ask()[1].values()) for _ in range(5)}
    assert got == {(0, 0, c) for c in range(0, 10, 2)} and s.ask() is None
