"""One suite that every database backend of db.SqlStore must pass: SQLite (a temporary file) and
PostgreSQL (a database created for this test session and dropped at its end).

Tests share the PostgreSQL database, so each works on its own template name and filters by it.
"""
from __future__ import annotations

import hashlib
import math
import os
import uuid
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from db import SqlStore, UnknownJob, open_store
from db import engine as db_engine
from db import migrate
from db.models import Base
from porter.errors import StoreError
from porter.records import JobSpec, Measurement, TrialRecord

PG_SERVER = os.environ.get("PORTER_TEST_PG", "postgresql://postgres@127.0.0.1:5432")
G = (4096, 4096, 4096)
H = (8192, 8192, 8192)


# ---- databases

def _pg_admin():
    import psycopg
    return psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=3)


def _pg_unreachable() -> str | None:
    try:
        _pg_admin().close()
    except Exception as e:  # noqa: BLE001  (any failure means: skip, saying why)
        return f"PostgreSQL at {PG_SERVER} is unreachable ({str(e).strip().splitlines()[0]})"
    return None


@contextmanager
def fresh_pg_database():
    """A new, empty, uniquely named database; dropped (with its connections) afterwards."""
    name = f"porter_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with _pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://{PG_SERVER.split('://', 1)[1]}/{name}"
    try:
        yield url
    finally:
        db_engine.dispose_all()
        with _pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_url():
    reason = _pg_unreachable()
    if reason:
        pytest.skip(reason)
    with fresh_pg_database() as url:
        yield url


BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.service)]


