"""The Celery tasks: thin, idempotent, and passing ids.

- `drive(job_id)` on `gpu.<arch>`: one slice of the job (drive.py), then it queues itself again
  while the job has work. submit() queues several, one per GPU worker that may join.
- `compile_trial(job_id, number)` on `compile`: compiles one claimed proposal into the shared
  compile cache (PORTER_CACHE_DIR) so that the GPU never waits on a compiler.
"""
from __future__ import annotations

import logging
import os
import socket
import time

from celery import shared_task
from celery.exceptions import Reject

from porter.compile import compile_variant
from porter.errors import PorterError, StoreError

from . import broker
from .app import app
from .claims import Claims
from .context import forget, job_context

log = logging.getLogger(__name__)
MAX_DELIVERIES = 3
WAIT_S = 3.0
_claims: Claims | None = None


def worker_name() -> str:
    return os.environ.get("PORTER_WORKER_NAME") or f"{socket.gethostname()}:{os.getpid()}"


def gpu_queue(arch: str) -> str:
    return f"gpu.{arch}"


def job_slots() -> int:
    return int(os.environ.get("PORTER_JOB_SLOTS", "8"))


def send_drive(job_id: int, arch: str, countdown: float = 0.0) -> None:
    drive.apply_async((job_id,), queue=gpu_queue(arch), countdown=countdown or None,
                      retry=True, retry_policy={"max_retries": 30, "interval_start": 0.5,
                                                "interval_step": 1.0, "interval_max": 2.0})


def _send_compile(job_id: int, number: int) -> None:
    compile_trial.apply_async((job_id, number), queue="compile", retry=True,
                              retry_policy={"max_retries": 2, "interval_start": 0.2,
                                            "interval_step": 0.5, "interval_max": 1.0})


def _delivery_guard(task) -> None:
    """Bounds redeliveries of one message: a task that took its worker down three times is
    dropped (the job goes on: its trials are bounded by their own attempt count)."""
    n = broker.count(f"deliveries:{task.request.id}", 3600)
    if n > MAX_DELIVERIES:
        raise Reject(f"delivered {n} times", requeue=False)


@shared_task(bind=True, name="porter.drive", acks_late=True, reject_on_worker_lost=True)
def drive(self, job_id: int) -> str:
    global _claims
    from .drive import Slice
    _delivery_guard(self)
    if _claims is None:
        _claims = Claims(worker_name())
    try:
        ctx = job_context(job_id)
        result = Slice(ctx, _claims, worker_name(), _send_compile).run()
    except StoreError as e:
        # the database blinked (or two workers created Optuna's tables at once): try again;
        # past the retries the supervisor re-queues the job once its heartbeat is stale
        raise self.retry(exc=e, countdown=2, max_retries=5)
    except PorterError as e:   # the job cannot run anywhere (template, replay source)
        return _fail(job_id, str(e))
    if result.action == "finished":
        forget(job_id)
    elif result.action == "more":
        send_drive(job_id, ctx.arch.name)
    else:
        send_drive(job_id, ctx.arch.name, countdown=WAIT_S)
    return f"job {job_id}: {result.action} after {result.trials} trials"


def _fail(job_id: int, message: str) -> str:
    from .context import store_for
    store = store_for()
    try:
        info = store.get_job(job_id)
    except PorterError:
        return f"job {job_id}: unknown"
    if info.status not in ("done", "failed", "cancelled"):
        store.set_job_status(job_id, "failed", message)
    return f"job {job_id}: failed: {message}"


@shared_task(bind=True, name="porter.compile_trial", acks_late=True,
             reject_on_worker_lost=True)
def compile_trial(self, job_id: int, number: int) -> str:
    _delivery_guard(self)
    ctx = job_context(job_id)
    storage = ctx.storage
    study_id = storage.get_study_id_from_name(ctx.study_name)
    trial = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study_id, number))
    if trial.state.is_finished():
        return "already finished"
    t0 = time.perf_counter()
    res = compile_variant(ctx.template, trial.params, ctx.arch)
    return f"{res.key} ok={res.ok} cached={res.cached} {time.perf_counter() - t0:.2f}s"


__all__ = ["app", "compile_trial", "drive"]
