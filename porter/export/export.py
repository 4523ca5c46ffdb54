"""Exporting tuned kernels: `porter export JOB --format FMT -o DIR`.

Formats: cu (standalone source, constants baked in, launch geometry, host launcher), cubin, ptx,
fatbin (one cubin per architecture of the template's jobs, in a directory with an index), python
(a module that loads the cubins with CuPy and dispatches by problem size, falling back to the
nearest tuned size), header (per-architecture, per-size configurations), json (the tuning
table), kt-cache (a Kernel Tuner cache file). Every export writes manifest.json beside it.
"""
from __future__ import annotations

import datetime
import json
import math
import re
from pathlib import Path

import porter.export.formats as fmt_
from porter.spec.arch import get_arch
from porter.build.compile import compile_ptx, compile_variant, nvrtc_version
from porter.errors import PorterError
from porter.records import TrialRecord
from porter.store.base import Store
from porter.spec.snapshot import job_template
from porter.spec.template import INCLUDE_DIR, Template

FORMATS = ("cu", "cubin", "ptx", "fatbin", "python", "header", "json", "kt-cache")


def tuning_table(store: Store, job_id: int) -> tuple[Template, str, list[dict]]:
    """Per problem size, the best trial of the job: [{size, params, measurement, trial}]."""
    info = store.get_job(job_id)
    tpl = job_template(store, info)       # the job's own snapshot, never the folder on disk
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
                         "gbps": m.gbps, "device": best.device})
    else:
        compiled = [t for t in trials if t.status == "compiled"]
        if not compiled:
            raise PorterError(f"job {job_id} has no measured or compiled trial to export")
        first = compiled[0]
        rows = [{"size": list(s), "params": first.params, "trial": first.number,
                 "note": "compile-only job: not measured; the first compiled configuration"}
                for s in info.spec.sizes]
    return tpl, info.spec.arch, rows


def _launch(tpl: Template, arch: str, params: dict, size) -> dict | None:
    """How to launch one tuned kernel at its size: geometry, workspace (the first
    workspace_clean_bytes zeroed before the first launch; the kernel leaves them so) and the TMA
    tensor maps it takes after its plain arguments, in order (a zero box: the configuration does
    not use that map; pass 128 zero bytes). None where the stored configuration no longer fits
    the template."""
    try:
        a, size = get_arch(arch), tuple(size)
        env = tpl.env(params, a, size)
        L = tpl.launch(params, a, size, env=env)
        d = {"grid": list(L.grid), "block": list(L.block), "smem_bytes": L.smem,
             "cluster": list(L.cluster), "workspace_bytes": tpl.workspace_bytes(params, a, size),
             "workspace_clean_bytes": tpl.workspace_clean_bytes(params, a, size)}
        if tpl.tensor_maps:
            d["tensor_maps"] = [{"buffer": buf, "box": list(box), "swizzle": sw}
                                for buf, box, sw in tpl.map_boxes(env)]
        return d
    except PorterError:
        return None


def _manifest(tpl: Template, arch: str, job_id: int, fmt: str, rows: list[dict]) -> dict:
    dev = next((r.get("device") for r in rows if r.get("device")), {}) or {}
    measured = any("ours_ms" in r for r in rows)
    return {"template": tpl.name, "template_version": tpl.version,
            "template_hash": tpl.source_hash, "arch": arch, "job": job_id, "format": fmt,
            "gpu": dev.get("gpu", "not measured"), "driver": dev.get("driver", ""),
            "nvrtc": nvrtc_version(),
            "toolchain": {"nvrtc": nvrtc_version(), "measured_with_nvrtc": dev.get("nvrtc"),
                          "cuda_driver": dev.get("cuda_driver")},
            "selection": "per size, the measured trial with the lowest median time (highest "
                         "ratio to the vendor baseline at that size)" if measured else
                         "compile-only job: nothing was measured; every size gets the first "
                         "compiled configuration",
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "measurements": [{**{k: v for k, v in r.items() if k != "device"},
                              "launch": _launch(tpl, arch, r["params"], r["size"])}
                             for r in rows]}


