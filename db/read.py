"""Read-side queries for the dashboard and reports, as methods that SqlStore inherits.

Methods here run through `self._read(what)` (a connection in a read transaction) and do their
filtering, paging and aggregation in SQL; callers outside db/ see only plain values (lists of
dicts, tuples), never SQLAlchemy objects. Long series come back downsampled by the database:
`convergence` keeps every improvement of the best so far and every k-th trial, `trial_sample`
every k-th measured trial plus the best ones, so a 100,000-trial job answers in a few thousand
rows.
"""
from __future__ import annotations

import math
import time
from typing import Any, Iterable

from sqlalchemy import and_, case, delete, func, or_, select, update

from .models import Job, Measurement, Trial
from .queries import job_stats

RANKED = ("measured", "compiled")
FAILED = ("compile_failed", "resource_rejected", "launch_failed", "wrong_result", "timeout",
          "crashed")
# per-trial metrics: (Measurement column or None for Trial.objective, higher is better)
METRICS = {"objective": (None, False), "ratio": ("ratio", True), "gbps": ("gbps", True),
           "tflops": ("tflops", True)}
TRIAL_SORTS = ("number", "status", "objective", "ratio", "gbps", "tflops", "registers",
               "smem_bytes", "spill_bytes", "compile_seconds", "finished_at")
_TRIAL_COLS = (Trial.id, Trial.number, Trial.status, Trial.objective, Trial.params,
               Trial.registers, Trial.smem_bytes, Trial.spill_bytes, Trial.compile_seconds,
               Trial.started_at, Trial.finished_at, Trial.message, Trial.note, Trial.reused_job,
               Trial.reused_number, Trial.origin)


def _geomean(col):
    return func.exp(func.avg(func.ln(col)))


def _per_trial(job_id: int, ids: Iterable[int] | None = None):
    """Per trial of the job: the geometric mean over its sizes of ratio, GB/s and TFLOP/s."""
    cols = [_geomean(func.nullif(getattr(Measurement, c), 0)).label(c)
            for c in ("ratio", "gbps", "tflops")]
    q = (select(Measurement.trial_id, *cols).join(Trial, Measurement.trial_id == Trial.id)
         .where(Trial.job_id == job_id).group_by(Measurement.trial_id))
    if ids is not None:
        q = q.where(Measurement.trial_id.in_(list(ids)))
    return q


def _search(q, search: str):
    s = search.strip()
    if not s:
        return q
    like = f"%{s.lower()}%"
    cond = [func.lower(Job.template_name).like(like), func.lower(Job.arch).like(like),
            func.lower(Job.name).like(like), func.lower(Job.status).like(like)]
    if s.isdigit():
        cond.append(Job.id == int(s))
    return q.where(or_(*cond))


