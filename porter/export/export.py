"""Exporting tuned kernels: `porter export JOB --format FMT -o DIR`.

Formats: cu (one translation unit per tuned size that compiles alone with NVRTC or nvcc, with a
host launcher for TMA and cluster kernels too, and with -DPORTER_MAIN a small checking and timing
program: fmt_cu), cubin, ptx, fatbin (one cubin per architecture of the template's jobs),
python (a module that launches the cubins through cuda-bindings and picks, for a size that was
not tuned, the nearest tuned configuration that is legal there: fmt_python), torch (a package
registering a torch.library custom op: fmt_torch), header (per-architecture, per-size
configurations), json (the tuning table), kt-cache (a Kernel Tuner cache file). Every export
writes manifest.json beside it: the job, its template snapshot, the architecture, the GPU and
the figures behind each entry. Exports read the job's own template snapshot, never the folder
on disk (`_job_template`).
"""
from __future__ import annotations

import datetime
import json
import math
import shutil
from pathlib import Path

import porter.export.formats as fmt_
from porter.build.compile import compile_ptx, compile_variant, nvrtc_version
from porter.errors import PorterError
from porter.export.fmt_cu import standalone_source
from porter.export.fmt_python import python_module
from porter.export.fmt_torch import torch_package
from porter.export.opargs import BUILTIN_OPS, map_dtypes, op_args
from porter.records import TrialRecord
from porter.spec.arch import Arch, get_arch, resolve_arch
from porter.spec.template import Template
from porter.store.base import JobInfo, Store

FORMATS = ("cu", "cubin", "ptx", "fatbin", "python", "torch", "header", "json", "kt-cache")


def _job_template(store: Store, info: JobInfo) -> Template:
    """The template the job ran: its own content-addressed snapshot (the one place exports
    look a template up)."""
    from porter.spec.snapshot import job_template
    return job_template(store, info)


def _table(store: Store, job_id: int) -> tuple[JobInfo, Template, Arch, list[dict]]:
    """The job, its template, its architecture (with the measured GPU's multiprocessor count)
    and per problem size the best trial: [{size, params, trial, figures..., device}]."""
    info = store.get_job(job_id)
    tpl = _job_template(store, info)
    trials = store.trials(job_id)
    measured = [t for t in trials if t.status == "measured"]
    rows = []
    if measured:
        for size in info.spec.sizes:
            size = tuple(size)

            def at(t: TrialRecord):
                return next((m for m in t.measurements if m.size == size), None)
            cands = [t for t in measured if at(t) is not None]
            if not cands:
                continue
            best = min(cands, key=lambda t: at(t).ours_ms)
            m = at(best)
            rows.append({"size": list(size), "params": best.params, "trial": best.number,
                         "ours_ms": m.ours_ms, "baseline": m.baseline,
                         "baseline_ms": m.baseline_ms, "ratio": m.ratio, "tflops": m.tflops,
                         "gbps": m.gbps, "device": best.device,
                         # a trial reusing an earlier job's measurement names that trial
                         **({"reused_from": list(best.reused_from)} if best.reused_from
                            else {}),
                         **({"origin": best.origin} if best.origin else {})})
    else:
        compiled = [t for t in trials if t.status == "compiled"]
        if not compiled:
            raise PorterError(f"job {job_id} has no measured or compiled trial to export")
        first = compiled[0]
        rows = [{"size": list(s), "params": first.params, "trial": first.number,
                 "note": "compile-only job: not measured; the first compiled configuration"}
                for s in info.spec.sizes]
    sms = next((int(r["device"].get("sms") or 0) for r in rows if r.get("device")), 0)
    return info, tpl, resolve_arch(info.spec.arch, info.spec.sms).with_sms(sms), rows


def tuning_table(store: Store, job_id: int) -> tuple[Template, str, list[dict]]:
    """Per problem size, the best trial of the job: (template, arch name, rows)."""
    _, tpl, a, rows = _table(store, job_id)
    return tpl, a.name, rows


