"""The service's fast path through Optuna's tables (porter/search/_rdb.py) against the local
PostgreSQL: what it writes reads back through Optuna as Optuna's own writes do, trial numbers stay
dense and unique with several processes opening trials at once, a trial another driver finished
is left as it is, and a job driven by four measuring workers records every trial once and
measures no configuration twice."""
from __future__ import annotations

import gzip
import json
import multiprocessing as mp
import uuid
from collections import Counter

import pytest

from test_service import (REPLAY, env, store, submit, wait_done, workers)  # noqa: F401

pytestmark = pytest.mark.service
PG = "postgresql+psycopg://postgres@127.0.0.1:5432/"
ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


@pytest.fixture
def pg_url():
    import psycopg
    name = f"porter_rows_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    yield PG + name
    with psycopg.connect(ADMIN, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _dists():
    from optuna.distributions import CategoricalDistribution
    return {"bm": CategoricalDistribution([64, 128, 256]),
            "kind": CategoricalDistribution(["plain", "split"]),
            "stages": CategoricalDistribution([2, 3, 4])}


def _rows(url: str, name: str = "s"):
    import optuna
    from porter.search._rdb import rows_for
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True)
    return study, rows_for(study, _dists())


@pytest.mark.parametrize("db", ["postgresql", "sqlite"])
def test_rows_read_back_through_optuna(db, pg_url, tmp_path):
    import optuna
    from optuna.trial import TrialState
    url = pg_url if db == "postgresql" else f"sqlite:///{tmp_path / 'o.db'}"
    study, rows = _rows(url)
    assert rows is not None
    a = rows.open({"bm": 128, "kind": "split", "stages": 3})
    b = rows.open({"bm": 64, "kind": "plain", "stages": 4})
    c = rows.open({"bm": 256, "kind": "plain", "stages": 2})
    assert [a[1], b[1], c[1]] == [0, 1, 2]
    assert rows.finish(a[0], 1.25) and rows.finish(b[0], None)
    back = {t.number: t for t in optuna.load_study(study_name="s", storage=url).trials}
    assert back[0].state == TrialState.COMPLETE and back[0].value == 1.25
    assert back[0].params == {"bm": 128, "kind": "split", "stages": 3}
    assert back[1].state == TrialState.FAIL and back[1].value is None
    assert back[2].state == TrialState.RUNNING
    assert back[2].distributions == _dists()
    # a trial someone else finished (another driver failing a trial it took for dead): the
    # late result is not written over it
    study.tell(2, state=TrialState.FAIL)
    assert rows.finish(c[0], 0.5) is False
    assert optuna.load_study(study_name="s", storage=url).trials[2].state == TrialState.FAIL


def test_changed_reads_what_changed(pg_url):
    """A second reader sees new trials once, and a running trial again until it finishes,
    with its value; Optuna's own writes are read too."""
    from optuna.trial import TrialState
    study, w = _rows(pg_url)
    _, r = _rows(pg_url)
    t0 = w.open({"bm": 64, "kind": "plain", "stages": 2})
    first = r.changed()
    assert [(t.number, t.state) for t in first] == [(0, TrialState.RUNNING)]
    assert first[0].params == {"bm": 64, "kind": "plain", "stages": 2}
    assert first[0].datetime_start is not None and first[0].datetime_start.tzinfo is not None
    assert [t.number for t in r.changed()] == [0], "still running: read again"
    w.finish(t0[0], 2.0)
    study.add_trial(__import__("optuna").trial.create_trial(
        params={"bm": 256, "kind": "split", "stages": 4}, distributions=_dists(), value=3.0))
    got = {t.number: (t.state, t.value, t.params["bm"]) for t in r.changed()}
    assert got == {0: (TrialState.COMPLETE, 2.0, 64), 1: (TrialState.COMPLETE, 3.0, 256)}
    assert r.changed() == [], "nothing new, nothing running"


def test_rows_refuse_another_distribution(pg_url):
    from optuna.distributions import CategoricalDistribution
    from porter.search._rdb import rows_for
    study, rows = _rows(pg_url)
    rows.open({"bm": 64, "kind": "plain", "stages": 2})
    other = dict(_dists(), bm=CategoricalDistribution([32, 64]))
    with pytest.raises(ValueError):
        rows_for(study, other).open({"bm": 32, "kind": "plain", "stages": 2})


def _open_many(url: str, n: int, q) -> None:
    _, rows = _rows(url)
    q.put([rows.open({"bm": 64, "kind": "plain", "stages": 2})[1] for _ in range(n)])


def test_numbers_dense_and_unique_under_concurrent_opens(pg_url):
    """Four processes open 15 trials each at once, without porter's ask lock: the study's row
    lock alone keeps the numbers 0..59, each once."""
    _rows(pg_url)               # the study exists before the processes race to open trials
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_open_many, args=(pg_url, 15, q)) for _ in range(4)]
    for p in procs:
        p.start()
    numbers = [n for _ in procs for n in q.get(timeout=120)]
    for p in procs:
        p.join(60)
    assert sorted(numbers) == list(range(60))


def test_four_drivers_record_every_trial_once(env, workers, tmp_path):  # noqa: F811
    """Four measuring workers drive one 60-trial job (each trial holds its worker 20 ms): every
    trial is recorded once, no configuration is measured twice, and the study agrees with the
    records: the same trials, finished, with the same configurations and objectives."""
    import optuna
    data = json.load(gzip.open(REPLAY, "rt"))
    for e in data["trials"].values():
        e["gpu_s"] = 0.02
    fast = tmp_path / "fast.json"
    fast.write_text(json.dumps(data))
    workers.start("gpu.sm_90a", 4, PORTER_REPLAY_HOLD="1")
    job = submit(dict(env, PORTER_DRIVERS="4"), replay=fast, trials=60)
    info = wait_done(env, job, timeout=120)
    assert info.status == "done", info.message
    trials = store(env).trials(job)
    assert len(trials) == 60 and len({t.number for t in trials}) == 60
    assert max(Counter(t.config_key for t in trials).values()) == 1, "a configuration twice"
    assert len({t.worker for t in trials}) >= 2
    study = optuna.load_study(study_name=info.study_name,
                              storage=store(env).optuna_storage())
    st = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert Counter(t.state.name for t in st.values()) == Counter({"COMPLETE": 60})
    assert sorted(st) == list(range(60))
    for t in trials:
        assert st[t.number].params == dict(t.params)
        assert st[t.number].value == pytest.approx(t.objective)
