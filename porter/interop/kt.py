"""Kernel Tuner interoperability: its cache files, BAT's T1 specifications, and importing a T1
kernel as a porter template (op "kt").

- `load_cache(path)`  -> KTCache: parameters in order, each entry's time (float) or failure
  string ("InvalidConfig", "CompilationFailedConfig", "RuntimeFailedConfig", ...), device.
- `kt_space(cache)`   -> (params, feasible): the configurations a search may spend evaluations
  on: every cached configuration except InvalidConfig (statically infeasible, never counted).
  Compile/runtime failures stay in: they cost an evaluation like any other.
- `load_t1(path)`     -> T1: tuning parameters (Values evaluated as Kernel Tuner evaluates them,
  comprehensions, range, list, + on lists and all, by porter's bounded safe evaluator),
  Conditions as porter.spec.expr.Expr (C-style operators translated), launch geometry. Every
  field Kernel Tuner's own T1 loader reads is used or, where porter cannot honour it, refused
  by name (REFUSED); Device, Search, Budget and SimulationInput are tuning instructions for
  Kernel Tuner that porter's own flags replace.
- `t1_to_template(kernel_cu, t1_json, out_dir)` -> the template folder it wrote (kernel.cu,
  t1.json, space.toml with a declared [op] named "kt": the T1 arguments in order, their sizes
  and size-valued scalars as expressions over P0, P1, ..., so --sizes drives them; the T1
  defaults are the reference configuration), checked with load_template; on any error nothing
  is left behind. `import_kt` is the same function under the CLI's name.
- `kernel_parameters(source, kernel)`, `passes_constant_arguments(...)`: whether the kernel also
  takes its constant-memory T1 arguments as parameters (Kernel Tuner passes them both ways).

Grid sizes follow Kernel Tuner: with GridDiv lists, grid[d] = ceil(ProblemSize[d] / product of
the divisors); without them, GlobalSizeType "CUDA" gives blocks and "OpenCL" gives threads.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

from porter.errors import TemplateError

from porter.interop.kt_cache import FAILURES, KTCache, kt_space, load_cache  # noqa: F401  (re-exported)
from porter.interop.t1 import (T1, T1Argument, _ARG_DTYPES, _FILLS, _SCALAR_DTYPES,  # noqa: F401
                               _values, load_t1, translate)
_DIMS = ("X", "Y", "Z")
_DEFAULT_DIV = {"X": ["block_size_x"], "Y": ["block_size_y"], "Z": ["block_size_z"]}


# ---- import --------------------------------------------------------------------------------
def _launch_expr(text: str) -> str:
    """A T1 launch expression over porter's size names P0, P1, ..."""
    return re.sub(r"ProblemSize\[(\d+)\]", r"P\1", translate(str(text)))


def _grid(t1: T1) -> list[str]:
    out = []
    has_div = any(v is not None for v in t1.grid_div.values())
    for i, d in enumerate(_DIMS):
        size = f"P{i}" if i < len(t1.problem_size) else "1"
        if has_div:
            div = t1.grid_div[d]
            if div is None:
                div = [x for x in _DEFAULT_DIV[d] if x in t1.params] or ["1"]
            divs = [_launch_expr(x) for x in (div if isinstance(div, list) else [div])]
            prod = " * ".join(f"({x})" for x in divs) if divs else "1"
            out.append(f"ceil_div({size}, {prod})")
        elif t1.global_size_type.lower() == "opencl":
            out.append(f"ceil_div({_launch_expr(t1.global_size[d])}, "
                       f"({_launch_expr(t1.local_size[d])}))")
        else:
            out.append(_launch_expr(t1.global_size[d]))
    return out


# __launch_bounds__ may come before or after `void` (CUDA's guide puts it after)
_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
_GLOBAL_RE = r"(__global__\s+" + _BOUNDS + r"void\s+" + _BOUNDS + r"{name}\s*\()"


def add_extern_c(source: str, kernel: str) -> str:
    """Adds `extern "C"` to the kernel's declaration(s) where missing (NVRTC keeps the name)."""
    pat = re.compile(r'(extern\s+"C"\s+)?' + _GLOBAL_RE.format(name=re.escape(kernel)))
    if not pat.search(source):
        raise TemplateError(f"the source has no `__global__ void {kernel}(` declaration")
    return pat.sub(lambda m: m.group(0) if m.group(1) else 'extern "C" ' + m.group(2), source)


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", "", source)


