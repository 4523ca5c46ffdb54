"""The export formats that build more than one file's worth of text: header, kt-cache, python
module and fatbin. porter.export.export picks the rows (best configuration per architecture and size)
and calls these."""
from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

from porter.spec.arch import get_arch
from porter.build.compile import compile_ptx
from porter.errors import PorterError
from porter.records import TrialRecord
from porter.spec.template import Template

EXPR_SOURCE = Path(__file__).resolve().parents[1] / "spec" / "expr.py"


def _cc(arch: str) -> int:
    a = get_arch(arch)
    return a.cc[0] * 10 + a.cc[1]


# ---- header ---------------------------------------------------------------------------------

def header(tpl: Template, by_arch: dict[str, list[dict]]) -> str:
    """A C header: one row per (architecture, size) and a lookup that takes the running
    architecture (e.g. 90) and the problem size and returns the nearest tuned row."""
    n = tpl.name
    guard = f"PORTER_{n.upper()}_TUNED_H"
    names = list(tpl.params)
    dims = list(tpl.size_names)
    out = [f"// {n} v{tpl.version}: tuned configurations by architecture and problem size",
           "// (Kernel Porter; see manifest.json for the measurements behind each row)",
           f"#ifndef {guard}", f"#define {guard}", "",
           f"struct {n}_config {{", "  int arch;                 // compute capability, e.g. 90",
           f"  long long {', '.join(dims)};",
           f"  int {', '.join(names)};", "};", "",
           f"static const struct {n}_config {n}_table[] = {{"]
    count = 0
    for arch, rows in sorted(by_arch.items()):
        for r in rows:
            vals = ", ".join(str(int(r["params"][k])) for k in names)
            note = f"  // {r['ratio']:.3f}x vendor" if r.get("ratio") else \
                ("  // not measured" if r.get("note") else "")
            out.append(f"  {{{_cc(arch)}, {', '.join(map(str, r['size']))}, {vals}}},{note}")
            count += 1
    args = ", ".join(f"long long {d}" for d in dims)
    dist = " + ".join(f"{n}_reldiff(e->{d}, {d})" for d in dims)
    out += ["};", f"static const int {n}_table_len = {count};", "",
            f"static inline double {n}_reldiff(long long a, long long b) {{",
            "  double d = (double)(a > b ? a - b : b - a);",
            "  return d / (double)(a > b ? a : b);", "}", "",
            "// The row for this architecture (or, failing that, the newest one below it) whose",
            "// size is nearest (sum of relative differences); NULL if none fits.",
            f"static inline const struct {n}_config* {n}_lookup(int arch, {args}) {{",
            f"  const struct {n}_config* best = 0;",
            "  double best_d = 1e300; int best_arch = -1;",
            f"  for (int i = 0; i < {n}_table_len; ++i) {{",
            f"    const struct {n}_config* e = &{n}_table[i];",
            "    if (e->arch > arch || e->arch < best_arch) continue;",
            f"    double d = {dist};",
            "    if (e->arch > best_arch || d < best_d) { best = e; best_d = d; "
            "best_arch = e->arch; }",
            "  }", "  return best;", "}", "", "#endif", ""]
    return "\n".join(out)


# ---- kt-cache -------------------------------------------------------------------------------

_KT_FAILURE = {"infeasible": "InvalidConfig", "resource_rejected": "InvalidConfig",
               "compile_failed": "CompilationFailedConfig"}


def kt_cache(tpl: Template, size: tuple[int, ...], trials: list[TrialRecord]) -> dict:
    """Kernel Tuner's cache-file layout (what its simulation mode reads) for one problem size;
    a failed trial carries Kernel Tuner's failure string as its time."""
    names = list(tpl.params)
    dev = next((t.device for t in trials if t.status == "measured"), {})
    cache = {}
    for t in trials:
        entry = {n: t.params[n] for n in names}
        m = next((m for m in t.measurements if tuple(m.size) == tuple(size)), None)
        stamp = datetime.datetime.fromtimestamp(t.finished_at or 0,
                                                datetime.timezone.utc).isoformat()
        if t.status == "measured" and m:
            entry.update(time=m.ours_ms, times=[m.ours_ms],
                         compile_time=(t.compile_seconds or 0) * 1e3, verification_time=0,
                         benchmark_time=0, strategy_time=0, framework_time=0, timestamp=stamp)
        else:
            entry.update(time=_KT_FAILURE.get(t.status, "RuntimeFailedConfig"),
                         compile_time=(t.compile_seconds or 0) * 1e3, verification_time=0,
                         benchmark_time=0, strategy_time=0, framework_time=0, timestamp=stamp)
        cache[",".join(str(t.params[n]) for n in names)] = entry
    return {"device_name": dev.get("gpu", "not measured"), "kernel_name": tpl.kernel,
            "problem_size": list(size), "tune_params_keys": names,
            "tune_params": {n: list(v) for n, v in tpl.params.items()}, "objective": "time",
            "cache": cache}


# ---- fatbin ---------------------------------------------------------------------------------

def nvfatbin():
    """cuda.bindings.nvfatbin when its library (PyPI: nvidia-nvfatbin) loads, else None."""
    try:
        from cuda.bindings import nvfatbin as nf
        nf.version()
        return nf
    except Exception:  # the binding is there but libnvfatbin is not, or an old cuda-bindings
        return None


