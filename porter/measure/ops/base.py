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
    # the kernel's parameters: "p" a pointer, "s" a scalar, in order (tensor maps follow);
    # None: the op cannot say (checked elsewhere)
    signature: tuple[str, ...] | None = None
    note: str = ""               # said on every measured row (e.g. what the reference is)

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


_REGISTRY: dict[str, type[Op]] = {}


def register(cls: type[Op]) -> type[Op]:
    """Registers an Op subclass under its `name` (usable as a class decorator)."""
    if not cls.name:
        raise TemplateError(f"op class {cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def _load() -> dict[str, type[Op]]:
    """Every op by name: the modules of this package that define Op subclasses (gemm,
    rmsnorm, kt, ...), then third-party ops from the entry point group `porter.ops`
    (name = "module:OpClass")."""
    if not _REGISTRY:
        import importlib
        import pkgutil
        from importlib.metadata import entry_points
        import porter.measure.ops as pkg
        for mod in pkgutil.iter_modules(pkg.__path__):
            if mod.name.startswith("_") or mod.name in ("base", "declared", "refs", "resolve"):
                continue
            m = importlib.import_module(f"{pkg.__name__}.{mod.name}")
            for obj in vars(m).values():
                if isinstance(obj, type) and issubclass(obj, Op) and obj is not Op and obj.name \
                        and obj.__module__ == m.__name__:
                    _REGISTRY.setdefault(obj.name, obj)
        for ep in entry_points(group="porter.ops"):
            try:
                cls = ep.load()
            except Exception as e:  # noqa: BLE001 - a broken plug-in names itself
                raise TemplateError(f"op plug-in {ep.name!r} ({ep.value}) cannot be loaded: "
                                    f"{e}") from e
            if isinstance(cls, type) and issubclass(cls, Op):
                _REGISTRY.setdefault(ep.name, cls)
    return _REGISTRY


def op_names() -> tuple[str, ...]:
    return tuple(sorted(_load()))


def get_op(name: str) -> Op:
    ops = _load()
    if name not in ops:
        raise TemplateError(f"unknown op {name!r}; known: {', '.join(sorted(ops))}, or declare "
                            "the op in an [op] section (docs/TEMPLATES.md)")
    return ops[name]()


def make_op(name: str, template_dir: str, trust_template_code: bool = False) -> Op:
    """The op that measures a template: its declared [op] if it has one, else the registered
    op `name`, configured from the template folder."""
    if template_dir:
        from porter.spec.template import load_template
        tpl = load_template(template_dir)
        if tpl.op_spec is not None:
            from porter.measure.ops.declared import DeclaredOp
            return DeclaredOp(tpl, trust_template_code)
    op = get_op(name)
    op.configure(template_dir)
    return op
