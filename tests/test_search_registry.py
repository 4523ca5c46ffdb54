"""porter.search.base: samplers are plug-ins, picked by name from a registry that built-ins,
register_sampler and installed entry points (group porter.samplers) fill."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from porter.errors import SpecError
from porter.search import (ENTRY_POINT_GROUP, Proposer, Searcher, SearchSpace, get_sampler,
                           register_sampler, sampler_names, unregister_sampler)

PARAMS = {"a": (1, 2, 3, 4), "b": (1, 2)}
SPACE = SearchSpace(PARAMS, lambda c: c["a"] * c["b"] <= 4)


class InOrder(Proposer):
    """Feasible configurations in product order; remembers what it was told."""

    def __init__(self, searcher, seed):
        super().__init__(searcher, seed)
        self.heard: list = []

    def propose(self):
        for key in self.feasible_list():
            if not self.seen(key):
                return key
        return None

    def told(self, key, value):
        self.heard.append((key, value))


@pytest.fixture
def in_order():
    register_sampler("in-order", InOrder)
    yield "in-order"
    unregister_sampler("in-order")


def test_builtins_are_listed_and_proposers():
    assert sampler_names()[:6] == ("auto", "tpe", "random", "cmaes", "gp", "grid")
    for name in ("auto", "tpe", "random", "grid"):
        assert issubclass(get_sampler(name), Proposer)


def test_registered_sampler_drives_a_searcher(in_order):
    s = Searcher(SPACE, in_order, seed=0)
    got = []
    while (nxt := s.ask()) is not None:
        number, cfg = nxt
        got.append((cfg["a"], cfg["b"]))
        s.tell(number, float(cfg["a"] + cfg["b"]))
    assert got == [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (4, 1)]
    assert s._engine.heard == [(k, float(sum(k))) for k in got]
    assert len(s.study.trials) == 6


def test_registered_sampler_names_a_job(in_order, tmp_path):
    from porter.job.jobs import make_spec
    from porter.records import SAMPLERS
    assert in_order in SAMPLERS and SAMPLERS.index("auto") == 0
    spec, _, _ = make_spec("rmsnorm", "sm_90a", trials=2, backend="compile-only",
                           sampler=in_order)
    assert spec.sampler == in_order
    unregister_sampler(in_order)
    assert in_order not in SAMPLERS
    with pytest.raises(SpecError, match="unknown sampler"):
        make_spec("rmsnorm", "sm_90a", trials=2, backend="compile-only", sampler=in_order)


def test_unknown_name_is_one_clear_error(in_order):
    with pytest.raises(SpecError) as e:
        Searcher(SPACE, "simulated-annealing", seed=0)
    msg = str(e.value)
    assert "unknown sampler 'simulated-annealing'" in msg and "auto" in msg and in_order in msg
    assert "\n" not in msg
    with pytest.raises(SpecError, match="already registered"):
        register_sampler("auto", InOrder)
    with pytest.raises(SpecError, match="already registered"):
        register_sampler(in_order, InOrder)


def test_entry_point_sampler(tmp_path, monkeypatch):
    """An installed package that declares a sampler under porter.samplers (a real
    distribution on sys.path, found by importlib.metadata)."""
    (tmp_path / "my_samplers.py").write_text(
        "from porter.search import Proposer\n"
        "class Last(Proposer):\n"
        "    def propose(self):\n"
        "        left = [k for k in self.feasible_list() if not self.seen(k)]\n"
        "        return left[-1] if left else None\n"
        "    def told(self, key, value):\n"
        "        pass\n")
    info = tmp_path / "my_samplers-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-samplers\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nlast = my_samplers:Last\n"
                                           "broken = my_samplers:Missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "last" in sampler_names()
    s = Searcher(SPACE, "last", seed=0)
    assert s.ask()[1] == {"a": 4, "b": 1}
    with pytest.raises(SpecError, match="cannot be loaded"):
        Searcher(SPACE, "broken", seed=0)
    sys.modules.pop("my_samplers", None)
