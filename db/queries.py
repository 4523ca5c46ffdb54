"""The aggregate queries (job summaries, progress, leaderboard) and the rows they return. Every
best-of and count is computed by the database; Python only maps rows to values."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from sqlalchemy import Select, case, func, select
from sqlalchemy.engine import Connection

from .models import Job, Measurement, Trial, parse_size

MEASURED = "measured"


@dataclass(frozen=True)
class JobStats:
    n_trials: int = 0
    n_measured: int = 0
    best_objective: float | None = None
    best_ratio: float | None = None
    n_reused: int = 0


@dataclass(frozen=True)
class JobProgress:
    """Where a job stands: trials per status, and the best so far."""
    job_id: int
    status: str
    counts: dict[str, int] = field(default_factory=dict)
    n_trials: int = 0
    best_objective: float | None = None
    best_ratio: float | None = None
    cancel_requested: bool = False
    heartbeat_at: float | None = None


@dataclass(frozen=True)
class BestConfig:
    """The best measured trial of one (template, arch, size) over all jobs: the highest ratio to
    the vendor baseline, then the lowest time (trials without a baseline rank after those with
    one)."""
    template: str
    arch: str
    size: tuple[int, ...]
    job_id: int
    trial_number: int
    template_hash: str
    params: dict[str, Any]
    config_key: str
    ours_ms: float
    ours_spread: float
    baseline: str
    baseline_ms: float | None
    ratio: float | None
    error: float | None
    tflops: float | None
    gbps: float | None
    registers: int | None
    smem_bytes: int | None
    device: dict[str, Any]


def trial_ratios(*where) -> Select:
    """Per trial (of the trials matching `where`), the geometric mean over its sizes of
    baseline_ms / ours_ms."""
    return (select(Trial.job_id, Trial.id.label("trial_id"),
                   func.exp(func.avg(func.ln(Measurement.ratio))).label("ratio"))
            .join(Measurement, Measurement.trial_id == Trial.id)
            .where(Measurement.ratio > 0, *where)
            .group_by(Trial.job_id, Trial.id))


def job_stats(conn: Connection, job_ids: Iterable[int]) -> dict[int, JobStats]:
    """Counts and bests for the given jobs: best_objective is the lowest objective of a measured
    trial; best_ratio the highest per-trial geometric-mean ratio of a measured trial."""
    ids = list(job_ids)
    if not ids:
        return {}
    measured = Trial.status == MEASURED
    counts = conn.execute(
        select(Trial.job_id, func.count(),
               func.sum(case((measured, 1), else_=0)),
               func.min(case((measured, Trial.objective), else_=None)),
               func.sum(case((Trial.reused_job.is_not(None), 1), else_=0)))
        .where(Trial.job_id.in_(ids))
        .group_by(Trial.job_id)).all()
    tr = trial_ratios(Trial.job_id.in_(ids), measured).subquery("trial_ratio")
    ratios = dict(conn.execute(
        select(tr.c.job_id, func.max(tr.c.ratio)).group_by(tr.c.job_id)).all())
    return {job_id: JobStats(int(n), int(n_measured or 0), best, ratios.get(job_id),
                             int(n_reused or 0))
            for job_id, n, n_measured, best, n_reused in counts}


def status_counts(conn: Connection, job_id: int) -> dict[str, int]:
    rows = conn.execute(select(Trial.status, func.count())
                        .where(Trial.job_id == job_id)
                        .group_by(Trial.status)).all()
    return {status: int(n) for status, n in rows}


def leaderboard_query(template: str | None = None, arch: str | None = None) -> Select:
    rank = func.row_number().over(
        partition_by=(Job.template_name, Job.arch, Measurement.size),
        order_by=(Measurement.ratio.desc().nulls_last(), Measurement.ours_ms.asc(),
                  Trial.id.asc()))
    q = (select(Job.template_name, Job.arch, Measurement.size, Job.id.label("job_id"),
                Trial.number, Job.template_hash, Trial.params, Trial.config_key,
                Measurement.ours_ms, Measurement.ours_spread, Measurement.baseline,
                Measurement.baseline_ms, Measurement.ratio, Measurement.error,
                Measurement.tflops, Measurement.gbps, Trial.registers, Trial.smem_bytes,
                Trial.device, rank.label("rank"))
         .join(Trial, Measurement.trial_id == Trial.id)
         .join(Job, Trial.job_id == Job.id)
         .where(Trial.status == MEASURED))
    if template is not None:
        q = q.where(Job.template_name == template)
    if arch is not None:
        q = q.where(Job.arch == arch)
    ranked = q.subquery("ranked")
    cols = [c for c in ranked.c if c.name != "rank"]
    return (select(*cols).where(ranked.c.rank == 1)
            .order_by(ranked.c.template_name, ranked.c.arch, ranked.c.size))


def leaderboard(conn: Connection, template: str | None = None,
                arch: str | None = None) -> list[BestConfig]:
    out = []
    for r in conn.execute(leaderboard_query(template, arch)).mappings():
        out.append(BestConfig(
            template=r["template_name"], arch=r["arch"], size=parse_size(r["size"]),
            job_id=r["job_id"], trial_number=r["number"], template_hash=r["template_hash"],
            params=r["params"], config_key=r["config_key"], ours_ms=r["ours_ms"],
            ours_spread=r["ours_spread"], baseline=r["baseline"],
            baseline_ms=r["baseline_ms"], ratio=r["ratio"], error=r["error"],
            tflops=r["tflops"], gbps=r["gbps"], registers=r["registers"],
            smem_bytes=r["smem_bytes"], device=r["device"] or {}))
    return out
