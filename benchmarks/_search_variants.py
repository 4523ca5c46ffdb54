"""auto's variants for leave-one-space-out: each is a set of porter.search.auto.Auto constants.
Every variant names all the constants the grid varies, so a variant's runs do not depend on
Auto's defaults; the defaults are the variant that is best over all ten spaces (checked by
search_quality.py: `auto` must score as that variant does)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from porter.search import register_sampler, sampler_names
from porter.search.auto import Auto

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "auto~"
# START: the first proposal (the middle of every value order, or random); N_INIT: random
# configurations before the climb; STALL: restart the climb after max(30, STALL * n)
# evaluations without progress (0: never)
GRID = {
    "old": dict(START="random", N_INIT=5, STALL=0.0),
    "center1": dict(START="center", N_INIT=1, STALL=0.0),
    "center1-stall25": dict(START="center", N_INIT=1, STALL=0.25),
    "center1-stall50": dict(START="center", N_INIT=1, STALL=0.5),
    "random1-stall50": dict(START="random", N_INIT=1, STALL=0.5),
}


def select(spec: str) -> dict[str, dict]:
    if spec in ("", "none"):
        return {}
    if spec == "all":
        return dict(GRID)
    return {n: GRID[n] for n in spec.split(",")}


def sampler_name(variant: str) -> str:
    return PREFIX + variant


def register(variants: dict[str, dict]) -> None:
    """Registers each variant as the sampler auto~NAME (an Auto subclass with its constants)."""
    for name, consts in variants.items():
        if sampler_name(name) not in sampler_names():
            register_sampler(sampler_name(name), type(f"Auto_{name}", (Auto,), dict(consts)))


def defaults_variant(variants: dict[str, dict]) -> str | None:
    """The variant whose constants are Auto's defaults, if any."""
    for name, consts in variants.items():
        if all(getattr(Auto, k) == v for k, v in consts.items()):
            return name
    return None


def code_hash() -> str:
    """The search code the runs depend on (porter/search/*.py)."""
    h = hashlib.sha256()
    for p in sorted((ROOT / "porter" / "search").glob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()[:12]
