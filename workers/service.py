"""The `service` plugin behind `porter submit`, `porter worker` and `porter cancel`."""
from __future__ import annotations

import os
import socket

from porter.errors import PorterError
from porter.records import JobSpec


class Service:
    def submit(self, spec: JobSpec, db_url: str | None) -> int:
        """Records the job (queued) and queues its drivers and its compile prefetcher."""
        from porter.job.jobs import template_record, template_snapshot
        from porter.store.base import open_store
        from porter.spec.template import find_template

        from .tasks import enqueue
        if spec.backend == "replay":
            check_replay_source(spec.replay)
        tpl = find_template(spec.template)
        store = open_store(db_url)
        src, space = template_record(tpl)
        store.optuna_storage()   # Optuna's tables exist before several drivers open them
        job_id = store.create_job(spec, tpl.name, tpl.source_hash, src, space, status="queued",
                                  snapshot=template_snapshot(tpl))
        drivers = int(os.environ.get("PORTER_DRIVERS", "2"))
        try:
            enqueue(job_id, spec.arch, drivers)
        except Exception as e:  # noqa: BLE001 - any broker failure: the job is not queued
            store.set_job_status(job_id, "failed", f"could not queue: {e}")
            raise PorterError(f"job {job_id} recorded but not queued: the broker "
                              f"{_safe(os.environ.get('PORTER_BROKER_URL', ''))} is "
                              f"unreachable ({type(e).__name__})") from None
        return job_id

    def worker(self, queues: list[str], db_url: str | None, concurrency: int | None) -> None:
        """Runs a Celery worker here. A queue `gpu.<arch>` makes it a measuring worker: one
        process (solo pool), one job driver at a time, on the GPU(s) CUDA_VISIBLE_DEVICES
        leaves it."""
        if db_url:
            os.environ["PORTER_DB_URL"] = db_url
        queues = [q.strip() for q in queues if q.strip()]
        if not queues:
            raise PorterError("--queues needs at least one queue, e.g. compile or gpu.sm_90a")
        for q in queues:
            if q != "compile" and not q.startswith("gpu."):
                raise PorterError(f"unknown queue {q!r}: use compile or gpu.<arch>")
            if q.startswith("gpu."):
                from porter.spec.arch import get_arch
                get_arch(q[4:])
        from .app import app
        from .deadletter import install
        from .health import preflight, start_reaper
        preflight(db_url, app.conf.broker_url)
        install()
        start_reaper(db_url)
        gpu = any(q.startswith("gpu.") for q in queues)
        pool = "solo" if gpu else "prefork"
        conc = 1 if gpu else (concurrency or max(1, (os.cpu_count() or 2) - 1))
        name = os.environ.get("PORTER_WORKER_NAME") or \
            f"{'gpu' if gpu else 'compile'}-{os.getpid()}@{socket.gethostname()}"
        app.worker_main(["worker", "-Q", ",".join(queues), "--pool", pool,
                         "--concurrency", str(conc), "-n", name, "--loglevel", "INFO",
                         "--without-gossip", "--without-mingle"])

    def cancel(self, job_id: int, db_url: str | None) -> None:
        from porter.store.base import open_store
        store = open_store(db_url)
        store.get_job(job_id)
        store.request_cancel(job_id)


def check_replay_source(path: str | None) -> None:
    """The service replays only recordings inside the data folder(s) PORTER_REPLAY_DIR names
    (os.pathsep-separated), so a submitter cannot make a worker read any file of its host."""
    from pathlib import Path
    roots = [Path(p).resolve() for p in os.environ.get("PORTER_REPLAY_DIR", "").split(os.pathsep)
             if p]
    if not roots:
        raise PorterError("the service replays only recordings in its data folder; set "
                          "PORTER_REPLAY_DIR to that folder and put the recording there")
    real = Path(path or "").resolve()
    if not any(r in real.parents for r in roots) or not real.is_file():
        raise PorterError(f"replay source {path} is not a file inside the data folder "
                          f"{os.pathsep.join(map(str, roots))} (PORTER_REPLAY_DIR); copy it "
                          "there")


def _safe(url: str) -> str:
    if "@" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def service() -> Service:
    return Service()
