"""Measurement backends: the GPU (a child process with CuPy), compile-only, and replay."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from porter.spec.arch import Arch
from porter.build.compile import CompileResult
from porter.records import Measurement
from porter.spec.template import Template


@dataclass(frozen=True)
class Outcome:
    status: str
    message: str = ""
    measurements: tuple[Measurement, ...] = ()
    device: dict = field(default_factory=dict)
    busy_ms: float = 0.0      # GPU time in our kernel and the baselines during this trial


class Backend(ABC):
    name: str = ""
    needs_compile: bool = True
    # multiprocessors of the device this backend measures on (0: none, use the arch table's);
    # the job loop evaluates arch_sms with it: Arch.with_sms(backend.sms)
    sms: int = 0

    @abstractmethod
    def measure(self, template: Template, arch: Arch, config: dict,
                compiled: CompileResult | None, sizes) -> Outcome: ...

    def device_info(self) -> dict:
        return {}

    def allows(self, config: dict) -> bool:
        """False for configurations this backend cannot evaluate (not in a replay recording),
        so the search never spends its budget on them."""
        return True

    def vendor_kernels(self, template: Template, sizes) -> list[list[str]]:
        """For each of `sizes`, the names of the kernels the op's vendor baselines launch
        there, the fastest baseline's first (what a template's [vendor] section reads its seed
        from); [] for a size where this backend cannot tell."""
        return [[] for _ in sizes]

    def close(self) -> None:
        pass


class CompileOnlyBackend(Backend):
    """No GPU of the architecture here: the trial stops after compiling and says so."""
    name = "compile-only"

    def measure(self, template, arch, config, compiled, sizes) -> Outcome:
        return Outcome("compiled", f"compile-only: no {arch.name} GPU measured this variant")
