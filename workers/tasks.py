"""Service tasks. Messages carry job ids only; everything else is read from the database.

drive_job(job_id) runs on a measuring worker (queue gpu.<arch>): it joins the job's run through
porter's one job loop (porter.job.loop.run_job) with the service's hooks (workers/driver.py:
the ask lock, heartbeats, trial liveness). prefetch_compiles(job_id) runs on compile workers and
fills the shared compile cache (PORTER_CACHE_DIR) with the job's feasible variants, so the
drivers' compiles are cache hits; variants the measurement cache serves the drivers (measured
by another job under the job's identity) need no compile and are left out.

Idempotence: trial numbers come from the shared study and the store records a (job, number) once,
so a redelivered driver never records a trial twice. A message delivered more than
MAX_DELIVERIES times (its worker died each time) fails the job instead of running again.
"""
from __future__ import annotations

import logging
import os
import random
import socket

from .app import app

log = logging.getLogger("porter.worker")
MAX_DELIVERIES = 3
PREFETCH_BATCH = 8        # variants compiled between looks at the job (status, cache)
FINISHED = ("done", "failed", "cancelled", "interrupted")
_redis = None


def redis_client():
    global _redis
    if _redis is None:
        import redis
        _redis = redis.Redis.from_url(app.conf.broker_url, socket_timeout=5,
                                      socket_connect_timeout=5)
    return _redis


def redis_try(fn, default=None):
    try:
        return fn(redis_client())
    except Exception as e:  # noqa: BLE001 - Redis down or restarting: the loop goes on
        log.warning("redis unavailable (%s)", type(e).__name__)
        return default


