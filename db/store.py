"""SqlStore: porter's Store on SQLAlchemy (SQLite embedded, PostgreSQL for the service).

`open_store(url)` is the `porter.plugins` entry point: it migrates the database to the newest
schema (once per URL per process) and returns a store. Every write is one transaction, and every
SQLAlchemy error leaves as a one-line StoreError with the original attached.
"""
from __future__ import annotations

import threading
import time
import tomllib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from porter.errors import StoreError
from porter.records import JOB_STATUSES, JobSpec, TrialRecord
from porter.store.base import JobInfo, Store, default_study_name

from . import migrate, queries
from .cache import CacheMixin
from .engine import (SQLITE_BUSY_SECONDS, get_engine, normalize_url, one_line, safe_url,
                     transaction, translate)
from .models import Job, Measurement, Template, Trial
from .queries import BestConfig, JobProgress
from .read import ReadMixin
from .rows import (_MEAS_COLS, _TRIAL_COLS, _job_info, _measurement_values, _trial_records,
                   _trial_values)
from .service_store import ServiceMixin

FINISHED = ("done", "failed", "cancelled", "interrupted")
# statuses whose trials have an objective worth ranking (compile-only jobs end in `compiled`)
RANKED = ("measured", "compiled")

class UnknownJob(StoreError):
    """No job with that id."""


@dataclass(frozen=True)
class TemplateInfo:
    """A template's source as it was submitted with a job."""
    source_hash: str
    name: str
    version: str
    source: str
    space_text: str


