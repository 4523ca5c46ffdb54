"""Service-side writes (claims, heartbeats, reclaiming dead drivers), as methods that SqlStore
inherits (the cross-job measurement cache is db/cache.py). Each write is one transaction
through `self._tx`."""
from __future__ import annotations

import time

from sqlalchemy import select, update

from .models import Job


class ServiceMixin:
    """Service-mode state of SqlStore (see db/store.py)."""

    def beat(self, job_id: int) -> tuple[str, bool]:
        """A driver's heartbeat: stamps the job alive now and returns (status, cancel
        requested) in the same round trip."""
        from .store import UnknownJob
        with self._tx("recording a heartbeat") as conn:
            row = conn.execute(update(Job).where(Job.id == job_id)
                               .values(heartbeat_at=time.time())
                               .returning(Job.status, Job.cancel_requested)).first()
        if row is None:
            raise UnknownJob(f"no job {job_id}")
        return row.status, bool(row.cancel_requested)

    def claim_stale_jobs(self, stale_s: float) -> list[tuple[int, str]]:
        """Running service jobs whose drivers have all gone quiet (no heartbeat for stale_s):
        each is claimed (its heartbeat stamped now, so only one caller re-drives it) and
        returned as (job id, arch). Jobs run embedded never beat and are never claimed."""
        now = time.time()
        with self._tx("claiming jobs with dead drivers") as conn:
            ids = list(conn.execute(
                select(Job.id).where(Job.status == "running", Job.heartbeat_at.is_not(None),
                                     Job.heartbeat_at < now - stale_s)
                .with_for_update(skip_locked=True)).scalars()) \
                if conn.dialect.name == "postgresql" else list(conn.execute(
                    select(Job.id).where(Job.status == "running", Job.heartbeat_at.is_not(None),
                                         Job.heartbeat_at < now - stale_s)).scalars())
            if not ids:
                return []
            rows = conn.execute(update(Job).where(Job.id.in_(ids),
                                                  Job.heartbeat_at < now - stale_s)
                                .values(heartbeat_at=now)
                                .returning(Job.id, Job.arch)).all()
        return [(r.id, r.arch) for r in rows]
