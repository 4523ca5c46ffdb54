"""What load_template checks once a space file has parsed: the names its expressions read and
the headers its source includes (porter/spec/template.py)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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