def _variant_name(tpl: Template, params: dict) -> str:
    return f"{tpl.name}_" + "_".join(f"{k}{v}" for k, v in params.items())


def standalone_source(tpl: Template, arch: str, params: dict, size=None) -> str:
    """The template with its constants as #defines and porter.cuh inlined; host launcher under
    #ifndef PORTER_NO_HOST."""
    a = get_arch(arch)
    src = tpl.source
    for m in re.finditer(r'^\s*#\s*include\s*"([^"]+)"', tpl.source, re.M):
        header = ((tpl.include_dir or INCLUDE_DIR) / m.group(1)).read_text().replace(
            "#pragma once", "")
        src = src.replace(m.group(0), f"// ---- {m.group(1)} (inlined) ----\n{header}")
    defines = "\n".join(f"#define {k} {int(v) if isinstance(v, bool) else v}"
                        for k, v in params.items())
    launch = tpl.launch(params, a, tuple(size)) if size else None
    geometry = ""
    if launch:
        geometry = (f"// tuned for {'x'.join(map(str, size))}: grid {launch.grid}, block "
                    f"{launch.block}, {launch.smem} bytes of dynamic shared memory\n"
                    + "".join(f"#define PORTER_TUNED_{k} {v}\n" for k, v in (
                        *zip(("GRID_X", "GRID_Y", "GRID_Z"), launch.grid),
                        *zip(("BLOCK_X", "BLOCK_Y", "BLOCK_Z"), launch.block),
                        ("SMEM_BYTES", launch.smem))))
    limits = a.limits()

    def c_text(e) -> str:  # the architecture's limits are constants in this file
        return re.sub(r"\barch_\w+\b", lambda m: str(limits.get(m.group(0), m.group(0))),
                      e.text)
    exprs = {"grid": [c_text(e) for e in tpl.grid], "block": [c_text(e) for e in tpl.block],
             "smem": c_text(tpl.smem)}
    host = _host_launcher(tpl, exprs, params)
    return (f"// {tpl.name} v{tpl.version} tuned by Kernel Porter for {arch}\n{geometry}"
            f"#define PORTER_ARCH {a.cc[0] * 10 + a.cc[1]}\n{defines}\n\n{src}\n{host}")


def _c_expr(text: str) -> str:
    """A space-file expression as C: its functions become porter_* inline functions (no macros
    leak into the user's code); conditional expressions are refused by the caller."""
    t = text.replace("//", "/")
    return re.sub(r"\b(min|max|ceil_div|round_up)\(", r"porter_\1(", t)


_HOST_ARGS = {
    "gemm": ("const bf16_t* A, const bf16_t* B, bf16_t* C, int M, int N, int K, void* workspace",
             "(void*)&A, (void*)&B, (void*)&C, (void*)&M, (void*)&N, (void*)&K, (void*)&workspace"),
    "rmsnorm": ("const bf16_t* x, const bf16_t* w, bf16_t* y, int rows, int cols, float eps",
                "(void*)&x, (void*)&w, (void*)&y, (void*)&rows, (void*)&cols, (void*)&eps"),
}


