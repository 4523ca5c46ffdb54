"""The storage contract. porter knows only this base; the SQL implementation lives in db/ and is
found through the `porter.plugins` entry point, so imports run one way (db -> porter)."""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from porter.errors import StoreError
from porter.records import JobSpec, TrialRecord

DEFAULT_DB_URL = "sqlite:///porter.db"


def default_study_name(job_id: int) -> str:
    """The Optuna study of a job that names none (the one definition, for every store and
    both ways of running a job)."""
    return f"porter-job-{job_id}"


@dataclass(frozen=True)
class JobInfo:
    id: int
    spec: JobSpec
    status: str
    template_name: str
    template_hash: str
    message: str = ""
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    n_trials: int = 0
    n_measured: int = 0
    n_reused: int = 0               # trials that reuse earlier jobs' measurements
    best_objective: float | None = None
    best_ratio: float | None = None
    study_name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Store(ABC):
    """Jobs and trials. Every write is one transaction: a trial row appears whole or not at all."""

    url: str

    @abstractmethod
    def create_job(self, spec: JobSpec, template_name: str, template_hash: str,
                   template_source: str, space_text: str, status: str = "queued",
                   study_name: str | None = None, snapshot: bytes | None = None) -> int:
        """snapshot: porter.spec.snapshot.bundle(folder).blob, stored once per template_hash."""

    @abstractmethod
    def get_job(self, job_id: int) -> JobInfo: ...

    @abstractmethod
    def template_snapshot(self, template_hash: str) -> bytes:
        """The snapshot blob of the template a job owns (porter.spec.snapshot.unpack reads it);
        StoreError if no template has that hash."""

    @abstractmethod
    def list_jobs(self, limit: int | None = 100, status: str | None = None,
                  template: str | None = None, arch: str | None = None) -> list[JobInfo]:
        """The newest jobs first, filtered by the store (not by the caller): only those with
        this status, template name and/or architecture; limit None: all that match."""

    @abstractmethod
    def set_job_status(self, job_id: int, status: str, message: str = "") -> None: ...

    @abstractmethod
    def record_trial(self, job_id: int, trial: TrialRecord) -> bool:
        """Stores the trial once; returns False (and changes nothing) if that trial number of
        that job is already recorded."""

    @abstractmethod
    def trials(self, job_id: int, status: str | None = None) -> list[TrialRecord]: ...

    def trial_statuses(self, job_id: int) -> dict[int, str]:
        """Trial number -> status of the job's recorded trials (stores may answer this without
        reading measurements)."""
        return {t.number: t.status for t in self.trials(job_id)}

    @abstractmethod
    def best_trials(self, job_id: int, n: int = 10) -> list[TrialRecord]: ...

    def cached_trial(self, measure_key: str, config_key: str,
                     exclude_job: int | None = None) -> TrialRecord | None:
        """The measurement cache (porter.job.cache): the newest trial, of a job other than
        exclude_job, with this measurement identity and configuration, in a reusable status
        (porter.records.REUSABLE_STATUSES) and itself measured rather than reused; returned
        with its measurements and `reused_from` = (its job, its number). None when there is
        none (stores without a cache: always)."""
        return None

    def cached_configs(self, measure_key: str, limit: int,
                       exclude_job: int | None = None) -> list[dict]:
        """The configurations cached_trial would answer for this identity, best objective
        first (failures last), at most `limit` (stores without a cache: none)."""
        return []

    def cached_config_keys(self, measure_key: str, config_keys,
                           exclude_job: int | None = None) -> set[str]:
        """The configuration keys, of those given, that cached_trial would answer for this
        identity, asked as one batch (stores without a cache: none)."""
        return set()

    def measure_keys(self, job_id: int) -> set[str]:
        """The measurement identities (porter.job.cache.measure_key) the job's recorded trials
        carry: those its parties measure under, known once one has recorded a trial (stores
        without a cache: none)."""
        return set()

    def cancel_requested(self, job_id: int) -> bool:
        """Whether someone asked the job to stop (stores without cancellation: never)."""
        return False

    def heartbeat(self, job_id: int) -> bool:
        """Stamps the job as alive now (stores may do nothing); returns cancel_requested."""
        return self.cancel_requested(job_id)

    def start_run(self, job_id: int) -> float:
        """Sets the job running and returns when its current run started (unix seconds), the
        origin of its deadline: now if it was not running, else the start that the party which
        set it running stamped (drivers joining a running job share its clock)."""
        import time
        info = self.get_job(job_id)
        if info.status == "running" and info.started_at:
            return info.started_at
        now = time.time()
        self.set_job_status(job_id, "running")
        return now

    def close(self) -> None:
        """Releases the store's connections (the store stays usable: they reopen on use)."""

    def optuna_storage(self):
        """An Optuna storage in the same database (Optuna's own tables)."""
        import optuna
        return optuna.storages.RDBStorage(self.url)


def db_url(url: str | None = None) -> str:
    return url or os.environ.get("PORTER_DB_URL") or DEFAULT_DB_URL


# the entry points pyproject.toml registers, for a checkout used without installing it
_DEFAULT_PLUGINS = {"store": "db.store:open_store", "service": "workers.service:service",
                    "dashboard": "dashboard.launcher:serve"}


def plugin(name: str):
    eps = entry_points(group="porter.plugins", name=name)
    if eps:
        return next(iter(eps)).load()
    if name in _DEFAULT_PLUGINS:
        import importlib
        module, attr = _DEFAULT_PLUGINS[name].split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as e:
            raise StoreError(f"the '{name}' plugin cannot be loaded ({e}); install the "
                             "project (pip install -e .)") from e
    raise StoreError(f"the '{name}' plugin is not installed; reinstall the project "
                     "(pip install -e .)")


def open_store(url: str | None = None) -> Store:
    return plugin("store")(db_url(url))
