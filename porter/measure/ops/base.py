from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from porter.errors import TemplateError


class Op(ABC):
    """One kind of computation. `setup` makes inputs and the reference for one problem size;
    `args` gives the kernel arguments; `error` compares the output with the reference."""

    name: str = ""
    dims: tuple[str, ...] = ()
    rtol: float = 1e-2           # tolerance on ||out - ref|| / ||ref||
    memory_bound: bool = False

    @abstractmethod
    def setup(self, size: tuple[int, ...], seed: int) -> dict[str, Any]:
        """Fresh random inputs (never zeros), the output buffer and the reference (fp32)."""

    @abstractmethod
    def args(self, state: dict[str, Any], workspace_ptr: int) -> list:
        """Kernel arguments as (ctypes-compatible) values in the op's documented order."""

    @abstractmethod
    def poison(self, state: dict[str, Any]) -> None:
        """Fills the output with NaN so an unwritten element fails verification."""

    @abstractmethod
    def error(self, state: dict[str, Any]) -> float:
        """Relative Frobenius error of the output against the reference (inf for NaN)."""

    @abstractmethod
    def baselines(self, state: dict[str, Any]) -> dict[str, Any]:
        """Vendor implementations by name: callables that compute the same output."""

    def configure(self, template_dir: str) -> None:
        """Reads whatever the op needs from the template folder (most need nothing)."""

    def constants(self, state: dict[str, Any]) -> dict:
        """__constant__ symbols of the module to fill before a launch: name -> array."""
        return {}

    def buffer(self, state: dict[str, Any], name: str):
        """(device pointer, rows, cols, row stride in bytes) of a named 2-D bf16 buffer."""
        arr = state[name]
        return arr.data.ptr, arr.shape[0], arr.shape[1], arr.strides[0]


def _load() -> dict[str, type[Op]]:
    from porter.measure.ops.gemm import GemmOp
    from porter.measure.ops.rmsnorm import RmsNormOp
    from porter.measure.ops.kt import KTOp
    return {c.name: c for c in (GemmOp, RmsNormOp, KTOp)}


OPS = ("gemm", "rmsnorm", "kt")


def get_op(name: str) -> Op:
    ops = _load()
    if name not in ops:
        raise TemplateError(f"unknown op {name!r}; known: {', '.join(sorted(ops))}")
    return ops[name]()
