"""The export formats that build more than one file's worth of text: header, kt-cache and
fatbin (cu, python and torch have modules of their own: fmt_cu, fmt_python, fmt_torch).
porter.export.export picks the rows (best configuration per architecture and size) and calls
these."""
from __future__ import annotations

import datetime

from porter.spec.arch import get_arch
from porter.build.compile import compile_ptx
from porter.errors import PorterError
from porter.records import TrialRecord
from porter.spec.template import Template


def _cc(arch: str) -> int:
    a = get_arch(arch)
    return a.cc[0] * 10 + a.cc[1]


# ---- header ---------------------------------------------------------------------------------

def _pitch_terms(tpl: Template, dims: list[str]) -> list[str]:
    """C terms, one per buffer a tensor map reads or writes: 1 where its row pitch is on 32-byte
    sectors at the row's size (e->M, ...) and off them at the asked size, or the other way
    round (runtime_py.PITCH_COST's rule, in the header's lookup); buffers whose row length is
    not an expression of the sizes are left out."""
    from porter.export.cexpr import to_c
    from porter.export.opargs import map_dtypes, op_args
    from porter.export.runtime_py import SECTOR
    from porter.spec.expr import Expr
    try:
        buffers, sizes = op_args(tpl).buffers, map_dtypes(tpl)
    except PorterError:
        return []
    terms, seen = [], set()
    for tm, (_, _, _, nbytes) in zip(tpl.tensor_maps, sizes):
        if tm.buffer in seen or tm.buffer not in buffers:
            continue
        seen.add(tm.buffer)
        cols = str(buffers[tm.buffer][-1])
        try:
            here = to_c(Expr(cols), {}, {d: d for d in dims})
            there = to_c(Expr(cols), {}, {d: f"e->{d}" for d in dims})
        except PorterError:
            continue
        terms.append(f"(({here} * {nbytes}LL % {SECTOR} == 0) != "
                     f"({there} * {nbytes}LL % {SECTOR} == 0))")
    return terms


def header(tpl: Template, by_arch: dict[str, list[dict]]) -> str:
    """A C header: one row per (architecture, size) and a lookup that takes the running
    architecture (e.g. 90) and the problem size and returns the nearest tuned row: the sum of
    relative differences, plus half (a doubling's worth) for each tensor-mapped buffer whose
    row pitch is on 32-byte sectors at one size and not the other (`_pitch_terms`)."""
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
    dist = " + ".join([f"{n}_reldiff(e->{d}, {d})" for d in dims]
                      + [f"0.5 * {t}" for t in _pitch_terms(tpl, dims)])
    out += ["};", f"static const int {n}_table_len = {count};", "",
            f"static inline double {n}_reldiff(long long a, long long b) {{",
            "  double d = (double)(a > b ? a - b : b - a);",
            "  return d / (double)(a > b ? a : b);", "}", "",
            "// The row for this architecture (or, failing that, the newest one below it) whose",
            "// size is nearest (sum of relative differences, plus 0.5 for each buffer whose rows",
            "// are on 32-byte sectors at one size and not the other); NULL if none fits.",
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
