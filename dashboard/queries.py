"""The dashboard's reads: SQLAlchemy queries over db.models, returned as pandas frames.

Counts, bests and per-trial ratios come from the database (db.queries' aggregates where they
exist); pandas only reshapes. Every function takes a Connection, so a page opens one per render.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import pandas as pd
from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from db import queries as dbq
from db.engine import get_engine, normalize_url, translate
from db.models import Job, Measurement, Template, Trial
from db.store import open_store

FAILED = ("compile_failed", "resource_rejected", "launch_failed", "wrong_result", "timeout",
          "crashed")


def store_for(url: str):
    """The SqlStore on `url` (migrated on first use in this process)."""
    return open_store(url)


@contextmanager
def connect(url: str) -> Iterator[Connection]:
    url = normalize_url(url)
    open_store(url)  # migrate once per process; a fresh database shows empty pages
    with translate("reading the dashboard's data", url), get_engine(url).connect() as conn:
        yield conn


def jobs(conn: Connection, limit: int = 200) -> pd.DataFrame:
    """The newest jobs with progress: trials done against the budget, measured, best ratio."""
    rows = conn.execute(select(Job.id, Job.template_name, Job.arch, Job.status, Job.spec,
                               Job.message, Job.created_at, Job.started_at, Job.finished_at)
                        .order_by(Job.id.desc()).limit(limit)).all()
    stats = dbq.job_stats(conn, [r.id for r in rows])
    out = []
    for r in rows:
        s = stats.get(r.id, dbq.JobStats())
        budget = (r.spec or {}).get("trials")
        out.append({"job": r.id, "template": r.template_name, "arch": r.arch,
                    "backend": (r.spec or {}).get("backend", ""), "status": r.status,
                    "trials": s.n_trials, "budget": budget,
                    "progress": min(1.0, s.n_trials / budget) if budget else None,
                    "measured": s.n_measured, "best_ratio": s.best_ratio,
                    "best_objective": s.best_objective,
                    "created": pd.to_datetime(r.created_at, unit="s"),
                    "minutes": ((r.finished_at or _now()) - r.started_at) / 60
                    if r.started_at else None,
                    "message": r.message})
    return pd.DataFrame(out, columns=["job", "template", "arch", "backend", "status", "trials",
                                      "budget", "progress", "measured", "best_ratio",
                                      "best_objective", "created", "minutes", "message"])


def _now() -> float:
    import time
    return time.time()


def job_row(conn: Connection, job_id: int):
    return conn.execute(select(Job.__table__).where(Job.id == job_id)).first()


def job_ids(conn: Connection, limit: int = 500) -> list[tuple[int, str]]:
    rows = conn.execute(select(Job.id, Job.template_name, Job.arch, Job.status)
                        .order_by(Job.id.desc()).limit(limit)).all()
    return [(r.id, f"{r.id}: {r.template_name} on {r.arch} ({r.status})") for r in rows]


def trials(conn: Connection, job_id: int) -> pd.DataFrame:
    """One row per trial: number, status, objective, end time, resources, and the geometric
    mean ratio over its sizes (from the database)."""
    tr = dbq.trial_ratios(Trial.job_id == job_id).subquery("tr")
    rows = conn.execute(
        select(Trial.number, Trial.status, Trial.objective, Trial.params, Trial.started_at,
               Trial.finished_at, Trial.registers, Trial.smem_bytes, Trial.spill_bytes,
               Trial.compile_seconds, tr.c.ratio)
        .outerjoin(tr, tr.c.trial_id == Trial.id)
        .where(Trial.job_id == job_id).order_by(Trial.number)).all()
    df = pd.DataFrame([r._asdict() for r in rows],
                      columns=["number", "status", "objective", "params", "started_at",
                               "finished_at", "registers", "smem_bytes", "spill_bytes",
                               "compile_seconds", "ratio"])
    return df


def convergence(df: pd.DataFrame) -> pd.DataFrame:
    """Best-so-far objective and ratio by trial order and by elapsed minutes."""
    if df.empty:
        return df.assign(best_objective=[], best_ratio=[], minutes=[])
    d = df.sort_values("finished_at", kind="stable").reset_index(drop=True)
    obj = d["objective"].where(d["status"].isin(("measured", "compiled")))
    d["best_objective"] = obj.cummin()
    d["best_ratio"] = d["ratio"].where(d["status"] == "measured").cummax()
    t0 = d["started_at"].min()
    d["minutes"] = (d["finished_at"] - t0) / 60 if pd.notna(t0) else None
    d["index"] = range(1, len(d) + 1)
    return d


def param_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Measured trials with one column per parameter, plus objective and ratio."""
    m = df[df["status"] == "measured"]
    if m.empty:
        return pd.DataFrame()
    p = pd.DataFrame(list(m["params"]), index=m.index)
    return pd.concat([m[["number", "objective", "ratio"]], p], axis=1)


