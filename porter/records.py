"""The values that flow between porter's steps and the store: job specs and trial records.

Plain frozen dataclasses; the store (db/) persists them, the engine and workers create them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# DESIGN.md's statuses, plus `compiled` for compile-only runs (no GPU for the architecture)
STATUSES = ("infeasible", "compile_failed", "resource_rejected", "launch_failed", "wrong_result",
            "timeout", "crashed", "measured", "compiled")
# statuses an evaluation of the variant ended in: a trial in one of them is a measurement that a
# later job of the same measurement identity reuses (porter.job.cache); `infeasible` costs nothing
# to decide again and `compiled` measured nothing
REUSABLE_STATUSES = ("compile_failed", "resource_rejected", "launch_failed", "wrong_result",
                     "timeout", "crashed", "measured")
JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled", "interrupted")
BACKENDS = ("gpu", "compile-only", "replay")
from porter.search.base import SAMPLER_NAMES as SAMPLERS  # noqa: E402  (live: the registry's names)


@dataclass(frozen=True)
class JobSpec:
    template: str                    # name, or path of a template folder
    arch: str
    sizes: tuple[tuple[int, ...], ...]
    trials: int | None = None        # budget in trials ...
    minutes: float | None = None     # ... or in minutes (the first reached ends the job)
    sampler: str = "auto"
    seed: int = 0
    backend: str = "gpu"
    replay: str | None = None        # replay source: a Kernel Tuner cache or a porter recording
    from_arch: str | None = None     # warm start from the best configurations on this arch
    from_job: int | None = None
    # multiprocessors of the target product where it differs from the architecture table's
    # (compile-only ports for, say, an H100 PCIe); a GPU backend uses its device's own count
    sms: int | None = None
    # measure every configuration again instead of reusing earlier jobs' measurements of the
    # same identity (porter.job.cache)
    fresh: bool = False
    # start from the template's own seeds only, not from the nearest sizes that jobs of the
    # template tuned before (porter.job.run.near_size_configs)
    cold: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sizes"] = [list(s) for s in self.sizes]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "JobSpec":
        d = dict(d)
        d["sizes"] = tuple(tuple(int(x) for x in s) for s in d["sizes"])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Measurement:
    """One problem size of one trial. Times in milliseconds (event medians)."""
    size: tuple[int, ...]
    ours_ms: float
    ours_spread: float = 0.0          # (p90 - p10) / median over repeats
    baseline: str = ""                # e.g. "cublas(cupy)"
    baseline_ms: float | None = None
    ratio: float | None = None        # baseline_ms / ours_ms
    error: float | None = None        # ||out - ref|| / ||ref||
    tflops: float | None = None
    gbps: float | None = None


@dataclass(frozen=True)
class TrialRecord:
    number: int                        # the job's trial number (Optuna's when it proposed it)
    params: dict[str, Any]
    config_key: str
    status: str
    message: str = ""
    backend: str = "gpu"
    objective: float | None = None     # geometric mean of ours/baseline (or ms); lower is better
    compile_seconds: float | None = None
    compile_log: str = ""
    registers: int | None = None
    smem_bytes: int | None = None      # static + dynamic at the job's first size
    spill_bytes: int | None = None
    stack_frame: int | None = None
    cubin_key: str | None = None
    measurements: tuple[Measurement, ...] = ()
    device: dict[str, Any] = field(default_factory=dict)
    started_at: float | None = None    # unix seconds
    finished_at: float | None = None
    worker: str = ""
    # the measurement's identity (porter.job.cache.measure_key; None: not reusable, e.g.
    # compile-only), and for a reused trial the (job id, trial number) it was measured as
    measure_key: str | None = None
    reused_from: tuple[int, int] | None = None
    # where the configuration came from: the search ("search (auto)"), the study's queue, or
    # the warm start's source ("vendor kernel nvjet_...", "nearest tuned sizes (...)", "job 3's
    # best", "template default", ...; porter.job.loop run_job)
    origin: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown trial status {self.status!r}")
