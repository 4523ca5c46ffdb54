"""What the exports need to know about an op's kernel arguments: their C types in order, which
are problem sizes, and the shape of each buffer (for tensor maps and the standalone program)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

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
    # buffer name -> its dimensions, outermost first: size names, integer text or expressions
    # over the size names ("B * H"); bf16, densely packed. Two for a row-major matrix (rows,
    # cols); attention's are rank 3 ({B * heads, S, D}: rows past S read as zero, stores clip)
    buffers: dict
    output: str | None  # the buffer the kernel writes
    # sizes that are no argument of their own: size name -> an expression over the plain
    # arguments (attention's MASK is "causal + 1") ...
    size_exprs: dict = field(default_factory=dict)
    # ... or an axis of an argument's shape (attention's D: Q's last axis)
    size_axes: dict = field(default_factory=dict)

    @property
    def matrix_buffers(self) -> bool:
        """Every buffer a row-major matrix (what the cu format's tensor maps describe)."""
        return all(len(dims) == 2 for dims in self.buffers.values())


_BUILTIN = {
    "gemm": OpArgs((Arg("A", "const bf16_t*", "ptr"), Arg("B", "const bf16_t*", "ptr"),
                    Arg("C", "bf16_t*", "ptr"), Arg("M", "int", "int"), Arg("N", "int", "int"),
                    Arg("K", "int", "int"), Arg("workspace", "void*", "workspace")),
                   {"A": ("M", "K"), "B": ("N", "K"), "C": ("M", "N")}, "C"),
    "rmsnorm": OpArgs((Arg("x", "const bf16_t*", "ptr"), Arg("w", "const bf16_t*", "ptr"),
                       Arg("y", "bf16_t*", "ptr"), Arg("rows", "int", "int"),
                       Arg("cols", "int", "int"), Arg("eps", "float", "float")),
                      {"x": ("rows", "cols"), "w": ("1", "cols"), "y": ("rows", "cols")}, "y"),
    # porter/measure/ops/attention.py: Q, O [B, H, S, D], K, V [B, HKV, S, D] bf16, LSE
    # [B, H, S] fp32; causal 0 / 1; the tensor maps are rank 3 over {D, S, B * heads}
    "attention": OpArgs((Arg("Q", "const bf16_t*", "ptr"), Arg("K", "const bf16_t*", "ptr"),
                         Arg("V", "const bf16_t*", "ptr"), Arg("O", "bf16_t*", "ptr"),
                         Arg("LSE", "float*", "ptr"), Arg("B", "int", "int"),
                         Arg("H", "int", "int"), Arg("HKV", "int", "int"),
                         Arg("S", "int", "int"), Arg("causal", "int", "int"),
                         Arg("scale", "float", "float"), Arg("workspace", "void*", "workspace")),
                        {"Q": ("B * H", "S", "D"), "K": ("B * HKV", "S", "D"),
                         "V": ("B * HKV", "S", "D"), "O": ("B * H", "S", "D")}, "O",
                        size_exprs={"MASK": "causal + 1"}, size_axes={"D": ("Q", 3)}),
}
BUILTIN_OPS = frozenset(_BUILTIN)
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
