"""The job loop: propose -> static check -> compile (a process pool, ahead of the GPU) ->
measure and verify (backend) -> record -> tell. Every proposal ends in one recorded status."""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable

from porter.spec.arch import Arch
from porter.measure.backends.base import Backend, Outcome
from porter.build.check import resource_check, search_space, static_check
from porter.build.compile import CompileResult, compile_variant, nvrtc_version
from porter.records import JobSpec, TrialRecord
from porter.search.searcher import Searcher
from porter.store.base import Store
from porter.spec.template import Template

MAX_INFEASIBLE_FACTOR = 20


@dataclass
class JobSummary:
    job_id: int
    status: str
    counts: dict[str, int] = field(default_factory=dict)
    best: TrialRecord | None = None
    wall_s: float = 0.0
    busy_ms: float = 0.0            # GPU time in kernels and baselines
    compile_s: float = 0.0          # summed compile time of fresh (uncached) variants
    compiled: int = 0

    @property
    def gpu_share(self) -> float:
        return self.busy_ms / 1e3 / self.wall_s if self.wall_s else 0.0


def objective(outcome: Outcome) -> float | None:
    """Geometric mean over sizes of ours/baseline (lower is better); ms where no baseline."""
    if outcome.status != "measured" or not outcome.measurements:
        return None
    logs = []
    for m in outcome.measurements:
        rel = m.ours_ms / m.baseline_ms if m.baseline_ms else m.ours_ms
        logs.append(math.log(max(rel, 1e-12)))
    return math.exp(sum(logs) / len(logs))


def _lower_priority():
    try:
        os.nice(10)
    except OSError:
        pass


def _compile_job(template: Template, config: dict, arch: Arch) -> CompileResult:
    return compile_variant(template, config, arch)


class Engine:
    def __init__(self, store: Store, template: Template, arch: Arch, backend: Backend,
                 workers: int | None = None,
                 on_trial: Callable[[TrialRecord, TrialRecord | None], None] | None = None,
                 worker_name: str = "embedded"):
        self.store, self.template, self.arch, self.backend = store, template, arch, backend
        # leave two cores to the measuring child and this process: a starved launch loop
        # shows up as idle GPU time
        self.workers = workers or max(1, (os.cpu_count() or 2) - 2)
        self.on_trial = on_trial
        self.worker_name = worker_name

    def searcher(self, job_id: int, spec: JobSpec, warm_start=(), prior=()) -> Searcher:
        space = search_space(self.template, self.arch, spec.sizes, self.backend.allows)
        return Searcher(space, spec.sampler, spec.seed, storage=self.store.optuna_storage(),
                        study_name=self.store.get_job(job_id).study_name or f"job-{job_id}",
                        warm_start=warm_start, prior=prior)

    def run(self, job_id: int, spec: JobSpec, warm_start=(), prior=()) -> JobSummary:
        """warm_start: configurations proposed first; prior: (configuration, objective) pairs
        measured elsewhere (another architecture) that the search learns from."""
        store, tpl, arch = self.store, self.template, self.arch
        t_start = time.monotonic()
        summary = JobSummary(job_id, "running")
        done = {t.number: t for t in store.trials(job_id)}
        for t in done.values():
            summary.counts[t.status] = summary.counts.get(t.status, 0) + 1
        best = min((t for t in done.values() if t.objective is not None),
                   key=lambda t: t.objective, default=None)
        store.set_job_status(job_id, "running")
        # the template's default (each parameter's first value) and its [[seeds]] are tried right
        # after any warm-start configurations: authors list what they expect to win first
        searcher = self.searcher(job_id, spec, [*warm_start, *tpl.start_configs()], prior)
        sizes = list(spec.sizes)
        deadline = t_start + spec.minutes * 60 if spec.minutes else None
        budget = spec.trials if spec.trials else (None if deadline else 100)
        counted = sum(1 for t in done.values() if t.status != "infeasible")
        infeasible_left = MAX_INFEASIBLE_FACTOR * (budget or 1000)
        pending: dict[Future, tuple[int, dict, float]] = {}
        exhausted = cancelled = False
        prefetch = self.workers * 2 if self.backend.needs_compile else 1
        toolchain = {"nvrtc": nvrtc_version(), "arch": arch.name}
        ctx = mp.get_context("spawn")
        pool = ProcessPoolExecutor(self.workers, mp_context=ctx,
                                   initializer=_lower_priority) \
            if self.backend.needs_compile else None

        def finish(number, config, started, outcome: Outcome, compiled: CompileResult | None):
            nonlocal best
            rec = trial_record(tpl, arch, self.backend.name, sizes, number, config, started,
                               outcome, compiled, toolchain, self.worker_name)
            obj = rec.objective
            if store.record_trial(job_id, rec):
                summary.counts[rec.status] = summary.counts.get(rec.status, 0) + 1
            searcher.tell(number, obj)
            summary.busy_ms += outcome.busy_ms
            if compiled and not compiled.cached:
                summary.compile_s += compiled.seconds
                summary.compiled += 1
            if obj is not None and (best is None or obj < best.objective):
                best = rec
            if self.on_trial:
                self.on_trial(rec, best)

        def handle(number, config, started, compiled: CompileResult | None):
            outcome = evaluate(tpl, arch, self.backend, config, compiled, sizes)
            finish(number, config, started, outcome, compiled)

        try:
            while True:
                stop_asking = exhausted or cancelled or \
                    (budget is not None and counted >= budget) or \
                    (deadline is not None and time.monotonic() >= deadline)
                if not stop_asking and hasattr(store, "cancel_requested") and \
                        store.cancel_requested(job_id):
                    cancelled = stop_asking = True
                while not stop_asking and len(pending) < prefetch:
                    proposal = searcher.ask()
                    if proposal is None:
                        exhausted = stop_asking = True
                        break
                    number, config = proposal
                    started = time.time()
                    why = static_check(tpl, arch, config, sizes)
                    if why:
                        finish(number, config, started, Outcome("infeasible", why), None)
                        infeasible_left -= 1
                        if infeasible_left <= 0:
                            exhausted = stop_asking = True
                        continue
                    counted += 1
                    if pool is None:
                        handle(number, config, started, None)
                        break
                    fut = pool.submit(_compile_job, tpl, config, arch)
                    pending[fut] = (number, config, started)
                    if budget is not None and counted >= budget:
                        break
                if not pending:
                    if stop_asking:
                        break
                    continue
                finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for fut in finished:
                    number, config, started = pending.pop(fut)
                    try:
                        compiled = fut.result()
                    except Exception as e:  # noqa: BLE001 - a dead compiler is this trial's
                        compiled = CompileResult(ok=False, key="", log=f"compiler died: {e}")
                    handle(number, config, started, compiled)
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        summary.wall_s = time.monotonic() - t_start
        summary.best = best
        summary.status = "cancelled" if cancelled else "done"
        store.set_job_status(job_id, summary.status, _summary_line(summary))
        return summary



