"""The `porter` command (typer + rich). Errors a user can cause print one line and exit 2."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from porter.errors import PorterError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Port GPU kernel templates to new architectures and tune them there.")
console = Console()

DbOpt = typer.Option(None, "--db", help="database URL (default: PORTER_DB_URL or sqlite:///porter.db)")
TplDirOpt = typer.Option(None, "--templates-dir", help="extra folder of templates")
FreshOpt = typer.Option(False, "--fresh", help="measure every configuration again instead of "
                        "reusing earlier jobs' measurements (same template snapshot, arch, GPU, "
                        "sizes and harness)")
ColdOpt = typer.Option(False, "--cold", help="start from the template's own seeds only, not "
                       "from the best configurations of the nearest sizes its earlier jobs "
                       "tuned on this architecture, nor from the vendor's own kernel")


def _store(db):
    from porter.store.base import open_store
    return open_store(db)


@app.command()
def templates(templates_dir: Optional[list[Path]] = TplDirOpt):
    """List templates with their op, parameters and supported architectures."""
    from porter.spec.template import discover, load_template
    table = Table("template", "op", "parameters", "space", "architectures", "folder")
    for name, folder in sorted(discover(templates_dir).items()):
        try:
            t = load_template(folder, variant=name)
        except PorterError as e:
            table.add_row(name, "-", f"[red]{e}[/red]", "", "", str(folder))
            continue
        table.add_row(t.name, t.op, ", ".join(t.params), str(t.space_size()),
                      " ".join(t.supported_archs()), str(folder))
    console.print(table)


@app.command()
def port(template: str = typer.Argument(..., help="template name or folder"),
         arch: str = typer.Option(..., "--arch", help="target architecture, e.g. sm_90a"),
         sizes: Optional[list[str]] = typer.Option(None, "--sizes", help="problem size, e.g. 4096x4096x4096 (repeatable)"),
         trials: Optional[int] = typer.Option(None, "--trials"),
         minutes: Optional[float] = typer.Option(None, "--minutes"),
         sampler: str = typer.Option("auto", "--sampler"),
         seed: int = typer.Option(0, "--seed"),
         backend: str = typer.Option("gpu", "--backend", help="gpu | compile-only | replay"),
         replay: Optional[str] = typer.Option(None, "--replay", help="recording or Kernel Tuner cache for --backend replay"),
         from_arch: Optional[str] = typer.Option(None, "--from-arch"),
         from_job: Optional[int] = typer.Option(None, "--from-job"),
         resume: Optional[int] = typer.Option(None, "--resume", help="resume an interrupted job"),
         workers: Optional[int] = typer.Option(None, "--workers", help="compile processes"),
         trust_template_code: bool = typer.Option(
             False, "--trust-template-code",
             help="let the template's own reference.py run here (embedded ports only)"),
         fresh: bool = FreshOpt, cold: bool = ColdOpt,
         db: Optional[str] = DbOpt, templates_dir: Optional[list[Path]] = TplDirOpt):
    """Run a porting job here and now, with a live progress bar."""
    import porter.api as api
    summary = api.port(template, arch, sizes, trials, minutes, sampler=sampler, seed=seed,
                       backend=backend, replay=replay, from_arch=from_arch, from_job=from_job,
                       resume=resume, workers=workers, db=db, templates_dir=templates_dir,
                       console=console, trust_template_code=trust_template_code,
                       fresh=fresh, cold=cold).summary
    if summary.status == "failed":
        raise typer.Exit(1)


@app.command()
def jobs(db: Optional[str] = DbOpt, limit: int = typer.Option(50, "--limit")):
    """Jobs with their status and progress."""
    store = _store(db)
    table = Table("job", "template", "arch", "backend", "status", "trials", "measured",
                  "best ratio", "message")
    for j in store.list_jobs(limit):
        table.add_row(str(j.id), j.template_name, j.spec.arch, j.spec.backend, j.status,
                      str(j.n_trials), str(j.n_measured),
                      f"{j.best_ratio:.3f}" if j.best_ratio else "-", j.message[:60])
    console.print(table)


@app.command()
def show(job: int, db: Optional[str] = DbOpt, top: int = typer.Option(10, "--top")):
    """The top configurations of a job, with measurements and resource use."""
    from porter.job.run import print_best
    store = _store(db)
    info = store.get_job(job)
    console.print(f"job {info.id}: {info.template_name} on {info.spec.arch}, {info.status}"
                  f" ({info.message})")
    print_best(console, store.best_trials(job, top))


@app.command()
def report(job: int, db: Optional[str] = DbOpt, top: int = typer.Option(20, "--top")):
    """What a port found: statuses, the feasible set, resources per variant, failures with
    their reasons, and for a warm-started job the source's best there and here."""
    from porter.export.report import report as do_report
    do_report(_store(db), job, console, top)


@app.command()
def best(template: str, arch: str = typer.Option(..., "--arch"), db: Optional[str] = DbOpt,
         top: int = typer.Option(5, "--top")):
    """The best configurations of a template on an architecture, over all its jobs."""
    from porter.job.run import print_best
    store = _store(db)
    rows = []
    for j in store.list_jobs(None, template=template, arch=arch):
        rows += store.best_trials(j.id, top)
    # a configuration once: a trial reused by a later job (porter.job.cache) repeats its source
    rows.sort(key=lambda t: (t.objective, t.reused_from is not None))
    seen: set[str] = set()
    rows = [t for t in rows if not (t.config_key in seen or seen.add(t.config_key))]
    print_best(console, rows[:top])


@app.command()
def export(job: int, fmt: str = typer.Option("cu", "--format", help="cu, cubin, ptx, fatbin, python, torch, header, json, kt-cache"),
           out: Path = typer.Option(Path("export"), "-o", "--out"), db: Optional[str] = DbOpt):
    """Export the tuned kernels of a job."""
    import porter.api as api
    paths = api.get_job(job, db).export(fmt, out)
    for p in paths:
        console.print(str(p))


