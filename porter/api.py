"""Kernel Porter's Python API; the `porter` command is a thin layer over it.

    import porter
    job = porter.port("gemm_wgmma", arch="sm_90a", sizes=["4096x4096x4096"], trials=200)
    job.best()                 # the best configuration and its figures
    job.trials()               # every trial, one row per (trial, size): a pandas DataFrame
    job.export("torch", "out/")

`porter.submit(...)` records a job for the service's workers instead (`job.wait()` follows it);
`porter.get_job(ID)` opens a recorded one. Mistakes a user can make raise PorterError with one line
that says what to fix; nothing is recorded then.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from porter.errors import PorterError

_DONE = ("done", "failed", "cancelled", "interrupted")


def _sizes(sizes) -> list[str] | None:
    """Sizes as the spec parser takes them: '4096x4096x4096', (4096, 4096, 4096) or a list."""
    if sizes is None:
        return None
    if isinstance(sizes, str) or (isinstance(sizes, Sequence) and sizes and
                                  all(isinstance(x, int) for x in sizes)):
        sizes = [sizes]
    return [s if isinstance(s, str) else "x".join(str(int(x)) for x in s) for s in sizes]


def _dirs(templates_dir) -> list[Path] | None:
    if templates_dir is None:
        return None
    if isinstance(templates_dir, (str, Path)):
        return [Path(templates_dir)]
    return [Path(d) for d in templates_dir]


class Job:
    """A recorded porting job: its state is read from the store on each call."""

    def __init__(self, job_id: int, db: str | None = None, summary: Any = None):
        self.id, self.db, self.summary = int(job_id), db, summary
        self._store = None

    def __repr__(self) -> str:
        info = self.info
        return (f"<porter.Job {self.id}: {info.template_name} on {info.spec.arch}, {info.status}, "
                f"{info.n_trials} trials>")

    @property
    def store(self):
        if self._store is None:
            from porter.store.base import open_store
            self._store = open_store(self.db)
        return self._store

    @property
    def info(self):
        """The job's JobInfo (spec, status, counts, best ratio)."""
        return self.store.get_job(self.id)

    @property
    def status(self) -> str:
        return self.info.status

    def best(self, n: int | None = None):
        """The best trial as a dict (params, objective, per-size measurements); with n, a list
        of the n best."""
        rows = [_trial_dict(t) for t in self.store.best_trials(self.id, n or 1)]
        if n is None:
            if not rows:
                raise PorterError(f"job {self.id} has no measured or compiled trial yet")
            return rows[0]
        return rows

    def trials(self, status: str | None = None):
        """Every trial (optionally of one status) as a pandas DataFrame: one row per trial and
        problem size, the parameters as columns, then ours_ms, baseline_ms, ratio, tflops,
        gbps (empty for trials that were not measured)."""
        try:
            import pandas as pd
        except ImportError:
            raise PorterError("Job.trials() returns a pandas DataFrame: pip install pandas") \
                from None
        records = []
        for t in self.store.trials(self.id, status):
            base = {"trial": t.number, "status": t.status,
                    "reused_from": _reused(t), "origin": t.origin, **t.params,
                    "objective": t.objective, "registers": t.registers,
                    "smem_bytes": t.smem_bytes, "compile_s": t.compile_seconds,
                    "message": t.message}
            if not t.measurements:
                records.append({**base, "size": None})
            for m in t.measurements:
                records.append({**base, "size": "x".join(map(str, m.size)),
                                "ours_ms": m.ours_ms, "baseline": m.baseline,
                                "baseline_ms": m.baseline_ms, "ratio": m.ratio,
                                "tflops": m.tflops, "gbps": m.gbps, "error": m.error})
        return pd.DataFrame.from_records(records)

    def export(self, fmt: str = "cu", path: str | Path = "export") -> list[Path]:
        """Writes the tuned kernels in `fmt` (cu, cubin, ptx, fatbin, python, torch, header,
        json, kt-cache) under `path`, with manifest.json; returns the paths written."""
        from porter.export.export import export
        return export(self.store, self.id, fmt, path)

    def wait(self, timeout: float | None = None, poll: float = 2.0) -> "Job":
        """Blocks until the job is done, failed or cancelled (a submitted job)."""
        t0 = time.monotonic()
        while self.status not in _DONE:
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise TimeoutError(f"job {self.id} still {self.status} after {timeout} s")
            time.sleep(poll)
        return self

    def cancel(self) -> None:
        """Asks a service job to stop (it stops within one trial)."""
        from porter.store.base import plugin
        plugin("service")().cancel(self.id, self.db)


