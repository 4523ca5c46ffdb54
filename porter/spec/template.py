"""Templates: a folder with CUDA C++ source and a declarative space file (`space.toml`).

The space file is parsed once, here, into frozen values; the rest of porter never sees raw
dictionaries. See docs/TEMPLATES.md for the format.
"""
from __future__ import annotations

import itertools
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from porter.spec.arch import ARCHS, FEATURES, Arch, check_features
from porter.errors import SpecError, TemplateError
from porter.spec.expr import Expr
from porter.spec.opspec import OpSpec, parse_op
from porter.spec.template_checks import VendorSpec, check_includes, check_names, parse_vendor

BUILTIN_DIR = Path(__file__).resolve().parents[2] / "search_spaces"
INCLUDE_DIR = Path(__file__).resolve().parents[1] / "include"

_TOP_KEYS = {"template", "sizes", "params", "constraints", "launch", "metrics", "verify",
             "tensor_maps", "resources", "seeds", "op", "variants", "vendor"}
_TEMPLATE_KEYS = {"name", "op", "version", "source", "kernel", "requires", "archs",
                  "description", "options"}


@dataclass(frozen=True)
class TensorMapSpec:
    buffer: str                 # which op buffer the map describes ("A", "B", "C")
    box: tuple[Expr, ...]       # box extent per dimension, innermost first
    swizzle: int = 128          # 0, 32, 64 or 128 bytes


