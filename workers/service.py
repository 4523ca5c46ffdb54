"""The service behind `porter submit`, `porter worker` and `porter cancel`."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time

from porter.errors import PorterError
from porter.records import JobSpec

log = logging.getLogger(__name__)


def supervise_s() -> float:
    return float(os.environ.get("PORTER_SUPERVISE_S", "10"))


def orphan_s() -> float:
    return float(os.environ.get("PORTER_ORPHAN_S", "30"))


class Service:
    def submit(self, spec: JobSpec, db_url: str | None = None) -> int:
        """Records the job (queued) and queues its drive tasks on gpu.<arch>; returns its id.
        A job that cannot be queued (broker unreachable) is marked failed, never left queued."""
        from porter.arch import get_arch
        from porter.jobs import probe_compile, template_record
        from porter.template import find_template
        from .context import store_for
        from .tasks import job_slots, send_drive
        tpl, arch = find_template(spec.template), get_arch(spec.arch)
        if spec.backend != "replay":
            probe_compile(tpl, arch, spec.sizes)
        store = store_for(db_url)
        src, space = template_record(tpl)
        job_id = store.create_job(spec, tpl.name, tpl.source_hash, src, space, status="queued")
        try:
            for _ in range(job_slots()):
                send_drive(job_id, arch.name)
        except Exception as e:  # noqa: BLE001 - kombu's connection errors vary
            from .app import broker_url
            store.set_job_status(job_id, "failed", f"could not queue: broker {broker_url()} "
                                 f"unreachable ({type(e).__name__})")
            raise PorterError(f"the broker at {broker_url()} is unreachable; is Redis up? "
                              "(set PORTER_BROKER_URL)") from e
        return job_id

    def cancel(self, job_id: int, db_url: str | None = None) -> bool:
        """Asks the job to stop: a queued job is cancelled at once, a running one stops within
        one trial (every worker checks before each measurement)."""
        from .context import store_for
        return store_for(db_url).request_cancel(job_id)

    def worker(self, queues: list[str], db_url: str | None = None,
               concurrency: int | None = None) -> None:
        """Runs a Celery worker here until it is stopped. A worker with a gpu.<arch> queue runs
        one task at a time in its own process (solo pool: one measuring child per GPU, whose
        CUDA_VISIBLE_DEVICES it inherits) and supervises jobs of its architectures."""
        from .app import app
        queues = [q.strip() for q in queues if q.strip()]
        bad = [q for q in queues if q != "compile" and not q.startswith("gpu.")]
        if not queues or bad:
            raise PorterError(f"unknown queue {', '.join(bad) or '(none)'}; use compile and/or "
                              "gpu.<arch>, e.g. --queues gpu.sm_90a")
        for q in queues:
            if q.startswith("gpu."):
                from porter.arch import get_arch
                get_arch(q[4:])
        if db_url:
            os.environ["PORTER_DB_URL"] = db_url
        from .context import store_for
        store_for(db_url)    # migrate (and fail here, in one line) before taking tasks
        gpu = [q[4:] for q in queues if q.startswith("gpu.")]
        name = os.environ.get("PORTER_WORKER_NAME") or \
            f"{'gpu' if gpu else 'compile'}{os.getpid()}@{socket.gethostname()}"
        os.environ.setdefault("PORTER_WORKER_NAME", name)
        argv = ["worker", "-Q", ",".join(queues), "-n", name, "--loglevel",
                os.environ.get("PORTER_LOG_LEVEL", "INFO"), "--without-gossip",
                "--without-mingle", "--prefetch-multiplier", "1"]
        if gpu:
            argv += ["--pool", "solo", "--concurrency", "1"]
            Supervisor(gpu, db_url).start()
        else:
            argv += ["--pool", "prefork", "--concurrency",
                     str(concurrency or max(1, (os.cpu_count() or 2) - 1))]
        app.worker_main(argv)


class Supervisor(threading.Thread):
    """Re-queues drive tasks of jobs that nobody is working on (their messages were lost, e.g.
    Redis restarted empty): a queued or running job of one of our architectures whose heartbeat
    is older than orphan_s(), while its gpu queue is empty."""

    def __init__(self, archs: list[str], db_url: str | None):
        super().__init__(name="porter-supervisor", daemon=True)
        self.archs, self.db_url = archs, db_url

    def run(self) -> None:
        while True:
            time.sleep(supervise_s())
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - the db or broker blinked; next tick
                log.warning("supervisor: %s", e)

    def tick(self) -> None:
        from . import broker
        from .context import store_for
        from .tasks import gpu_queue, job_slots, send_drive
        store = store_for(self.db_url)
        now = time.time()
        for arch in self.archs:
            jobs = [j for status in ("queued", "running")
                    for j in store.list_jobs(200, status=status, arch=arch)]
            for j in jobs:
                last = max(j.extra.get("heartbeat_at") or 0.0, j.created_at or 0.0)
                if now - last < orphan_s():
                    continue
                if broker.queue_length(gpu_queue(arch)) != 0:
                    continue
                if not broker.lock(f"reseed:{j.id}", orphan_s(), default=False):
                    continue
                log.warning("job %s: no worker on it for %.0f s and no task queued; "
                            "re-queueing", j.id, now - last)
                for _ in range(job_slots()):
                    send_drive(j.id, arch)


def service() -> Service:
    return Service()