def _host_launcher(tpl: Template, exprs: dict, params: dict) -> str:
    if tpl.op not in _HOST_ARGS or tpl.tensor_maps or " if " in " ".join(
            exprs["grid"] + exprs["block"] + [exprs["smem"]]):
        return ("#ifndef PORTER_NO_HOST\n// host launcher: this template's launch needs tensor "
                "maps or conditional geometry; see manifest.json for grid/block/smem\n#endif\n")
    sig, ptrs = _HOST_ARGS[tpl.op]
    dims = ", ".join(tpl.size_names)
    g = ", ".join(f"(unsigned)({_c_expr(e)})" for e in exprs["grid"])
    b = ", ".join(f"(unsigned)({_c_expr(e)})" for e in exprs["block"])
    return f"""#ifndef PORTER_NO_HOST
#include <cuda_runtime.h>
static inline long long porter_min(long long a, long long b) {{ return a < b ? a : b; }}
static inline long long porter_max(long long a, long long b) {{ return a > b ? a : b; }}
static inline long long porter_ceil_div(long long a, long long b) {{ return (a + b - 1) / b; }}
static inline long long porter_round_up(long long a, long long b) {{
  return porter_ceil_div(a, b) * b;
}}
// Launches the tuned kernel; sizes ({dims}) are the problem's, geometry follows the space file.
extern "C" cudaError_t launch_{tpl.kernel}({sig}, cudaStream_t stream) {{
  dim3 grid({g});
  dim3 block({b});
  size_t smem = (size_t)({_c_expr(exprs["smem"])});
  if (smem > 48 * 1024)
    cudaFuncSetAttribute({tpl.kernel}, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  void* args[] = {{{ptrs}}};
  return cudaLaunchKernel((const void*){tpl.kernel}, grid, block, args, smem, stream);
}}
#endif
"""


def _cubin(tpl: Template, arch: str, params: dict) -> bytes:
    res = compile_variant(tpl, params, get_arch(arch))
    if not res.ok:
        raise PorterError(f"the tuned configuration no longer compiles: {res.log[:200]}")
    return Path(res.cubin_path).read_bytes()


def export(store: Store, job_id: int, fmt: str, out_dir: str | Path) -> list[Path]:
    """Writes the job's tuned kernels in `fmt` (one of FORMATS) into out_dir, with
    manifest.json; returns the paths written. Raises PorterError (one line) for an unknown
    format or job, or a job with no measured or compiled trial."""
    if fmt not in FORMATS:
        raise PorterError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")
    tpl, arch, rows = tuning_table(store, job_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    extra: dict = {}

    def write(name: str, data: str | bytes) -> None:
        p = out / name
        p.write_bytes(data) if isinstance(data, bytes) else p.write_text(data)
        written.append(p)

    distinct = {json.dumps(r["params"], sort_keys=True): r["params"] for r in rows}
    if fmt == "cu":
        for r in rows:
            write(f"{tpl.name}_{arch}_{_size(r['size'])}.cu",
                  standalone_source(tpl, arch, r["params"], r["size"]))
    elif fmt in ("cubin", "python"):
        files = {}
        for key, params in distinct.items():
            files[key] = f"{_variant_name(tpl, params)}.{arch}.cubin"
            write(files[key], _cubin(tpl, arch, params))
        if fmt == "python":
            write(f"{tpl.name}_tuned.py", fmt_.python_module(tpl, arch, rows, files))
    elif fmt == "fatbin":
        extra = _fatbins(store, tpl, arch, rows, write)
    elif fmt == "ptx":
        for params in distinct.values():
            ok, log, ptx = compile_ptx(tpl, params, get_arch(arch))
            if not ok:
                raise PorterError(f"the tuned configuration no longer compiles: "
                                  f"{_first_line(log)}")
            write(f"{_variant_name(tpl, params)}.{arch}.ptx", ptx)
    elif fmt == "header":
        by_arch = {a: _arch_rows(store, tpl.name, a) for a in _archs(store, tpl.name)}
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
    m.write_text(json.dumps(dict(_manifest(tpl, arch, job_id, fmt, rows), **extra), indent=1))
    return written + [m]


def _size(size) -> str:
    return "x".join(map(str, size))


def _first_line(log: str) -> str:
    return next((ln.strip() for ln in log.splitlines() if "error" in ln), log.strip()[:200])


def _archs(store: Store, template: str) -> list[str]:
    return sorted({j.spec.arch for j in store.list_jobs(1000) if j.template_name == template})


def _arch_rows(store: Store, template: str, arch: str) -> list[dict]:
    """Per size, the best row over every job of (template, arch); measured rows first."""
    best: dict[tuple, dict] = {}
    for j in store.list_jobs(1000):
        if j.template_name != template or j.spec.arch != arch:
            continue
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