class SqlStore(ReadMixin, ServiceMixin, CacheMixin, Store):
    """porter's Store on one database URL. Use open_store(url), which migrates first.

    Beyond the base: list_jobs filters, cancellation (request_cancel, cancel_requested,
    heartbeat), trial_numbers, job_progress, leaderboard, get_template and the measurement
    cache's lookups (db/cache.py). JobInfo.extra holds
    `arch`, `cancel_requested` and `heartbeat_at`.
    """

    def __init__(self, url: str):
        self.url = normalize_url(url)
        self._engine = get_engine(self.url)
        self._optuna = None

    def __repr__(self) -> str:
        return f"SqlStore({safe_url(self.url)!r})"

    def _tx(self, what: str):
        return transaction(self._engine, what, self.url)

    @contextmanager
    def _read(self, what: str) -> Iterator[Connection]:
        with translate(what, self.url), self._engine.connect() as conn:
            yield conn

    # ---- jobs

    def create_job(self, spec: JobSpec, template_name: str, template_hash: str,
                   template_source: str, space_text: str, status: str = "queued",
                   study_name: str | None = None, snapshot: bytes | None = None) -> int:
        """Records the job and its template snapshot (once per hash: jobs of an unchanged
        template share the row); the study name defaults to `porter-job-<id>`. Without a
        snapshot the row keeps a bundle of the source and the space file alone."""
        _check_job_status(status)
        now = time.time()
        if snapshot is None:
            snapshot = _record_bundle(template_source, space_text)
        with self._tx("creating a job") as conn:
            self._add_template(conn, template_name, template_hash, template_source, space_text,
                               snapshot)
            job_id = conn.execute(insert(Job).values(
                spec=spec.to_dict(), template_name=template_name, template_hash=template_hash,
                arch=spec.arch, status=status, message="", created_at=now,
                started_at=now if status == "running" else None,
                finished_at=now if status in FINISHED else None,
                study_name=study_name or "", cancel_requested=False,
            )).inserted_primary_key[0]
            if not study_name:
                conn.execute(update(Job).where(Job.id == job_id)
                             .values(study_name=default_study_name(job_id)))
        return int(job_id)

    def _add_template(self, conn: Connection, name: str, source_hash: str, source: str,
                      space_text: str, snapshot: bytes) -> None:
        values = dict(source_hash=source_hash, name=name, version=_space_version(space_text),
                      source=source, space_text=space_text, created_at=time.time(),
                      files=snapshot)
        dialect = conn.dialect.name
        if dialect in ("postgresql", "sqlite"):
            ins = pg_insert if dialect == "postgresql" else sqlite_insert
            conn.execute(ins(Template).values(**values)
                         .on_conflict_do_nothing(index_elements=["source_hash"]))
        elif conn.execute(select(Template.id).where(Template.source_hash == source_hash)
                          ).first() is None:
            conn.execute(insert(Template).values(**values))

    def get_job(self, job_id: int) -> JobInfo:
        with self._read("reading a job") as conn:
            row = conn.execute(select(Job.__table__).where(Job.id == job_id)).first()
            if row is None:
                raise UnknownJob(f"no job {job_id} in {safe_url(self.url)}")
            stats = queries.job_stats(conn, [job_id])
        return _job_info(row, stats.get(job_id))

    def list_jobs(self, limit: int | None = 100, status: str | None = None,
                  template: str | None = None, arch: str | None = None) -> list[JobInfo]:
        """The newest jobs first, optionally only those with a status, template or arch."""
        q = select(Job.__table__).order_by(Job.id.desc())
        if limit is not None:
            q = q.limit(limit)
        if status is not None:
            q = q.where(Job.status == status)
        if template is not None:
            q = q.where(Job.template_name == template)
        if arch is not None:
            q = q.where(Job.arch == arch)
        with self._read("listing jobs") as conn:
            rows = conn.execute(q).all()
            stats = queries.job_stats(conn, [r.id for r in rows])
        return [_job_info(r, stats.get(r.id)) for r in rows]

    def set_job_status(self, job_id: int, status: str, message: str = "") -> None:
        """Sets status and message; `running` stamps started_at (the first time), a finished
        status stamps finished_at, and going back to queued/running clears it."""
        _check_job_status(status)
        now = time.time()
        values: dict[str, Any] = dict(status=status, message=message,
                                      finished_at=now if status in FINISHED else None)
        if status == "running":
            # coalesce keeps the first start of a job that a retry runs again
            values["started_at"] = func.coalesce(Job.started_at, now)
        with self._tx("setting a job's status") as conn:
            res = conn.execute(update(Job).where(Job.id == job_id).values(**values))
            if res.rowcount == 0:
                raise UnknownJob(f"no job {job_id} in {safe_url(self.url)}")

    def request_cancel(self, job_id: int) -> bool:
        """Asks the job to stop. A queued job is cancelled at once; a running one sees the flag
        at its next check (cancel_requested or heartbeat). Returns False if the job had
        already finished."""
        now = time.time()
        with self._tx("cancelling a job") as conn:
            status = conn.execute(select(Job.status).where(Job.id == job_id)).scalar()
            if status is None:
                raise UnknownJob(f"no job {job_id} in {safe_url(self.url)}")
            if status in FINISHED:
                return False
            conn.execute(update(Job).where(Job.id == job_id).values(cancel_requested=True))
            conn.execute(update(Job).where(Job.id == job_id, Job.status == "queued")
                         .values(status="cancelled", message="cancelled before it started",
                                 finished_at=now))
        return True

    def cancel_requested(self, job_id: int) -> bool:
        with self._read("reading a job's cancel flag") as conn:
            flag = conn.execute(select(Job.cancel_requested).where(Job.id == job_id)).scalar()
        if flag is None:
            raise UnknownJob(f"no job {job_id} in {safe_url(self.url)}")
        return bool(flag)

    def heartbeat(self, job_id: int) -> bool:
        """Stamps the job as alive now; returns whether cancellation was requested, so a
        worker's periodic call needs one round trip."""
        with self._tx("recording a heartbeat") as conn:
            res = conn.execute(update(Job).where(Job.id == job_id)
                               .values(heartbeat_at=time.time()))
            if res.rowcount == 0:
                raise UnknownJob(f"no job {job_id} in {safe_url(self.url)}")
            return bool(conn.execute(select(Job.cancel_requested)
                                     .where(Job.id == job_id)).scalar())

    def job_progress(self, job_id: int) -> JobProgress:
        """Trials per status and the best so far (see queries.job_stats)."""
        with self._read("reading a job's progress") as conn:
            job = conn.execute(select(Job.status, Job.cancel_requested, Job.heartbeat_at)
                               .where(Job.id == job_id)).first()
            if job is None:
                raise UnknownJob(f"no job {job_id} in {safe_url(self.url)}")
            counts = queries.status_counts(conn, job_id)
            stats = queries.job_stats(conn, [job_id]).get(job_id, queries.JobStats())
        return JobProgress(job_id=job_id, status=job.status, counts=counts,
                           n_trials=sum(counts.values()), best_objective=stats.best_objective,
                           best_ratio=stats.best_ratio,
                           cancel_requested=bool(job.cancel_requested),
                           heartbeat_at=job.heartbeat_at)

    def get_template(self, source_hash: str) -> TemplateInfo:
        """The template source and space file a job was submitted with."""
        with self._read("reading a template") as conn:
            row = conn.execute(select(Template.__table__).where(Template.source_hash == source_hash)
                               ).first()
        if row is None:
            raise StoreError(f"no template with hash {source_hash} in {safe_url(self.url)}")
        return TemplateInfo(row.source_hash, row.name, row.version, row.source, row.space_text)

    def template_snapshot(self, source_hash: str) -> bytes:
        """The template snapshot (porter.spec.snapshot's blob) stored under this hash."""
        with self._read("reading a template snapshot") as conn:
            row = conn.execute(select(Template.files, Template.source, Template.space_text)
                               .where(Template.source_hash == source_hash)).first()
        if row is None:
            raise StoreError(f"no template with hash {source_hash} in {safe_url(self.url)}")
        return row.files if row.files is not None else _record_bundle(row.source,
                                                                       row.space_text)

    # ---- trials

    def record_trial(self, job_id: int, trial: TrialRecord) -> bool:
        try:
            with self._engine.begin() as conn:
                trial_id = conn.execute(insert(Trial).values(
                    job_id=job_id, **_trial_values(trial))).inserted_primary_key[0]
                if trial.measurements:
                    conn.execute(insert(Measurement),
                                 [_measurement_values(trial_id, m) for m in trial.measurements])
        except IntegrityError as e:
            # the transaction is rolled back: no trial row and no measurement remain
            if trial.number in self.trial_numbers(job_id):
                return False
            raise StoreError(f"recording trial {trial.number} of job {job_id} failed on "
                             f"{safe_url(self.url)}: {one_line(e)}") from e
        except SQLAlchemyError as e:
            raise StoreError(f"recording trial {trial.number} of job {job_id} failed on "
                             f"{safe_url(self.url)}: {one_line(e)}") from e
        return True

    def trial_numbers(self, job_id: int) -> set[int]:
        """The numbers of the trials already recorded for the job (raises UnknownJob if there
        is no such job)."""
        with self._read("reading trial numbers") as conn:
            numbers = set(conn.execute(select(Trial.number).where(Trial.job_id == job_id))
                          .scalars())
            if not numbers and conn.execute(select(Job.id).where(Job.id == job_id)
                                            ).first() is None:
                raise UnknownJob(f"no job {job_id} in {safe_url(self.url)}")
        return numbers

    def trial_statuses(self, job_id: int) -> dict[int, str]:
        """Trial number -> status, one light query (the service's drivers ask this before every
        proposal)."""
        with self._read("reading trial statuses") as conn:
            return dict(conn.execute(select(Trial.number, Trial.status)
                                     .where(Trial.job_id == job_id)).all())

    def trials(self, job_id: int, status: str | None = None) -> list[TrialRecord]:
        """The job's trials in number order, with their measurements."""
        where = [Trial.job_id == job_id]
        if status is not None:
            where.append(Trial.status == status)
        with self._read("reading trials") as conn:
            rows = conn.execute(select(*_TRIAL_COLS).where(*where).order_by(Trial.number)).all()
            meas = conn.execute(select(*_MEAS_COLS).join(Trial, Measurement.trial_id == Trial.id)
                                .where(*where).order_by(Measurement.id)).all()
        return _trial_records(rows, meas)

    def best_trials(self, job_id: int, n: int = 10) -> list[TrialRecord]:
        """The n trials with the lowest objective (measured, or compiled for compile-only jobs);
        ties go to the earlier trial."""
        with self._read("reading the best trials") as conn:
            rows = conn.execute(
                select(*_TRIAL_COLS)
                .where(Trial.job_id == job_id, Trial.status.in_(RANKED),
                       Trial.objective.is_not(None))
                .order_by(Trial.objective, Trial.number).limit(n)).all()
            meas = conn.execute(select(*_MEAS_COLS)
                                .where(Measurement.trial_id.in_([r.id for r in rows]))
                                .order_by(Measurement.id)).all() if rows else []
        return _trial_records(rows, meas)

    def leaderboard(self, template: str | None = None,
                    arch: str | None = None) -> list[BestConfig]:
        """For each (template, arch, size), the best measured trial over all jobs (see
        BestConfig for the ranking), ordered by template, arch and size."""
        with self._read("reading the leaderboard") as conn:
            return queries.leaderboard(conn, template, arch)

    # ---- Optuna

    def optuna_storage(self):
        """Optuna's RDBStorage on the same database (its own tables), one per store."""
        if self._optuna is None:
            import optuna
            if self.url.startswith("sqlite"):
                kwargs = {"connect_args": {"timeout": SQLITE_BUSY_SECONDS}}
            else:
                kwargs = {"pool_pre_ping": True}
            with translate("opening Optuna's storage", self.url):
                self._optuna = optuna.storages.RDBStorage(self.url, engine_kwargs=kwargs)
        return self._optuna

    def close(self) -> None:
        """Closes this store's pooled connections and forgets its Optuna storage (the next use
        opens fresh ones: after a database restart, or before a process exits)."""
        self._engine.dispose()
        if self._optuna is not None:
            self._optuna.engine.dispose()
            self._optuna = None


_migrated: set[str] = set()
_migrate_lock = threading.Lock()


def open_store(url: str) -> SqlStore:
    """A store on `url`, its schema migrated to the newest revision (once per process)."""
    url = normalize_url(url)
    with _migrate_lock:
        if url not in _migrated:
            migrate.upgrade(url)
            _migrated.add(url)
    return SqlStore(url)


def _record_bundle(source: str, space_text: str) -> bytes:
    from porter.spec.snapshot import from_record
    return from_record(source, space_text).blob


def _check_job_status(status: str) -> None:
    if status not in JOB_STATUSES:
        raise ValueError(f"unknown job status {status!r}; one of {', '.join(JOB_STATUSES)}")


def _space_version(space_text: str) -> str:
    try:
        return str(tomllib.loads(space_text).get("template", {}).get("version", ""))
    except (tomllib.TOMLDecodeError, AttributeError):
        return ""
