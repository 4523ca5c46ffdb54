"""The `python` format: one module beside the cubins that needs cuda-bindings and nothing of
porter. It carries the tuning table and the template's space (constraints, geometry, workspace,
tensor maps) as data, porter's safe expression evaluator and the launcher in
porter/export/runtime_py.py, both copied in."""
from __future__ import annotations

import json
import re
from pathlib import Path

from porter.export.opargs import map_dtypes, op_args
from porter.spec.arch import Arch, get_arch
from porter.spec.template import Template

_HERE = Path(__file__).resolve().parent
EXPR_SOURCE = _HERE.parent / "spec" / "expr.py"
RUNTIME_SOURCE = _HERE / "runtime_py.py"
_KEEP = ("ours_ms", "baseline", "baseline_ms", "ratio", "tflops", "gbps", "trial", "note")


def spec(tpl: Template, arch: str | Arch, rows: list[dict], files: dict[str, str]) -> dict:
    """What the module knows: kernel, argument kinds, buffer shapes, the architecture's limits,
    the space's expressions (each tensor map as [buffer, box, swizzle, the buffer's element
    type]) and the table (per tuned size: configuration, cubin, figures)."""
    ops = op_args(tpl)
    a = arch if isinstance(arch, Arch) else get_arch(arch)
    return {
        "name": tpl.name, "kernel": tpl.kernel, "arch": a.name, "op": tpl.op,
        "template_hash": tpl.source_hash, "dims": list(tpl.size_names),
        "args": [[x.name, x.kind] for x in ops.args],
        "buffers": {k: list(v) for k, v in ops.buffers.items()},
        "size_exprs": dict(ops.size_exprs),
        "size_axes": {k: list(v) for k, v in ops.size_axes.items()},
        "limits": a.limits(),
        "space": {"constraints": [c.text for c in tpl.constraints],
                  "grid": [e.text for e in tpl.grid], "block": [e.text for e in tpl.block],
                  "cluster": [e.text for e in tpl.cluster], "smem": tpl.smem.text,
                  "workspace": tpl.workspace.text,
                  "maps": [[m.buffer, [e.text for e in m.box], m.swizzle, t[0]]
                           for m, t in zip(tpl.tensor_maps, map_dtypes(tpl))]},
        "table": [{"size": list(r["size"]), "params": r["params"],
                   "file": files[json.dumps(r["params"], sort_keys=True)],
                   **{k: r[k] for k in _KEEP if r.get(k) is not None}} for r in rows],
    }


def _expr_source() -> str:
    text = EXPR_SOURCE.read_text().replace("from __future__ import annotations\n", "")
    return re.sub(r"^from porter\.errors import TemplateError$",
                  "class TemplateError(ValueError):\n    pass", text, flags=re.M)


def _runtime_source() -> str:
    text = RUNTIME_SOURCE.read_text()
    text = text[text.index("\nimport "):]           # past the module docstring
    return "\n".join(ln for ln in text.splitlines() if not ln.endswith("# porter-export: drop"))


def _size_note(tpl: Template) -> str:
    """A line for the module's docstring where some sizes are not arguments of their own."""
    ops = op_args(tpl)
    if not ops.size_axes:
        return ""
    said = [f"{d} from {b}.shape[{ax}]" for d, (b, ax) in ops.size_axes.items()]
    said += [f"{d} = {e}" for d, e in ops.size_exprs.items()]
    return (f"    # the size ({', '.join(tpl.size_names)}) is read from the arguments ("
            f"{'; '.join(said)}); with raw addresses pass size=(...)\n")


def python_module(tpl: Template, arch: str | Arch, rows: list[dict], files: dict[str, str]) -> str:
    """The module's text (see the module docstring of what it writes)."""
    args = ", ".join(x.name for x in op_args(tpl).args if x.kind != "workspace")
    arch = arch.name if isinstance(arch, Arch) else arch
    return f'''"""{tpl.name} tuned by Kernel Porter for {arch}: launches the cubins beside this file through
cuda-bindings (no porter, no CuPy needed), dispatching by problem size.

    import {tpl.name}_tuned as k
    k.launch({args}, stream=None)   # device arrays: torch, CuPy or raw addresses
{_size_note(tpl)}
A size that was not tuned runs the configuration tuned at the nearest size whose constraints
hold at this size (a warning says so when the nearest one does not); k.select(size) says which,
and raises ValueError when none is legal. A workspace the kernel needs is allocated, zeroed
once, per context and stream (the kernel leaves it zeroed).
"""
import json
import os

SPEC = json.loads(r"""{json.dumps(spec(tpl, arch, rows, files), indent=1)}""")

# ---- porter.spec.expr (copied): the safe evaluator for the space's expressions ----
{_expr_source()}

# ---- porter.export.runtime_py (copied): choosing a configuration and launching it ----
{_runtime_source()}

_HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL = TunedKernel(SPEC, _HERE)
TABLE = SPEC["table"]
DIMS = SPEC["dims"]


def select(size):
    """The table entry that runs at `size`."""
    return KERNEL.select(size)


def launch(*args, size=None, stream=None):
    """Runs the tuned kernel; returns the table entry it used."""
    return KERNEL.launch(*args, size=size, stream=stream)


def nearest(size):
    """The entry tuned at the size nearest to `size` (legal there or not)."""
    return KERNEL.ranked(size)[0]


def geometry(entry, size):
    """(grid, block, dynamic shared memory, workspace bytes) of `entry` at `size`."""
    p = KERNEL.plan(entry, size)
    return tuple(p["grid"]), tuple(p["block"]), p["smem"], p["workspace"]
'''