@pytest.fixture(params=BACKENDS)
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'porter.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture(params=BACKENDS)
def empty_url(request, tmp_path):
    """A database nobody has touched yet."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh' / 'porter.db'}"
        return
    reason = _pg_unreachable()
    if reason:
        pytest.skip(reason)
    with fresh_pg_database() as u:
        yield u


@pytest.fixture
def store(url) -> SqlStore:
    return open_store(url)


@pytest.fixture
def tpl() -> str:
    """A template name no other test uses."""
    return f"gemm_{uuid.uuid4().hex[:8]}"


# ---- values

def make_job(store: SqlStore, tpl: str, arch: str = "sm_90a", sizes=(G,), status="queued",
             source: str = "__global__ void k() {}") -> int:
    spec = JobSpec(template=tpl, arch=arch, sizes=tuple(sizes), trials=20, sampler="tpe",
                   seed=7)
    source_hash = hashlib.sha256((tpl + source).encode()).hexdigest()[:16]
    return store.create_job(spec, tpl, source_hash, source,
                            '[template]\nname = "x"\nversion = "2"\n', status=status)


def meas(size=G, ours=1.0, base: float | None = 1.2) -> Measurement:
    return Measurement(size=size, ours_ms=ours, ours_spread=0.01, baseline="cublas(cupy)",
                       baseline_ms=base, ratio=None if base is None else base / ours,
                       error=1e-6, tflops=2 * math.prod(size) / ours / 1e9, gbps=None)


def trial(number: int, objective: float | None = None, status: str = "measured",
          measurements=None, **kw) -> TrialRecord:
    if measurements is None:
        measurements = (meas(ours=objective or 1.0),) if status == "measured" else ()
    return TrialRecord(
        number=number, params={"BM": 128, "BN": 64 + number, "SCHEME": "pingpong"},
        config_key=f"BM128_BN{64 + number}", status=status, message="" if status ==
        "measured" else "nope", objective=objective, compile_seconds=0.5,
        compile_log="ptxas info", registers=168, smem_bytes=98304, spill_bytes=0,
        stack_frame=0, cubin_key=f"cubin{number}", measurements=tuple(measurements),
        device={"name": "NVIDIA H100", "driver": "570.1", "clocks": {"sm": 1980}},
        started_at=1000.0 + number, finished_at=1001.5 + number, worker="w1", **kw)


def count_rows(store: SqlStore, table: str, job_id: int) -> int:
    q = {"porter_trials": "SELECT count(*) FROM porter_trials WHERE job_id = :j",
         "porter_measurements": "SELECT count(*) FROM porter_measurements m JOIN porter_trials"
                                " t ON m.trial_id = t.id WHERE t.job_id = :j"}[table]
    with db_engine.get_engine(store.url).connect() as conn:
        return conn.execute(sa.text(q), {"j": job_id}).scalar()


# ---- jobs

def test_create_and_get_job(store, tpl):
    job_id = make_job(store, tpl, sizes=(G, H))
    job = store.get_job(job_id)
    assert job.id == job_id
    assert job.spec == JobSpec(template=tpl, arch="sm_90a", sizes=(G, H), trials=20,
                               sampler="tpe", seed=7)
    assert (job.status, job.template_name, job.message) == ("queued", tpl, "")
    assert job.study_name == f"porter-job-{job_id}"
    assert job.created_at > 0 and job.started_at is None and job.finished_at is None
    assert (job.n_trials, job.n_measured, job.best_objective, job.best_ratio) == (0, 0, None,
                                                                                   None)
    assert job.extra["arch"] == "sm_90a" and job.extra["cancel_requested"] is False
    t = store.get_template(job.template_hash)
    assert (t.name, t.version, t.source) == (tpl, "2", "__global__ void k() {}")
    # the same source again is stored once
    assert store.get_job(make_job(store, tpl)).template_hash == job.template_hash
    with pytest.raises(UnknownJob):
        store.get_job(10**9)


def test_list_jobs(store, tpl):
    ids = [make_job(store, tpl, arch=a) for a in ("sm_90a", "sm_80", "sm_90a")]
    store.set_job_status(ids[0], "running")
    assert [j.id for j in store.list_jobs(template=tpl)] == ids[::-1]
    assert [j.id for j in store.list_jobs(limit=2, template=tpl)] == ids[:0:-1]
    assert [j.id for j in store.list_jobs(template=tpl, arch="sm_90a")] == [ids[2], ids[0]]
    assert [j.id for j in store.list_jobs(template=tpl, status="running")] == [ids[0]]
    assert ids[2] in [j.id for j in store.list_jobs()]
    assert [j.id for j in store.list_jobs(None, template=tpl)] == ids[::-1]


def test_status_changes(store, tpl):
    job_id = make_job(store, tpl)
    store.set_job_status(job_id, "running")
    started = store.get_job(job_id).started_at
    assert started is not None and store.get_job(job_id).finished_at is None
    store.set_job_status(job_id, "running")  # a retry keeps the first start
    assert store.get_job(job_id).started_at == started
    store.set_job_status(job_id, "failed", "compile worker died")
    job = store.get_job(job_id)
    assert (job.status, job.message) == ("failed", "compile worker died")
    assert job.finished_at >= started
    store.set_job_status(job_id, "queued")
    assert store.get_job(job_id).finished_at is None
    with pytest.raises(ValueError):
        store.set_job_status(job_id, "exploded")
    with pytest.raises(UnknownJob):
        store.set_job_status(10**9, "done")


def test_cancel(store, tpl):
    queued, running, done = (make_job(store, tpl) for _ in range(3))
    store.set_job_status(running, "running")
    store.set_job_status(done, "done")
    assert not store.cancel_requested(queued)
    assert store.heartbeat(running) is False
    assert store.get_job(running).extra["heartbeat_at"] is not None

    assert store.request_cancel(queued) is True
    assert store.get_job(queued).status == "cancelled"
    assert store.cancel_requested(queued)

    assert store.request_cancel(running) is True
    assert store.get_job(running).status == "running"  # the worker stops it
    assert store.cancel_requested(running) and store.heartbeat(running) is True

    assert store.request_cancel(done) is False
    assert not store.cancel_requested(done) and store.get_job(done).status == "done"
    with pytest.raises(UnknownJob):
        store.request_cancel(10**9)


# ---- trials

def test_record_and_read_trials(store, tpl):
    job_id = make_job(store, tpl, sizes=(G, H))
    recorded = [
        trial(0, 0.9, measurements=(meas(G, 1.0, 1.2), meas(H, 8.0, 8.8))),
        trial(1, status="compile_failed"),
        trial(2, 0.7, measurements=(meas(G, 0.9, 1.2), meas(H, 7.0, 8.8))),
        trial(3, status="measured", objective=1.1,
              measurements=(meas(G, 2.0, None), meas(H, 9.0, None))),
    ]
    for t in reversed(recorded):
        assert store.record_trial(job_id, t) is True
    assert store.trials(job_id) == recorded
    assert store.trials(job_id, status="compile_failed") == [recorded[1]]
    assert store.trials(job_id, status="timeout") == []
    assert store.trial_numbers(job_id) == {0, 1, 2, 3}
    assert store.trial_statuses(job_id) == {0: "measured", 1: "compile_failed", 2: "measured",
                                            3: "measured"}

    job = store.get_job(job_id)
    assert (job.n_trials, job.n_measured) == (4, 3)
    assert job.best_objective == 0.7
    # geometric mean over the sizes of the best trial by ratio (trial 2)
    assert job.best_ratio == pytest.approx(math.sqrt(1.2 / 0.9 * 8.8 / 7.0))

    p = store.job_progress(job_id)
    assert p.counts == {"measured": 3, "compile_failed": 1} and p.n_trials == 4
    assert p.best_objective == 0.7 and p.best_ratio == pytest.approx(job.best_ratio)
    assert p.status == "queued" and not p.cancel_requested


def test_duplicate_trial_refused(store, tpl):
    job_id = make_job(store, tpl)
    first = trial(5, 0.8)
    assert store.record_trial(job_id, first) is True
    again = trial(5, 0.1, measurements=(meas(G, 0.1), meas(H, 0.2), meas((1, 2, 3), 0.3)))
    assert store.record_trial(job_id, again) is False
    assert store.trials(job_id) == [first]
    assert count_rows(store, "porter_trials", job_id) == 1
    assert count_rows(store, "porter_measurements", job_id) == 1
    # the same number in another job is another trial
    assert store.record_trial(make_job(store, tpl), again) is True


def test_failed_write_leaves_nothing(store, tpl):
    job_id = make_job(store, tpl)
    broken = trial(1, 0.5, measurements=(meas(G), Measurement(size=H, ours_ms=None)))
    with pytest.raises(StoreError) as e:
        store.record_trial(job_id, broken)
    assert "\n" not in str(e.value) and isinstance(e.value.__cause__, sa.exc.SQLAlchemyError)
    assert count_rows(store, "porter_trials", job_id) == 0
    assert count_rows(store, "porter_measurements", job_id) == 0
    assert store.record_trial(job_id, trial(1, 0.5)) is True
    with pytest.raises(StoreError):
        store.record_trial(10**9, trial(0, 0.5))
    with pytest.raises(UnknownJob):
        store.trial_numbers(10**9)


def test_best_trials(store, tpl):
    job_id = make_job(store, tpl)
    objectives = {0: 0.9, 1: 0.5, 2: None, 3: 0.7, 4: 0.5, 5: 0.6}
    for n, obj in objectives.items():
        status = "measured" if obj is not None else "wrong_result"
        store.record_trial(job_id, trial(n, obj, status=status))
    store.record_trial(job_id, trial(6, 0.01, status="timeout"))  # not a ranked status
    assert [t.number for t in store.best_trials(job_id)] == [1, 4, 5, 3, 0]
    best = store.best_trials(job_id, n=2)
    assert [t.number for t in best] == [1, 4]
    assert best[0].measurements == (meas(ours=0.5),)
    assert store.best_trials(make_job(store, tpl)) == []


def test_leaderboard(store, tpl):
    a = make_job(store, tpl, sizes=(G, H))
    b = make_job(store, tpl, sizes=(G, H))
    other_arch = make_job(store, tpl, arch="sm_80")
    store.record_trial(a, trial(0, 0.8, measurements=(meas(G, 1.0, 1.2), meas(H, 8.0, 8.8))))
    store.record_trial(a, trial(1, 0.9, measurements=(meas(G, 1.1, 1.2), meas(H, 7.0, 8.8))))
    store.record_trial(b, trial(0, 0.7, measurements=(meas(G, 0.9, 1.2), meas(H, 9.0, 8.8))))
    # faster than everything, but wrong: never on the leaderboard
    store.record_trial(b, trial(1, status="wrong_result", measurements=(meas(G, 0.1, 1.2),)))
    store.record_trial(other_arch, trial(0, 1.0, measurements=(meas(G, 3.0, 3.0),)))

    board = store.leaderboard(template=tpl)
    assert [(r.arch, r.size, r.job_id, r.trial_number) for r in board] == [
        ("sm_80", G, other_arch, 0),
        ("sm_90a", G, b, 0),
        ("sm_90a", H, a, 1),
    ]
    top = board[1]
    assert top.template == tpl and top.ours_ms == 0.9 and top.ratio == pytest.approx(1.2 / 0.9)
    assert top.params == {"BM": 128, "BN": 64, "SCHEME": "pingpong"}
    assert top.device["name"] == "NVIDIA H100" and top.baseline == "cublas(cupy)"
    assert [r.job_id for r in store.leaderboard(template=tpl, arch="sm_80")] == [other_arch]
    assert store.leaderboard(template="no-such-template") == []
    assert {(r.template, r.arch, r.size) for r in board} <= {
        (r.template, r.arch, r.size) for r in store.leaderboard()}


# ---- schema, Optuna, errors

def test_migrations_create_schema(empty_url):
    assert migrate.current(empty_url) is None
    store = open_store(empty_url)
    assert migrate.current(store.url) == migrate.head() is not None
    engine = db_engine.get_engine(store.url)
    insp = sa.inspect(engine)
    tables = set(insp.get_table_names())
    assert {"porter_jobs", "porter_templates", "porter_trials", "porter_measurements",
            "porter_alembic_version"} <= tables
    indexed = {tuple(i["column_names"]) for i in insp.get_indexes("porter_trials")}
    assert {("job_id", "status"), ("job_id", "objective")} <= indexed
    # the migration creates exactly what the models declare
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={
            "include_name": lambda name, type_, _: type_ != "table" or name.startswith(
                "porter_") and name != "porter_alembic_version",
            "compare_type": True})
        assert compare_metadata(ctx, Base.metadata) == []
    migrate.upgrade(store.url)  # again: nothing to do
    assert migrate.current(store.url) == migrate.head()


def test_optuna_shares_the_database(store, tpl):
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    job_id = make_job(store, tpl)
    name = store.get_job(job_id).study_name
    study = optuna.create_study(storage=store.optuna_storage(), study_name=name,
                                load_if_exists=True, sampler=optuna.samplers.RandomSampler(0))
    study.optimize(lambda t: (t.suggest_int("BM", 64, 256) - 128) ** 2, n_trials=3)
    again = optuna.load_study(study_name=name, storage=store.optuna_storage())
    assert len(again.trials) == 3
    for t in again.trials:
        store.record_trial(job_id, trial(t.number, float(t.value)))
    assert store.trial_numbers(job_id) == {0, 1, 2}
    tables = set(sa.inspect(db_engine.get_engine(store.url)).get_table_names())
    assert {"studies", "trials", "alembic_version", "porter_trials"} <= tables


def test_entry_point_and_errors(url, tmp_path):
    from porter.store import base as porter_store
    assert isinstance(porter_store.open_store(url), SqlStore)
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = [f"sqlite:///{blocker}/porter.db", "nosuchdb://x"]
    if url.startswith("postgresql"):
        bad.append(url.rsplit("/", 1)[0] + "/porter_no_such_database")
    for u in bad:
        with pytest.raises(StoreError) as e:
            open_store(u)
        assert "\n" not in str(e.value) and e.value.__cause__ is not None


def _record_many(url: str, job_id: int, numbers: list[int]) -> int:
    store = open_store(url)
    return sum(store.record_trial(job_id, trial(n, 1.0 + n / 100)) for n in numbers)


def test_concurrent_writers_record_each_trial_once(store, tpl):
    job_id = make_job(store, tpl)
    numbers = list(range(30))
    with ProcessPoolExecutor(4, mp_context=get_context("spawn")) as pool:
        written = list(pool.map(_record_many, [store.url] * 4, [job_id] * 4,
                                [numbers, numbers[::-1], numbers, numbers[::-1]]))
    assert sum(written) == 30
    assert store.trial_numbers(job_id) == set(numbers)
    assert count_rows(store, "porter_measurements", job_id) == 30
