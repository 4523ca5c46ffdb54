"""The job loop end to end without a GPU: compile-only and replayed runs, resume."""
import gzip
import json
from pathlib import Path

import pytest

from porter.measure.backends.base import CompileOnlyBackend
from porter.measure.backends.replay import ReplayBackend, recording
from porter.job.loop import Engine
from porter.job.jobs import make_spec, template_record, template_snapshot
from porter.records import Measurement, TrialRecord
from porter.store.base import open_store

ROOT = Path(__file__).resolve().parents[1]
PLANTED = ROOT / "tests" / "data" / "templates" / "planted"
REPLAY = ROOT / "tests" / "data" / "replay"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    return open_store(f"sqlite:///{tmp_path / 'p.db'}")


def new_job(store, spec, tpl):
    src, space = template_record(tpl)
    return store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                            snapshot=template_snapshot(tpl))


def test_compile_only_records_resources(store):
    spec, tpl, arch = make_spec(str(PLANTED), "sm_90a", trials=8, backend="compile-only")
    job = new_job(store, spec, tpl)
    summary = Engine(store, tpl, arch, CompileOnlyBackend(), workers=2).run(job, spec)
    trials = store.trials(job)
    assert summary.status == "done" and len(trials) == 8
    assert {t.status for t in trials} == {"compiled"}
    for t in trials:
        assert "compile-only" in t.message
        assert t.registers and t.registers > 0 and t.spill_bytes == 0
        if t.params["MODE"] == 0:   # the static reduction buffer
            assert t.smem_bytes == 4 * t.params["THREADS"] // 32
    assert store.get_job(job).status == "done"


def _fake_recording(tmp_path, tpl, statuses):
    """A tiny recording for the replay path's own mechanics (the real H200 recordings are used
    wherever results matter)."""
    trials = []
    for i, (cfg, status) in enumerate(statuses):
        ms = (Measurement(size=(1024, 1024), ours_ms=0.01 * (i + 1), baseline="torch",
                          baseline_ms=0.02, ratio=0.02 / (0.01 * (i + 1))),) \
            if status == "measured" else ()
        trials.append(TrialRecord(number=i, params=cfg, config_key=tpl.config_key(cfg),
                                  status=status, measurements=ms))
    path = tmp_path / "rec.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(recording(tpl.name, "sm_90a", tpl.param_names, {"gpu": "test"}, trials), f)
    return path


def test_replay_and_resume(store, tmp_path):
    _, tpl, _ = make_spec(str(PLANTED), "sm_90a")
    statuses = [({"MODE": m, "THREADS": t}, s) for (m, s) in
                [(0, "measured"), (1, "wrong_result"), (2, "crashed"), (3, "timeout")]
                for t in (128, 256)]
    rec = _fake_recording(tmp_path, tpl, statuses)
    spec, tpl, arch = make_spec(str(PLANTED), "sm_90a", trials=3, backend="replay",
                                replay=str(rec))
    job = new_job(store, spec, tpl)
    Engine(store, tpl, arch, ReplayBackend(rec)).run(job, spec)
    first = store.trials(job)
    assert len(first) == 3 and all(t.backend == "replay" for t in first)
    # resume with a larger budget: earlier trials stay, nothing is proposed twice
    spec2 = make_spec(str(PLANTED), "sm_90a", trials=8, backend="replay", replay=str(rec))[0]
    Engine(store, tpl, arch, ReplayBackend(rec)).run(job, spec2)
    trials = store.trials(job)
    keys = [t.config_key for t in trials]
    assert len(trials) == 8 and len(set(keys)) == 8
    by_key = {t.config_key: t.status for t in trials}
    assert by_key["1,128"] == "wrong_result" and by_key["2,256"] == "crashed"
    best = store.best_trials(job, 1)[0]
    assert best.params["MODE"] == 0 and best.objective == pytest.approx(0.5)


@pytest.mark.skipif(not (REPLAY / "gemm_mma_h200.json.gz").exists(),
                    reason="the H200 recording of gemm_mma is not in the tree")
