"""The `[op]` section of space.toml: an op declared by the template instead of named from
porter's registry. Parsed once into frozen values (see docs/TEMPLATES.md, "Declaring your op").

    [op]
    name = "softmax"
    reference = "reference:softmax"           # module:function (optional)
    baseline = "reference:torch_softmax"      # module:function (optional)
    reference_config = { THREADS = 256 }      # without a reference: this configuration's output
    rtol = 1e-5                               # relative Frobenius tolerance (default by dtype)
    [[op.args]]                               # kernel arguments, in the kernel's order
    name = "x"
    dtype = "float32"
    shape = ["rows", "cols"]                  # expressions over the size names
    fill = "normal"                           # normal | uniform | constant | index
    [[op.args]]
    name = "rows"
    dtype = "int32"
    value = "rows"                            # a scalar: an expression over the size names
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from porter.errors import TemplateError
from porter.spec.expr import Expr

# storage dtype (NumPy / CuPy name; bf16 lives in uint16) and the C spellings a kernel may use
DTYPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "float32": ("float32", ("float", "float32_t")),
    "float64": ("float64", ("double",)),
    "float16": ("float16", ("half", "__half", "float16_t")),
    "bf16": ("uint16", ("bf16_t", "__nv_bfloat16", "nv_bfloat16", "bfloat16", "uint16_t",
                        "unsigned short")),
    "int8": ("int8", ("char", "signed char", "int8_t")),
    "uint8": ("uint8", ("unsigned char", "uint8_t")),
    "int16": ("int16", ("short", "int16_t")),
    "uint16": ("uint16", ("unsigned short", "uint16_t")),
    "int32": ("int32", ("int", "int32_t", "signed", "signed int")),
    "uint32": ("uint32", ("unsigned", "unsigned int", "uint32_t")),
    "int64": ("int64", ("long long", "int64_t", "long", "long long int")),
    "uint64": ("uint64", ("unsigned long long", "uint64_t", "size_t", "unsigned long")),
}
SCALAR_DTYPES = ("int32", "uint32", "int64", "float32", "float64")
FILLS = ("normal", "uniform", "constant", "index")
# relative Frobenius tolerance by output dtype when the template gives none
DEFAULT_RTOL = {"float64": 1e-10, "float32": 1e-4, "float16": 5e-3, "bf16": 2e-2}
_OP_KEYS = {"name", "reference", "baseline", "reference_config", "rtol", "args"}
_ARG_KEYS = {"name", "dtype", "shape", "value", "fill", "fill_value", "mean", "std", "low", "high",
             "output",
             "inout", "symbol", "param", "workspace"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FUNC_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class OpArg:
    """One kernel argument. A buffer has a shape; a scalar has a value; a workspace argument
    is the job's zeroed scratch (`void*`)."""
    name: str
    dtype: str = "float32"
    shape: tuple[Expr, ...] | None = None
    value: Expr | None = None
    fill: str = "normal"
    fill_args: tuple[float, float] = (0.0, 1.0)   # normal: mean, std; uniform: low, high;
    output: bool = False                          # constant: fill_value, unused
    inout: bool = False              # an output the kernel also reads: restored, not poisoned
    symbol: bool = False             # also copied into the __constant__ symbol of this name
    param: bool = True               # passed as a kernel parameter
    workspace: bool = False

    @property
    def is_buffer(self) -> bool:
        return self.shape is not None

    @property
    def storage(self) -> str:
        return DTYPES[self.dtype][0]


@dataclass(frozen=True)
class OpSpec:
    name: str
    args: tuple[OpArg, ...]
    reference: str | None = None
    baseline: str | None = None
    reference_config: Mapping[str, Any] | None = None
    rtol: float | None = None

    @property
    def outputs(self) -> tuple[OpArg, ...]:
        return tuple(a for a in self.args if a.output)

    @property
    def kernel_args(self) -> tuple[OpArg, ...]:
        return tuple(a for a in self.args if a.param)

    def default_rtol(self) -> float:
        if self.rtol is not None:
            return self.rtol
        return max((DEFAULT_RTOL.get(a.dtype, 0.0) for a in self.outputs), default=0.0)


def _expr(v, what: str) -> Expr:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise TemplateError(f"{what} must be an expression (a string or a number), not {v!r}")
    return Expr(v)


