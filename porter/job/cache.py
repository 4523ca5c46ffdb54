"""The measurement cache across jobs: a configuration already measured under the same identity is
reused by a later job (recorded with a link to the trial that measured it) unless that job asks
for fresh measurements (`JobSpec.fresh`, `porter port --fresh`).

A measurement's identity (`measure_key`) is everything that changes its figure besides the
configuration: the template snapshot (its content hash: source, space file, headers, op), the
architecture and the multiprocessor count the launch geometry saw, the GPU model, the problem
sizes in the job's order, the measurement protocol (porter.measure.HARNESS_VERSION), the kind of
backend and, where it compiles, the compiler's version; for a replay backend, the recording's
content (a replayed figure is never reused as a real GPU's, nor one recording's as another's).
The compile-only backend measures nothing and has no identity.

The store keeps the cache: every trial row carries its identity, and a lookup returns the newest
trial of another job with that identity and configuration in a reusable status
(porter.records.REUSABLE_STATUSES) that was itself measured, not reused.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

from porter.measure import HARNESS_VERSION
from porter.measure.backends.base import Backend
from porter.records import TrialRecord
from porter.spec.arch import Arch
from porter.spec.template import Template

MEASURING_BACKENDS = ("gpu", "replay")
# configurations a job without a trial budget (--minutes only) takes from the cache at its start
UNBUDGETED_REUSE = 1000


def measure_key(tpl: Template, arch: Arch, backend: Backend, sizes) -> str | None:
    """The identity of the measurements `backend` makes of `tpl` on `arch` at `sizes` (a hex
    digest), or None where the backend measures nothing. Asks a GPU backend for its device
    (which starts its measuring process)."""
    if backend.name not in MEASURING_BACKENDS:
        return None
    device = backend.device_info()
    ident = {
        "harness": HARNESS_VERSION, "template": tpl.source_hash, "op": tpl.op,
        "arch": arch.name, "sms": arch.sms, "sizes": [[int(x) for x in s] for s in sizes],
        "backend": backend.name, "gpu": str(device.get("gpu", "")),
        "compiler": _compiler() if backend.needs_compile else "",
        "source": _source_hash(backend),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def reused_record(cached: TrialRecord, number: int, started: float, worker: str) -> TrialRecord:
    """The record of trial `number` of this job that reuses `cached` (a store's cached_trial):
    the original's status, figures, resources, logs and device; this job's number, times and
    worker; nothing compiled here."""
    if cached.reused_from is None:
        raise ValueError("a reused trial needs the (job, trial) it was measured as")
    return dataclasses.replace(cached, number=number, started_at=started,
                               finished_at=time.time(), worker=worker, compile_seconds=None)


def reuse_limit(budget: int | None) -> int:
    """How many cached configurations a job takes first: its trial budget, or UNBUDGETED_REUSE
    for a job with a deadline only."""
    return budget if budget is not None else UNBUDGETED_REUSE


def _compiler() -> str:
    from porter.build.compile import nvrtc_version
    try:
        return nvrtc_version()
    except Exception:  # noqa: BLE001 - no NVRTC here: the compile of every trial says so
        return "unknown"


def _source_hash(backend: Backend) -> str:
    from porter.measure.backends.replay import ReplayBackend
    if not isinstance(backend, ReplayBackend):
        return ""
    return hashlib.sha256(Path(backend.source).read_bytes()).hexdigest()
