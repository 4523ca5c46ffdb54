"""The measurement cache across jobs (porter.job.cache), as methods SqlStore inherits: lookups
of trials measured under a measurement identity. Each trial row carries its identity
(`measure_key`); a reused trial carries the job and number of the trial it copies and is never
itself a source, so every link points at a trial that was measured."""
from __future__ import annotations

import dataclasses

from sqlalchemy import func, select

from porter.records import REUSABLE_STATUSES, TrialRecord

from .models import Measurement, Trial
from .rows import _MEAS_COLS, _TRIAL_COLS, _trial_records

IN_CHUNK = 500          # configuration keys per IN list (well inside every database's limit)


def _sources(measure_key: str, exclude_job: int | None):
    where = [Trial.measure_key == measure_key, Trial.reused_job.is_(None),
             Trial.status.in_(REUSABLE_STATUSES)]
    if exclude_job is not None:
        where.append(Trial.job_id != exclude_job)
    return where


class CacheMixin:
    """Measurement-cache reads of SqlStore (see db/store.py)."""

    def cached_trial(self, measure_key: str, config_key: str,
                     exclude_job: int | None = None) -> TrialRecord | None:
        """The newest trial of another job measured under this identity with this
        configuration (see porter.store.base.Store.cached_trial), with reused_from set."""
        with self._read("looking up the measurement cache") as conn:
            row = conn.execute(
                select(*_TRIAL_COLS, Trial.job_id)
                .where(*_sources(measure_key, exclude_job), Trial.config_key == config_key)
                .order_by(Trial.id.desc()).limit(1)).first()
            if row is None:
                return None
            meas = conn.execute(select(*_MEAS_COLS).where(Measurement.trial_id == row.id)
                                .order_by(Measurement.id)).all()
        rec = _trial_records([row], meas)[0]
        return dataclasses.replace(rec, reused_from=(row.job_id, row.number))

    def cached_configs(self, measure_key: str, limit: int,
                       exclude_job: int | None = None) -> list[dict]:
        """The cached configurations of this identity (the newest measurement of each), best
        objective first, failures after, at most `limit`."""
        newest = func.row_number().over(partition_by=Trial.config_key,
                                        order_by=Trial.id.desc()).label("newest")
        sub = (select(Trial.id, Trial.params, Trial.objective, newest)
               .where(*_sources(measure_key, exclude_job)).subquery("cached"))
        with self._read("reading the measurement cache") as conn:
            rows = conn.execute(select(sub.c.params).where(sub.c.newest == 1)
                                .order_by(sub.c.objective.asc().nulls_last(), sub.c.id)
                                .limit(max(0, limit))).scalars().all()
        return [dict(p) for p in rows]

    def cached_config_keys(self, measure_key: str, config_keys,
                           exclude_job: int | None = None) -> set[str]:
        """Which of `config_keys` cached_trial would answer for this identity: one query per
        IN_CHUNK keys (the service's compile prefetch asks this for each batch of variants)."""
        keys = list(dict.fromkeys(config_keys))
        found: set[str] = set()
        with self._read("looking up the measurement cache") as conn:
            for i in range(0, len(keys), IN_CHUNK):
                found.update(conn.execute(
                    select(Trial.config_key).distinct()
                    .where(*_sources(measure_key, exclude_job),
                           Trial.config_key.in_(keys[i:i + IN_CHUNK]))).scalars())
        return found

    def measure_keys(self, job_id: int) -> set[str]:
        """The measurement identities the job's recorded trials carry (those its drivers
        measure under; none before its first trial that has one)."""
        with self._read("reading the job's measurement identities") as conn:
            return set(conn.execute(
                select(Trial.measure_key).distinct()
                .where(Trial.job_id == job_id, Trial.measure_key.is_not(None))).scalars())