@app.command()
def record(job: int, out: Path = typer.Option(..., "-o", "--out"), db: Optional[str] = DbOpt):
    """Write a job's measurements as a replay recording (.json or .json.gz); a trial that
    reused an earlier job's measurement says which (`reused_from`: [job, trial])."""
    import gzip
    from porter.measure.backends.replay import recording
    from porter.spec.snapshot import job_template
    store = _store(db)
    info = store.get_job(job)
    tpl = job_template(store, info)
    trials = store.trials(job)
    dev = next((t.device for t in trials if t.status == "measured"), {})
    data = json.dumps(recording(tpl.name, info.spec.arch, tpl.param_names, dev, trials))
    out.parent.mkdir(parents=True, exist_ok=True)
    (gzip.open(out, "wt") if out.suffix == ".gz" else open(out, "w")).write(data)
    reused = sum(t.reused_from is not None for t in trials)
    console.print(f"{out}: {len(trials)} trials" + (
        f", {reused} reused from earlier jobs' measurements" if reused else ""))


@app.command("import-kt")
def import_kt(kernel: Path = typer.Argument(..., help="the kernel's .cu file"),
              spec: Path = typer.Argument(..., help="its T1 JSON file"),
              out: Optional[Path] = typer.Option(None, "-o", "--out",
                                                 help="template folder to write")):
    """Turn a Kernel Tuner kernel and its T1 file into a template that tunes like any other."""
    from porter.interop.kt import import_kt as do_import
    from porter.spec.template import load_template
    for p in (kernel, spec):
        if not p.is_file():
            raise PorterError(f"{p} does not exist")
    folder = do_import(kernel, spec, out or Path("templates") / kernel.stem)
    t = load_template(folder)
    console.print(f"{folder}: template {t.name!r}, {len(t.params)} parameters, "
                  f"{t.space_size()} configurations; port it with: porter port {folder} "
                  "--arch ARCH")


def _service():
    from porter.store.base import plugin
    return plugin("service")()


@app.command()
def submit(template: str, arch: str = typer.Option(..., "--arch"),
           sizes: Optional[list[str]] = typer.Option(None, "--sizes"),
           trials: Optional[int] = typer.Option(None, "--trials"),
           minutes: Optional[float] = typer.Option(None, "--minutes"),
           sampler: str = typer.Option("auto", "--sampler"), seed: int = typer.Option(0, "--seed"),
           backend: str = typer.Option("gpu", "--backend"),
           replay: Optional[str] = typer.Option(None, "--replay"),
           from_arch: Optional[str] = typer.Option(None, "--from-arch"),
           from_job: Optional[int] = typer.Option(None, "--from-job"),
           fresh: bool = FreshOpt, cold: bool = ColdOpt,
           db: Optional[str] = DbOpt, templates_dir: Optional[list[Path]] = TplDirOpt):
    """Record a job and queue it for the service's workers; prints the job id."""
    import porter.api as api
    job_id = api.submit(template, arch, sizes, trials, minutes, sampler=sampler, seed=seed,
                        backend=backend, replay=replay, from_arch=from_arch, from_job=from_job,
                        db=db, templates_dir=templates_dir, fresh=fresh,
                        cold=cold).id
    console.print(job_id)


@app.command()
def worker(queues: str = typer.Option("compile", "--queues"), db: Optional[str] = DbOpt,
           concurrency: Optional[int] = typer.Option(None, "--concurrency")):
    """Start a Celery worker: `compile` (CPU) and/or `gpu.<arch>` (one per GPU)."""
    _service().worker(queues.split(","), db, concurrency)


@app.command()
def status(job: int, db: Optional[str] = DbOpt):
    """Progress and best-so-far of one job."""
    store = _store(db)
    j = store.get_job(job)
    best = f"; best ratio {j.best_ratio:.3f}" if j.best_ratio else ""
    reused = f" ({j.n_reused} reused from earlier jobs)" if j.n_reused else ""
    console.print(f"job {j.id} {j.template_name} {j.spec.arch}: {j.status}; {j.n_trials} "
                  f"trials, {j.n_measured} measured{reused}{best}")


@app.command()
def cancel(job: int, db: Optional[str] = DbOpt):
    """Ask a job to stop; it stops within one trial."""
    _service().cancel(job, db)
    console.print(f"job {job}: cancel requested")


@app.command()
def dashboard(db: Optional[str] = DbOpt, port: int = typer.Option(8501, "--port"),
              address: str = typer.Option("127.0.0.1", "--address")):
    """Serve the Streamlit dashboard on localhost (stopping this stops it)."""
    import importlib.util
    from porter.store.base import plugin
    if importlib.util.find_spec("streamlit") is None:
        raise PorterError("the dashboard is not installed; pip install -e '.[dashboard]'")
    serve = plugin("dashboard")     # dashboard.launcher:serve (porter imports no dashboard)
    raise SystemExit(serve(port, address, db))


def main():
    try:
        rc = app(standalone_mode=False)
        if isinstance(rc, int) and rc:   # typer returns Exit's code (130 after Ctrl-C)
            raise SystemExit(rc)
    except PorterError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except typer.Exit as e:
        raise SystemExit(e.exit_code)
    except typer.Abort:
        raise SystemExit(130)
    except Exception as e:  # click's usage errors (typer may carry its own click)
        if hasattr(e, "show") and hasattr(e, "exit_code") and hasattr(e, "format_message"):
            print(f"error: {e.format_message()}", file=sys.stderr)
            raise SystemExit(2)
        raise


if __name__ == "__main__":
    main()
