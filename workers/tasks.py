"""Service tasks. Messages carry job ids only; everything else is read from the database.

drive_job(job_id) runs on a measuring worker (queue gpu.<arch>): it shares the job's Optuna study
with the job's other drivers and loops ask -> static check -> compile (cache) -> resource check
-> measure -> record -> tell until the budget is recorded, the space is exhausted, or the job is
cancelled. prefetch_compiles(job_id) runs on compile workers and fills the shared compile cache
(PORTER_CACHE_DIR) with the job's feasible variants, so the drivers' compiles are cache hits.

Idempotence: trial numbers come from the shared study and the store records a (job, number) once,
so a redelivered driver never records a trial twice. A driver that died leaves an asked but
untold trial: once its liveness key in Redis is gone and it is older than PORTER_STALE_TRIAL_S,
any driver fails it in the study; only recorded trials count against the budget.
"""
from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from contextlib import contextmanager

import optuna

from .app import app

log = logging.getLogger("porter.worker")
MAX_DELIVERIES = 3
STALE_TRIAL_S = float(os.environ.get("PORTER_STALE_TRIAL_S", "20"))
LIVE_TTL_S = 10
_redis = None


def redis_client():
    global _redis
    if _redis is None:
        import redis
        _redis = redis.Redis.from_url(app.conf.broker_url, socket_timeout=5,
                                      socket_connect_timeout=5)
    return _redis


def _redis_try(fn, default=None):
    try:
        return fn(redis_client())
    except Exception as e:  # noqa: BLE001 - Redis down or restarting: the loop goes on
        log.warning("redis unavailable (%s)", type(e).__name__)
        return default


def enqueue(job_id: int, arch: str, drivers: int = 2) -> None:
    retry = {"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5}
    for _ in range(max(1, drivers)):
        drive_job.apply_async((job_id,), queue=f"gpu.{arch}", retry=True, retry_policy=retry)
    prefetch_compiles.apply_async((job_id,), queue="compile", retry=True, retry_policy=retry)


def _deliveries(task_id: str) -> int:
    key = f"porter:deliveries:{task_id}"

    def incr(r):
        n = r.incr(key)
        r.expire(key, 7 * 86400)
        return n
    return _redis_try(incr, 1)


@contextmanager
def _ask_lock(store, job_id: int):
    """Serialises ask() over the job's drivers, so two drivers never propose the same
    configuration: a PostgreSQL advisory lock (released by the server if the holder dies), or
    for a SQLite file (its drivers share one host) an flock on a file beside it (released by the
    kernel if the holder dies)."""
    if store.url.startswith("sqlite"):
        path = _sqlite_lock_path(store.url)
        if path is None:      # an in-memory database: one process, nothing to serialise
            yield
            return
        import fcntl
        try:
            f = open(path, "a")
        except OSError as e:   # a read-only folder: go on unserialised, as before
            log.warning("no ask lock beside the database (%s)", e)
            yield
            return
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return
    if not store.url.startswith("postgresql"):
        yield
        return
    from sqlalchemy import text
    with store._engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": 0x504F5254 * 1000 + job_id})
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"),
                         {"k": 0x504F5254 * 1000 + job_id})
            conn.commit()


def _sqlite_lock_path(url: str) -> str | None:
    from sqlalchemy.engine import make_url
    db = make_url(url).database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return f"{db}.ask.lock"


class _Liveness(threading.Thread):
    """Keeps `porter:trial:<job>:<number>` alive in Redis while this driver works on it."""

    def __init__(self, job_id: int, driver: str):
        super().__init__(daemon=True)
        self.job_id, self.driver = job_id, driver
        self.number: int | None = None
        self.stop = threading.Event()

    def touch(self):
        n = self.number
        if n is not None:
            _redis_try(lambda r: r.set(f"porter:trial:{self.job_id}:{n}", self.driver,
                                       ex=LIVE_TTL_S))

    def run(self):
        while not self.stop.wait(3):
            self.touch()


def _fail_stale(study, job_id: int, running) -> set[int]:
    """Fails, in the study, the running trials (FrozenTrials, not recorded) whose driver has
    died: older than STALE_TRIAL_S and no liveness key in Redis. Returns their numbers."""
    now = time.time()
    failed = set()
    for t in running:
        if t.datetime_start is None or now - t.datetime_start.timestamp() < STALE_TRIAL_S:
            continue
        alive = _redis_try(lambda r: r.exists(f"porter:trial:{job_id}:{t.number}"), 1)
        if alive:
            continue
        try:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            log.warning("job %s: trial %s was left by a dead driver; failed in the study",
                        job_id, t.number)
        except (ValueError, RuntimeError):
            pass
        failed.add(t.number)
    return failed


def _finish(store, job_id: int, status: str, message: str = "") -> None:
    info = store.get_job(job_id)
    if info.status in ("done", "failed", "cancelled"):
        return
    if not message:
        counts: dict[str, int] = {}
        for t in store.trials(job_id):
            counts[t.status] = counts.get(t.status, 0) + 1
        message = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    store.set_job_status(job_id, status, message)