def kernel_parameters(source: str, kernel: str) -> list[str]:
    """The parameter declarations of `__global__ void kernel(...)` in source, in order."""
    text = _strip_comments(source)
    m = re.search(_GLOBAL_RE.format(name=re.escape(kernel)), text)
    if not m:
        raise TemplateError(f"the source has no `__global__ void {kernel}(` declaration")
    params, depth, cur = [], 1, []
    for ch in text[m.end():]:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
            if depth == 0:
                break
        if ch == "," and depth == 1:
            params.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    else:
        raise TemplateError(f"the parameter list of {kernel} is not closed")
    params.append("".join(cur).strip())
    return [] if params in ([""], ["void"]) else params


def passes_constant_arguments(n_params: int, constant_memory: list[bool], kernel: str) -> bool:
    """Whether the kernel takes the T1 arguments that live in constant memory as parameters as
    well. Kernel Tuner passes every argument to the kernel and also copies the constant ones
    into their __constant__ symbols, so a kernel may declare them (and ignore them) or not; the
    kernel's parameter count says which. A count that fits neither is a TemplateError."""
    n_all, n_const = len(constant_memory), sum(constant_memory)
    if n_params == n_all:
        return True
    if n_params == n_all - n_const:
        return False
    raise TemplateError(
        f"kernel {kernel} has {n_params} parameters but the T1 file lists {n_all} arguments "
        f"({n_const} in constant memory); the T1 Arguments must match the kernel's signature")


def _toml_str(s: str) -> str:
    return json.dumps(s)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


def t1_to_template(kernel_cu_path: str | Path, t1_path: str | Path,
                   out_dir: str | Path) -> Path:
    """Writes a template folder (kernel.cu, t1.json, space.toml) for a T1 kernel and returns it.

    The template uses op "kt" (its harness reads t1.json beside the space file for the
    arguments); its sizes are P0, P1, ... with default the T1 ProblemSize; parameters keep the
    T1 value order; Conditions become constraints. The folder is checked with load_template
    before it appears: on any error (an include outside porter's folder, a kernel name the
    source does not declare, ...) a TemplateError says what to fix and nothing is written."""
    kernel_cu, t1_json, out_dir = Path(kernel_cu_path), Path(t1_path), Path(out_dir)
    t1 = load_t1(t1_json)
    source = add_extern_c(kernel_cu.read_text(), t1.kernel_name)
    if not t1.problem_size:
        raise TemplateError(f"{t1_json}: KernelSpecification has no ProblemSize")
    for n in t1.params:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) or re.fullmatch(r"P\d+", n):
            raise TemplateError(f"T1 parameter name {n!r} cannot be a porter parameter")
    sizes = [f"P{i}" for i in range(len(t1.problem_size))]
    # Kernel Tuner defines block_size_x/y/z for every kernel; keep that for constant ones
    options = [o for o in t1.compiler_options if not o.startswith("-std")]
    for i, d in enumerate(_DIMS):
        name = f"block_size_{d.lower()}"
        if name not in t1.params:
            try:
                val = int(ast.literal_eval(t1.local_size[d]))
                options.append(f"-D{name}={val}")
            except (ValueError, SyntaxError):
                pass
    block = [_launch_expr(t1.local_size[d]) for d in _DIMS]
    smem = _launch_expr(t1.shared_memory)
    lines = [
        "# imported from a Kernel Tuner / BAT T1 specification by porter.interop.kt.import_kt",
        "[template]",
        f"name = {_toml_str(t1.name)}",
        f"kernel = {_toml_str(t1.kernel_name)}",
        'source = "kernel.cu"',
        'version = "1"',
        f"options = [{', '.join(_toml_str(o) for o in options)}]",
        f"description = {_toml_str('Kernel Tuner T1 import of ' + t1.kernel_file)}",
        "",
        "[sizes]",
        f"names = [{', '.join(_toml_str(s) for s in sizes)}]",
        f"default = [{_toml_str('x'.join(str(v) for v in t1.problem_size))}]",
        "",
        "[params]   # T1 value order kept (the auto sampler's neighbourhoods follow it)",
    ]
    for n, vals in t1.params.items():
        ordered = list(vals)
        # keep the value order (the auto sampler uses it as a neighbourhood)
        lines.append(f"{n} = [{', '.join(_toml_value(v) for v in ordered)}]")
    conds = []
    for c in t1.conditions:
        text = re.sub(r"ProblemSize_(\d+)", r"P\1", c.text)
        conds.append(text)
    lines += ["", "[constraints]", "list = ["]
    lines += [f"  {_toml_str(c)}," for c in conds]
    lines += ["]", "", "[launch]",
              f"grid = [{', '.join(_toml_str(g) for g in _grid(t1))}]",
              f"block = [{', '.join(_toml_str(b) for b in block)}]",
              f"smem = {_toml_str(smem)}", ""]
    lines += _op_section(t1, source)
    return _write_checked(out_dir, {"kernel.cu": source, "t1.json": t1_json.read_text(),
                                     "space.toml": "\n".join(lines)})


