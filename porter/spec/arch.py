"""The architecture table: one row per target, limits and features as data."""
from __future__ import annotations

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
        }


_AMPERE = frozenset({"cp.async", "ldmatrix", "mma.sync", "bf16"})
_HOPPER = _AMPERE | {"tma", "clusters", "fp8"}
_BLACKWELL = _HOPPER | {"tcgen05", "tmem"}
K = 1024

ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("sm_80", (8, 0), "ampere", 163 * K, 164 * K, 65536, 255, 1024, 2048, 32, 1, _AMPERE),
    Arch("sm_86", (8, 6), "ampere", 99 * K, 100 * K, 65536, 255, 1024, 1536, 16, 1, _AMPERE),
    Arch("sm_89", (8, 9), "ada", 99 * K, 100 * K, 65536, 255, 1024, 1536, 24, 1, _AMPERE | {"fp8"}),
    Arch("sm_90", (9, 0), "hopper", 227 * K, 228 * K, 65536, 255, 1024, 2048, 32, 8, _HOPPER),
    Arch("sm_90a", (9, 0), "hopper", 227 * K, 228 * K, 65536, 255, 1024, 2048, 32, 8,
         _HOPPER | {"wgmma", "setmaxnreg"}),
    Arch("sm_100a", (10, 0), "blackwell", 227 * K, 228 * K, 65536, 255, 1024, 2048, 32, 8,
         _BLACKWELL | {"setmaxnreg"}),
    Arch("sm_103a", (10, 3), "blackwell", 227 * K, 228 * K, 65536, 255, 1024, 2048, 32, 8,
         _BLACKWELL | {"setmaxnreg"}),
    Arch("sm_120", (12, 0), "blackwell-consumer", 99 * K, 100 * K, 65536, 255, 1024, 1536, 32, 8,
         _HOPPER),
)}


def get_arch(name: str) -> Arch:
    try:
        return ARCHS[name]
    except KeyError:
        raise ArchError(f"unknown architecture {name!r}; known: {', '.join(ARCHS)}") from None


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
