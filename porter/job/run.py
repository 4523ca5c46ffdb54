"""`porter port`: validate, record the job, run the engine with a live progress bar."""
from __future__ import annotations

from typing import NamedTuple

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


def feasible_in(tpl, arch, sizes):
    """feasible(cfg, size=None): cfg takes only values the template offers and passes the
    static check at `size`, or at every one of `sizes` (a warm seed's test)."""
    from porter.build.check import static_check

    def feasible(cfg, size=None):
        return all(cfg.get(p) in vals for p, vals in tpl.params.items()) and \
            static_check(tpl, arch, cfg, [tuple(size)] if size else sizes) is None
    return feasible


NEAR_SEEDS = 8      # warm-start configurations drawn from the nearest tuned sizes, at most
NEAR_WAVE = 3       # of those, tile shapes that fill this size's waves better ([launch] tiles)


def near_size_configs(store: Store, tpl, arch, spec, exclude_job: int | None = None
                      ) -> tuple[list[dict], list[tuple[int, ...]]]:
    """A new size's warm start from what earlier jobs of the template tuned: for each of the
    job's sizes, porter.search.warm.seeds_for over the jobs that tuned one size on this
    architecture (and on spec.from_arch): the nearest sizes' best configurations first
    (log2 distance plus the template's [sizes] align), each with what its own size forced
    undone and repaired into this job's feasible set (a value the template no longer has
    counts as infeasible), then up to NEAR_WAVE tile shapes whose whole waves cost less here
    ([launch] tiles and tile_cost on `arch`'s multiprocessors). Interleaved over the job's
    sizes; at most NEAR_SEEDS and a quarter of the trial budget. Returns the configurations and
    the tuned sizes nearest to the job's first size (up to three). Nothing for a cold job or
    where no job of the template tuned a size."""
    import itertools
    from porter.job.loop import trial_budget
    from porter.search.warm import seeds_for, size_distance, tuned_from_store
    if spec.cold:
        return [], []
    # configurations of an older template take its defaults for parameters they lack; those
    # with a parameter it no longer has ran another kernel and are left out
    defaults = tpl.complete({})
    tuned = [t for a in dict.fromkeys([arch.name, spec.from_arch or arch.name])
             for t in tuned_from_store(store, tpl.name, a, exclude_job=exclude_job,
                                       defaults=defaults)
             if len(t.size) == len(tpl.size_names)]
    if not tuned:
        return [], []
    budget = trial_budget(spec)
    n = min(NEAR_SEEDS, max(1, budget // 4)) if budget else NEAR_SEEDS
    names = (tpl.tiles.names if tpl.tiles is not None else frozenset()) | \
        (tpl.tile_cost.names if tpl.tile_cost is not None else frozenset())
    wave_vary = [p for p in tpl.params if p in names]
    sizes = [tuple(s) for s in spec.sizes]

    feasible_at = feasible_in(tpl, arch, sizes)

    def cost_at(size):
        def cost(cfg):
            try:
                return tpl.wave_cost(cfg, arch, size)
            except Exception:  # noqa: BLE001 - a cost the template cannot evaluate ranks nothing
                return None
        return cost
    per_size = [seeds_for(size, tuned, tpl.params, feasible_at, n, align=tpl.size_align,
                          cost=cost_at(size), wave_vary=wave_vary,
                          n_wave=NEAR_WAVE if wave_vary else 0, feasible_at=feasible_at,
                          exclude_size=False) for size in sizes]
    out, seen = [], set()
    for cfg in itertools.chain.from_iterable(itertools.zip_longest(*per_size)):
        if cfg is not None and tpl.config_key(cfg) not in seen and len(out) < n:
            seen.add(tpl.config_key(cfg))
            out.append(cfg)
    nearest = sorted({t.size for t in tuned},
                     key=lambda s: size_distance(sizes[0], s, align=tpl.size_align))[:3]
    return out, nearest


VENDOR_SIZES = 3    # the job's sizes whose vendor kernels are read, at most (a profile each)


def vendor_configs(tpl, arch, spec, backend, base: dict | None = None
                   ) -> tuple[list[dict], str]:
    """The template's [vendor] seeds (porter.search.vendor.vendor_seeds): for each of the job's
    first VENDOR_SIZES sizes, the vendor library's own kernel there (the backend reads the
    baselines' kernel names) put on `base` (the nearest tuned size's best, else the template's
    first start configuration) and fitted to the job's sizes; where the vendor runs clusters,
    the same tile without one too. Returns the configurations and a note for the user (which
    kernel, or why none). Nothing for a cold job, a template without [vendor], or a backend
    that cannot tell the kernels."""
    seeds, note = vendor_seeds_named(tpl, arch, spec, backend, base)
    return [cfg for cfg, _ in seeds], note


def vendor_seeds_named(tpl, arch, spec, backend, base: dict | None = None
                       ) -> tuple[list[tuple[dict, str]], str]:
    """vendor_configs with the kernel each seed came from: ([(configuration, kernel name)],
    note)."""
    from porter.search.vendor import nvjet_tile, vendor_seeds
    if spec.cold or tpl.vendor is None or backend is None:
        return [], ""
    sizes = [tuple(s) for s in spec.sizes]
    base = tpl.complete(base or tpl.start_configs()[0])
    feasible = feasible_in(tpl, arch, sizes)
    try:
        by_size = backend.vendor_kernels(tpl, sizes[:VENDOR_SIZES])
    except Exception as e:  # noqa: BLE001 - a seed fewer, never a failed job
        return [], f"the vendor's kernels unknown ({e})"
    out, seen, picked = [], set(), []
    for kernels in by_size:
        name = next((k for k in kernels if nvjet_tile(k) is not None), None)
        if name is None:
            continue
        for cfg in vendor_seeds(kernels, base, tpl.params, feasible, tpl.vendor.params):
            if tpl.config_key(cfg) not in seen:
                seen.add(tpl.config_key(cfg))
                out.append((cfg, name))
        picked.append(name)
    if out:
        return out, (f"{len(out)} from the vendor's own kernel" + ("s " if len(picked) > 1
                                                                   else " ")
                     + ", ".join(dict.fromkeys(picked)))
    why = getattr(backend, "vendor_note", "")
    return [], ("no vendor seed: " + why) if why else ""


class WarmStart(NamedTuple):
    """What a job's run starts from (job_warm_start)."""
    configs: list[dict]                     # proposed first, in this order
    prior: list[tuple[dict, float]]         # measured elsewhere: the search learns from them
    note: str                               # for the user; empty without a warm start
    origins: dict[str, str]                 # config key -> where that configuration came from


def job_warm_start(store: Store, tpl, arch, spec, job_id: int, backend=None) -> WarmStart:
    """What a job's run starts from: --from-job's best configurations, then the nearest tuned
    sizes' best (near_size_configs), the template's [vendor] seeds read through `backend`
    (vendor_configs), the other near sizes' configurations, then --from-arch's; the prior of
    the source jobs' measurements; a note for the user (empty when there is no warm start);
    and each configuration's origin, which its trial records (the first source that names a
    configuration is its origin)."""
    first = warm_start_configs(store, tpl.name, None, spec.from_job)
    near, sizes = near_size_configs(store, tpl, arch, spec, exclude_job=job_id)
    vendor, vendor_note = vendor_seeds_named(tpl, arch, spec, backend, near[0] if near else None)
    rest = warm_start_configs(store, tpl.name, spec.from_arch, None) if spec.from_arch else []
    near_label = "nearest tuned sizes (" + ", ".join("x".join(map(str, s)) for s in sizes) + ")"
    labelled = [*((c, f"job {spec.from_job}'s best") for c in first),
                *((c, near_label) for c in near[:1]),
                *((c, f"vendor kernel {name}") for c, name in vendor),
                *((c, near_label) for c in near[1:]),
                *((c, f"{spec.from_arch}'s best") for c in rest)]
    # (the searcher skips a repeat, and what is not in its space)
    warm = [c for c, _ in labelled]
    origins: dict[str, str] = {}
    for c, label in labelled:
        origins.setdefault(tpl.config_key(tpl.complete(c)), label)
    prior = warm_start_prior(store, tpl.name, spec.from_arch, spec.from_job)
    notes = []
    if near:
        notes.append(f"{len(near)} warm-start configs from the {near_label}")
    if vendor_note:
        notes.append(vendor_note)
    if first or rest:
        notes.append(f"{len(first) + len(rest)} from --from-job/--from-arch and a prior of "
                     f"{len(prior)} measured ones")
    return WarmStart(warm, prior, "; ".join(notes), origins)


def port_here(template, arch, sizes, trials, minutes, sampler, seed, backend, replay, from_arch,
              from_job, resume, workers, db, templates_dir, console: Console,
              trust_template_code: bool = False, fresh: bool = False, cold: bool = False):
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
                                 trust_template_code=trust_template_code, fresh=fresh,
                                 cold=cold)
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
    warm, prior, warm_note, origins = job_warm_start(store, tpl, a.with_sms(be.sms), spec, job_id,
                                                     be)
    total = spec.trials or (None if spec.minutes else 100)
    console.print(f"job {job_id}: {tpl.name} -> {a.name}, sizes "
                  f"{', '.join('x'.join(map(str, s)) for s in spec.sizes)}, backend {be.name}, "
                  f"sampler {spec.sampler}" + (", fresh measurements" if spec.fresh else "")
                  + (f", {warm_note}" if warm_note else ""))
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
            summary = engine.run(job_id, spec, warm, prior, origins)
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
                  "TFLOP/s", "GB/s", "origin")
    for t in trials:
        m = t.measurements[0] if t.measurements else None
        table.add_row(str(t.number), " ".join(f"{k}={v}" for k, v in t.params.items()),
                      t.status, str(t.registers or "-"), str(t.smem_bytes or "-"),
                      f"{m.ours_ms:.4f}" if m else "-",
                      f"{m.baseline_ms:.4f}" if m and m.baseline_ms else "-",
                      f"{m.ratio:.3f}" if m and m.ratio else "-",
                      f"{m.tflops:.0f}" if m and m.tflops else "-",
                      f"{m.gbps:.0f}" if m and m.gbps else "-",
                      "; ".join([*([f"reused job {t.reused_from[0]} #{t.reused_from[1]}"]
                                   if t.reused_from else []), *([t.origin] if t.origin else [])])
                      or "-")
    console.print(table)
