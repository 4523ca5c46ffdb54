"""The harness for kernels imported from Kernel Tuner by earlier versions of `porter import-kt`
(op "kt" without an [op] section; imports now declare their op and run on
porter.measure.ops.declared): arguments come from the template's T1 file (`t1.json` beside the
space file), in its order, with its fills.

T1 files carry no reference implementation, so the reference is the output of the first
configuration of the job that runs (the T1 default when the search starts there); every later
variant must match it. There is no vendor baseline: objectives are times in milliseconds."""
from __future__ import annotations

import ctypes
import json
import re
from pathlib import Path

from porter.spec.expr import Expr
from porter.measure.ops._bf16 import rel_error
from porter.measure.ops.base import Op

_TYPES = {"float": ("float32", ctypes.c_float), "double": ("float64", ctypes.c_double),
          "int": ("int32", ctypes.c_int), "int32": ("int32", ctypes.c_int),
          "unsigned int": ("uint32", ctypes.c_uint), "char": ("int8", ctypes.c_byte),
          "half": ("float16", None), "long": ("int64", ctypes.c_longlong)}


def size_env(t1: dict, size) -> dict:
    """Names a T1 Size expression may read: ProblemSize_i and each parameter's value list."""
    from porter.interop.kt import _values
    env = {f"ProblemSize_{i}": v for i, v in enumerate(size)}
    for p in t1["ConfigurationSpace"]["TuningParameters"]:
        env[p["Name"]] = _values(p["Values"], p["Name"], str(p.get("Type", "int")))
    return env


def t1_expr(text) -> Expr:
    return Expr(re.sub(r"ProblemSize\[(\d)\]", r"ProblemSize_\1", str(text)))


class KTOp(Op):
    name = "kt"
    dims = ()
    rtol = 1e-3

    pass_constants = False

    def configure(self, template_dir: str):
        from porter.interop.kt import kernel_parameters, passes_constant_arguments
        from porter.spec.template import load_template
        self.t1 = json.loads((Path(template_dir) / "t1.json").read_text())
        self.arguments = self.t1["KernelSpecification"]["Arguments"]
        # a kernel may declare its constant-memory arguments as (unused) parameters too, as
        # Kernel Tuner passes every argument; launching with fewer would read past the list
        tpl = load_template(template_dir)
        self.pass_constants = passes_constant_arguments(
            len(kernel_parameters(tpl.source, tpl.kernel)),
            [a.get("MemType") == "Constant" for a in self.arguments], tpl.kernel)

    def setup(self, size, seed):
        import cupy as cp
        rng = cp.random.default_rng(seed)
        env = size_env(self.t1, size)
        state = {"size": size, "bufs": [], "ref": None, "outputs": []}
        for a in self.arguments:
            dtype = _TYPES[a["Type"]][0]
            if a.get("MemoryType", "Vector") == "Scalar":
                state["bufs"].append(("scalar", a))
                continue
            n = int(t1_expr(a["Size"]).walk(env))
            if a.get("FillType") == "Random":
                arr = (rng.random(n, dtype=cp.float64) * float(a.get("FillValue", 1.0)))
                arr = arr.astype(dtype)
            else:
                arr = cp.full(n, a.get("FillValue", 0), dtype=dtype)
            state["bufs"].append(("vector", a, arr))
            if a.get("Output"):
                state["outputs"].append(arr)
        return state

    def constants(self, state) -> dict:
        return {b[1]["Name"]: b[2] for b in state["bufs"]
                if b[0] == "vector" and b[1].get("MemType") == "Constant"}

    def args(self, state, workspace_ptr):
        out = []
        for b in state["bufs"]:
            if b[0] == "scalar":
                out.append(_TYPES[b[1]["Type"]][1](b[1].get("FillValue", 0)))
            elif b[1].get("MemType") != "Constant" or self.pass_constants:
                out.append(ctypes.c_void_p(b[2].data.ptr))
        return out

    def poison(self, state):
        for arr in state["outputs"]:
            arr.fill(float("nan") if arr.dtype.kind == "f" else -1)

    def error(self, state):
        import cupy as cp
        outs = [o.astype(cp.float64) for o in state["outputs"]]
        if state["ref"] is None:
            if not all(bool(cp.isfinite(o).all()) for o in outs):
                return float("inf")
            state["ref"] = [o.copy() for o in outs]
            return 0.0
        return max((rel_error(o, r) for o, r in zip(outs, state["ref"])), default=0.0)

    def baselines(self, state):
        return {}