def trial_record(tpl: Template, arch: Arch, backend_name: str, sizes, number: int, config: dict,
                 started: float, outcome: Outcome, compiled: CompileResult | None,
                 toolchain: dict, worker: str) -> TrialRecord:
    """The record of one finished trial (shared by the embedded engine and service workers)."""
    obj = objective(outcome)
    launch_smem = tpl.launch(config, arch, sizes[0]).smem if sizes else 0
    r = compiled.resources if compiled else None
    return TrialRecord(
        number=number, params=dict(config), config_key=tpl.config_key(config),
        status=outcome.status, message=outcome.message, backend=backend_name,
        objective=obj,
        compile_seconds=compiled.seconds if compiled else None,
        compile_log=compiled.log[-20000:] if compiled else "",
        registers=r.registers if r and compiled.ok else None,
        smem_bytes=(r.smem_static + launch_smem) if r and compiled.ok else None,
        spill_bytes=(r.spill_stores + r.spill_loads) if r and compiled.ok else None,
        stack_frame=r.stack_frame if r and compiled.ok else None,
        cubin_key=compiled.key if compiled and compiled.ok else None,
        measurements=outcome.measurements,
        device=dict(outcome.device, **toolchain), started_at=started,
        finished_at=time.time(), worker=worker)


def evaluate(tpl: Template, arch: Arch, backend: Backend, config: dict,
             compiled: CompileResult | None, sizes) -> Outcome:
    """A statically feasible, compiled (or not, for backends without compilation) variant ->
    its outcome: compile failure, resource rejection, or the backend's measurement."""
    if compiled is not None and not compiled.ok:
        return Outcome("compile_failed", _first_error(compiled.log))
    if compiled is not None:
        why = resource_check(tpl, arch, config, compiled, sizes)
        if why:
            return Outcome("resource_rejected", why)
    return backend.measure(tpl, arch, config, compiled, sizes)


def run_trial(tpl: Template, arch: Arch, backend: Backend, number: int, config: dict, sizes,
              toolchain: dict, worker: str) -> tuple[TrialRecord, Outcome,
                                                     CompileResult | None]:
    """One proposal, start to end, in this process: static check -> compile (through the
    compile cache) -> resource check -> measure -> its record. Every path ends in a record."""
    started = time.time()
    compiled = None
    why = static_check(tpl, arch, config, sizes)
    if why:
        outcome = Outcome("infeasible", why)
    else:
        if backend.needs_compile:
            try:
                compiled = compile_variant(tpl, config, arch)
            except Exception as e:  # noqa: BLE001 - a dead compiler is this trial's
                compiled = CompileResult(ok=False, key="", log=f"compiler died: {e}")
        outcome = evaluate(tpl, arch, backend, config, compiled, sizes)
    rec = trial_record(tpl, arch, backend.name, sizes, number, config, started, outcome,
                       compiled, toolchain, worker)
    return rec, outcome, compiled

def _first_error(log: str) -> str:
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    return (log.strip().splitlines() or ["compile failed"])[0][:300]


def _summary_line(s: JobSummary) -> str:
    parts = [f"{n} {k}" for k, n in sorted(s.counts.items())]
    return ", ".join(parts)