def parse_op(raw: Mapping, tpl_name: str, size_names: tuple[str, ...],
             params: Mapping[str, tuple]) -> OpSpec:
    """The [op] table of a space file; every problem is a TemplateError saying what to fix."""
    where = f"template {tpl_name!r}: [op]"
    if not isinstance(raw, Mapping):
        raise TemplateError(f"{where} must be a table")
    unknown = set(raw) - _OP_KEYS
    if unknown:
        raise TemplateError(f"{where} has unknown key(s) {', '.join(sorted(unknown))}; known: "
                            f"{', '.join(sorted(_OP_KEYS))}")
    for key in ("reference", "baseline"):
        if key in raw and not (isinstance(raw[key], str) and _FUNC_REF.fullmatch(raw[key])):
            raise TemplateError(f"{where} {key} = {raw[key]!r} must read 'module:function'")
    args_raw = raw.get("args")
    if not isinstance(args_raw, list) or not args_raw:
        raise TemplateError(f"{where} needs [[op.args]]: the kernel's arguments in order")
    args = tuple(_arg(a, i, where, set(size_names)) for i, a in enumerate(args_raw))
    names = [a.name for a in args]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TemplateError(f"{where} names argument(s) {', '.join(dup)} more than once")
    if not any(a.output for a in args):
        raise TemplateError(f"{where} declares no output (output = true on the buffer(s) the "
                            "kernel writes)")
    ref_cfg = raw.get("reference_config")
    if ref_cfg is not None:
        if not isinstance(ref_cfg, Mapping):
            raise TemplateError(f"{where} reference_config must be a table of parameter values")
        for k, v in ref_cfg.items():
            if k not in params or v not in params[k]:
                raise TemplateError(f"{where} reference_config sets {k} = {v!r}, which is not "
                                    "a parameter value of this template")
    rtol = raw.get("rtol")
    if rtol is not None and (isinstance(rtol, bool) or not isinstance(rtol, (int, float))
                             or rtol < 0):
        raise TemplateError(f"{where} rtol must be a non-negative number")
    return OpSpec(name=str(raw.get("name", tpl_name)), args=args,
                  reference=raw.get("reference"), baseline=raw.get("baseline"),
                  reference_config=dict(ref_cfg) if ref_cfg is not None else None,
                  rtol=None if rtol is None else float(rtol))


def _arg(a, i: int, where: str, sizes: set[str]) -> OpArg:
    if not isinstance(a, Mapping) or not isinstance(a.get("name"), str) \
            or not _IDENT.fullmatch(a["name"]):
        raise TemplateError(f"{where} argument {i + 1} needs a name (an identifier)")
    name = a["name"]
    what = f"{where} argument {name!r}"
    unknown = set(a) - _ARG_KEYS
    if unknown:
        raise TemplateError(f"{what} has unknown key(s) {', '.join(sorted(unknown))}; known: "
                            f"{', '.join(sorted(_ARG_KEYS))}")
    if a.get("workspace"):
        return OpArg(name=name, dtype="uint8", workspace=True, fill="constant")
    dtype = a.get("dtype", "float32")
    if dtype == "bfloat16":
        dtype = "bf16"
    if dtype not in DTYPES:
        raise TemplateError(f"{what} has dtype {dtype!r}; known: {', '.join(DTYPES)}")
    if ("shape" in a) == ("value" in a):
        raise TemplateError(f"{what} needs either shape (a buffer) or value (a scalar)")
    if "value" in a:
        if dtype not in SCALAR_DTYPES:
            raise TemplateError(f"{what}: a scalar's dtype must be one of "
                                f"{', '.join(SCALAR_DTYPES)}")
        value = _expr(a["value"], f"{what} value")
        _names(value, sizes, what)
        return OpArg(name=name, dtype=dtype, value=value, fill="constant")
    shape_raw = a["shape"] if isinstance(a["shape"], list) else [a["shape"]]
    if not shape_raw:
        raise TemplateError(f"{what} shape needs at least one extent")
    shape = tuple(_expr(s, f"{what} shape") for s in shape_raw)
    for e in shape:
        _names(e, sizes, what)
    output = bool(a.get("output", False))
    inout = bool(a.get("inout", False))
    fill = a.get("fill", "constant" if output and not inout else "normal")
    if fill not in FILLS:
        raise TemplateError(f"{what} fill {fill!r} is not one of {', '.join(FILLS)}")
    for k in ("mean", "std", "low", "high", "fill_value"):
        if k in a and (isinstance(a[k], bool) or not isinstance(a[k], (int, float))):
            raise TemplateError(f"{what} {k} must be a number")
    fill_args = {"normal": (a.get("mean", 0.0), a.get("std", 1.0)),
                 "uniform": (a.get("low", 0.0), a.get("high", 1.0)),
                 "constant": (a.get("fill_value", 0.0), 0.0), "index": (0.0, 0.0)}[fill]
    return OpArg(name=name, dtype=dtype, shape=shape, fill=fill,
                 fill_args=(float(fill_args[0]), float(fill_args[1])), output=output or inout,
                 inout=inout, symbol=bool(a.get("symbol", False)),
                 param=bool(a.get("param", True)))


def _names(e: Expr, sizes: set[str], what: str) -> None:
    unknown = sorted(e.names - sizes)
    if unknown:
        raise TemplateError(f"{what}: {e.text!r} names {', '.join(unknown)}, which is not a "
                            f"size name ({', '.join(sorted(sizes))}); inputs depend on sizes only")