class ReadMixin:
    """Dashboard and report queries of SqlStore (see db/store.py)."""

    # ---- jobs

    def job_rows(self, limit: int = 50, offset: int = 0, search: str = "",
                 status: str | None = None,
                 stats: bool = True) -> tuple[list[dict[str, Any]], int]:
        """A page of jobs, newest first, with their progress (stats=False: without trial
        counts and bests, which cost a pass over big jobs' trials); and how many jobs match.
        `search` matches a job id exactly, or part of a template, architecture, name or
        status."""
        q = _search(select(Job.__table__), search)
        if status:
            q = q.where(Job.status == status)
        with self._read("listing jobs") as conn:
            total = conn.execute(select(func.count()).select_from(q.subquery())).scalar()
            rows = conn.execute(q.order_by(Job.id.desc()).limit(limit).offset(offset)).all()
            per_job = job_stats(conn, [r.id for r in rows]) if stats else {}
        now = time.time()
        out = []
        for r in rows:
            s = per_job.get(r.id)
            budget = (r.spec or {}).get("trials")
            n = s.n_trials if s else 0
            out.append({
                "job": r.id, "name": r.name or "", "template": r.template_name, "arch": r.arch,
                "backend": (r.spec or {}).get("backend", ""), "status": r.status,
                "trials": n, "budget": budget,
                "progress": min(1.0, n / budget) if budget else None,
                "measured": s.n_measured if s else 0,
                "best_ratio": s.best_ratio if s else None,
                "best_objective": s.best_objective if s else None,
                "created_at": r.created_at,
                "minutes": ((r.finished_at or now) - r.started_at) / 60 if r.started_at
                else None,
                "message": r.message or ""})
        return out, int(total or 0)

    def job_status_counts(self) -> dict[str, int]:
        """Jobs per status over the whole database."""
        with self._read("counting jobs") as conn:
            return {s: int(n) for s, n in conn.execute(
                select(Job.status, func.count()).group_by(Job.status)).all()}

    def job_detail(self, job_id: int) -> dict[str, Any] | None:
        """The job's row (spec, status, name, notes, times), its trials per status and its
        bests; None if there is no such job."""
        with self._read("reading a job") as conn:
            row = conn.execute(select(Job.__table__).where(Job.id == job_id)).first()
            if row is None:
                return None
            counts = dict(conn.execute(select(Trial.status, func.count())
                                       .where(Trial.job_id == job_id)
                                       .group_by(Trial.status)).all())
            stats = job_stats(conn, [job_id]).get(job_id)
        d = dict(row._mapping)
        d.update(counts={k: int(v) for k, v in counts.items()},
                 n_trials=int(sum(counts.values())),
                 n_measured=stats.n_measured if stats else 0,
                 n_reused=stats.n_reused if stats else 0,
                 best_ratio=stats.best_ratio if stats else None,
                 best_objective=stats.best_objective if stats else None)
        return d

    def job_version(self, job_id: int) -> tuple:
        """A cheap fingerprint of everything the job's pages show: it changes when a trial is
        recorded, the status moves or the notes are edited (pages cache on it)."""
        with self._read("reading a job's version") as conn:
            j = conn.execute(select(Job.status, Job.name, Job.notes, Job.message)
                             .where(Job.id == job_id)).first()
            n, last = conn.execute(select(func.count(), func.max(Trial.id))
                                   .where(Trial.job_id == job_id)).first()
        return (None,) if j is None else (*j, int(n or 0), last)

    def data_version(self) -> tuple:
        """A cheap fingerprint of the whole database's results: it changes when a job is
        created or deleted or any trial is recorded (cross-job pages cache on it)."""
        with self._read("reading the database's version") as conn:
            jobs = conn.execute(select(func.count(), func.max(Job.id))).first()
            last = conn.execute(select(func.max(Trial.id))).scalar()
        return (*jobs, last)

    def templates_and_archs(self) -> dict[str, list[str]]:
        with self._read("listing templates") as conn:
            rows = conn.execute(select(Job.template_name, Job.arch).distinct()
                                .order_by(Job.template_name, Job.arch)).all()
        out: dict[str, list[str]] = {}
        for t, a in rows:
            out.setdefault(t, []).append(a)
        return out

    # ---- a job's trials

    def convergence(self, job_id: int, metric: str = "objective",
                    max_points: int = 1500) -> list[dict[str, Any]]:
        """The best so far in the order trials were recorded (they are recorded as they
        finish), forward-filled over failed trials: every trial that improved it, every k-th
        trial (k keeps about max_points), and the last. Each row: idx (1-based position),
        number, status, t (finished_at), value (this trial's metric, None if it has none), best
        and origin (where its configuration came from)."""
        col, higher = METRICS[metric]
        ranked = Trial.status.in_(RANKED) if col is None else Trial.status == "measured"
        if col is None:
            base = select(Trial.id, Trial.number, Trial.status, Trial.finished_at, Trial.origin,
                          case((ranked, Trial.objective), else_=None).label("v"))
        else:
            agg = _per_trial(job_id).subquery("agg")
            base = (select(Trial.id, Trial.number, Trial.status, Trial.finished_at, Trial.origin,
                           case((ranked, getattr(agg.c, col)), else_=None).label("v"))
                    .outerjoin(agg, agg.c.trial_id == Trial.id))
        base = base.where(Trial.job_id == job_id).subquery("base")
        order = base.c.id
        v = base.c.v
        best = (func.max if higher else func.min)(v).over(order_by=order, rows=(None, 0))
        w = select(base.c.number, base.c.status, base.c.finished_at, base.c.origin,
                   v.label("value"),
                   func.row_number().over(order_by=order).label("idx"),
                   best.label("best")).subquery("w")
        w2 = select(w, func.lag(w.c.best).over(order_by=w.c.idx).label("prev")).subquery("w2")
        with self._read("reading a job's convergence") as conn:
            total = conn.execute(select(func.count()).where(Trial.job_id == job_id)).scalar()
            step = max(1, math.ceil((total or 0) / max_points))
            rows = conn.execute(
                select(w2.c.idx, w2.c.number, w2.c.status, w2.c.finished_at, w2.c.value,
                       w2.c.best, w2.c.origin)
                .where(or_(and_(w2.c.best.is_not(None),
                                or_(w2.c.prev.is_(None), w2.c.best != w2.c.prev)),
                           w2.c.idx % step == 0, w2.c.idx == 1, w2.c.idx == total))
                .order_by(w2.c.idx)).all()
        return [{"idx": r.idx, "number": r.number, "status": r.status, "t": r.finished_at,
                 "value": r.value, "best": r.best, "origin": r.origin or ""} for r in rows]

    def _trial_query(self, job_id: int, statuses=None, ranges=None):
        q = select(*_TRIAL_COLS).where(Trial.job_id == job_id)
        if statuses:
            q = q.where(Trial.status.in_(list(statuses)))
        for name, (lo, hi) in (ranges or {}).items():
            p = Trial.params[name].as_float()
            q = q.where(p >= lo, p <= hi)
        return q

    def trial_page(self, job_id: int, statuses: Iterable[str] | None = None,
                   ranges: dict[str, tuple[float, float]] | None = None, sort: str = "number",
                   descending: bool = False, limit: int | None = 50,
                   offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """A page of the job's trials that pass the filters (statuses; numeric parameter
        ranges, inclusive), sorted by a TRIAL_SORTS column or `param:NAME` (numeric), with
        each trial's geometric-mean ratio, GB/s and TFLOP/s; and how many trials pass."""
        q = self._trial_query(job_id, statuses, ranges)
        agg = None
        if sort.startswith("param:"):
            key = Trial.params[sort[6:]].as_float()
        elif sort in ("ratio", "gbps", "tflops"):
            agg = _per_trial(job_id).subquery("agg")
            q = q.outerjoin(agg, agg.c.trial_id == Trial.id)
            key = getattr(agg.c, sort)
        elif sort in TRIAL_SORTS:
            key = getattr(Trial, sort)
        else:
            raise ValueError(f"cannot sort trials by {sort!r}")
        key = key.desc().nulls_last() if descending else key.asc().nulls_last()
        q = q.order_by(key, Trial.number)
        with self._read("reading a page of trials") as conn:
            total = conn.execute(select(func.count()).select_from(
                self._trial_query(job_id, statuses, ranges).subquery())).scalar()
            rows = conn.execute(q.limit(limit).offset(offset)).all()
            extra = {r.trial_id: r for r in conn.execute(
                _per_trial(job_id, [r.id for r in rows]))} if rows else {}
        return [_trial_dict(r, extra.get(r.id)) for r in rows], int(total or 0)

    def trial_detail(self, job_id: int, number: int) -> dict[str, Any] | None:
        """One trial whole: its row (compile log, device, resources) and its measurements."""
        with self._read("reading a trial") as conn:
            row = conn.execute(select(Trial.__table__).where(Trial.job_id == job_id,
                                                             Trial.number == number)).first()
            if row is None:
                return None
            meas = conn.execute(select(Measurement.__table__)
                                .where(Measurement.trial_id == row.id)
                                .order_by(Measurement.id)).all()
        d = dict(row._mapping)
        d["measurements"] = [dict(m._mapping) for m in meas]
        return d

    def trial_sample(self, job_id: int, max_rows: int = 2000, best: int = 50,
                     statuses: Iterable[str] = ("measured",)) -> list[dict[str, Any]]:
        """The analysis set: the trials in the statuses whose number is a multiple of k (k
        keeps about max_rows) and the `best` lowest objectives, with their per-trial
        aggregates and measurements."""
        where = (Trial.job_id == job_id, Trial.status.in_(list(statuses)))
        with self._read("sampling a job's trials") as conn:
            n = conn.execute(select(func.count()).where(*where)).scalar() or 0
            step = max(1, math.ceil(n / max_rows))
            ids = set(conn.execute(select(Trial.id).where(*where, Trial.number % step == 0))
                      .scalars())
            ids |= set(conn.execute(select(Trial.id).where(*where, Trial.objective.is_not(None))
                                    .order_by(Trial.objective, Trial.number).limit(best))
                       .scalars())
            if not ids:
                return []
            ids = sorted(ids)
            rows = conn.execute(select(*_TRIAL_COLS).where(Trial.id.in_(ids))
                                .order_by(Trial.number)).all()
            extra = {r.trial_id: r for r in conn.execute(_per_trial(job_id, ids))}
            meas: dict[int, list] = {}
            for m in conn.execute(select(Measurement.trial_id, Measurement.size,
                                         Measurement.ours_ms, Measurement.ratio,
                                         Measurement.gbps, Measurement.tflops)
                                  .where(Measurement.trial_id.in_(ids))):
                meas.setdefault(m.trial_id, []).append(dict(m._mapping))
        out = []
        for r in rows:
            d = _trial_dict(r, extra.get(r.id))
            d["measurements"] = meas.get(r.id, [])
            out.append(d)
        return out

    # ---- job control

    def set_job_notes(self, job_id: int, name: str | None = None,
                      notes: str | None = None) -> None:
        """Renames the job and/or replaces its notes (None leaves a field as it is)."""
        values = {k: v for k, v in (("name", name), ("notes", notes)) if v is not None}
        if not values:
            return
        with self._tx("editing a job's notes") as conn:
            if conn.execute(update(Job).where(Job.id == job_id).values(**values)).rowcount == 0:
                from .store import UnknownJob
                raise UnknownJob(f"no job {job_id}")

    def set_trial_note(self, job_id: int, number: int, note: str) -> None:
        with self._tx("editing a trial's note") as conn:
            conn.execute(update(Trial).where(Trial.job_id == job_id, Trial.number == number)
                         .values(note=note))

    def delete_job(self, job_id: int) -> bool:
        """Deletes the job with its trials and measurements (and its Optuna study, if any);
        False if there was no such job. A queued or running job must be cancelled first."""
        with self._tx("deleting a job") as conn:
            row = conn.execute(select(Job.status, Job.study_name)
                               .where(Job.id == job_id)).first()
            if row is None:
                return False
            if row.status in ("queued", "running"):
                from porter.errors import StoreError
                raise StoreError(f"job {job_id} is {row.status}: cancel it first")
            ids = select(Trial.id).where(Trial.job_id == job_id)
            conn.execute(delete(Measurement).where(Measurement.trial_id.in_(ids)))
            conn.execute(delete(Trial).where(Trial.job_id == job_id))
            conn.execute(delete(Job).where(Job.id == job_id))
        if row.study_name:
            import optuna
            try:
                optuna.delete_study(study_name=row.study_name, storage=self.optuna_storage())
            except KeyError:  # no study was ever stored for this job
                pass
        return True


def _trial_dict(r, extra) -> dict[str, Any]:
    return {"id": r.id, "number": r.number, "status": r.status, "objective": r.objective,
            "ratio": extra.ratio if extra else None, "gbps": extra.gbps if extra else None,
            "tflops": extra.tflops if extra else None, "registers": r.registers,
            "smem_bytes": r.smem_bytes, "spill_bytes": r.spill_bytes,
            "compile_seconds": r.compile_seconds, "started_at": r.started_at,
            "finished_at": r.finished_at, "message": r.message or "", "note": r.note or "",
            "reused_from": (r.reused_job, r.reused_number) if r.reused_job is not None
            else None, "origin": r.origin or "", "params": r.params or {}}