def test_replayed_gemm_mma_port_finds_good_configs(store):
    rec = REPLAY / "gemm_mma_h200.json.gz"
    spec, tpl, arch = make_spec("gemm_mma", "sm_90a", ["4096x4096x4096"], trials=40,
                                backend="replay", replay=str(rec))
    job = new_job(store, spec, tpl)
    Engine(store, tpl, arch, ReplayBackend(rec)).run(job, spec)
    trials = store.trials(job)
    assert len([t for t in trials if t.status != "infeasible"]) == 40
    measured = [t for t in trials if t.status == "measured"]
    assert measured and all(t.measurements[0].ratio > 0 for t in measured)


def test_seed_configurations_are_tried_first(store, tmp_path):
    """[[seeds]] tables (partial configurations, the default fills the rest) are proposed right
    after the default, before the sampler's own picks; an infeasible seed is skipped."""
    import shutil
    folder = tmp_path / "seeded"
    shutil.copytree(PLANTED, folder)
    with open(folder / "space.toml", "a") as f:
        f.write('\n[constraints]\nlist = ["MODE != 1"]\n'
                '\n[[seeds]]\nMODE = 3\n\n[[seeds]]\nMODE = 1\n'
                '\n[[seeds]]\nMODE = 2\nTHREADS = 256\n')
    spec, tpl, arch = make_spec(str(folder), "sm_90a", trials=3, backend="compile-only")
    assert tpl.start_configs() == [{"MODE": 0, "THREADS": 128}, {"MODE": 3, "THREADS": 128},
                                   {"MODE": 1, "THREADS": 128}, {"MODE": 2, "THREADS": 256}]
    job = new_job(store, spec, tpl)
    Engine(store, tpl, arch, CompileOnlyBackend(), workers=1).run(job, spec)
    trials = sorted(store.trials(job), key=lambda t: t.number)
    assert [t.params for t in trials] == [{"MODE": 0, "THREADS": 128},
                                          {"MODE": 3, "THREADS": 128},
                                          {"MODE": 2, "THREADS": 256}]


def test_bad_seed_is_refused_in_one_sentence(tmp_path):
    import shutil
    from porter.errors import TemplateError
    from porter.spec.template import load_template
    folder = tmp_path / "badseed"
    shutil.copytree(PLANTED, folder)
    with open(folder / "space.toml", "a") as f:
        f.write('\n[[seeds]]\nTHREADS = 100\n')
    with pytest.raises(TemplateError, match="seed 1 sets THREADS = 100"):
        load_template(folder)


def test_warm_start_passes_the_source_measurements_as_a_prior(store):
    """--from-job / --from-arch: the source's top configurations are proposed first and every
    measured configuration there, with its objective, reaches the target's search as its prior."""
    from porter.job.run import warm_start_configs, warm_start_prior
    rec = REPLAY / "gemm_mma_h200.json.gz"
    spec, tpl, arch = make_spec("gemm_mma", "sm_90a", ["4096x4096x4096"], trials=30,
                                backend="replay", replay=str(rec))
    src = new_job(store, spec, tpl)
    Engine(store, tpl, arch, ReplayBackend(rec)).run(src, spec)
    measured = {t.config_key: t.objective for t in store.trials(src, status="measured")}
    prior = warm_start_prior(store, "gemm_mma", None, src)
    assert {tpl.config_key(c): v for c, v in prior} == measured
    assert warm_start_prior(store, "gemm_mma", "sm_90a", None) == prior
    assert warm_start_prior(store, "gemm_mma", "sm_100a", None) == []
    warm = warm_start_configs(store, "gemm_mma", None, src)
    assert tpl.config_key(warm[0]) == min(measured, key=measured.get)
    # the target job runs with both (here: the same architecture, replayed again)
    spec2, _, _ = make_spec("gemm_mma", "sm_90a", ["4096x4096x4096"], trials=5,
                            backend="replay", replay=str(rec))
    job = new_job(store, spec2, tpl)
    Engine(store, tpl, arch, ReplayBackend(rec)).run(job, spec2, warm, prior)
    first = min(store.trials(job), key=lambda t: t.number)
    assert first.config_key == tpl.config_key(warm[0])


