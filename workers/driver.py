"""How a service driver takes part in a job: the hooks it passes to porter's one job loop
(porter.job.loop.run_job).

- lock(): asks are serialised over the job's drivers, so two never propose the same
  configuration: a PostgreSQL advisory lock on a connection of its own (released by the server
  if the holder dies), or beside a SQLite file an flock (released by the kernel).
- beat(): a thread stamps the job's heartbeat every BEAT_S seconds (the reaper re-drives a job
  whose heartbeats stop) and keeps `porter:trial:<job>:<number>` alive in Redis for the trials in
  flight, setting a new trial's key as soon as asked() wakes it (the ask, under the job's lock,
  does not wait for Redis; a trial is reclaimable only STALE_TRIAL_S after it started, long after
  its key is set); the loop reads the thread's last answer, so a round costs no query.
- reclaim(): a RUNNING trial of the study that nobody recorded is failed once it is older than
  STALE_TRIAL_S and its liveness key is gone (its driver died).
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from contextlib import contextmanager

from porter.job.hooks import JobHooks, fail_trials

log = logging.getLogger("porter.worker")
STALE_TRIAL_S = float(os.environ.get("PORTER_STALE_TRIAL_S", "20"))
BEAT_S = float(os.environ.get("PORTER_BEAT_S", "3"))
LIVE_TTL_S = 10
LOCK_BASE = 0x504F5254 * 1000


class ServiceHooks(JobHooks):
    wait_s = 1.0
    sole = False                # other drivers share the job's study

    def __init__(self, driver: str, redis_try):
        self.driver, self._redis_try = driver, redis_try
        self._live: set[int] = set()
        self._new: list[int] = []          # asked, key not set yet (the thread sets it)
        self._signal: str | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_conn = None

    # ---- heartbeats
    def start(self, store, job_id: int) -> None:
        super().start(store, job_id)
        self._beat_now()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"porter-beat-{job_id}")
        self._thread.start()

    def _beat_now(self) -> None:
        status, cancel = self.store.beat(self.job_id)
        self._signal = "cancel" if cancel else ("stop" if status != "running" else None)

    def _run(self) -> None:
        due = time.monotonic() + BEAT_S
        while True:
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                return
            while self._new:
                self._touch(self._new.pop())
            if time.monotonic() < due:
                continue
            due = time.monotonic() + BEAT_S
            try:
                self._beat_now()
            except Exception as e:  # noqa: BLE001 - the database is retried by the loop
                log.warning("job %s: heartbeat failed (%s)", self.job_id, type(e).__name__)
            for n in list(self._live):
                self._touch(n)

    def beat(self) -> str | None:
        return self._signal

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._lock_conn is not None:
            self._lock_conn.close()
            self._lock_conn = None

    # ---- trial liveness
    def _touch(self, number: int) -> None:
        self._redis_try(lambda r: r.set(f"porter:trial:{self.job_id}:{number}", self.driver,
                                        ex=LIVE_TTL_S))

    def asked(self, number: int) -> None:
        self._live.add(number)
        self._new.append(number)
        self._wake.set()

    def told(self, number: int) -> None:
        self._live.discard(number)

    def reclaim(self, study, foreign: list) -> set[int]:
        now = time.time()
        dead = []
        for t in foreign:
            if t.datetime_start is None or now - t.datetime_start.timestamp() < STALE_TRIAL_S:
                continue
            if self._redis_try(lambda r: r.exists(f"porter:trial:{self.job_id}:{t.number}"), 1):
                continue
            log.warning("job %s: trial %s was left by a dead driver; failed in the study",
                        self.job_id, t.number)
            dead.append(t.number)
        return fail_trials(study, dead)

    # ---- the ask lock
    @contextmanager
    def lock(self):
        url = self.store.url
        if url.startswith("postgresql"):
            with self._pg_lock():
                yield
        elif url.startswith("sqlite") and (path := _sqlite_lock_path(url)):
            with open(path, "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
        else:        # an in-memory database: one process, nothing to serialise
            yield

    @contextmanager
    def _pg_lock(self):
        # one connection of our own, kept for the run (a checkout per ask cost a round trip);
        # a broken one is dropped and the loop's retry takes a new one
        import psycopg
        from sqlalchemy.engine import make_url
        key = LOCK_BASE + self.job_id
        try:
            if self._lock_conn is None:   # (re)connecting is inside: a refused connection
                u = make_url(self.store.url)  # is as transient as a dropped one
                self._lock_conn = psycopg.connect(
                    host=u.host, port=u.port or 5432, user=u.username, password=u.password,
                    dbname=u.database, autocommit=True, connect_timeout=5)
            self._lock_conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        except psycopg.Error as e:
            if self._lock_conn is not None:
                self._lock_conn.close()
            self._lock_conn = None
            from sqlalchemy.exc import OperationalError
            raise OperationalError("pg_advisory_lock", {}, e) from e
        conn = self._lock_conn
        try:
            yield
        finally:
            try:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            except psycopg.Error:
                self._lock_conn = None      # the server released it with the session
                conn.close()


def _sqlite_lock_path(url: str) -> str | None:
    from sqlalchemy.engine import make_url
    db = make_url(url).database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return f"{db}.ask.lock"
