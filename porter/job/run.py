"""`porter port`: validate, record the job, run the engine with a live progress bar."""
from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from porter.records import TrialRecord
from porter.store.base import Store


def warm_start_configs(store: Store, template_name: str, from_arch: str | None,
                       from_job: int | None, n: int = 10) -> list[dict]:
    """The best configurations of earlier jobs, best first (fit is checked by the searcher)."""
    trials: list[TrialRecord] = []
    if from_job is not None:
        trials += store.best_trials(from_job, n)
    if from_arch:
        for j in store.list_jobs(None, template=template_name, arch=from_arch):
            trials += store.best_trials(j.id, n)
    trials.sort(key=lambda t: t.objective)
    seen, out = set(), []
    for t in trials:
        if t.config_key not in seen:
            seen.add(t.config_key)
            out.append(dict(t.params))
    return out[:n]


def warm_start_prior(store: Store, template_name: str, from_arch: str | None,
                     from_job: int | None) -> list[tuple[dict, float]]:
    """Every measured configuration of the source jobs with its objective: the search's prior
    (it learns how far to trust it from the results on the target)."""
    jobs = [from_job] if from_job is not None else []
    if from_arch:
        jobs += [j.id for j in store.list_jobs(None, template=template_name, arch=from_arch)]
    best: dict[str, tuple[dict, float]] = {}
    for j in dict.fromkeys(jobs):
        for t in store.trials(j, status="measured"):
            if t.objective and (t.config_key not in best or t.objective < best[t.config_key][1]):
                best[t.config_key] = (dict(t.params), t.objective)
    return list(best.values())


def port_here(template, arch, sizes, trials, minutes, sampler, seed, backend, replay, from_arch,
              from_job, resume, workers, db, templates_dir, console: Console,
              trust_template_code: bool = False, fresh: bool = False):
    from porter.job.loop import Engine
    from porter.job.jobs import (make_backend, make_spec, probe_compile, template_record,
                                 template_snapshot)
    from porter.store.base import open_store
    from porter.spec.snapshot import job_parts

    store = open_store(db)
    if resume is not None:
        info, tpl, a = job_parts(store, resume)
        spec = info.spec
        job_id = resume
    else:
        spec, tpl, a = make_spec(template, arch, sizes, trials, minutes, sampler, seed, backend,
                                 replay, from_arch, from_job, templates_dir,
                                 trust_template_code=trust_template_code, fresh=fresh)
    if spec.backend != "replay":
        probe_compile(tpl, a, spec.sizes)
    be, note = make_backend(spec, a)
    be.trust_template_code = trust_template_code    # template code runs only when trusted
    if note:
        console.print(f"[yellow]{note}[/yellow]")
    if resume is None:
        src, space = template_record(tpl)
        job_id = store.create_job(spec, tpl.name, tpl.source_hash, src, space, status="running",
                                  snapshot=template_snapshot(tpl))
    warm = warm_start_configs(store, tpl.name, spec.from_arch, spec.from_job)
    prior = warm_start_prior(store, tpl.name, spec.from_arch, spec.from_job)
    total = spec.trials or (None if spec.minutes else 100)
    console.print(f"job {job_id}: {tpl.name} -> {a.name}, sizes "
                  f"{', '.join('x'.join(map(str, s)) for s in spec.sizes)}, backend {be.name}, "
                  f"sampler {spec.sampler}" + (", fresh measurements" if spec.fresh else "")
                  + (f", {len(warm)} warm-start configs and a prior of {len(prior)} measured ones"
                     if warm else ""))
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[best]}"), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task("trials", total=total, best="")

        def on_trial(rec: TrialRecord, best: TrialRecord | None):
            if rec.status != "infeasible":
                progress.advance(task)
            last = rec.status + (" (reused)" if rec.reused_from else "")
            desc = ""
            if best is not None and best.measurements:
                ratios = [m.ratio for m in best.measurements if m.ratio]
                if ratios:
                    desc = f"best {min(ratios):.3f}..{max(ratios):.3f}x vendor"
                else:
                    desc = f"best {best.measurements[0].ours_ms:.4g} ms"
            progress.update(task, best=f"{desc}  last: {last}")

        engine = Engine(store, tpl, a, be, workers=workers, on_trial=on_trial)
        try:
            summary = engine.run(job_id, spec, warm, prior)
        except KeyboardInterrupt:
            # the loop marked the job interrupted and failed its open trials
            progress.stop()
            console.print(f"job {job_id} interrupted; resume with: porter port --resume "
                          f"{job_id}" + (f" --db {db}" if db else ""), style="yellow")
            raise
        finally:
            be.close()
    console.print(f"job {job_id} {summary.status}: {summary.message}")
    if summary.compiled:
        console.print(f"compiled {summary.compiled} variants in {summary.wall_s:.1f} s wall "
                      f"({summary.compile_s / summary.compiled:.2f} s each on one core)")
    if summary.reused:
        console.print(f"{summary.reused} trials reused earlier jobs' measurements of the same "
                      "template, GPU, sizes and harness (nothing measured for them; --fresh "
                      "measures again)")
    if summary.busy_ms:
        console.print(f"GPU busy in kernels and baselines: {summary.gpu_share:.0%} of wall time")
    if be.name == "compile-only":
        console.print("compile-only: nothing was measured; every trial row says so")
    print_best(console, store.best_trials(job_id, 5))
    return job_id, summary


def print_best(console: Console, trials: list[TrialRecord]):
    if not trials:
        return
    table = Table("trial", "params", "status", "regs", "smem", "ms", "vendor ms", "ratio",
                  "TFLOP/s", "GB/s", "reused from")
    for t in trials:
        m = t.measurements[0] if t.measurements else None
        table.add_row(str(t.number), " ".join(f"{k}={v}" for k, v in t.params.items()),
                      t.status, str(t.registers or "-"), str(t.smem_bytes or "-"),
                      f"{m.ours_ms:.4f}" if m else "-",
                      f"{m.baseline_ms:.4f}" if m and m.baseline_ms else "-",
                      f"{m.ratio:.3f}" if m and m.ratio else "-",
                      f"{m.tflops:.0f}" if m and m.tflops else "-",
                      f"{m.gbps:.0f}" if m and m.gbps else "-",
                      f"job {t.reused_from[0]} #{t.reused_from[1]}" if t.reused_from else "-")
    console.print(table)