def _launch(tpl: Template, a: Arch, params: dict, size, dtypes=None) -> dict | None:
    """How to launch one tuned kernel at its size: geometry, workspace (the first
    workspace_clean_bytes zeroed before the first launch; the kernel leaves them so) and the TMA
    tensor maps it takes after its plain arguments, in order (a zero box: the configuration does
    not use that map; pass 128 zero bytes), each with its buffer's element type (`dtypes`:
    map_dtypes), the CUtensorMapDataType that encodes it and its bytes. None where the stored
    configuration no longer fits the template."""
    dtypes = map_dtypes(tpl) if dtypes is None else dtypes
    try:
        size = tuple(size)
        env = tpl.env(params, a, size)
        L = tpl.launch(params, a, size, env=env)
        d = {"grid": list(L.grid), "block": list(L.block), "smem_bytes": L.smem,
             "cluster": list(L.cluster), "workspace_bytes": tpl.workspace_bytes(params, a, size),
             "workspace_clean_bytes": tpl.workspace_clean_bytes(params, a, size)}
        if tpl.tensor_maps:
            d["tensor_maps"] = [{"buffer": buf, "box": list(box), "swizzle": sw,
                                 "dtype": t[0], "tma_data_type": t[1], "elem_bytes": t[3]}
                                for (buf, box, sw), t in zip(tpl.map_boxes(env), dtypes)]
        return d
    except PorterError:
        return None


def _manifest(info: JobInfo, tpl: Template, a: Arch, fmt: str, rows: list[dict]) -> dict:
    dtypes = map_dtypes(tpl)
    dev = next((r.get("device") for r in rows if r.get("device")), {}) or {}
    measured = any("ours_ms" in r for r in rows)
    return {"template": tpl.name, "template_version": tpl.version,
            "template_hash": tpl.source_hash, "template_snapshot": info.template_hash,
            "arch": a.name, "sms": a.sms, "job": info.id, "job_status": info.status,
            "format": fmt, "gpu": dev.get("gpu", "not measured"),
            "driver": dev.get("driver", ""), "nvrtc": nvrtc_version(),
            "toolchain": {"nvrtc": nvrtc_version(), "measured_with_nvrtc": dev.get("nvrtc"),
                          "cuda_driver": dev.get("cuda_driver")},
            "selection": "per size, the measured trial with the lowest median time (highest "
                         "ratio to the vendor baseline at that size)" if measured else
                         "compile-only job: nothing was measured; every size gets the first "
                         "compiled configuration",
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "measurements": [{**{k: v for k, v in r.items() if k != "device"},
                              "launch": _launch(tpl, a, r["params"], r["size"], dtypes)}
                             for r in rows]}


def _variant_name(tpl: Template, params: dict) -> str:
    return f"{tpl.name}_" + "_".join(f"{k}{v}" for k, v in params.items())


def _cubin(tpl: Template, arch: str | Arch, params: dict) -> bytes:
    res = compile_variant(tpl, params, arch if isinstance(arch, Arch) else get_arch(arch))
    if not res.ok:
        raise PorterError(f"the tuned configuration no longer compiles: {_first_line(res.log)}")
    return Path(res.cubin_path).read_bytes()


def export(store: Store, job_id: int, fmt: str, out_dir: str | Path) -> list[Path]:
    """Writes the job's tuned kernels in `fmt` (one of FORMATS) into out_dir, with
    manifest.json; returns the paths written. Raises PorterError (one line) for an unknown
    format or job, or a job with no measured or compiled trial."""
    if fmt not in FORMATS:
        raise PorterError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")
    info, tpl, a, rows = _table(store, job_id)
    map_dtypes(tpl)             # a buffer type TMA cannot encode: refused before writing
    arch = a.name
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    extra: dict = {}

    def write(name: str, data: str | bytes) -> None:
        p = out / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data) if isinstance(data, bytes) else p.write_text(data)
        written.append(p)

    distinct = {json.dumps(r["params"], sort_keys=True): r["params"] for r in rows}
    if fmt == "cu":
        if tpl.op in BUILTIN_OPS and not op_args(tpl).matrix_buffers:
            raise PorterError(f"the cu format's tensor maps are matrices; op {tpl.op!r} takes "
                              "rank-3 maps: export it as python or torch (or cubin)")
        for r in rows:
            write(f"{tpl.name}_{arch}_{_size(r['size'])}.cu",
                  standalone_source(tpl, a, r["params"], r["size"]))
    elif fmt in ("cubin", "python", "torch"):
        if fmt == "torch":
            init = torch_package(tpl, arch, rows)   # refuses other ops before writing
            pkg = f"{tpl.name}_torch"
            if (out / pkg).is_dir():
                shutil.rmtree(out / pkg)
        prefix = f"{pkg}/" if fmt == "torch" else ""
        files = {}
        for key, params in distinct.items():
            files[key] = f"{_variant_name(tpl, params)}.{arch}.cubin"
            write(prefix + files[key], _cubin(tpl, a, params))
        if fmt == "python":
            write(f"{tpl.name}_tuned.py", python_module(tpl, a, rows, files))
        elif fmt == "torch":
            write(f"{pkg}/_kernel.py", python_module(tpl, a, rows, files))
            write(f"{pkg}/__init__.py", init)
    elif fmt == "fatbin":
        extra = _fatbins(store, tpl, arch, rows, write)
    elif fmt == "ptx":
        for params in distinct.values():
            ok, log, ptx = compile_ptx(tpl, params, a)
            if not ok:
                raise PorterError(f"the tuned configuration no longer compiles: "
                                  f"{_first_line(log)}")
            write(f"{_variant_name(tpl, params)}.{arch}.ptx", ptx)
    elif fmt == "header":
        by_arch = {x: _arch_rows(store, tpl.name, x) for x in _archs(store, tpl.name)}
        by_arch[arch] = rows
        write(f"{tpl.name}_tuned.h", fmt_.header(tpl, by_arch))
        extra = {"archs": sorted(by_arch)}
    elif fmt == "json":
        write(f"{tpl.name}_{arch}.json",
              json.dumps({"template": tpl.name, "arch": arch, "table": rows}, indent=1))
    elif fmt == "kt-cache":
        trials = store.trials(job_id)
        for r in rows:
            write(f"{tpl.name}_{arch}_{_size(r['size'])}_kt_cache.json",
                  json.dumps(fmt_.kt_cache(tpl, tuple(r["size"]), trials), indent=1))
    m = out / "manifest.json"
    m.write_text(json.dumps(dict(_manifest(info, tpl, a, fmt, rows), **extra), indent=1))
    return written + [m]