def fatbin(images: list[tuple[str, bytes]], ptx: tuple[str, str] | None) -> bytes:
    """One fatbin from (arch, cubin) images and optionally (arch, PTX) for newer GPUs."""
    nf = nvfatbin()
    if nf is None:
        raise PorterError("the fatbin format needs nvFatbin: pip install nvidia-nvfatbin")
    handle = nf.create([], 0)
    try:
        for arch, cubin in images:
            nf.add_cubin(handle, cubin, len(cubin), arch[3:], f"{arch}")
        if ptx:
            code = ptx[1].encode() + b"\0"
            nf.add_ptx(handle, code, len(code), ptx[0][3:], f"{ptx[0]}_ptx", "")
        buf = bytearray(nf.size(handle))
        nf.get(handle, buf)
        return bytes(buf)
    finally:
        nf.destroy(handle)


def portable_ptx(tpl: Template, by_arch: dict[str, dict]) -> tuple[str, str] | None:
    """PTX of the newest architecture without arch-specific (`a`) features, which newer GPUs
    can JIT; None when every architecture is arch-specific."""
    plain = [a for a in by_arch if not a.endswith("a")]
    if not plain:
        return None
    arch = max(plain, key=_cc)
    ok, log, ptx = compile_ptx(tpl, by_arch[arch], get_arch(arch))
    return (arch, ptx) if ok else None


# ---- python module --------------------------------------------------------------------------

def python_module(tpl: Template, arch: str, rows: list[dict], files: dict[str, str]) -> str:
    """A module that loads the cubins beside it with CuPy (imported on first launch) and
    dispatches by problem size; geometry for untuned sizes goes through porter's safe
    expression evaluator, inlined so the module needs nothing of porter."""
    a = get_arch(arch)
    table = []
    for r in rows:
        size = tuple(r["size"])
        launch = tpl.launch(r["params"], a, size)
        table.append({"size": r["size"], "file": files[json.dumps(r["params"],
                                                                  sort_keys=True)],
                      "grid": launch.grid, "block": launch.block, "smem": launch.smem,
                      "workspace": tpl.workspace_bytes(r["params"], a, size),
                      "params": r["params"], "arch_limits": a.limits(),
                      "geometry": {"grid": [e.text for e in tpl.grid],
                                   "block": [e.text for e in tpl.block],
                                   "smem": tpl.smem.text, "workspace": tpl.workspace.text}})
    expr = EXPR_SOURCE.read_text()
    expr = expr.replace("from __future__ import annotations\n", "")
    expr = re.sub(r"^from porter\.errors import TemplateError$",
                  "class TemplateError(ValueError):\n    pass", expr, flags=re.M)
    return (_PY_TEMPLATE.replace("@TABLE@", json.dumps(table, indent=1))
            .replace("@KERNEL@", tpl.kernel).replace("@NAME@", tpl.name)
            .replace("@ARCH@", arch).replace("@DIMS@", repr(tpl.size_names))
            .replace("@GEMM@", repr(tpl.op == "gemm")).replace("@EXPR@", expr))


_PY_TEMPLATE = '''"""@NAME@ tuned by Kernel Porter for @ARCH@: loads the cubins beside this file with CuPy and
dispatches by problem size; a size that was not tuned uses the nearest tuned size's configuration
(its launch geometry recomputed for the actual size).

    import @NAME@_tuned as k
    k.launch(*op_args, size=(M, N, K))      # op_args as in docs/TEMPLATES.md, without workspace
"""
import json
import math
import os

KERNEL = "@KERNEL@"
ARCH = "@ARCH@"
DIMS = @DIMS@
NEEDS_WORKSPACE = @GEMM@
TABLE = json.loads(r"""@TABLE@""")
_HERE = os.path.dirname(os.path.abspath(__file__))
_FUNCS = {}
_WORKSPACE = {}


def nearest(size):
    """The tuned entry closest to `size` (sum of log-distances over the dimensions)."""
    return min(TABLE, key=lambda e: sum(abs(math.log(a) - math.log(b))
                                        for a, b in zip(e["size"], size)))


def geometry(entry, size):
    """(grid, block, dynamic shared memory, workspace bytes) of `entry` at `size`."""
    if list(size) == list(entry["size"]):
        return tuple(entry["grid"]), tuple(entry["block"]), entry["smem"], entry["workspace"]
    env = dict(entry["arch_limits"])
    env.update(zip(DIMS, size))
    env.update(entry["params"])
    g = entry["geometry"]
    ev = lambda text: int(Expr(text)(env))  # noqa: E731
    return (tuple(ev(x) for x in g["grid"]), tuple(ev(x) for x in g["block"]), ev(g["smem"]),
            ev(g["workspace"]))


def function(entry):
    import cupy as cp
    if entry["file"] not in _FUNCS:
        mod = cp.RawModule(path=os.path.join(_HERE, entry["file"]))
        _FUNCS[entry["file"]] = (mod, mod.get_function(KERNEL))
    return _FUNCS[entry["file"]][1]


def launch(*args, size, stream=None):
    """Runs the kernel on `args` (the op's arguments, e.g. A, B, C, M, N, K) for `size`;
    returns the table entry it used."""
    import cupy as cp
    entry = nearest(size)
    grid, block, smem, workspace = geometry(entry, size)
    f = function(entry)
    if smem > 48 * 1024:
        f.max_dynamic_shared_size_bytes = smem
    extra = ()
    if NEEDS_WORKSPACE:  # the gemm op's scratch, which the kernel leaves zeroed
        key = max(workspace, 16)
        if key not in _WORKSPACE:
            _WORKSPACE[key] = cp.zeros(key, dtype=cp.uint8)
        extra = (_WORKSPACE[key],)
    f(grid, block, tuple(args) + extra, shared_mem=smem, stream=stream)
    return entry


# ---- porter.spec.expr (inlined): the safe evaluator for the geometry expressions ----
@EXPR@'''
