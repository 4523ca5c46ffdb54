"""Rows to porter's values and back: the column lists the store reads, and the mappers between
SQLAlchemy rows and JobInfo / TrialRecord / Measurement."""
from __future__ import annotations

from typing import Any, Iterable

from sqlalchemy.engine import Row

from porter.records import JobSpec, Measurement as MeasurementRecord, TrialRecord
from porter.store.base import JobInfo

from . import queries
from .models import Measurement, Trial, parse_size, size_text

_TRIAL_COLS = (Trial.id, Trial.number, Trial.params, Trial.config_key, Trial.status,
               Trial.message, Trial.backend, Trial.objective, Trial.compile_seconds,
               Trial.compile_log, Trial.registers, Trial.smem_bytes, Trial.spill_bytes,
               Trial.stack_frame, Trial.cubin_key, Trial.device, Trial.started_at,
               Trial.finished_at, Trial.worker, Trial.measure_key, Trial.reused_job,
               Trial.reused_number, Trial.origin)
_MEAS_COLS = (Measurement.trial_id, Measurement.size, Measurement.ours_ms,
              Measurement.ours_spread, Measurement.baseline, Measurement.baseline_ms,
              Measurement.ratio, Measurement.error, Measurement.tflops, Measurement.gbps)


def _job_info(job: Row, stats: queries.JobStats | None) -> JobInfo:
    stats = stats or queries.JobStats()
    return JobInfo(
        id=job.id, spec=JobSpec.from_dict(job.spec), status=job.status,
        template_name=job.template_name, template_hash=job.template_hash,
        message=job.message, created_at=job.created_at, started_at=job.started_at,
        finished_at=job.finished_at, n_trials=stats.n_trials, n_measured=stats.n_measured,
        best_objective=stats.best_objective, best_ratio=stats.best_ratio,
        n_reused=stats.n_reused, study_name=job.study_name,
        extra={"arch": job.arch, "cancel_requested": bool(job.cancel_requested),
               "heartbeat_at": job.heartbeat_at})


def _trial_values(t: TrialRecord) -> dict[str, Any]:
    return dict(number=t.number, params=dict(t.params), config_key=t.config_key,
                status=t.status, message=t.message, backend=t.backend, objective=t.objective,
                compile_seconds=t.compile_seconds, compile_log=t.compile_log,
                registers=t.registers, smem_bytes=t.smem_bytes, spill_bytes=t.spill_bytes,
                stack_frame=t.stack_frame, cubin_key=t.cubin_key, device=dict(t.device),
                started_at=t.started_at, finished_at=t.finished_at, worker=t.worker,
                measure_key=t.measure_key,
                reused_job=t.reused_from[0] if t.reused_from else None,
                reused_number=t.reused_from[1] if t.reused_from else None,
                origin=t.origin[:300])


def _measurement_values(trial_id: int, m: MeasurementRecord) -> dict[str, Any]:
    return dict(trial_id=trial_id, size=size_text(m.size), ours_ms=m.ours_ms,
                ours_spread=m.ours_spread, baseline=m.baseline, baseline_ms=m.baseline_ms,
                ratio=m.ratio, error=m.error, tflops=m.tflops, gbps=m.gbps)


def _trial_records(rows: Iterable[Row], meas: Iterable[Row]) -> list[TrialRecord]:
    by_trial: dict[int, list[MeasurementRecord]] = {}
    for m in meas:
        by_trial.setdefault(m.trial_id, []).append(MeasurementRecord(
            size=parse_size(m.size), ours_ms=m.ours_ms, ours_spread=m.ours_spread,
            baseline=m.baseline, baseline_ms=m.baseline_ms, ratio=m.ratio, error=m.error,
            tflops=m.tflops, gbps=m.gbps))
    return [TrialRecord(
        number=r.number, params=r.params, config_key=r.config_key, status=r.status,
        message=r.message, backend=r.backend, objective=r.objective,
        compile_seconds=r.compile_seconds, compile_log=r.compile_log, registers=r.registers,
        smem_bytes=r.smem_bytes, spill_bytes=r.spill_bytes, stack_frame=r.stack_frame,
        cubin_key=r.cubin_key, measurements=tuple(by_trial.get(r.id, ())),
        device=r.device or {}, started_at=r.started_at, finished_at=r.finished_at,
        worker=r.worker, measure_key=r.measure_key,
        reused_from=(r.reused_job, r.reused_number) if r.reused_job is not None else None,
        origin=r.origin or "")
        for r in rows]