def _reused(t) -> str | None:
    """'job J trial N' for a trial that reuses that trial's measurement, else None."""
    return f"job {t.reused_from[0]} trial {t.reused_from[1]}" if t.reused_from else None


def _trial_dict(t) -> dict:
    return {"trial": t.number, "status": t.status, "params": dict(t.params),
            "reused_from": list(t.reused_from) if t.reused_from else None,
            "origin": t.origin, "objective": t.objective, "registers": t.registers,
            "smem_bytes": t.smem_bytes,
            "measurements": [{"size": list(m.size), "ours_ms": m.ours_ms,
                              "baseline": m.baseline, "baseline_ms": m.baseline_ms,
                              "ratio": m.ratio, "tflops": m.tflops, "gbps": m.gbps}
                             for m in t.measurements]}


def port(template: str, arch: str, sizes: Iterable | str | None = None,
         trials: int | None = None, minutes: float | None = None, *, sampler: str = "auto",
         seed: int = 0, backend: str = "gpu", replay: str | Path | None = None,
         from_arch: str | None = None, from_job: int | None = None, resume: int | None = None,
         workers: int | None = None, db: str | None = None, templates_dir=None,
         progress: bool = True, console=None, fresh: bool = False, cold: bool = False,
         **options) -> Job:
    """Runs a porting job here and now (like `porter port`) and returns it when it ends.
    template: a name or a template folder; sizes: '4096x4096x4096', a tuple, or a list of
    either; backend: gpu, compile-only or replay (with replay=FILE). progress=False keeps it
    quiet; `console` may be a rich Console to print to. fresh=True measures every
    configuration again instead of reusing earlier jobs' measurements of the same template
    snapshot, architecture, GPU, sizes and harness (porter.job.cache). cold=True starts from
    the template's own seeds only, not from the nearest sizes its earlier jobs tuned on the
    architecture (porter.job.run.near_size_configs) nor the vendor's own kernel
    (porter.job.run.vendor_configs). Further options (e.g.
    trust_template_code=True) go to the engine's port_here as keywords."""
    from rich.console import Console
    from porter.job.run import port_here
    console = console or Console(quiet=not progress)
    job_id, summary = port_here(template, arch, _sizes(sizes), trials, minutes, sampler, seed,
                                backend, str(replay) if replay else None, from_arch, from_job,
                                resume, workers, db, _dirs(templates_dir), console,
                                fresh=fresh, cold=cold, **options)
    return Job(job_id, db, summary)


def submit(template: str, arch: str, sizes: Iterable | str | None = None,
           trials: int | None = None, minutes: float | None = None, *, sampler: str = "auto",
           seed: int = 0, backend: str = "gpu", replay: str | Path | None = None,
           from_arch: str | None = None, from_job: int | None = None, db: str | None = None,
           templates_dir=None, fresh: bool = False, cold: bool = False) -> Job:
    """Records a job and queues it for the service's workers (like `porter submit`); returns
    it at once (`.wait()` follows it). fresh=True: measure everything again; cold=True: no
    warm start from the nearest tuned sizes (see port)."""
    from porter.job.jobs import make_spec
    from porter.store.base import plugin
    spec, _, _ = make_spec(template, arch, _sizes(sizes), trials, minutes, sampler, seed,
                           backend, str(replay) if replay else None, from_arch, from_job,
                           _dirs(templates_dir), service=True, fresh=fresh,
                           cold=cold)
    return Job(plugin("service")().submit(spec, db), db)


def get_job(job_id: int, db: str | None = None) -> Job:
    """A recorded job by id (PorterError if there is none)."""
    j = Job(job_id, db)
    j.info                      # noqa: B018 - raises the store's one-line error for a bad id
    return j


def jobs(db: str | None = None, limit: int | None = 50) -> list[Job]:
    """The recorded jobs, newest first."""
    from porter.store.base import open_store
    return [Job(j.id, db) for j in open_store(db).list_jobs(limit)]