def enqueue(job_id: int, arch: str, drivers: int = 2, prefetch: bool = True) -> None:
    retry = {"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5}
    for _ in range(max(1, drivers)):
        drive_job.apply_async((job_id,), queue=f"gpu.{arch}", retry=True, retry_policy=retry)
    if prefetch:
        prefetch_compiles.apply_async((job_id,), queue="compile", retry=True,
                                      retry_policy=retry)


def _deliveries(task_id: str) -> int:
    key = f"porter:deliveries:{task_id}"

    def incr(r):
        n = r.incr(key)
        r.expire(key, 7 * 86400)
        return n
    return redis_try(incr, 1)


def _job_id(value, task: str) -> int | None:
    """The task's argument as a job id; anything else is a malformed message, dead-lettered."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        from .deadletter import push
        push(f"{task}: a job id must be a positive integer, not {value!r:.80}", value)
        return None
    return value


@app.task(bind=True, name="workers.tasks.drive_job", acks_late=True)
def drive_job(self, job_id) -> str:
    from porter.job.loop import finish_job, run_job
    from porter.job.run import job_warm_start
    from porter.store.base import open_store

    from .driver import ServiceHooks
    job_id = _job_id(job_id, "drive_job")
    if job_id is None:
        return "rejected"
    store = open_store(None)
    task_id = self.request.id or f"local-{os.getpid()}"
    n = _deliveries(task_id)
    info = store.get_job(job_id)
    if info.status in FINISHED:
        return info.status
    if n > MAX_DELIVERIES:
        finish_job(store, job_id, "failed", f"a driver of this job was delivered {n - 1} times "
                   "and its worker died each time (a kernel that kills its process?); not "
                   "retried")
        return "failed"
    driver = f"{socket.gethostname()}-{os.getpid()}"
    try:
        info, tpl, arch, backend = job_parts(store, info)
    except Exception as e:  # noqa: BLE001 - a job that cannot run here fails with a reason
        log.warning("job %s cannot run: %s", job_id, e)
        finish_job(store, job_id, "failed", f"cannot run here: {e}")
        return "failed"
    spec = info.spec
    try:
        warm, prior, note, origins = job_warm_start(store, tpl, arch.with_sms(backend.sms), spec,
                                                    job_id, backend)
        if note:
            log.info("job %s starts from %s", job_id, note)
        summary = run_job(store, job_id, spec, tpl, arch, backend,
                          hooks=ServiceHooks(driver, redis_try), warm_start=warm, prior=prior,
                          origins=origins, worker=f"service:{driver}")
    finally:
        backend.close()
    log.info("job %s: this driver ended with %s (%s)", job_id, summary.status, summary.message)
    return summary.status


def job_parts(store, info):
    """(JobInfo, Template, Arch, Backend) of a job, from what the job stored: the one place a
    worker loads a job's template."""
    from porter.job.jobs import make_backend
    from porter.spec.snapshot import job_parts as stored_parts
    from .service import check_replay_source
    info, tpl, arch = stored_parts(store, info)
    if info.spec.backend == "replay":
        check_replay_source(info.spec.replay)      # the worker's own data folder
    backend, _ = make_backend(info.spec, arch,
                              hold=os.environ.get("PORTER_REPLAY_HOLD") == "1")
    return info, tpl, arch, backend


@app.task(name="workers.tasks.prefetch_compiles", acks_late=True)
def prefetch_compiles(job_id) -> int:
    """Compiles the job's feasible variants in random order into the shared cache until the job
    ends, leaving out those the measurement cache will serve its drivers (cache_served);
    returns how many it compiled (nothing to do for backends that do not compile)."""
    from porter.spec.snapshot import job_parts as stored_parts
    from porter.store.base import open_store

    job_id = _job_id(job_id, "prefetch_compiles")
    if job_id is None:
        return 0
    store = open_store(None)
    try:
        info, tpl, arch = stored_parts(store, job_id)
    except Exception as e:  # noqa: BLE001 - the driver fails the job with the reason
        log.warning("job %s: nothing to prefetch (%s)", job_id, e)
        return 0
    spec = info.spec
    if spec.backend == "replay":
        return 0
    done, skipped = compile_ahead(store, job_id, tpl, arch, spec)
    log.info("job %s: prefetched %d variants; %d left to the measurement cache", job_id, done,
             skipped)
    return done


def compile_ahead(store, job_id: int, tpl, arch, spec) -> tuple[int, int]:
    """The prefetch proper: compiles the job's variants (prefetch_order) a batch at a time,
    each batch without those the measurement cache serves, until the job ends; returns (how
    many it compiled, how many it left to the cache)."""
    from porter.build.compile import compile_variant
    configs = prefetch_order(tpl, arch, spec, job_id)
    done = skipped = 0
    for i in range(0, len(configs), PREFETCH_BATCH):
        if store.get_job(job_id).status in FINISHED:
            break
        batch = configs[i:i + PREFETCH_BATCH]
        keys = [tpl.config_key(c) for c in batch]
        served = cache_served(store, job_id, spec, keys)
        for c, key in zip(batch, keys):
            if key in served:
                skipped += 1
                continue
            compile_variant(tpl, c, arch)
            done += 1
    return done, skipped


def prefetch_order(tpl, arch, spec, job_id: int) -> list[dict]:
    """The job's statically feasible configurations in the prefetch's random order."""
    from porter.build.check import search_space
    from porter.measure.backends.base import CompileOnlyBackend
    # the GPU backend compiles the same variants as compile-only and refuses none; its GPU
    # probe would start processes from this pool worker, which a daemonic process may not
    space = search_space(tpl, arch, list(spec.sizes), CompileOnlyBackend().allows)
    configs = [c for c in (dict(zip(space.names, k)) for k in space.candidates())
               if space.is_feasible(c)]
    random.Random(spec.seed + job_id).shuffle(configs)
    return configs


def cache_served(store, job_id: int, spec, config_keys: list[str]) -> set[str]:
    """Those of `config_keys` that the job's drivers will take from the measurement cache
    (recorded as reused, never compiled): measured by another job under every identity the
    job's trials carry. The identity names the GPU the drivers measure on, so it is known only
    once one of them has recorded a trial (a job with cached configurations records those
    first); until then, and for a job that asked for fresh measurements, none."""
    if spec.fresh:
        return set()
    served = None
    for key in store.measure_keys(job_id):
        found = store.cached_config_keys(key, config_keys, exclude_job=job_id)
        served = found if served is None else served & found
    return served or set()