@dataclass(frozen=True)
class Launch:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    cluster: tuple[int, int, int] = (1, 1, 1)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class Template:
    name: str
    folder: Path
    op: str
    version: str
    source: str
    source_name: str
    kernel: str
    requires: tuple[str, ...]
    archs: tuple[str, ...]
    description: str
    options: tuple[str, ...]
    size_names: tuple[str, ...]
    default_sizes: tuple[tuple[int, ...], ...]
    params: Mapping[str, tuple]                    # ordered name -> allowed values
    constraints: tuple[Expr, ...]
    grid: tuple[Expr, Expr, Expr]
    block: tuple[Expr, Expr, Expr]
    smem: Expr
    cluster: tuple[Expr, Expr, Expr]
    workspace: Expr                                # bytes of zeroed scratch the kernel may use
    metrics: Mapping[str, Expr]
    tensor_maps: tuple[TensorMapSpec, ...] = ()
    rtol: float | None = None
    allow_spills: bool = False
    seeds: tuple = ()                              # [[seeds]]: known-good partial configurations
    # bytes at the start of the workspace that must be zero again when the kernel ends (flags,
    # counters); None: all of it. The rest is scratch the kernel fully writes before it reads.
    workspace_clean: Expr | None = None
    # [launch] tiles / tile_cost: independent output tiles and one tile's relative time, for
    # wave quantization (wave_cost); None: the template does not say
    tiles: Expr | None = None
    tile_cost: Expr | None = None
    # [sizes] align: per size dimension, what a difference of one in the power of two dividing
    # it counts in the distance between sizes (porter.search.warm.size_distance), beside the
    # log2 distance; None: the sizes' magnitudes alone
    size_align: tuple[float, ...] | None = None
    source_hash: str = field(default="", compare=False)
    op_spec: OpSpec | None = None                  # [op]: an op declared by the template
    vendor: VendorSpec | None = None               # [vendor]: seed the vendor's own tile
    # porter headers this template compiles against: a snapshot carries its own; None: the
    # project's include folder
    include_dir: Path | None = field(default=None, compare=False)

    # ---- parameters and configurations -------------------------------------------------
    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(self.params)

    def start_configs(self) -> list[dict[str, Any]]:
        """What a search tries first: the default (every parameter's first value), then each
        [[seeds]] table with the default filling the parameters it leaves out. Infeasible ones
        are skipped by the search."""
        default = {n: v[0] for n, v in self.params.items()}
        return [default, *({**default, **seed} for seed in self.seeds)]

    def space_size(self) -> int:
        n = 1
        for v in self.params.values():
            n *= len(v)
        return n

    def iter_configs(self) -> Iterator[dict[str, Any]]:
        names = self.param_names
        for values in itertools.product(*self.params.values()):
            yield dict(zip(names, values))

    def complete(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """`config` with the parameters it lacks at their defaults (as recorded before them)."""
        return {n: config.get(n, v[0]) for n, v in self.params.items()}

    def config_key(self, config: Mapping[str, Any]) -> str:
        """Kernel Tuner's key: the values in parameter order, comma-joined."""
        return ",".join(str(config[n]) for n in self.param_names)

    def supported_archs(self) -> tuple[str, ...]:
        if self.archs:
            return self.archs
        return tuple(a.name for a in ARCHS.values() if all(a.has(f) for f in self.requires))

    def check_arch(self, arch: Arch) -> None:
        check_features(arch, self.requires, self.name)
        if self.archs and arch.name not in self.archs:
            raise TemplateError(f"template {self.name!r} supports {', '.join(self.archs)}, "
                                f"not {arch.name}")

    # ---- sizes -------------------------------------------------------------------------
    def parse_size(self, text: str) -> tuple[int, ...]:
        """'4096x4096x4096' or 'M=4096,N=4096,K=4096' -> (4096, 4096, 4096)."""
        s = str(text).strip()
        try:
            if "=" in s:
                kv = dict(p.split("=", 1) for p in s.replace(" ", "").split(","))
                unknown = set(kv) - set(self.size_names)
                if unknown or len(kv) != len(self.size_names):
                    raise ValueError
                vals = tuple(int(kv[n]) for n in self.size_names)
            else:
                vals = tuple(int(p) for p in re.split(r"[x,×]", s.lower()))
        except ValueError:
            raise SpecError(f"malformed size {text!r} for template {self.name!r}: write "
                            f"{'x'.join(self.size_names)} as integers, e.g. "
                            f"{'x'.join(str(v) for v in self.default_sizes[0])}") from None
        if len(vals) != len(self.size_names) or any(v <= 0 for v in vals):
            raise SpecError(f"malformed size {text!r} for template {self.name!r}: it needs "
                            f"{len(self.size_names)} positive integers "
                            f"({'x'.join(self.size_names)})")
        return vals

    def size_env(self, size: tuple[int, ...]) -> dict[str, int]:
        return dict(zip(self.size_names, size))

    # ---- static evaluation -------------------------------------------------------------
    def env(self, config: Mapping[str, Any], arch: Arch, size: tuple[int, ...] | None = None):
        if size is None:
            return {**arch._limits(), **config}
        return {**arch._limits(), **dict(zip(self.size_names, size)), **config}

    def launch(self, config, arch: Arch, size: tuple[int, ...], env=None) -> Launch:
        """env: this configuration's env at this size, if the caller has it already."""
        env = self.env(config, arch, size) if env is None else env
        return Launch(grid=tuple(int(e(env)) for e in self.grid),
                      block=tuple(int(e(env)) for e in self.block),
                      smem=int(self.smem(env)),
                      cluster=tuple(int(e(env)) for e in self.cluster))

    def map_boxes(self, env) -> list[tuple[str, tuple[int, ...], int]]:
        """Each [[tensor_maps]] entry as (buffer, box, swizzle) in this configuration's env; a
        box with a zero extent: the configuration does not use that map."""
        return [(tm.buffer, tuple(int(b(env)) for b in tm.box), tm.swizzle)
                for tm in self.tensor_maps]

    def metric(self, name: str, config, arch: Arch, size) -> float | None:
        e = self.metrics.get(name)
        return None if e is None else float(e(self.env(config, arch, size)))

    def workspace_bytes(self, config, arch: Arch, size) -> int:
        return int(self.workspace(self.env(config, arch, size)))

    def workspace_clean_bytes(self, config, arch: Arch, size) -> int:
        """How much of the workspace, from its start, the kernel must leave zeroed."""
        total = self.workspace_bytes(config, arch, size)
        if self.workspace_clean is None:
            return total
        return min(total, int(self.workspace_clean(self.env(config, arch, size))))

    def wave_cost(self, config, arch: Arch, size) -> float | None:
        """Estimated relative time: whole waves of `tiles` over the multiprocessors (arch_sms),
        each wave one tile_cost; what a warm start ranks tile shapes by where a tuned one leaves
        a ragged last wave or idle multiprocessors. None without [launch] tiles."""
        if self.tiles is None:
            return None
        env = self.env(config, arch, size)
        waves = math.ceil(float(self.tiles(env)) / max(1, int(env.get("arch_sms") or 1)))
        return waves * (float(self.tile_cost(env)) if self.tile_cost is not None else 1.0)

    def defines(self, config: Mapping[str, Any], arch: Arch) -> list[str]:
        opts = [f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in config.items()]
        opts.append(f"-DPORTER_ARCH={arch.cc[0] * 10 + arch.cc[1]}")
        return opts


def _exprs(value, what: str, n: int | None = None) -> tuple[Expr, ...]:
    if isinstance(value, (str, int, float)):
        value = [value]
    if not isinstance(value, list) or (n is not None and len(value) > n):
        raise TemplateError(f"{what} must be a list of up to {n} expressions")
    out = [Expr(v) for v in value]
    if n is not None:
        out += [Expr(1)] * (n - len(out))
    return tuple(out)


def load_template(folder: str | Path, include_dir: Path | None = None,
                  source_hash: str | None = None, variant: str | None = None) -> Template:
    """Parses one template folder; every problem becomes a TemplateError naming what to fix.
    source_hash: the folder's snapshot hash (porter.spec.snapshot), computed when not given.
    variant: one of its [variants] (porter.spec.variants); any other name gives the base."""
    folder = Path(folder)
    space_path = folder / "space.toml"
    if not space_path.is_file():
        raise TemplateError(f"{folder} has no space.toml")
    try:
        raw = tomllib.loads(space_path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise TemplateError(f"{space_path}: {e}") from None
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise TemplateError(f"{space_path}: unknown section(s) {', '.join(sorted(unknown))}")
    t = raw.get("template", {})
    unknown = set(t) - _TEMPLATE_KEYS
    if unknown:
        raise TemplateError(f"{space_path}: unknown key(s) in [template]: "
                            f"{', '.join(sorted(unknown))}")
    for key in ("name", "kernel") if "op" in raw else ("name", "op", "kernel"):
        if key not in t:
            raise TemplateError(f"{space_path}: [template] needs {key!r}"
                                + (" (a built-in op, or an [op] section)" if key == "op" else ""))
    name = str(t["name"])
    src_name = str(t.get("source", "kernel.cu"))
    src_path = (folder / src_name).resolve()
    if folder.resolve() not in src_path.parents or not src_path.is_file():
        raise TemplateError(f"template {name!r}: source {src_name!r} is not a file in {folder}")
    source = src_path.read_text()
    check_includes(name, source, INCLUDE_DIR)

    requires = tuple(t.get("requires", ()))
    bad = [f for f in requires if f not in FEATURES]
    if bad:
        raise TemplateError(f"template {name!r} requires unknown feature(s) {', '.join(bad)}; "
                            f"known: {', '.join(FEATURES)}")
    archs = tuple(t.get("archs", ()))
    bad = [a for a in archs if a not in ARCHS]
    if bad:
        raise TemplateError(f"template {name!r} lists unknown architecture(s) {', '.join(bad)}")

    params_raw = raw.get("params", {})
    if not params_raw:
        raise TemplateError(f"template {name!r} declares no [params]")
    params: dict[str, tuple] = {}
    for p, vals in params_raw.items():
        if not isinstance(vals, list) or not vals:
            raise TemplateError(f"template {name!r}: parameter {p!r} needs a non-empty list")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p):
            raise TemplateError(f"template {name!r}: parameter name {p!r} is not an identifier")
        params[p] = tuple(vals)

    sizes = raw.get("sizes", {})
    size_names = tuple(sizes.get("names", ()))
    if not size_names:
        raise TemplateError(f"template {name!r}: [sizes] needs names")
    align = sizes.get("align")
    if align is not None and (not isinstance(align, list) or len(align) != len(size_names) or
                              not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                      and x >= 0 for x in align)):
        raise TemplateError(f"template {name!r}: [sizes] align must list {len(size_names)} "
                            "non-negative numbers, one for each of " + ", ".join(size_names))

    launch = raw.get("launch", {})
    if "grid" not in launch or "block" not in launch:
        raise TemplateError(f"template {name!r}: [launch] needs grid and block")
    metrics = {k: Expr(v) for k, v in raw.get("metrics", {}).items()}
    constraints = _exprs(raw.get("constraints", {}).get("list", []), "constraints.list")
    tmaps = []
    for tm in raw.get("tensor_maps", []):
        tmaps.append(TensorMapSpec(buffer=str(tm["buffer"]), box=_exprs(tm["box"], "box"),
                                   swizzle=int(tm.get("swizzle", 128))))
    verify = raw.get("verify", {})
    resources = raw.get("resources", {})
    seeds = raw.get("seeds", [])
    if not isinstance(seeds, list) or not all(isinstance(x, dict) for x in seeds):
        raise TemplateError(f"template {name!r}: seeds must be [[seeds]] tables of parameter "
                            "values")
    for i, seed in enumerate(seeds):
        for k, v in seed.items():
            if k not in params:
                raise TemplateError(f"template {name!r}: seed {i + 1} names {k!r}, which is not "
                                    "a parameter")
            if v not in params[k]:
                raise TemplateError(f"template {name!r}: seed {i + 1} sets {k} = {v!r}, which is "
                                    f"not one of its values {list(params[k])}")

    op_spec = parse_op(raw["op"], name, size_names, params) if "op" in raw else None
    vendor = parse_vendor(raw["vendor"], name, params) if "vendor" in raw else None
    tpl = Template(
        name=name, folder=folder, op=op_spec.name if op_spec else str(t["op"]), op_spec=op_spec,
        version=str(t.get("version", "1")),
        source=source, source_name=src_name, kernel=str(t["kernel"]), requires=requires,
        archs=archs, description=str(t.get("description", "")),
        options=tuple(t.get("options", ())), size_names=size_names,
        default_sizes=(), params=params, constraints=constraints,
        grid=_exprs(launch["grid"], "launch.grid", 3), block=_exprs(launch["block"],
                                                                    "launch.block", 3),
        smem=Expr(launch.get("smem", 0)), cluster=_exprs(launch.get("cluster", [1]),
                                                         "launch.cluster", 3),
        workspace=Expr(launch.get("workspace", 0)),
        workspace_clean=Expr(launch["workspace_clean"]) if "workspace_clean" in launch else None,
        tiles=Expr(launch["tiles"]) if "tiles" in launch else None,
        tile_cost=Expr(launch["tile_cost"]) if "tile_cost" in launch else None,
        metrics=metrics, tensor_maps=tuple(tmaps),
        rtol=verify.get("rtol"), allow_spills=bool(resources.get("allow_spills", False)),
        seeds=tuple(dict(x) for x in seeds), vendor=vendor,
        size_align=tuple(float(x) for x in align) if align is not None else None,
        source_hash=source_hash or _snapshot_hash(folder),
        include_dir=include_dir,
    )
    defaults = tuple(tpl.parse_size(s) for s in sizes.get("default", []))
    if not defaults:
        raise TemplateError(f"template {name!r}: [sizes] needs at least one default size")
    object.__setattr__(tpl, "default_sizes", defaults)
    check_names(tpl)
    from porter.spec.variants import select
    return select(tpl, raw, variant)


