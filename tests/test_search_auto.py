"""porter.search.auto: the default sampler's start, its model and its restarts."""
from __future__ import annotations

import itertools
import math

import numpy as np

from porter.search import Searcher, SearchSpace
from porter.search.auto import Auto, _Ridge

PARAMS = {"bx": (16, 32, 64, 128, 256), "ty": (1, 2, 4, 8), "flag": (0, 1)}


def test_first_proposal_is_the_middle_of_every_order():
    s = Searcher(SearchSpace(PARAMS, lambda c: True), "auto", seed=5)
    assert s.ask()[1] == {"bx": 64, "ty": 2, "flag": 0}
    # the middle itself infeasible: the nearest feasible one
    s = Searcher(SearchSpace(PARAMS, lambda c: c["bx"] != 64), "auto", seed=5)
    cfg = s.ask()[1]
    assert cfg["bx"] in (32, 128) and cfg["ty"] == 2 and cfg["flag"] == 0


def test_ridge_updated_in_place_equals_the_batch_fit():
    rng = np.random.default_rng(0)
    sizes = [5, 4, 2]
    offsets = [0, 5, 9]
    rows = [tuple(int(rng.integers(n)) for n in sizes) for _ in range(40)]
    y = [float(math.exp(rng.normal())) for _ in rows]
    z = [float(rng.normal()) for _ in rows]
    m = _Ridge(11, True, 1.0)
    for r, v, zz in zip(rows, y, z):
        m.add(([o + i for o, i in zip(offsets, r)], zz), v)
    x = np.zeros((len(rows), 12))
    for i, r in enumerate(rows):
        x[i, [o + j for o, j in zip(offsets, r)]] = 1.0
        x[i, 11] = z[i]
    ly = np.log(y)
    w = np.linalg.solve(x.T @ x + np.eye(12), x.T @ (ly - ly.mean()))
    feats = [([o + j for o, j in zip(offsets, r)], zz) for r, zz in zip(rows, z)]
    assert np.allclose(m.predict(feats), x @ w)
    m.add(([0, 5, 9], 0.0), -1.0)          # a non-positive objective: raw values from then on
    assert not m.log and m.n == 41


def test_a_stalled_climb_restarts_elsewhere():
    """With nothing ever improving on the first result, the climb is abandoned after
    STALL_MIN evaluations and a new one starts (its parents only its own results)."""
    space = SearchSpace({"a": tuple(range(12)), "b": tuple(range(12))}, lambda c: True)
    s = Searcher(space, "auto", seed=1)
    eng = s._engine
    restarted = False
    for i in range(Auto.STALL_MIN + 5):
        number, cfg = s.ask()
        s.tell(number, 1.0 if i == 0 else 2.0)
        restarted |= math.isinf(eng.climb_best) or eng.climb_best == 2.0
    assert restarted
    assert all(v == 2.0 for v, _ in eng.own)        # the first climb's best is not a parent
    assert eng.ranked[0] == (1.0, (5, 5))           # the model and the record keep it


def test_auto_never_repeats_across_restarts():
    space = SearchSpace({"a": tuple(range(6)), "b": tuple(range(5)), "c": (0, 1)},
                        lambda c: (c["a"] + c["b"]) % 4 != 3)
    feasible = [k for k in itertools.product(range(6), range(5), (0, 1))
                if (k[0] + k[1]) % 4 != 3]
    s = Searcher(space, "auto", seed=2)
    seen = []
    while (got := s.ask()) is not None:
        number, cfg = got
        seen.append(tuple(cfg.values()))
        s.tell(number, 1.0 + (cfg["a"] == 0))      # flat: stalls, restarts, never improves
    assert sorted(seen) == sorted(feasible) and len(set(seen)) == len(seen)
