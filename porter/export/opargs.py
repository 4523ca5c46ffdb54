"""What the exports need to know about an op's kernel arguments: their C types in order, which
are problem sizes, and the shape and element type of each buffer (for tensor maps and the
standalone program)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

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
    # over the size names ("B * H"); densely packed. Two for a row-major matrix (rows, cols);
    # attention's are rank 3 ({B * heads, S, D}: rows past S read as zero, stores clip)
    buffers: dict
    output: str | None  # the buffer the kernel writes
    # sizes that are no argument of their own: size name -> an expression over the plain
    # arguments (attention's MASK is "causal + 1") ...
    size_exprs: dict = field(default_factory=dict)
    # ... or an axis of an argument's shape (attention's D: Q's last axis)
    size_axes: dict = field(default_factory=dict)
    # buffer name -> element type (a TMA_DTYPES name of porter/export/runtime_py.py, as the
    # measuring op holds it: gemm_fp8's A and B are e4m3 bytes); a buffer not named: bf16
    dtypes: dict = field(default_factory=dict)

    def dtype(self, buffer: str) -> str:
        return self.dtypes.get(buffer, "bf16")

    @property
    def matrix_buffers(self) -> bool:
        """Every buffer a row-major matrix (what the cu format's tensor maps describe)."""
        return all(len(dims) == 2 for dims in self.buffers.values())


_BUILTIN = {
    "gemm": OpArgs((Arg("A", "const bf16_t*", "ptr"), Arg("B", "const bf16_t*", "ptr"),
                    Arg("C", "bf16_t*", "ptr"), Arg("M", "int", "int"), Arg("N", "int", "int"),
                    Arg("K", "int", "int"), Arg("workspace", "void*", "workspace")),
                   {"A": ("M", "K"), "B": ("N", "K"), "C": ("M", "N")}, "C"),
    # porter/measure/ops/gemm.py's GemmF16Op: gemm's arguments, fp16 buffers
    "gemm_f16": OpArgs((Arg("A", "const f16_t*", "ptr"), Arg("B", "const f16_t*", "ptr"),
                        Arg("C", "f16_t*", "ptr"), Arg("M", "int", "int"),
                        Arg("N", "int", "int"), Arg("K", "int", "int"),
                        Arg("workspace", "void*", "workspace")),
                       {"A": ("M", "K"), "B": ("N", "K"), "C": ("M", "N")}, "C",
                       dtypes={"A": "float16", "B": "float16", "C": "float16"}),
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
                        size_exprs={"MASK": "causal + 1"}, size_axes={"D": ("Q", 3)},
                        dtypes={"LSE": "float32"}),
    # porter/measure/ops/gemm_fp8.py: A [M, K] and B [N, K] e4m3 (bytes), C [M, N] bf16, scales
    # fp32 ([1] or per row); SCALING is the scaling argument, ACCUM no argument (the python
    # module asks for size=(...))
    "gemm_fp8": OpArgs((Arg("A", "const uint8_t*", "ptr"), Arg("B", "const uint8_t*", "ptr"),
                        Arg("C", "bf16_t*", "ptr"), Arg("scale_a", "const float*", "ptr"),
                        Arg("scale_b", "const float*", "ptr"), Arg("M", "int", "int"),
                        Arg("N", "int", "int"), Arg("K", "int", "int"),
                        Arg("scaling", "int", "int"), Arg("workspace", "void*", "workspace")),
                       {"A": ("M", "K"), "B": ("N", "K"), "C": ("M", "N")}, "C",
                       size_exprs={"SCALING": "scaling"},
                       dtypes={"A": "e4m3", "B": "e4m3", "C": "bf16", "scale_a": "float32",
                               "scale_b": "float32"}),
}
# gemm_fp8's variant with A in e5m2: the same arguments
_BUILTIN["gemm_fp8_e5m2"] = replace(_BUILTIN["gemm_fp8"],
                                  dtypes={**_BUILTIN["gemm_fp8"].dtypes, "A": "e5m2"})
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


def map_dtypes(tpl: Template) -> list[tuple[str, str, int, int]]:
    """Per [[tensor_maps]] entry, in order, its buffer's element type as (dtype, the
    CUtensorMapDataType's name, its value, bytes per element): the declared [op]'s dtype, a
    built-in op's (OpArgs.dtypes), else bf16 (what porter's harness encodes the buffers of an op
    without a tensor_map of its own as). PorterError (one line) for a type TMA has none for."""
    from porter.export.runtime_py import tma_dtype
    if not tpl.tensor_maps:
        return []
    if tpl.op_spec is not None:
        declared = {a.name: a.dtype for a in tpl.op_spec.args if a.is_buffer}
        dtype_of = lambda b: declared.get(b, "bf16")     # noqa: E731
    elif tpl.op in _BUILTIN:
        dtype_of = _BUILTIN[tpl.op].dtype
    else:
        dtype_of = lambda b: "bf16"                      # noqa: E731
    out = []
    for tm in tpl.tensor_maps:
        try:
            out.append(tma_dtype(dtype_of(tm.buffer)))
        except ValueError as e:
            raise PorterError(f"template {tpl.name!r}: tensor map over {tm.buffer!r}: {e}") \
                from None
    return out
