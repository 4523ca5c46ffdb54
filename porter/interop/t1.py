"""Kernel Tuner / BAT T1 specifications, read as Kernel Tuner's own loader (tune_kernel_T1)
reads them: Values evaluated as Python list expressions by porter's bounded safe evaluator,
Conditions as expressions (C-style operators translated), Arguments with their sizes; fields
porter cannot honour are refused by name. See porter.interop.kt for the import."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from porter.errors import SpecError, TemplateError
from porter.spec.expr import Expr

_DIMS = ("X", "Y", "Z")


# ---- T1 ------------------------------------------------------------------------------------
def translate(text: str) -> str:
    """A T1 expression in porter's expression language: C-style boolean operators become
    Python's, ProblemSize[i] becomes ProblemSize_i."""
    s = str(text)
    s = s.replace("&&", " and ").replace("||", " or ")
    s = re.sub(r"!(?!=)", " not ", s)
    s = re.sub(r"\btrue\b", "True", s)
    s = re.sub(r"\bfalse\b", "False", s)
    s = re.sub(r"ProblemSize\[(\d+)\]", r"ProblemSize_\1", s)
    return s.strip()


@dataclass(frozen=True)
class T1Argument:
    """One kernel argument of a T1 file, in call order. `size` is an expression over
    ProblemSize_i and the parameters' value lists (e.g. max(filter_width)); scalars have none."""
    name: str
    type: str
    memory_type: str                   # "Vector" or "Scalar"
    access: str                        # "ReadOnly", "WriteOnly", "ReadWrite"
    fill_type: str                     # "Random", "Constant", ... ("" for scalars)
    fill_value: Any
    size: Expr | None
    output: bool
    constant_memory: bool              # MemType "Constant": a __constant__ symbol, not a pointer


@dataclass(frozen=True)
class T1:
    name: str
    kernel_name: str
    kernel_file: str
    params: Mapping[str, tuple]
    defaults: Mapping[str, Any]
    conditions: tuple[Expr, ...]
    problem_size: tuple[int, ...]
    local_size: Mapping[str, str]
    global_size: Mapping[str, str]
    global_size_type: str
    grid_div: Mapping[str, list | None]
    shared_memory: str
    compiler_options: tuple[str, ...]
    arguments: tuple[T1Argument, ...] = ()
    raw: Mapping = field(repr=False, default_factory=dict)

    def is_valid(self, config: Mapping[str, Any]) -> bool:
        env = dict(config)
        env.update({f"ProblemSize_{i}": v for i, v in enumerate(self.problem_size)})
        return all(bool(c(env)) for c in self.conditions)


_PARAM_TYPES = {"int": int, "uint": int, "float": float, "bool": bool, "string": str}
# T1 fields porter cannot honour, refused by name rather than ignored
_FILLS = {"Random": "normal", "Constant": "constant"}
_ARG_DTYPES = {"float": "float32", "double": "float64", "half": "float16", "int": "int32",
               "int32": "int32", "uint32": "uint32", "unsigned int": "uint32", "int8": "int8",
               "char": "int8", "uint8": "uint8", "bool": "uint8", "int16": "int16",
               "uint16": "uint16", "int64": "int64", "long": "int64", "uint64": "uint64"}
_SCALAR_DTYPES = {"float": "float32", "double": "float64", "int": "int32", "int32": "int32",
                  "uint32": "uint32", "unsigned int": "uint32", "int64": "int64",
                  "long": "int64"}


def _values(v, name: str = "", ptype: str = "int"):
    """A T1 Values string as Kernel Tuner evaluates it (a Python list expression), by the
    bounded safe evaluator."""
    if ptype not in _PARAM_TYPES:
        raise TemplateError(f"T1 parameter {name!r} has Type {ptype!r}; porter supports "
                            f"{', '.join(_PARAM_TYPES)}")
    if isinstance(v, str):
        try:
            v = Expr(v).walk({})
        except TemplateError as e:
            raise TemplateError(f"T1 Values of {name!r}: {e}") from None
    if isinstance(v, range):
        v = tuple(v)
    if not isinstance(v, (list, tuple)) or not v:
        raise TemplateError(f"T1 Values of {name!r} ({v!r}) is not a non-empty list")
    if any(isinstance(x, (list, tuple, dict)) for x in v):
        raise TemplateError(f"T1 Values of {name!r} must be a list of single values")
    return tuple(v)


