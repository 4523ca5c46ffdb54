"""Turning user input into a validated job, and running one here and now.

Everything a user can get wrong is checked here, before anything is written, and raised as a
PorterError with one line saying what to fix."""
from __future__ import annotations

import os
from pathlib import Path

from porter.spec.arch import Arch, arch_for_cc, get_arch, resolve_arch
from porter.measure.backends.base import Backend, CompileOnlyBackend
from porter.errors import SpecError
from porter.records import BACKENDS, SAMPLERS, JobSpec
from porter.spec.template import Template, find_template


def make_spec(template: str, arch: str, sizes: list[str] | None = None, trials: int | None = None,
              minutes: float | None = None, sampler: str = "auto", seed: int = 0,
              backend: str = "gpu", replay: str | None = None, from_arch: str | None = None,
              from_job: int | None = None, templates_dir: list[Path] | None = None,
              sms: int | None = None, trust_template_code: bool = False,
              service: bool = False, fresh: bool = False, cold: bool = False
              ) -> tuple[JobSpec, Template, Arch]:
    """sms: multiprocessors of the target product, where it is not the table's (arch_sms).
    fresh: measure every configuration, reusing no earlier job's measurement (porter.job.cache).
    cold: no warm start from the nearest tuned sizes (porter.job.run.near_size_configs) nor
    from the vendor's kernel (porter.job.run.vendor_configs).
    trust_template_code: the template's own reference.py may run (embedded ports only);
    service: the job goes to the service, which never imports code that came with it."""
    tpl = find_template(template, templates_dir)
    from porter.measure.ops import validate_template
    validate_template(tpl, trust_template_code, service)
    if sms is not None and not 1 <= sms <= 1024:
        raise SpecError(f"--sms {sms}: a GPU has between 1 and 1024 multiprocessors")
    a = resolve_arch(arch, sms)
    tpl.check_arch(a)
    if from_arch:
        get_arch(from_arch)
    parsed = tuple(tpl.parse_size(s) for s in sizes) if sizes else tpl.default_sizes
    if sampler not in SAMPLERS:
        raise SpecError(f"unknown sampler {sampler!r}; choose from {', '.join(SAMPLERS)}")
    if backend not in BACKENDS:
        raise SpecError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "replay" and not replay:
        raise SpecError("--backend replay needs --replay FILE (a recording or a Kernel Tuner "
                        "cache)")
    if replay and not Path(replay).is_file():
        raise SpecError(f"replay source {replay} does not exist")
    if trials is not None and trials <= 0:
        raise SpecError("--trials must be a positive number")
    if minutes is not None and minutes <= 0:
        raise SpecError("--minutes must be positive")
    name = template if not Path(template).is_dir() else str(Path(template).resolve())
    spec = JobSpec(template=name, arch=a.name, sizes=parsed, trials=trials, minutes=minutes,
                   sampler=sampler, seed=seed, backend="replay" if replay else backend,
                   replay=str(Path(replay).resolve()) if replay else None,
                   from_arch=from_arch, from_job=from_job, sms=sms, fresh=bool(fresh),
                   cold=bool(cold))
    return spec, tpl, a


def make_backend(spec: JobSpec, arch: Arch, hold: bool | None = None) -> tuple[Backend, str]:
    """The backend for a spec, and a note for the user when it differs from what was asked."""
    if spec.backend == "replay":
        from porter.measure.backends.replay import ReplayBackend
        if hold is None:     # a replay that takes each trial's recorded GPU time (benchmarks)
            hold = os.environ.get("PORTER_REPLAY_HOLD") == "1"
        return ReplayBackend(spec.replay, hold=hold), ""
    if spec.backend == "compile-only":
        return CompileOnlyBackend(), "compile-only run: variants are compiled, not measured"
    from porter.measure.backends.gpu import GpuBackend, gpu_available, local_device
    if not gpu_available():
        return CompileOnlyBackend(), (f"no GPU here: compile-only run for {arch.name} "
                                      "(every trial says so)")
    dev = local_device()
    if dev is not None and arch_for_cc(*dev[0]).cc != arch.cc:
        cc = dev[0]
        return CompileOnlyBackend(), (f"the GPU here is sm_{cc[0]}{cc[1]}, not {arch.name}: "
                                      "compile-only run")
    return GpuBackend(seed=spec.seed, sms=dev[1] if dev else 0), ""


def template_record(tpl: Template) -> tuple[str, str]:
    """(source, space file text) as stored with the job."""
    return tpl.source, (tpl.folder / "space.toml").read_text()


def template_snapshot(tpl: Template) -> bytes:
    """The snapshot of the template's folder that a new job stores (porter.spec.snapshot); a
    folder that changed since the template was loaded is refused rather than stored mixed."""
    from porter.errors import TemplateError
    from porter.spec.snapshot import bundle
    snap = bundle(tpl.folder, tpl.include_dir)
    if snap.hash != tpl.source_hash:
        raise TemplateError(f"template {tpl.name!r} changed on disk while the job was being "
                            "made; run the command again")
    return snap.blob


def probe_compile(tpl: Template, arch: Arch, sizes) -> None:
    """Compiles the first feasible configuration, so a template whose source cannot compile is
    refused in one line before a job is recorded."""
    from porter.build.check import static_check
    from porter.build.compile import compile_variant
    from porter.errors import TemplateError
    for config in tpl.iter_configs():
        if static_check(tpl, arch, config, sizes) is None:
            res = compile_variant(tpl, config, arch)
            if not res.ok:
                first = next((ln.strip() for ln in res.log.splitlines() if "error" in ln),
                             res.log.strip()[:200])
                raise TemplateError(f"template {tpl.name!r} does not compile for {arch.name}: "
                                    f"{first}")
            return
    raise TemplateError(f"template {tpl.name!r} has no configuration that fits {arch.name} "
                        "at these sizes")