def test_ctrl_c_interrupts_with_resume_hint(tmp_path):
    """Ctrl-C in `porter port`: the resume hint, status 130, the job `interrupted`, no Optuna
    trial left RUNNING; the resume finishes the budget without repeating a configuration."""
    import os
    import signal
    import subprocess
    import time

    import optuna
    import sys
    porter = [sys.executable, "-m", "porter.cli"]
    data = json.load(gzip.open(REPLAY / "gemm_mma_h200.json.gz", "rt"))
    for e in data["trials"].values():
        e["gpu_s"] = 0.3
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(data))
    db = f"sqlite:///{tmp_path / 'p.db'}"
    args = [*porter, "port", "gemm_mma", "--arch", "sm_90a", "--backend", "replay", "--replay",
            str(slow), "--sizes", "4096x4096x4096", "--trials", "20", "--db", db]
    env = dict(os.environ, PORTER_REPLAY_HOLD="1", PORTER_CACHE_DIR=str(tmp_path / "cache"))
    # SIGINT at its default in the child: a test run started in the background of a
    # non-interactive shell inherits SIGINT ignored, and Python then installs no handler
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    s = open_store(db)
    t0 = time.time()
    while time.time() - t0 < 60:
        jobs = s.list_jobs(1)
        if jobs and s.trial_numbers(jobs[0].id):
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (out, err)
    job = s.list_jobs(1)[0]
    assert f"--resume {job.id}" in out
    assert job.status == "interrupted" and f"--resume {job.id}" in job.message
    study = optuna.load_study(study_name=job.study_name, storage=s.optuna_storage())
    assert not [t for t in study.get_trials() if t.state.name == "RUNNING"]
    r = subprocess.run([*porter, "port", "--resume", str(job.id), "--db", db, "gemm_mma",
                        "--arch", "sm_90a"], env=dict(env, PORTER_REPLAY_HOLD="0"),
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    trials = s.trials(job.id)
    assert s.get_job(job.id).status == "done" and len(trials) == 20
    assert len({t.config_key for t in trials}) == 20


def test_ctrl_c_inside_a_write_still_finishes_the_job(tmp_path, monkeypatch):
    """Ctrl-C that lands between a write and its commit leaves that connection, its
    transaction open, in the interrupted frames; on SQLite its write lock would stop the job's
    final status (the job loop once waited out the busy timeout and every retry). The job is
    still marked `interrupted`, at once, and the lock is gone."""
    import sqlite3
    import time
    import db.engine
    import db.store
    from porter.job.hooks import JobHooks
    from porter.errors import StoreError
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    for module in (db.engine, db.store):    # the store's engine and Optuna's
        monkeypatch.setattr(module, "SQLITE_BUSY_SECONDS", 2.0)
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}")
    _, tpl, _ = make_spec(str(PLANTED), "sm_90a")
    rec = _fake_recording(tmp_path, tpl, [({"MODE": m, "THREADS": t}, "measured")
                                          for m in range(4) for t in (128, 256)])
    spec, tpl, arch = make_spec(str(PLANTED), "sm_90a", trials=8, backend="replay",
                                replay=str(rec))
    job = new_job(store, spec, tpl)

    class InterruptedMidWrite(ReplayBackend):
        calls = 0

        def measure(self, *a, **k):
            InterruptedMidWrite.calls += 1
            if InterruptedMidWrite.calls == 3:
                # a connection of this process in the middle of a write (pysqlite begins the
                # transaction at the UPDATE), as Ctrl-C leaves one of the store's
                conn = sqlite3.connect(tmp_path / "p.db")
                conn.execute("UPDATE porter_jobs SET message = 'half' WHERE id = ?", (job,))
                raise KeyboardInterrupt     # before the commit; `conn` stays in this frame
            return super().measure(*a, **k)

    hooks = JobHooks()
    hooks.db_retry_s = 1.0
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        try:
            Engine(store, tpl, arch, InterruptedMidWrite(rec), hooks=hooks).run(job, spec)
        except StoreError as e:    # the lock outlived the retries
            pytest.fail(f"the job's final status was not written: {e}")
    assert time.monotonic() - t0 < 10
    j = store.get_job(job)
    assert j.status == "interrupted" and j.message != "half"
    assert len(store.trials(job)) == 2


def test_a_refused_driver_connection_is_transient_and_a_bad_query_is_not():
    """A driver's own psycopg connection (the ask lock's) refused during a database restart is
    retried like the store's; a constraint violation is not."""
    psycopg = pytest.importorskip("psycopg")
    from porter.job.hooks import is_transient
    assert is_transient(psycopg.OperationalError("connection failed: not accepting connections"))
    assert not is_transient(psycopg.errors.UniqueViolation("duplicate key"))
    assert not is_transient(ValueError("connection failed"))


