"""The architecture table: one row per target, limits and features as data."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from porter.errors import ArchError

FEATURES = (
    "cp.async", "ldmatrix", "mma.sync", "bf16", "tma", "wgmma", "setmaxnreg", "clusters",
    "tcgen05", "tmem", "fp8",
)


@dataclass(frozen=True)
class Arch:
    name: str             # NVRTC's --gpu-architecture value, e.g. "sm_90a"
    cc: tuple[int, int]   # compute capability
    family: str
    smem_per_block: int   # bytes a block may opt in to (dynamic + static)
    smem_per_sm: int
    regs_per_sm: int
    regs_per_thread: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    max_cluster_size: int  # portable cluster size limit; 1 where clusters do not exist
    features: frozenset[str]
    # multiprocessors of the table's reference product (named in SM_PRODUCTS); a job measured
    # on a GPU uses that device's own count instead (with_sms)
    sms: int = 0

    def has(self, feature: str) -> bool:
        return feature in self.features

    def limits(self) -> dict[str, int]:
        """The names a space file's expressions can use to refer to this architecture (a
        fresh copy: callers may change it)."""
        return dict(self._limits())

    @functools.cache
    def _limits(self) -> dict[str, int]:
        return {
            "arch_cc": self.cc[0] * 10 + self.cc[1],
            "arch_smem_per_block": self.smem_per_block,
            "arch_smem_per_sm": self.smem_per_sm,
            "arch_regs_per_sm": self.regs_per_sm,
            "arch_regs_per_thread": self.regs_per_thread,
            "arch_max_threads": self.max_threads_per_block,
            "arch_max_cluster": self.max_cluster_size,
            "arch_sms": self.sms,
        }

    def with_sms(self, sms: int) -> "Arch":
        """This row with a measured device's multiprocessor count."""
        return self if sms == self.sms or sms <= 0 else dataclasses.replace(self, sms=int(sms))


_AMPERE = frozenset({"cp.async", "ldmatrix", "mma.sync", "bf16"})
_HOPPER = _AMPERE | {"tma", "clusters", "fp8"}
_BLACKWELL = _HOPPER | {"tcgen05", "tmem"}
K = 1024
# the product whose multiprocessor count each row carries (compile-only ports use it)
SM_PRODUCTS = {"sm_80": "A100", "sm_86": "RTX A6000", "sm_89": "L40S", "sm_90": "H100/H200 SXM",
               "sm_90a": "H100/H200 SXM", "sm_100a": "B200", "sm_103a": "B300 (B200's count, unchecked)",
               "sm_120": "RTX 5090"}

ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("sm_80", (8, 0), "ampere", 163 * K, 164 * K, 65536, 255, 1024, 2048, 32, 1, _AMPERE, 108),
    Arch("sm_86", (8, 6), "ampere", 99 * K, 100 * K, 65536, 255, 1024, 1536, 16, 1, _AMPERE, 84),
    Arch("sm_89", (8, 9), "ada", 99 * K, 100 * K, 65536, 255, 1024, 1536, 24, 1, _AMPERE | {"fp8"}, 142),
    Arch("sm_90", (9, 0), "hopper", 227 * K, 228 * K, 65536, 255, 1024, 2048, 32, 8, _HOPPER, 132),
    Arch("sm_90a", (9, 0), "hopper", 227 * K, 228 * K, 65536, 255, 1024, 2048, 32, 8,
         _HOPPER | {"wgmma", "setmaxnreg"}, 132),
    Arch("sm_100a", (10, 0), "blackwell", 227 * K, 228 * K, 65536, 255, 1024, 2048, 32, 8,
         _BLACKWELL | {"setmaxnreg"}, 148),
    Arch("sm_103a", (10, 3), "blackwell", 227 * K, 228 * K, 65536, 255, 1024, 2048, 32, 8,
         _BLACKWELL | {"setmaxnreg"}, 148),
    Arch("sm_120", (12, 0), "blackwell-consumer", 99 * K, 100 * K, 65536, 255, 1024, 1536, 32, 8,
         _HOPPER, 170),
)}


def get_arch(name: str) -> Arch:
    try:
        return ARCHS[name]
    except KeyError:
        raise ArchError(f"unknown architecture {name!r}; known: {', '.join(ARCHS)}") from None


def resolve_arch(name: str, sms: int | None = None) -> Arch:
    """A table row, with a product's multiprocessor count where one is given."""
    return get_arch(name).with_sms(sms or 0)


def arch_for_cc(major: int, minor: int) -> Arch:
    """The most capable table row a device of this compute capability runs (sm_90 -> sm_90a)."""
    rows = [a for a in ARCHS.values() if a.cc == (major, minor)]
    if not rows:
        raise ArchError(f"no architecture in the table for compute capability {major}.{minor}")
    return max(rows, key=lambda a: len(a.features))


def check_features(arch: Arch, required: tuple[str, ...], template: str) -> None:
    missing = [f for f in required if not arch.has(f)]
    if missing:
        raise ArchError(
            f"template {template!r} needs {', '.join(missing)}, which {arch.name} does not have")
