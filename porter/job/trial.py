"""One trial, start to end: its evaluation (compile result -> resource check -> backend) and its
record. Every path ends in exactly one status; the job loop (porter.job.loop) calls these."""
from __future__ import annotations

import math
import time

from porter.build.check import resource_check, static_check
from porter.build.compile import CompileResult, compile_variant
from porter.measure.backends.base import Backend, Outcome
from porter.records import TrialRecord
from porter.spec.arch import Arch
from porter.spec.template import Template


def objective(outcome: Outcome) -> float | None:
    """Geometric mean over sizes of ours/baseline (lower is better); ms where no baseline."""
    if outcome.status != "measured" or not outcome.measurements:
        return None
    logs = []
    for m in outcome.measurements:
        rel = m.ours_ms / m.baseline_ms if m.baseline_ms else m.ours_ms
        logs.append(math.log(max(rel, 1e-12)))
    return math.exp(sum(logs) / len(logs))


def compile_safely(tpl: Template, config: dict, arch: Arch) -> CompileResult:
    """compile_variant, with a compiler that dies recorded as this trial's compile failure."""
    try:
        return compile_variant(tpl, config, arch)
    except Exception as e:  # noqa: BLE001 - a dead compiler is this trial's
        return CompileResult(ok=False, key="", log=f"compiler died: {e}")


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
        return Outcome("compile_failed", first_error(compiled.log))
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
            compiled = compile_safely(tpl, config, arch)
        outcome = evaluate(tpl, arch, backend, config, compiled, sizes)
    rec = trial_record(tpl, arch, backend.name, sizes, number, config, started, outcome,
                       compiled, toolchain, worker)
    return rec, outcome, compiled

def first_error(log: str) -> str:
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    return (log.strip().splitlines() or ["compile failed"])[0][:300]
