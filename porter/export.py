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
import shutil
from pathlib import Path

from .arch import get_arch
from .compile import compile_ptx, compile_variant, nvrtc_version
from .errors import PorterError
from .records import TrialRecord
from .store import Store
from .template import INCLUDE_DIR, Template, find_template

FORMATS = ("cu", "cubin", "ptx", "fatbin", "python", "header", "json", "kt-cache")


def tuning_table(store: Store, job_id: int) -> tuple[Template, str, list[dict]]:
    """Per problem size, the best trial of the job: [{size, params, measurement, trial}]."""
    info = store.get_job(job_id)
    tpl = find_template(info.spec.template)
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


def _manifest(tpl: Template, arch: str, job_id: int, fmt: str, rows: list[dict]) -> dict:
    dev = next((r.get("device") for r in rows if r.get("device")), {}) or {}
    return {"template": tpl.name, "template_version": tpl.version,
            "template_hash": tpl.source_hash, "arch": arch, "job": job_id, "format": fmt,
            "gpu": dev.get("gpu", "not measured"), "driver": dev.get("driver", ""),
            "nvrtc": nvrtc_version(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "measurements": [{k: v for k, v in r.items() if k != "device"} for r in rows]}


def _variant_name(tpl: Template, params: dict) -> str:
    return f"{tpl.name}_" + "_".join(f"{k}{v}" for k, v in params.items())


def standalone_source(tpl: Template, arch: str, params: dict, size=None) -> str:
    """The template with its constants as #defines and porter.cuh inlined; host launcher under
    #ifndef PORTER_NO_HOST."""
    a = get_arch(arch)
    src = tpl.source
    for m in re.finditer(r'^\s*#\s*include\s*"([^"]+)"', tpl.source, re.M):
        header = (INCLUDE_DIR / m.group(1)).read_text().replace("#pragma once", "")
        src = src.replace(m.group(0), f"// ---- {m.group(1)} (inlined) ----\n{header}")
    defines = "\n".join(f"#define {k} {int(v) if isinstance(v, bool) else v}"
                        for k, v in params.items())
    launch = tpl.launch(params, a, tuple(size)) if size else None
    geometry = ""
    if launch:
        geometry = (f"// tuned for {'x'.join(map(str, size))}: grid {launch.grid}, block "
                    f"{launch.block}, {launch.smem} bytes of dynamic shared memory\n")
    exprs = {"grid": [e.text for e in tpl.grid], "block": [e.text for e in tpl.block],
             "smem": tpl.smem.text}
    host = _host_launcher(tpl, exprs, params)
    return (f"// {tpl.name} v{tpl.version} tuned by Kernel Porter for {arch}\n{geometry}"
            f"#define PORTER_ARCH {a.cc[0] * 10 + a.cc[1]}\n{defines}\n\n{src}\n{host}")


def _c_expr(text: str) -> str:
    """A space-file expression as C (ceil_div/min/max become macros; `a if c else b` is not
    translated and falls back to a comment)."""
    t = text.replace("//", "/")
    return t


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
#define ceil_div(a, b) (((a) + (b) - 1) / (b))
#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))
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
    if fmt not in FORMATS:
        raise PorterError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")
    tpl, arch, rows = tuning_table(store, job_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    distinct = {json.dumps(r["params"], sort_keys=True): r["params"] for r in rows}
    if fmt == "cu":
        for r in rows:
            p = out / f"{tpl.name}_{arch}_{'x'.join(map(str, r['size']))}.cu"
            p.write_text(standalone_source(tpl, arch, r["params"], r["size"]))
            written.append(p)
    elif fmt in ("cubin", "fatbin", "python"):
        archs = [arch]
        if fmt == "fatbin":  # every architecture this template was tuned for
            archs = sorted({j.spec.arch for j in store.list_jobs(1000)
                            if j.template_name == tpl.name} | {arch})
        index = []
        for a in archs:
            a_rows = rows if a == arch else _best_rows(store, tpl.name, a)
            for params in {json.dumps(r["params"], sort_keys=True): r["params"]
                           for r in a_rows}.values():
                p = out / f"{_variant_name(tpl, params)}.{a}.cubin"
                p.write_bytes(_cubin(tpl, a, params))
                written.append(p)
                index.append({"arch": a, "params": params, "file": p.name,
                              "sizes": [r["size"] for r in a_rows if r["params"] == params]})
        if fmt == "fatbin":
            p = out / f"{tpl.name}.fatbin.json"
            p.write_text(json.dumps({"kernel": tpl.kernel, "images": index}, indent=1))
            written.append(p)
        if fmt == "python":
            written.append(_python_module(tpl, arch, rows, index, out))
    elif fmt == "ptx":
        for params in distinct.values():
            ok, log, ptx = compile_ptx(tpl, params, get_arch(arch))
            if not ok:
                raise PorterError(f"the tuned configuration no longer compiles: {log[:200]}")
            p = out / f"{_variant_name(tpl, params)}.{arch}.ptx"
            p.write_text(ptx)
            written.append(p)
    elif fmt == "header":
        p = out / f"{tpl.name}_tuned.h"
        p.write_text(_header(tpl, arch, rows))
        written.append(p)
    elif fmt == "json":
        p = out / f"{tpl.name}_{arch}.json"
        p.write_text(json.dumps({"template": tpl.name, "arch": arch, "table": rows}, indent=1))
        written.append(p)
    elif fmt == "kt-cache":
        p = out / f"{tpl.name}_{arch}_kt_cache.json"
        p.write_text(json.dumps(kt_cache(store, job_id, tpl), indent=1))
        written.append(p)
    m = out / "manifest.json"
    m.write_text(json.dumps(_manifest(tpl, arch, job_id, fmt, rows), indent=1))
    return written + [m]


def _best_rows(store: Store, template: str, arch: str) -> list[dict]:
    jobs = [j for j in store.list_jobs(1000) if j.template_name == template and j.spec.arch == arch]
    rows = []
    for j in jobs:
        try:
            rows += tuning_table(store, j.id)[2]
        except PorterError:
            continue
    return rows


def _header(tpl: Template, arch: str, rows: list[dict]) -> str:
    guard = f"PORTER_{tpl.name.upper()}_TUNED_H"
    names = list(tpl.params)
    lines = [f"// {tpl.name}: tuned configurations by architecture and problem size",
             f"#ifndef {guard}", f"#define {guard}", "",
             f"struct {tpl.name}_config {{ int arch; long long " +
             ", ".join(tpl.size_names) + "; int " + ", ".join(names) + "; };", "",
             f"static const struct {tpl.name}_config {tpl.name}_table[] = {{"]
    a = get_arch(arch)
    for r in rows:
        vals = ", ".join(str(int(r["params"][n])) for n in names)
        lines.append(f"  {{{a.cc[0] * 10 + a.cc[1]}, {', '.join(map(str, r['size']))}, {vals}}},")
    lines += ["};", f"static const int {tpl.name}_table_len = {len(rows)};", "", "#endif", ""]
    return "\n".join(lines)


def kt_cache(store: Store, job_id: int, tpl: Template) -> dict:
    info = store.get_job(job_id)
    trials = store.trials(job_id)
    names = list(tpl.params)
    dev = next((t.device for t in trials if t.status == "measured"), {})
    cache = {}
    failure = {"infeasible": "InvalidConfig", "resource_rejected": "InvalidConfig",
               "compile_failed": "CompilationFailedConfig"}
    size0 = tuple(info.spec.sizes[0])
    for t in trials:
        entry = {n: t.params[n] for n in names}
        m = next((m for m in t.measurements if m.size == size0), None)
        if t.status == "measured" and m:
            entry.update(time=m.ours_ms, times=[m.ours_ms], compile_time=(t.compile_seconds or 0)
                         * 1e3, verification_time=0, benchmark_time=0, strategy_time=0,
                         framework_time=0, timestamp=datetime.datetime.fromtimestamp(
                             t.finished_at or 0, datetime.timezone.utc).isoformat())
        else:
            entry.update(time=failure.get(t.status, "RuntimeFailedConfig"), compile_time=0,
                         verification_time=0, benchmark_time=0, strategy_time=0,
                         framework_time=0, timestamp="")
        cache[",".join(str(t.params[n]) for n in names)] = entry
    return {"device_name": dev.get("gpu", "not measured"), "kernel_name": tpl.kernel,
            "problem_size": list(size0), "tune_params_keys": names,
            "tune_params": {n: list(v) for n, v in tpl.params.items()}, "objective": "time",
            "cache": cache}


def _python_module(tpl: Template, arch: str, rows: list[dict], index: list[dict],
                   out: Path) -> Path:
    a = get_arch(arch)
    table = []
    for r in rows:
        launch = tpl.launch(r["params"], a, tuple(r["size"]))
        env = tpl.env(r["params"], a, tuple(r["size"]))
        file = next(i["file"] for i in index if i["params"] == r["params"])
        table.append({"size": r["size"], "file": file, "grid": launch.grid,
                      "block": launch.block, "smem": launch.smem,
                      "workspace": tpl.workspace_bytes(r["params"], a, tuple(r["size"])),
                      "geometry": {"grid": [e.text for e in tpl.grid],
                                   "block": [e.text for e in tpl.block],
                                   "smem": tpl.smem.text, "workspace": tpl.workspace.text},
                      "params": r["params"], "env_keys": sorted(env)})
    p = out / f"{tpl.name}_tuned.py"
    p.write_text(_PY_TEMPLATE.replace("@TABLE@", json.dumps(table, indent=1))
                 .replace("@KERNEL@", tpl.kernel).replace("@NAME@", tpl.name)
                 .replace("@DIMS@", repr(tpl.size_names)))
    return p


_PY_TEMPLATE = '''"""@NAME@ tuned by Kernel Porter: loads the cubins beside this file with CuPy and dispatches by
problem size; a size that was not tuned uses the nearest tuned size's configuration (its launch
geometry recomputed for the actual size)."""
import math
import os

import cupy as cp

KERNEL = "@KERNEL@"
DIMS = @DIMS@
TABLE = @TABLE@
_HERE = os.path.dirname(os.path.abspath(__file__))
_FUNCS = {}
_WORKSPACE = {}


def nearest(size):
    """The tuned entry closest to `size` (log-distance over the dimensions)."""
    return min(TABLE, key=lambda e: sum(abs(math.log(a) - math.log(b))
                                        for a, b in zip(e["size"], size)))


def _geometry(entry, size):
    if list(size) == entry["size"]:
        return tuple(entry["grid"]), tuple(entry["block"]), entry["smem"], entry["workspace"]
    # another size: the space file's geometry expressions, through porter's safe evaluator
    from porter.expr import Expr
    env = dict(entry["params"])
    env.update(zip(DIMS, size))
    ev = lambda t: int(Expr(t)(env))
    g = entry["geometry"]
    grid = tuple(ev(x) for x in g["grid"])
    block = tuple(ev(x) for x in g["block"])
    return grid, block, ev(g["smem"]), ev(g["workspace"])


def function(entry):
    if entry["file"] not in _FUNCS:
        mod = cp.RawModule(path=os.path.join(_HERE, entry["file"]))
        _FUNCS[entry["file"]] = (mod, mod.get_function(KERNEL))
    return _FUNCS[entry["file"]][1]


def launch(*args, size, stream=None):
    """Runs the kernel on `args` (the op's arguments, e.g. A, B, C, M, N, K) for `size`."""
    entry = nearest(size)
    grid, block, smem, workspace = _geometry(entry, size)
    f = function(entry)
    if smem > 48 * 1024:
        f.max_dynamic_shared_size_bytes = smem
    extra = ()
    if KERNEL.startswith("gemm"):  # the gemm op's scratch, left zeroed by the kernel
        key = max(workspace, 16)
        if key not in _WORKSPACE:
            _WORKSPACE[key] = cp.zeros(key, dtype=cp.uint8)
        extra = (_WORKSPACE[key],)
    f(grid, block, tuple(args) + extra, shared_mem=smem, stream=stream)
    return entry
'''