def load_t1(path: str | Path) -> T1:
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read T1 file {p}: {e}") from None
    cs = raw.get("ConfigurationSpace", {})
    ks = raw.get("KernelSpecification", {})
    if not isinstance(cs, Mapping) or not isinstance(ks, Mapping):
        raise TemplateError(f"{p}: ConfigurationSpace and KernelSpecification must be objects")
    _refuse(raw, ks, p)
    params, defaults = {}, {}
    for tp in cs.get("TuningParameters", []):
        if not isinstance(tp, Mapping) or "Name" not in tp or "Values" not in tp:
            raise TemplateError(f"{p}: every TuningParameters entry needs a Name and Values")
        params[tp["Name"]] = _values(tp["Values"], tp["Name"], str(tp.get("Type", "int")))
        defaults[tp["Name"]] = tp.get("Default", params[tp["Name"]][0])
    conds = []
    for c in cs.get("Conditions", []) or []:
        text = c.get("Expression") if isinstance(c, Mapping) else c
        if not isinstance(text, str):
            raise TemplateError(f"{p}: a Condition's Expression must be a string (Kernel "
                                f"Tuner converts no other kind): {c!r}")
        conds.append(Expr(translate(text)))
    conds = tuple(conds)
    if "KernelName" not in ks:
        raise TemplateError(f"{p}: KernelSpecification has no KernelName")
    grid_div = {d: ks.get(f"GridDiv{d}") for d in _DIMS}
    args = tuple(_argument(a, p) for a in ks.get("Arguments", ()) or ())
    return T1(
        name=str(raw.get("General", {}).get("BenchmarkName") or ks.get("BenchmarkName")
                 or ks["KernelName"]),
        kernel_name=str(ks["KernelName"]), kernel_file=str(ks.get("KernelFile", "")),
        params=params, defaults=defaults, conditions=conds,
        problem_size=tuple(int(x) for x in ks.get("ProblemSize", ())),
        local_size={d: str(ks.get("LocalSize", {}).get(d, "1")) for d in _DIMS},
        global_size={d: str(ks.get("GlobalSize", {}).get(d, "1")) for d in _DIMS},
        global_size_type=str(ks.get("GlobalSizeType", "CUDA")),
        grid_div=grid_div, shared_memory=str(ks.get("SharedMemory", 0) or 0),
        compiler_options=tuple(ks.get("CompilerOptions", ()) or ()), arguments=args, raw=raw)


def _refuse(raw: Mapping, ks: Mapping, p: Path) -> None:
    """T1 fields whose meaning porter cannot give, named so the user can change them."""
    lang = str(ks.get("Language", "CUDA"))
    if lang != "CUDA":
        raise TemplateError(f"{p}: Language {lang!r} is not supported (porter tunes CUDA)")
    if ks.get("ReferenceArguments"):
        raise TemplateError(f"{p}: ReferenceArguments is not supported; declare a reference "
                            "function in the imported template's [op] instead")
    for b in raw.get("Budget", []) or []:
        if isinstance(b, Mapping) and b.get("Type") not in ("ConfigurationCount",
                                                             "TuningDuration"):
            raise TemplateError(f"{p}: Budget Type {b.get('Type')!r} is not supported (use "
                                "porter port --trials or --minutes)")
    for a in ks.get("Arguments", ()) or ():
        if not isinstance(a, Mapping):
            continue
        name = a.get("Name", "?")
        mt = str(a.get("MemoryType", "Vector"))
        if mt not in ("Vector", "Scalar"):
            raise TemplateError(f"{p}: argument {name!r} has MemoryType {mt!r}; supported: "
                                "Vector, Scalar")
        ft = a.get("FillType")
        if mt == "Vector" and ft is not None and ft not in _FILLS:
            raise TemplateError(f"{p}: argument {name!r} has FillType {ft!r}; supported: "
                                f"{', '.join(_FILLS)}")
        table = _ARG_DTYPES if mt == "Vector" else _SCALAR_DTYPES
        if str(a.get("Type")) not in table:
            raise TemplateError(f"{p}: argument {name!r} has Type {a.get('Type')!r}; supported "
                                f"for {mt}: {', '.join(table)}")


def _argument(a: Mapping, path: Path) -> T1Argument:
    if not isinstance(a, Mapping) or "Name" not in a or "Type" not in a:
        raise TemplateError(f"{path}: every entry of Arguments needs a Name and a Type")
    scalar = str(a.get("MemoryType", "Vector")) == "Scalar"
    size = None if scalar or "Size" not in a else Expr(translate(str(a["Size"])))
    return T1Argument(
        name=str(a["Name"]), type=str(a["Type"]),
        memory_type="Scalar" if scalar else "Vector",
        access=str(a.get("AccessType", "ReadWrite")), fill_type=str(a.get("FillType", "")),
        fill_value=a.get("FillValue", 0), size=size, output=bool(a.get("Output", 0)),
        constant_memory=str(a.get("MemType", "")) == "Constant")