import_kt = t1_to_template


def _size_text(t1: T1, text) -> str:
    """A T1 Size over P0, P1, ... alone: the parameters' value lists (max(filter_width)) are
    written in as literals, since inputs may depend on sizes only."""
    tree = ast.parse(re.sub(r"ProblemSize_(\d+)", r"P\1", _launch_expr(str(text))), mode="eval")

    class Lists(ast.NodeTransformer):
        def visit_Name(self, node):
            if node.id in t1.params:
                return ast.parse(repr(tuple(t1.params[node.id])), mode="eval").body
            return node
    return ast.unparse(Lists().visit(tree))


def reference_config(t1: T1) -> dict:
    """The T1 defaults where the Conditions allow them, else the first configuration they
    allow, in T1 value order: the imported template's reference."""
    import itertools
    if t1.is_valid(t1.defaults) and all(t1.defaults[n] in v for n, v in t1.params.items()):
        return dict(t1.defaults)
    for i, values in enumerate(itertools.product(*t1.params.values())):
        cfg = dict(zip(t1.params, values))
        if t1.is_valid(cfg):
            return cfg
        if i > 1_000_000:
            break
    raise TemplateError("no configuration of the T1 file satisfies its Conditions")


def _op_section(t1: T1, source: str) -> list[str]:
    """The T1 Arguments as a declared op: buffers with their sizes over P0, P1, ...; scalars
    whose value is a ProblemSize entry follow --sizes (P<i>), the others keep their value."""
    if not t1.arguments:
        raise TemplateError("the T1 file lists no Arguments: porter needs them to call the "
                            "kernel")
    passes = passes_constant_arguments(
        len(kernel_parameters(source, t1.kernel_name)),
        [a.constant_memory for a in t1.arguments], t1.kernel_name)
    cfg = reference_config(t1)
    lines = ["# the T1 Arguments in call order; T1 files carry no reference, so the output of",
             "# reference_config (the T1 defaults, or the first configuration the Conditions",
             "# allow) is what every other configuration must match",
             "[op]", 'name = "kt"', "rtol = 1e-3",
             "reference_config = { " + ", ".join(f"{k} = {_toml_value(v)}"
                                                for k, v in cfg.items()) + " }", ""]
    for a in t1.arguments:
        lines += ["[[op.args]]", f"name = {_toml_str(a.name)}"]
        if a.memory_type == "Scalar":
            lines.append(f"dtype = {_toml_str(_SCALAR_DTYPES[a.type])}")
            value = a.fill_value
            match = [i for i, v in enumerate(t1.problem_size) if v == value]
            if match and _SCALAR_DTYPES[a.type].startswith(("int", "uint")):
                lines.append(f'value = "P{match[0]}"   # T1 FillValue {value} = '
                             f"ProblemSize[{match[0]}]: follows --sizes")
            else:
                lines.append(f"value = {_toml_str(repr(value))}")
        else:
            if a.size is None:
                raise TemplateError(f"T1 argument {a.name!r} has no Size")
            lines += [f"dtype = {_toml_str(_ARG_DTYPES[a.type])}",
                      f"shape = [{_toml_str(_size_text(t1, a.size.text))}]",
                      f"fill = {_toml_str(_FILLS.get(a.fill_type or 'Constant', 'constant'))}"]
            if (a.fill_type or "Constant") == "Constant":
                lines.append(f"fill_value = {float(a.fill_value or 0)!r}")
            if a.output:
                lines.append("inout = true" if a.access == "ReadWrite" else "output = true")
            if a.constant_memory:
                lines.append("symbol = true")
                if not passes:
                    lines.append("param = false")
        lines.append("")
    return lines


def _write_checked(out_dir: Path, files: Mapping[str, str]) -> Path:
    """Writes the files into a scratch folder beside out_dir, loads it as a template, then
    moves them into out_dir (replacing those three files only)."""
    from porter.spec.template import load_template   # template imports nothing of this module
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        for name, text in files.items():
            (scratch / name).write_text(text)
        load_template(scratch)
        out_dir.mkdir(exist_ok=True)
        for name in files:
            os.replace(scratch / name, out_dir / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out_dir
