"""`porter report JOB`: what a port found, in one screen.

For every job: the trial statuses, the feasible share of the space at the job's sizes, the
resources of each compiled variant and each failure with its reason. For a warm-started job
(`--from-arch A` / `--from-job J`) also: A's best on A, A's best as-is on this architecture,
this job's best, the speedup, and which parameters moved. Trials that reuse an earlier job's
measurement (porter.job.cache) are counted and each names the trial it was measured as.
"""
from __future__ import annotations

import random
from collections import Counter

from rich.console import Console
from rich.table import Table

from porter.build.check import static_check
from porter.records import TrialRecord
from porter.store.base import Store
from porter.spec.snapshot import job_parts
from porter.spec.template import Template

EXACT_UP_TO = 20_000      # spaces up to this size are counted exactly, larger ones sampled
SAMPLE = 4_000


def _ratio(t: TrialRecord | None) -> float | None:
    return 1.0 / t.objective if t is not None and t.objective else None


def _params(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def _from(t: TrialRecord) -> str:
    return f"job {t.reused_from[0]} #{t.reused_from[1]}" if t.reused_from else "-"


def _values(tpl: Template, cfg: dict) -> str:
    return " ".join(str(cfg.get(k, "-")) for k in tpl.param_names)


def feasible_share(tpl: Template, arch, sizes, seed: int = 0) -> tuple[int, int, bool]:
    """(feasible, examined, exact): configurations of the space that pass the static check at
    every size; exact when the whole space was counted, else a uniform sample of it."""
    n = tpl.space_size()
    if n <= EXACT_UP_TO:
        configs = tpl.iter_configs()
        exact = True
    else:
        rng = random.Random(seed)
        names = tpl.param_names
        configs = ({k: rng.choice(tpl.params[k]) for k in names} for _ in range(SAMPLE))
        exact = False
    ok = total = 0
    for cfg in configs:
        total += 1
        ok += static_check(tpl, arch, cfg, sizes) is None
    return ok, total, exact


def _source_trials(store: Store, template: str, from_arch: str | None,
                   from_job: int | None) -> list[TrialRecord]:
    trials: list[TrialRecord] = []
    if from_job is not None:
        trials += store.best_trials(from_job, 1)
    if from_arch:
        for j in store.list_jobs(None, template=template, arch=from_arch):
            trials += store.best_trials(j.id, 1)
    return sorted((t for t in trials if t.objective), key=lambda t: t.objective)


def report(store: Store, job_id: int, console: Console, top: int = 20) -> None:
    info, tpl, arch = job_parts(store, job_id)
    spec = info.spec
    sizes = [tuple(s) for s in spec.sizes]
    trials = store.trials(job_id)
    counts = Counter(t.status for t in trials)
    console.print(f"[bold]job {info.id}[/bold]: {tpl.name} -> {arch.name}, sizes "
                  f"{', '.join('x'.join(map(str, s)) for s in sizes)}, backend {spec.backend}, "
                  f"{info.status}" + (f" ({info.message})" if info.message else ""))
    console.print("trials: " + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
    reused = [t for t in trials if t.reused_from]
    if reused:
        jobs = sorted({t.reused_from[0] for t in reused})
        console.print(f"reused: {len(reused)} of {len(trials)} trials are earlier measurements "
                      "of the same configurations (same template snapshot, architecture, GPU, "
                      f"sizes and harness) from job{'s' if len(jobs) > 1 else ''} "
                      f"{', '.join(map(str, jobs))}; nothing was measured for them (--fresh "
                      "measures again)")
    ok, total, exact = feasible_share(tpl, arch, sizes)
    if exact:
        console.print(f"feasible set: {ok} of the space's {total} configurations pass the static "
                      "checks at these sizes")
    else:
        console.print(f"feasible set: about {ok / total:.1%} of the space's "
                      f"{tpl.space_size()} configurations pass the static checks (sampled "
                      f"{total})")

    best = min((t for t in trials if t.objective), key=lambda t: t.objective, default=None)
    if best is not None:
        console.print(f"best: trial {best.number}, {_ratio(best):.3f}x the vendor "
                      f"(geometric mean over the sizes): {_params(best.params)}"
                      + (f" (reused from {_from(best)})" if best.reused_from else ""))
        if best.origin:
            console.print(f"  its configuration came from: {best.origin}")
        # where the trials came from: the warm start's sources and the search
        origins: dict[str, list] = {}
        for t in trials:
            if t.origin and t.status != "infeasible":
                origins.setdefault(t.origin, []).append(t)
        if origins:
            console.print("trials by origin: " + "; ".join(
                f"{o} {len(ts)} (best {min(ts, key=lambda t: t.objective or 1e300).number})"
                if any(t.objective for t in ts) else f"{o} {len(ts)}"
                for o, ts in origins.items()))

    if spec.from_arch or spec.from_job is not None:
        _warm_section(store, tpl, arch, sizes, spec, trials, best, console)

    built = [t for t in trials if t.registers is not None and t.status in
             ("compiled", "measured", "wrong_result", "timeout", "crashed", "launch_failed")]
    if built:
        table = Table("trial", " ".join(tpl.param_names), "status", "regs", "smem B",
                      "spill B", "stack B", "ratio", "reused from", title=f"resources per variant ({len(built)} built"
                      + (f", first {top}" if len(built) > top else "") + ")")
        for t in sorted(built, key=lambda t: (t.objective is None, t.objective or 0,
                                               t.number))[:top]:
            r = _ratio(t)
            table.add_row(str(t.number), _values(tpl, t.params), t.status, str(t.registers),
                          str(t.smem_bytes if t.smem_bytes is not None else "-"),
                          str(t.spill_bytes if t.spill_bytes is not None else "-"),
                          str(t.stack_frame if t.stack_frame is not None else "-"),
                          f"{r:.3f}" if r else "-", _from(t))
        console.print(table)

    failed = [t for t in trials if t.status not in ("compiled", "measured")]
    if failed:
        table = Table("trial", "status", "reason", " ".join(tpl.param_names), "reused from",
                      title=f"failures and refusals ({len(failed)})")
        for t in sorted(failed, key=lambda t: t.number)[:top]:
            reason = (t.message or t.compile_log or "").strip().splitlines()
            table.add_row(str(t.number), t.status, reason[0][:100] if reason else "-",
                          _values(tpl, t.params), _from(t))
        console.print(table)


def _warm_section(store, tpl, arch, sizes, spec, trials, best, console) -> None:
    src = _source_trials(store, tpl.name, spec.from_arch, spec.from_job)
    where = spec.from_arch or f"job {spec.from_job}"
    if not src:
        console.print(f"warm start from {where}: no measured configuration there")
        return
    a_best = src[0]
    a_arch = spec.from_arch or store.get_job(spec.from_job).spec.arch
    console.print(f"warm start from {where}: best there {_ratio(a_best):.3f}x the vendor on "
                  f"{a_arch}: {_params(a_best.params)}")
    here = next((t for t in trials if t.config_key == a_best.config_key), None)
    if here is None:
        why = static_check(tpl, arch, a_best.params, sizes)
        console.print(f"  as-is on {arch.name}: " + (f"does not fit ({why})" if why else
                                                      "not tried in this job"))
    elif here.objective:
        console.print(f"  as-is on {arch.name}: {_ratio(here):.3f}x the vendor (trial "
                      f"{here.number})")
    else:
        console.print(f"  as-is on {arch.name}: {here.status} (trial {here.number})")
    if best is None:
        return
    console.print(f"  best on {arch.name}: {_ratio(best):.3f}x the vendor (trial {best.number})"
                  + (f", {_ratio(best) / _ratio(here):.2f}x the source's best as-is"
                     if here is not None and here.objective else ""))
    moved = {k: (a_best.params.get(k), v) for k, v in best.params.items()
             if a_best.params.get(k) != v}
    console.print("  parameters that moved: " + (", ".join(f"{k} {a} -> {b}" for k, (a, b)
                                                          in moved.items()) or "none"))