@app.task(bind=True, name="workers.tasks.drive_job", acks_late=True)
def drive_job(self, job_id: int) -> str:
    from porter.spec.arch import get_arch
    from porter.build.check import search_space
    from porter.build.compile import nvrtc_version
    from porter.job.loop import MAX_INFEASIBLE_FACTOR, run_trial
    from porter.job.jobs import make_backend
    from porter.job.run import warm_start_configs, warm_start_prior
    from porter.search.searcher import Searcher
    from porter.store.base import open_store
    from porter.spec.template import find_template

    store = open_store(None)
    task_id = self.request.id or f"local-{os.getpid()}"
    n = _deliveries(task_id)
    info = store.get_job(job_id)
    if info.status in ("done", "failed", "cancelled"):
        return info.status
    if n > MAX_DELIVERIES:
        _finish(store, job_id, "failed", f"a driver of this job was delivered {n - 1} times and "
                "its worker died each time (a kernel that kills its process?); not retried")
        return "failed"
    spec = info.spec
    driver = f"{socket.gethostname()}-{os.getpid()}"
    tpl, arch = find_template(spec.template), get_arch(spec.arch)
    try:
        backend, _ = make_backend(spec, arch, hold=os.environ.get("PORTER_REPLAY_HOLD") == "1")
    except Exception as e:  # noqa: BLE001 - a job that cannot run here fails with a reason
        _finish(store, job_id, "failed", f"backend: {e}")
        return "failed"
    if info.status == "queued":
        store.set_job_status(job_id, "running")
    sizes = list(spec.sizes)
    warm = warm_start_configs(store, tpl.name, spec.from_arch, spec.from_job)
    prior = warm_start_prior(store, tpl.name, spec.from_arch, spec.from_job)
    space = search_space(tpl, arch, sizes, backend.allows)
    for attempt in range(5):
        try:   # drivers starting together may race on creating the study: try again
            searcher = Searcher(space, spec.sampler, spec.seed, storage=store.optuna_storage(),
                                study_name=info.study_name or f"porter-job-{job_id}",
                                warm_start=[*warm, *tpl.start_configs()], prior=prior)
            break
        except Exception:  # noqa: BLE001
            if attempt == 4:
                raise
            store._optuna = None
            time.sleep(0.5 + random.random())
    study = searcher.study
    budget = spec.trials if spec.trials else (None if spec.minutes else 100)
    deadline = (info.started_at or time.time()) + spec.minutes * 60 if spec.minutes else None
    infeasible_left = MAX_INFEASIBLE_FACTOR * (budget or 1000)
    toolchain = {"nvrtc": nvrtc_version(), "arch": arch.name}
    live = _Liveness(job_id, driver)
    live.start()
    result = "done"
    try:
        while True:
            if store.heartbeat(job_id):
                result = "cancelled"
                break
            if store.get_job(job_id).status in ("done", "failed", "cancelled"):
                result = None
                break
            proposal = None
            with _ask_lock(store, job_id):
                # the study's running trials first, the store's records second: a trial is
                # recorded before it is told, so one that finishes in between is seen in the
                # records; one seen in neither cannot exist (asking needs this lock)
                # (one read of the study serves this check and the search's own bookkeeping)
                in_study = searcher.sync()
                statuses = store.trial_statuses(job_id)
                recorded = set(statuses)
                counted = sum(1 for st in statuses.values() if st != "infeasible")
                running = [t for t in in_study if t.number not in recorded]
                if running:
                    failed = _fail_stale(study, job_id, running)
                    running = [t for t in running if t.number not in failed]
                if budget is not None and counted >= budget:
                    break
                out_of_time = deadline is not None and time.time() >= deadline
                if not out_of_time and infeasible_left > 0 and \
                        (budget is None or counted + len(running) < budget):
                    proposal = searcher.ask(sync=False)
                    if proposal is None and not running:
                        break                       # the space is exhausted
                elif out_of_time and not running:
                    break
                if proposal is not None:
                    live.number = proposal[0]
                    live.touch()
            if proposal is None:
                time.sleep(1.0)   # others' trials are in flight: wait for them (or to go stale)
                continue
            number, config = proposal
            rec, _, _ = run_trial(tpl, arch, backend, number, config, sizes, toolchain,
                                  f"service:{driver}")
            if rec.status == "infeasible":
                infeasible_left -= 1
            store.record_trial(job_id, rec)
            searcher.tell(number, rec.objective)
            live.number = None
            log.info("job %s trial %s: %s", job_id, number, rec.status)
    finally:
        live.stop.set()
        backend.close()
    if result:
        _finish(store, job_id, result)
    return result or "stopped"


@app.task(name="workers.tasks.prefetch_compiles", acks_late=True)
def prefetch_compiles(job_id: int) -> int:
    """Compiles the job's feasible variants in random order into the shared cache until the job
    ends (nothing to do for backends that do not compile)."""
    from porter.spec.arch import get_arch
    from porter.measure.backends.base import CompileOnlyBackend
    from porter.build.check import search_space
    from porter.build.compile import compile_variant
    from porter.job.jobs import make_backend
    from porter.store.base import open_store
    from porter.spec.template import find_template

    store = open_store(None)
    info = store.get_job(job_id)
    spec = info.spec
    tpl, arch = find_template(spec.template), get_arch(spec.arch)
    if spec.backend == "replay":
        backend, _ = make_backend(spec, arch)
    else:
        # the GPU backend compiles the same variants as compile-only and refuses none; its GPU
        # probe would start processes from this pool worker, which a daemonic process may not
        backend = CompileOnlyBackend()
    try:
        if not backend.needs_compile:
            return 0
        space = search_space(tpl, arch, list(spec.sizes), backend.allows)
        configs = [c for c in (dict(zip(space.names, k)) for k in space.candidates())
                   if space.is_feasible(c)]
        random.Random(spec.seed + job_id).shuffle(configs)
        done = 0
        for i, c in enumerate(configs):
            if i % 8 == 0 and store.get_job(job_id).status in ("done", "failed", "cancelled"):
                break
            compile_variant(tpl, c, arch)
            done += 1
        return done
    finally:
        backend.close()