def importance(pf: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """A cheap stand-in for fANOVA: for each parameter, the share of the variance of
    log(objective) explained by its values (one-way ANOVA's eta squared)."""
    if pf.empty or len(pf) < 3:
        return pd.DataFrame(columns=["param", "importance"])
    y = pf["objective"].clip(lower=1e-30).map(math.log)
    total = float(((y - y.mean()) ** 2).sum()) or 1.0
    rows = []
    for n in names:
        if n not in pf:
            continue
        g = y.groupby(pf[n].astype(str))
        between = float((g.count() * (g.mean() - y.mean()) ** 2).sum())
        rows.append({"param": n, "importance": between / total})
    return pd.DataFrame(rows).sort_values("importance", ascending=False)


def status_counts(conn: Connection, job_id: int) -> dict[str, int]:
    return dbq.status_counts(conn, job_id)


def failures(conn: Connection, job_id: int, limit: int = 50) -> pd.DataFrame:
    rows = conn.execute(select(Trial.number, Trial.status, Trial.params, Trial.message,
                               Trial.compile_log)
                        .where(Trial.job_id == job_id, Trial.status.in_(FAILED))
                        .order_by(Trial.number).limit(limit)).all()
    return pd.DataFrame([r._asdict() for r in rows],
                        columns=["number", "status", "params", "message", "compile_log"])


def top_configs(conn: Connection, job_id: int, n: int = 10) -> pd.DataFrame:
    """The n best trials, one row per size; a compile-only job's compiled trials (no
    objective) come in trial order."""
    order = (Trial.objective.asc().nulls_last(), Trial.number)
    best = (select(Trial.id).where(Trial.job_id == job_id,
                                   Trial.status.in_(("measured", "compiled")))
            .order_by(*order).limit(n).subquery())
    rows = conn.execute(
        select(Trial.number, Trial.status, Trial.objective, Trial.params, Trial.registers,
               Trial.smem_bytes, Trial.spill_bytes, Measurement.size, Measurement.ours_ms,
               Measurement.baseline, Measurement.baseline_ms, Measurement.ratio,
               Measurement.tflops, Measurement.gbps)
        .join(best, best.c.id == Trial.id)
        .outerjoin(Measurement, Measurement.trial_id == Trial.id)
        .order_by(*order, Measurement.id)).all()
    df = pd.DataFrame([r._asdict() for r in rows],
                      columns=["number", "status", "objective", "params", "registers",
                               "smem_bytes", "spill_bytes", "size", "ours_ms", "baseline",
                               "baseline_ms", "ratio", "tflops", "gbps"])
    if not df.empty:
        df["params"] = df["params"].map(lambda p: " ".join(f"{k}={v}" for k, v in p.items()))
    return df


def template_source(conn: Connection, source_hash: str) -> tuple[str, str] | None:
    row = conn.execute(select(Template.source, Template.space_text)
                       .where(Template.source_hash == source_hash)).first()
    return (row.source, row.space_text) if row else None


def leaderboard(conn: Connection, template: str | None = None,
                arch: str | None = None) -> pd.DataFrame:
    """db.queries.leaderboard as a frame: the best measured trial per (template, arch, size)."""
    rows = dbq.leaderboard(conn, template, arch)
    return pd.DataFrame([{
        "template": b.template, "arch": b.arch, "size": "x".join(map(str, b.size)),
        "ratio": b.ratio, "ours_ms": b.ours_ms, "baseline": b.baseline,
        "baseline_ms": b.baseline_ms, "tflops": b.tflops, "gbps": b.gbps,
        "registers": b.registers, "smem_bytes": b.smem_bytes, "job": b.job_id,
        "trial": b.trial_number, "gpu": (b.device or {}).get("gpu", ""),
        "params": b.params,
        "config": " ".join(f"{k}={v}" for k, v in b.params.items())} for b in rows],
        columns=["template", "arch", "size", "ratio", "ours_ms", "baseline", "baseline_ms",
                 "tflops", "gbps", "registers", "smem_bytes", "job", "trial", "gpu", "params",
                 "config"])


def templates_and_archs(conn: Connection) -> dict[str, list[str]]:
    rows = conn.execute(select(Job.template_name, Job.arch).distinct()
                        .order_by(Job.template_name, Job.arch)).all()
    out: dict[str, list[str]] = {}
    for t, a in rows:
        out.setdefault(t, []).append(a)
    return out


def compare(conn: Connection, template: str, arch_a: str, arch_b: str) -> pd.DataFrame:
    """Per size, the best of `template` on two architectures: times, the speedup of B over A
    (ms_A / ms_B; different GPUs, so this compares the hardware as much as the port), each
    one's ratio to its own vendor baseline, and the parameters whose tuned values differ."""
    a = leaderboard(conn, template, arch_a).set_index("size")
    b = leaderboard(conn, template, arch_b).set_index("size")
    rows = []
    for size in sorted(set(a.index) | set(b.index)):
        ra = a.loc[size] if size in a.index else None
        rb = b.loc[size] if size in b.index else None
        moved = []
        if ra is not None and rb is not None:
            pa, pb = ra["params"], rb["params"]
            moved = [f"{k}: {pa.get(k)} -> {pb.get(k)}" for k in pa if pa.get(k) != pb.get(k)]
        rows.append({
            "size": size,
            f"ms {arch_a}": None if ra is None else ra["ours_ms"],
            f"ms {arch_b}": None if rb is None else rb["ours_ms"],
            "speedup": (ra["ours_ms"] / rb["ours_ms"]) if ra is not None and rb is not None
            else None,
            f"ratio {arch_a}": None if ra is None else ra["ratio"],
            f"ratio {arch_b}": None if rb is None else rb["ratio"],
            "params moved": ", ".join(moved) if moved else ("-" if ra is not None and
                                                            rb is not None else "n/a"),
        })
    return pd.DataFrame(rows)


def active_jobs(conn: Connection) -> int:
    """How many jobs are queued or running (the Jobs page refreshes itself while any are)."""
    return int(conn.execute(select(func.count()).select_from(Job)
                            .where(Job.status.in_(("queued", "running")))).scalar() or 0)


def trial_count(conn: Connection) -> int:
    return int(conn.execute(select(func.count()).select_from(Trial)).scalar() or 0)
