"""The store methods the dashboard reads through (db/read.py), on SQLite and PostgreSQL:
job search and paging, convergence (forward-filled, downsampled in SQL with every improvement
kept), trial pages with filters and sorting, the analysis sample, notes, delete. And the line
the dashboard keeps: it imports no SQLAlchemy and nothing from db/."""
from __future__ import annotations

import ast
import hashlib
import os
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from porter.errors import StoreError
from porter.records import JobSpec, Measurement, TrialRecord

ROOT = Path(__file__).resolve().parents[1]
PG_SERVER = os.environ.get("PORTER_TEST_PG", "postgresql://postgres@127.0.0.1:5432")
SIZE = (1024, 1024, 1024)


@contextmanager
def _pg_database():
    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=3)
    except Exception as e:  # noqa: BLE001 - any failure: skip, saying why
        pytest.skip(f"PostgreSQL at {PG_SERVER} is unreachable ({str(e).splitlines()[0]})")
    name = f"porter_dash_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://{PG_SERVER.split('://', 1)[1]}/{name}"
    finally:
        from db import engine
        engine.dispose_all()
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.service)])
def store(request, tmp_path):
    from porter.store.base import open_store
    if request.param == "sqlite":
        yield open_store(f"sqlite:///{tmp_path / 'porter.db'}")
        return
    with _pg_database() as url:
        yield open_store(url)


def make_job(store, template="gemm_x", arch="sm_90a", status="done") -> int:
    spec = JobSpec(template=template, arch=arch, sizes=(SIZE,), trials=100)
    h = hashlib.sha256(template.encode()).hexdigest()[:16]
    return store.create_job(spec, template, h, "__global__ void k() {}",
                            '[template]\nname = "x"\n', status=status)


def record(store, job_id: int, number: int, objective: float | None, status="measured"):
    ms = (Measurement(size=SIZE, ours_ms=objective, baseline="v", baseline_ms=1.0,
                      ratio=1.0 / objective, gbps=100.0 / objective,
                      tflops=10.0 / objective),) if status == "measured" else ()
    store.record_trial(job_id, TrialRecord(
        number=number, params={"BM": 32 * (1 + number % 4), "S": number % 3},
        config_key=str(number), status=status, objective=objective, registers=64 + number,
        smem_bytes=1024 * number, measurements=ms, started_at=1000.0 + number,
        finished_at=1000.5 + number))


def test_job_rows_search_and_paging(store):
    ids = [make_job(store, "gemm_x" if i % 2 else "rmsnorm_y", "sm_90a" if i < 3 else "sm_80")
           for i in range(6)]
    rows, total = store.job_rows(limit=2)
    assert total == 6 and [r["job"] for r in rows] == ids[::-1][:2]
    rows, total = store.job_rows(limit=2, offset=4)
    assert [r["job"] for r in rows] == ids[1::-1]
    rows, total = store.job_rows(search="rmsnorm")
    assert total == 3 and {r["template"] for r in rows} == {"rmsnorm_y"}
    rows, total = store.job_rows(search="SM_80")
    assert total == 3
    rows, total = store.job_rows(search=str(ids[0]))        # an id: that job (and any name)
    assert ids[0] in [r["job"] for r in rows]
    assert store.job_detail(10_000) is None
    assert store.job_status_counts() == {"done": 6}


def test_convergence_forward_fills_and_keeps_every_improvement(store):
    job = make_job(store)
    objs = [5.0, None, 4.0, None, None, 6.0, 3.0, None, 2.5, 7.0] * 30   # 300 trials
    best = float("inf")
    improvements = []
    for n, o in enumerate(objs):
        record(store, job, n, o, "measured" if o else "compile_failed")
        if o and o < best:
            best = o
            improvements.append(n)
    rows = store.convergence(job, "objective", max_points=20)
    assert len(rows) < 60                                    # downsampled in SQL
    assert {r["number"] for r in rows} >= set(improvements)   # no improvement lost
    assert rows[0]["idx"] == 1 and rows[-1]["idx"] == len(objs)
    # forward-filled: the best is defined on every row after the first measured trial,
    # failed ones included, and never gets worse
    bests = [r["best"] for r in rows]
    assert None not in bests and bests == sorted(bests, reverse=True)
    assert any(r["status"] == "compile_failed" and r["best"] for r in rows)
    # higher-is-better metrics take the maximum
    ratio = store.convergence(job, "ratio", max_points=20)
    assert ratio[-1]["best"] == pytest.approx(1 / 2.5)
    gbps = store.convergence(job, "gbps", max_points=1000)
    assert len(gbps) == len(objs) and gbps[-1]["best"] == pytest.approx(100 / 2.5)


def test_trial_page_filters_sorts_and_pages(store):
    job = make_job(store)
    for n in range(40):
        record(store, job, n, 1.0 + (n * 7 % 40) / 10 if n % 5 else None,
               "measured" if n % 5 else "resource_rejected")
    rows, total = store.trial_page(job, statuses=["measured"], sort="objective", limit=5)
    assert total == 32 and len(rows) == 5
    assert [r["objective"] for r in rows] == sorted(r["objective"] for r in rows)
    assert rows[0]["ratio"] == pytest.approx(1 / rows[0]["objective"])
    rows, total = store.trial_page(job, ranges={"BM": (64, 96)}, sort="param:BM",
                                   descending=True, limit=None)
    assert total == 20 and {r["params"]["BM"] for r in rows} == {64, 96}
    assert rows[0]["params"]["BM"] == 96
    rows, _ = store.trial_page(job, sort="ratio", descending=True, limit=3, offset=1)
    ratios = [r["ratio"] for r in rows]
    assert ratios == sorted(ratios, reverse=True)
    with pytest.raises(ValueError):
        store.trial_page(job, sort="params; drop table")
    detail = store.trial_detail(job, 3)
    assert detail["measurements"][0]["size"] == "1024x1024x1024"
    assert store.trial_detail(job, 999) is None


def test_sample_keeps_the_best_and_caps_the_rest(store):
    job = make_job(store)
    for n in range(300):
        record(store, job, n, 1.0 + ((n * 37) % 300) / 100)
    rows = store.trial_sample(job, max_rows=40, best=5)
    assert 40 <= len(rows) <= 46
    best5 = sorted(range(300), key=lambda n: (n * 37) % 300)[:5]
    assert set(best5) <= {r["number"] for r in rows}
    assert all(r["measurements"] for r in rows)


def test_notes_rename_and_delete(store):
    job = make_job(store)
    record(store, job, 0, 1.0)
    v0 = store.job_version(job)
    store.set_job_notes(job, name="baseline run", notes="H200, clocks locked")
    d = store.job_detail(job)
    assert (d["name"], d["notes"]) == ("baseline run", "H200, clocks locked")
    assert store.job_version(job) != v0
    assert store.job_rows(search="baseline")[1] == 1
    store.set_trial_note(job, 0, "the winner")
    assert store.trial_detail(job, 0)["note"] == "the winner"
    running = make_job(store, status="running")
    with pytest.raises(StoreError, match="cancel it first"):
        store.delete_job(running)
    assert store.delete_job(job) is True
    assert store.job_detail(job) is None and store.delete_job(job) is False
    assert store.job_rows()[1] == 1


def test_dashboard_imports_no_sqlalchemy_and_nothing_from_db():
    for path in (ROOT / "dashboard").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for n in names:
                assert not n.startswith(("sqlalchemy", "db")), f"{path.name} imports {n}"
    assert not (ROOT / "dashboard" / "queries.py").exists()
