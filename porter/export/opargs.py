"""What the exports need to know about an op's kernel arguments: their C types in order, which
are problem sizes, and the shape of each buffer (for tensor maps and the standalone program)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from porter.errors import PorterError
from porter.spec.template import Template


@dataclass(frozen=True)
class Arg:
    name: str
    ctype: str          # as the host launcher declares it
    kind: str           # "ptr", "int", "float", "workspace"


@dataclass(frozen=True)
class OpArgs:
    args: tuple[Arg, ...]
    buffers: dict       # buffer name -> (rows, cols): size names or integer text; bf16 row-major
    output: str | None  # the buffer the kernel writes


_BUILTIN = {
    "gemm": OpArgs((Arg("A", "const bf16_t*", "ptr"), Arg("B", "const bf16_t*", "ptr"),
                    Arg("C", "bf16_t*", "ptr"), Arg("M", "int", "int"), Arg("N", "int", "int"),
                    Arg("K", "int", "int"), Arg("workspace", "void*", "workspace")),
                   {"A": ("M", "K"), "B": ("N", "K"), "C": ("M", "N")}, "C"),
    "rmsnorm": OpArgs((Arg("x", "const bf16_t*", "ptr"), Arg("w", "const bf16_t*", "ptr"),
                       Arg("y", "bf16_t*", "ptr"), Arg("rows", "int", "int"),
                       Arg("cols", "int", "int"), Arg("eps", "float", "float")),
                      {"x": ("rows", "cols"), "w": ("1", "cols"), "y": ("rows", "cols")}, "y"),
}
_KT_KINDS = {"float": "float", "double": "float", "int": "int", "int32": "int",
             "unsigned int": "int", "long": "int", "char": "int"}


def op_args(tpl: Template) -> OpArgs:
    """The kernel's plain arguments (before any tensor maps). For an imported Kernel Tuner
    kernel they are the kernel's own parameters, typed by its T1 file."""
    if tpl.op in _BUILTIN:
        return _BUILTIN[tpl.op]
    if tpl.op == "kt":
        from porter.interop.kt import kernel_parameters
        t1 = json.loads((tpl.folder / "t1.json").read_text())
        declared = {a["Name"]: a for a in t1["KernelSpecification"]["Arguments"]}
        args = []
        for decl in kernel_parameters(tpl.source, tpl.kernel):
            name = re.findall(r"[A-Za-z_]\w*", decl)[-1]
            a = declared.get(name, {})
            pointer = "*" in decl
            kind = "ptr" if pointer else _KT_KINDS.get(a.get("Type", "int"), "int")
            args.append(Arg(name, decl[: decl.rfind(name)].strip() or "int", kind))
        return OpArgs(tuple(args), {}, None)
    raise PorterError(f"the exports do not know the arguments of op {tpl.op!r}")
