"""Variants: one template folder, more than one template. A `[variants.NAME]` table of a space
file names a template that is the folder's own kernel built with more compile options and
measured by another op, e.g. gemm_wgmma's

    [variants.gemm_wgmma_f16]
    op = "gemm_f16"
    options = ["-DDTYPE=1"]
    description = "..."

`porter port gemm_wgmma_f16 ...` compiles the same source with -DDTYPE=1 and measures it with the
gemm_f16 op; parameters, constraints, launch geometry, tensor maps and seeds are the base's. The
variant is a template of its own everywhere a name is shown or searched (jobs, `porter best`,
exports); its job stores the folder's snapshot (the same hash as the base's) and loads it back
by the job's template name (porter.spec.snapshot.job_template).
"""
from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

from porter.errors import TemplateError

_KEYS = {"op", "options", "description"}


def parse(raw: Any, base: str) -> dict[str, dict]:
    """The [variants] tables checked: name -> {op, options, description}."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise TemplateError(f"template {base!r}: variants must be [variants.NAME] tables")
    out = {}
    for name, table in raw.items():
        where = f"template {base!r}: variant {name!r}"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name) or name == base:
            raise TemplateError(f"{where}: a variant needs a name of its own (letters, digits, "
                                "_ . -)")
        unknown = set(table) - _KEYS
        if unknown:
            raise TemplateError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: "
                                f"{', '.join(sorted(_KEYS))}")
        if not isinstance(table.get("op"), str):
            raise TemplateError(f"{where} needs op = \"NAME\" (a built-in or registered op)")
        options = table.get("options", [])
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise TemplateError(f"{where}: options must be a list of strings")
        out[name] = {"op": table["op"], "options": tuple(options),
                     "description": str(table.get("description", ""))}
    return out


def select(tpl, raw: Mapping[str, Any], variant: str | None):
    """The template `variant` names: the base `tpl` unless `variant` is one of its [variants]
    (any other name, e.g. the folder's, is the base). Every variant table is checked either way."""
    variants = parse(raw.get("variants"), tpl.name)
    if variants and tpl.op_spec is not None:
        raise TemplateError(f"template {tpl.name!r}: variants need a built-in op, not an [op] "
                            "section")
    v = variants.get(variant or "")
    if v is None:
        return tpl
    return dataclasses.replace(tpl, name=variant, op=v["op"], options=tpl.options + v["options"],
                               description=v["description"] or tpl.description)


def names(space_path: Path) -> tuple[str, ...]:
    """The variant names a space file declares (none where it cannot be read: loading it says
    why)."""
    try:
        raw = tomllib.loads(Path(space_path).read_text()).get("variants", {})
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return ()
    return tuple(raw) if isinstance(raw, dict) else ()