class CountingPool:
    """Mixin for a compile pool that counts what it is given and whether it was closed."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.submitted, self.closed = 0, False

    def submit(self, *args, **kw):
        self.submitted += 1
        return super().submit(*args, **kw)

    def close(self):
        self.closed = True
        return super().close()


def counting_pool(workers=2, ahead=None):
    from porter.job.hooks import PoolCompiles
    return type("CountingPoolCompiles", (CountingPool, PoolCompiles), {})(workers, ahead)


def _no_pool_of_its_own(monkeypatch):
    import porter.job.loop as loop

    def refuse(needs_compile, workers):
        if needs_compile:
            raise AssertionError("the engine made a compile pool of its own")
        return original(needs_compile, workers)
    original = loop.compiles_for
    monkeypatch.setattr(loop, "compiles_for", refuse)


def test_a_lent_compile_pool_serves_jobs_and_stays_open(store, monkeypatch):
    """Engine(..., compiles=pool): every compile of two jobs goes to the caller's pool, which
    the engine neither replaces nor closes; a backend that compiles nothing leaves it idle."""
    _no_pool_of_its_own(monkeypatch)
    pool = counting_pool()
    try:
        for _ in range(2):
            spec, tpl, arch = make_spec(str(PLANTED), "sm_90a", trials=8,
                                        backend="compile-only")
            job = new_job(store, spec, tpl)
            summary = Engine(store, tpl, arch, CompileOnlyBackend(), compiles=pool).run(job, spec)
            assert summary.status == "done", summary.message
            assert [t.status for t in store.trials(job)] == ["compiled"] * 8
            assert not pool.closed and pool.pending() == 0
        assert pool.submitted == 16
        rec = REPLAY / "gemm_mma_h200.json.gz"
        spec, tpl, arch = make_spec("gemm_mma", "sm_90a", ["4096x4096x4096"], trials=4,
                                    backend="replay", replay=str(rec))
        job = new_job(store, spec, tpl)
        assert Engine(store, tpl, arch, ReplayBackend(rec), compiles=pool).run(
            job, spec).status == "done"
        assert pool.submitted == 16 and not pool.closed
    finally:
        pool.close()


def test_without_a_lent_pool_the_run_closes_the_one_it_made(store, monkeypatch):
    import porter.job.loop as loop
    made = []
    monkeypatch.setattr(loop, "compiles_for",
                        lambda needs, n: made.append(counting_pool(n)) or made[-1])
    spec, tpl, arch = make_spec(str(PLANTED), "sm_90a", trials=4, backend="compile-only")
    job = new_job(store, spec, tpl)
    assert Engine(store, tpl, arch, CompileOnlyBackend(), workers=2).run(job, spec).status \
        == "done"
    assert len(made) == 1 and made[0].submitted == 4 and made[0].closed


class BrokenAfter(CompileOnlyBackend):
    """Compile-only, until its `n`-th evaluation raises (a backend bug mid-job)."""

    def __init__(self, n):
        self.n = n

    def measure(self, *args, **kw):
        self.n -= 1
        if self.n <= 0:
            raise RuntimeError("planted backend bug")
        return super().measure(*args, **kw)


def test_an_abandoned_run_leaves_nothing_pending_in_a_lent_pool(store, monkeypatch):
    """A job that fails with compiles in flight drops them from the lent pool (drop_pending):
    the next job on the same pool sees only its own trials."""
    _no_pool_of_its_own(monkeypatch)
    pool = counting_pool(workers=2, ahead=6)
    try:
        spec, tpl, arch = make_spec(str(PLANTED), "sm_90a", trials=8, backend="compile-only")
        job = new_job(store, spec, tpl)
        summary = Engine(store, tpl, arch, BrokenAfter(2), compiles=pool).run(job, spec)
        assert summary.status == "failed" and "planted backend bug" in summary.message
        assert pool.submitted > 2, "compiles were in flight when it failed"
        assert pool.pending() == 0 and not pool.closed
        job2 = new_job(store, spec, tpl)
        summary = Engine(store, tpl, arch, CompileOnlyBackend(), compiles=pool).run(job2, spec)
        assert summary.status == "done", summary.message
        trials = store.trials(job2)
        assert sorted(t.number for t in trials) == list(range(8))
        assert len({t.config_key for t in trials}) == 8
    finally:
        pool.close()