def _size(size) -> str:
    return "x".join(map(str, size))


def _first_line(log: str) -> str:
    return next((ln.strip() for ln in log.splitlines() if "error" in ln), log.strip()[:200])


def _archs(store: Store, template: str) -> list[str]:
    return sorted({j.spec.arch for j in store.list_jobs(None, template=template)})


def _arch_rows(store: Store, template: str, arch: str) -> list[dict]:
    """Per size, the best row over every job of (template, arch); measured rows first."""
    best: dict[tuple, dict] = {}
    for j in store.list_jobs(None, template=template, arch=arch):
        try:
            rows = tuning_table(store, j.id)[2]
        except PorterError:
            continue
        for r in rows:
            key = tuple(r["size"])
            rank = (r.get("ours_ms") is None, r.get("ours_ms") or 0.0)
            old = best.get(key)
            if old is None or rank < (old.get("ours_ms") is None, old.get("ours_ms") or 0.0):
                best[key] = r
    return [best[k] for k in sorted(best)]


def _nearest_row(rows: list[dict], size) -> dict:
    return min(rows, key=lambda r: sum(abs(math.log(a) - math.log(b))
                                       for a, b in zip(r["size"], size)))


def _fatbins(store: Store, tpl: Template, arch: str, rows: list[dict], write) -> dict:
    """Per size of the job, one fatbin holding, for every architecture this template has jobs
    on, that architecture's best configuration at the size (or the nearest size it has), plus
    PTX for newer GPUs where an architecture without `a` features exists. Without nvFatbin the
    cubins are written side by side under the same index."""
    by_arch = {a: _arch_rows(store, tpl.name, a) for a in _archs(store, tpl.name)}
    by_arch[arch] = rows
    by_arch = {a: r for a, r in by_arch.items() if r}
    have_nvfatbin = fmt_.nvfatbin() is not None
    index = []
    for r in rows:
        chosen = {a: _nearest_row(a_rows, r["size"])["params"] for a, a_rows in by_arch.items()}
        images = [(a, _cubin(tpl, a, p)) for a, p in sorted(chosen.items())]
        entry = {"size": r["size"], "images": [{"arch": a, "params": p}
                                               for a, p in sorted(chosen.items())]}
        if have_nvfatbin:
            ptx = fmt_.portable_ptx(tpl, chosen)
            name = f"{tpl.name}_{_size(r['size'])}.fatbin"
            write(name, fmt_.fatbin(images, ptx))
            entry.update(file=name, ptx=ptx[0] if ptx else None)
        else:
            for (a, cubin), img in zip(images, entry["images"]):
                img["file"] = f"{tpl.name}_{_size(r['size'])}.{a}.cubin"
                write(img["file"], cubin)
        index.append(entry)
    container = "nvFatbin" if have_nvfatbin else \
        "cubins side by side (nvFatbin not installed: pip install nvidia-nvfatbin)"
    write(f"{tpl.name}.fatbin.json", json.dumps({"kernel": tpl.kernel, "container": container,
                                                 "fatbins": index}, indent=1))
    return {"archs": sorted(by_arch), "container": container}
