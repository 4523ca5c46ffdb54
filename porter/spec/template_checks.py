"""What load_template checks once a space file has parsed: the names its expressions read, the
headers its source includes and its [vendor] section (porter/spec/template.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from porter.errors import TemplateError
from porter.spec.arch import ARCHS

if TYPE_CHECKING:
    from porter.spec.expr import Expr
    from porter.spec.template import Template


def check_names(tpl: Template) -> None:
    """Every name an expression reads must be a parameter, a size or an architecture limit."""
    known = set(tpl.params) | set(tpl.size_names) | set(ARCHS["sm_90a"].limits())
    exprs: list[tuple[str, Expr]] = [("constraint", c) for c in tpl.constraints]
    exprs += [("launch.grid", e) for e in tpl.grid] + [("launch.block", e) for e in tpl.block]
    exprs += [("launch.cluster", e) for e in tpl.cluster]
    exprs += [("launch.smem", tpl.smem), ("launch.workspace", tpl.workspace)]
    for key in ("workspace_clean", "tiles", "tile_cost"):
        if getattr(tpl, key) is not None:
            exprs.append((f"launch.{key}", getattr(tpl, key)))
    exprs += [(f"metrics.{k}", e) for k, e in tpl.metrics.items()]
    exprs += [("tensor_maps.box", e) for tm in tpl.tensor_maps for e in tm.box]
    for where, e in exprs:
        unknown = sorted(e.names - known)
        if unknown:
            raise TemplateError(f"template {tpl.name!r}: {where} {e.text!r} names unknown "
                                f"parameter(s) {', '.join(unknown)}")


def check_includes(name: str, source: str, include_dir: Path) -> None:
    """Every #include names one of the project's headers (include_dir), literally: NVRTC from
    PyPI carries no CUDA headers, and templates may read nothing else."""
    allowed = {p.relative_to(include_dir).as_posix() for p in include_dir.rglob("*")
               if p.suffix in (".cuh", ".h")}
    # checked on what the preprocessor sees (comments, splices, digraphs, computed includes)
    from porter.build.includes import forbidden_include
    bad = forbidden_include(source, allowed)
    if bad:
        raise TemplateError(f"template {name!r} has {bad}, which is outside the project's "
                            "include folder (name one of its headers literally); allowed: "
                            f"{', '.join(sorted(allowed))}")


@dataclass(frozen=True)
class VendorSpec:
    """[vendor]: the vendor library's own kernel for a job's size is a warm seed. `kernels`
    names how its kernel names encode the tile (porter.search.vendor.DECODERS); `params` maps
    each field of the name to the template parameter it sets."""
    kernels: str
    params: Mapping[str, str]


def parse_vendor(raw, name: str, params: Mapping[str, tuple]) -> VendorSpec:
    """[vendor] kernels = "nvjet" and, optionally, params = {FIELD = "PARAM", ...} where a
    field of the name sets a parameter of another name (by default each field sets the
    parameter of its own name, where the template has one)."""
    from porter.search.vendor import DECODERS
    where = f"template {name!r}: [vendor]"
    if not isinstance(raw, dict) or set(raw) - {"kernels", "params"}:
        raise TemplateError(f"{where} takes kernels and params only")
    kind = raw.get("kernels")
    if kind not in DECODERS:
        raise TemplateError(f"{where} kernels must be one of {', '.join(DECODERS)}, not "
                            f"{kind!r}")
    fields = DECODERS[kind]
    given = raw.get("params", {f: f for f in fields if f in params})
    if not isinstance(given, dict):
        raise TemplateError(f"{where} params must be a table FIELD = \"PARAM\"")
    for f, p in given.items():
        if f not in fields:
            raise TemplateError(f"{where} params names {f!r}; {kind} names give "
                                + ", ".join(fields))
        if p not in params:
            raise TemplateError(f"{where} maps {f} to {p!r}, which is not a parameter")
    if not given:
        raise TemplateError(f"{where}: none of the fields {', '.join(fields)} is a parameter; "
                            "map them with params = {FIELD = \"PARAM\"}")
    return VendorSpec(str(kind), dict(given))
