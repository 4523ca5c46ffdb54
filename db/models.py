"""The schema: porter's tables, prefixed `porter_` because Optuna keeps its own tables (`studies`,
`trials`, ... and `alembic_version`) in the same database.

Times are unix seconds (double precision), as in porter.records, so values round-trip exactly on
SQLite and PostgreSQL. A measurement's size is text such as "4096x4096x4096" so that the
leaderboard can group by it in SQL. The initial migration (db/migrations/versions) creates exactly
these tables; tests/test_db.py checks that the two agree.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import (JSON, Boolean, Double, ForeignKey, Index, Integer, LargeBinary, MetaData,
                        String, Text, UniqueConstraint)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# JSONB on PostgreSQL (comparable, indexable), JSON text elsewhere
JsonType = JSON().with_variant(JSONB(), "postgresql")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Template(Base):
    """A template as a job received it (a snapshot of its folder); jobs refer to it by hash, so a
    template that changes later never rewrites the history of earlier jobs."""
    __tablename__ = "porter_templates"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    version: Mapped[str] = mapped_column(String(50), default="")
    source: Mapped[str] = mapped_column(Text)
    space_text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Double)
    # the whole template folder (porter.spec.snapshot); source_hash is its content hash
    files: Mapped[bytes | None] = mapped_column(LargeBinary)


class Job(Base):
    __tablename__ = "porter_jobs"
    __table_args__ = (Index(None, "template_name", "arch"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JsonType)
    template_name: Mapped[str] = mapped_column(String(200))
    template_hash: Mapped[str] = mapped_column(
        String(64), ForeignKey("porter_templates.source_hash"))
    arch: Mapped[str] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20), index=True)
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Double)
    started_at: Mapped[float | None] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double)
    study_name: Mapped[str] = mapped_column(String(200), default="")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    heartbeat_at: Mapped[float | None] = mapped_column(Double)
    # what people call the job and what they noted about it (the dashboard edits both)
    name: Mapped[str] = mapped_column(String(200), default="", server_default="")
    notes: Mapped[str] = mapped_column(Text, default="", server_default="")


class Trial(Base):
    """One proposed configuration of one job, in exactly one final status. (job_id, number) is
    unique: a redelivered task cannot record the same trial twice."""
    __tablename__ = "porter_trials"
    __table_args__ = (
        UniqueConstraint("job_id", "number"),
        Index(None, "job_id", "status"),
        Index(None, "job_id", "objective"),
        Index(None, "measure_key", "config_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("porter_jobs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column(JsonType)
    config_key: Mapped[str] = mapped_column(String(500))
    status: Mapped[str] = mapped_column(String(30))
    message: Mapped[str] = mapped_column(Text, default="")
    backend: Mapped[str] = mapped_column(String(30), default="gpu")
    objective: Mapped[float | None] = mapped_column(Double)
    compile_seconds: Mapped[float | None] = mapped_column(Double)
    compile_log: Mapped[str] = mapped_column(Text, default="")
    registers: Mapped[int | None] = mapped_column(Integer)
    smem_bytes: Mapped[int | None] = mapped_column(Integer)
    spill_bytes: Mapped[int | None] = mapped_column(Integer)
    stack_frame: Mapped[int | None] = mapped_column(Integer)
    cubin_key: Mapped[str | None] = mapped_column(String(200))
    device: Mapped[dict[str, Any]] = mapped_column(JsonType)
    started_at: Mapped[float | None] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double)
    worker: Mapped[str] = mapped_column(String(200), default="")
    note: Mapped[str] = mapped_column(Text, default="", server_default="")
    # the measurement cache (porter.job.cache): the identity the trial was measured under, and
    # for a trial that reuses another job's measurement, that trial's job and number (a plain
    # link, kept when that job is deleted)
    measure_key: Mapped[str | None] = mapped_column(String(64))
    reused_job: Mapped[int | None] = mapped_column(Integer)
    reused_number: Mapped[int | None] = mapped_column(Integer)
    # where the configuration came from (TrialRecord.origin): the search or a warm start's source
    origin: Mapped[str] = mapped_column(String(300), default="", server_default="")


class Measurement(Base):
    """One problem size of one trial."""
    __tablename__ = "porter_measurements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("porter_trials.id", ondelete="CASCADE"), index=True)
    size: Mapped[str] = mapped_column(String(100))
    ours_ms: Mapped[float] = mapped_column(Double)
    ours_spread: Mapped[float] = mapped_column(Double, default=0.0)
    baseline: Mapped[str] = mapped_column(String(100), default="")
    baseline_ms: Mapped[float | None] = mapped_column(Double)
    ratio: Mapped[float | None] = mapped_column(Double)
    error: Mapped[float | None] = mapped_column(Double)
    tflops: Mapped[float | None] = mapped_column(Double)
    gbps: Mapped[float | None] = mapped_column(Double)


def size_text(size: tuple[int, ...]) -> str:
    return "x".join(str(int(x)) for x in size)


def parse_size(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("x")) if text else ()