def _snapshot_hash(folder: Path) -> str:
    from porter.spec.snapshot import bundle
    return bundle(folder).hash


def template_dirs() -> list[Path]:
    dirs = [BUILTIN_DIR]
    extra = os.environ.get("PORTER_TEMPLATES", "")
    dirs += [Path(p) for p in extra.split(os.pathsep) if p]
    return dirs


def discover(extra_dirs: list[Path] | None = None) -> dict[str, Path]:
    """Template name -> folder, over the built-in folder, PORTER_TEMPLATES and extra_dirs (a
    [variants] name -> its folder)."""
    from porter.spec.variants import names
    found: dict[str, Path] = {}
    for d in template_dirs() + list(extra_dirs or []):
        if not d.is_dir():
            continue
        for sub in [d] if (d / "space.toml").is_file() else sorted(d.iterdir()):
            if (sub / "space.toml").is_file():
                for name in (sub.name, *names(sub / "space.toml")):   # and its [variants]
                    found.setdefault(name, sub)
    return found


def find_template(name_or_path: str, extra_dirs: list[Path] | None = None) -> Template:
    p = Path(name_or_path)
    if (p / "space.toml").is_file():
        return load_template(p)
    found = discover(extra_dirs)
    if name_or_path not in found:
        raise TemplateError(f"unknown template {name_or_path!r}; known: "
                            f"{', '.join(sorted(found)) or 'none'}")
    return load_template(found[name_or_path], variant=name_or_path)
