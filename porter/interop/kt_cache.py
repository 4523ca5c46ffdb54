"""Kernel Tuner cache files: `load_cache(path)` -> KTCache (parameters in order, each entry's
time or failure string, device); `kt_space(cache)` -> (params, feasible): every cached
configuration except InvalidConfig (statically infeasible, never counted). Compile/runtime
failures stay in: they cost an evaluation like any other. `t1_beside(path)`: the T1 file of a
cache's kernel in the same folder (`<kernel>.T1.json` beside `<kernel>_<GPU>.json.gz`).

Caches in the wild differ: `device_name` may be empty (then the GPU is read from an
`environment` block, else from the file name after the kernel's T1 name, else the file stem),
and `problem_size` may be one bare integer."""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from porter.errors import SpecError

FAILURES = ("InvalidConfig", "CompilationFailedConfig", "RuntimeFailedConfig", "ErrorConfig")


# ---- caches --------------------------------------------------------------------------------
@dataclass(frozen=True)
class KTCache:
    path: str
    device: str
    kernel_name: str
    problem_size: tuple
    params: Mapping[str, tuple]             # ordered name -> values
    entries: Mapping[str, float | str]      # key "v1,v2,..." -> time (ms) or failure string

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.params)

    def key(self, config: Mapping[str, Any] | tuple) -> str:
        vals = config if isinstance(config, tuple) else tuple(config[n] for n in self.names)
        return ",".join(str(v) for v in vals)

    def config(self, key: str) -> tuple:
        """The value tuple of a cache key (values matched by their text)."""
        texts = key.split(",")
        if len(texts) != len(self.params):
            raise SpecError(f"{self.path}: key {key!r} does not have {len(self.params)} values")
        out = []
        for t, (n, vals) in zip(texts, self.params.items()):
            for v in vals:
                if str(v) == t:
                    out.append(v)
                    break
            else:
                raise SpecError(f"{self.path}: key {key!r}: {t!r} is not a value of {n}")
        return tuple(out)

    def time(self, config) -> float | str | None:
        return self.entries.get(self.key(config))

    def valid_times(self) -> dict[str, float]:
        return {k: v for k, v in self.entries.items() if isinstance(v, float)}

    def optimum(self) -> tuple[str, float]:
        return min(self.valid_times().items(), key=lambda kv: kv[1])

    def top(self, n: int) -> list[dict]:
        """The n fastest configurations, as dicts."""
        best = sorted(self.valid_times().items(), key=lambda kv: kv[1])[:n]
        return [dict(zip(self.names, self.config(k))) for k, _ in best]


def _read_json(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def load_cache(path: str | Path) -> KTCache:
    p = Path(path)
    try:
        data = _read_json(p)
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read Kernel Tuner cache {p}: {e}") from None
    if not isinstance(data, dict) or "cache" not in data or "tune_params_keys" not in data:
        raise SpecError(f"{p} is not a Kernel Tuner cache file")
    names = list(data["tune_params_keys"])
    tp = data.get("tune_params") or {}
    params = {n: tuple(tp.get(n, ())) for n in names}
    entries: dict[str, float | str] = {}
    for key, e in data["cache"].items():
        t = e.get("time") if isinstance(e, dict) else None
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            t = float(t)
            if t >= 1e20:                     # some caches write failures as a huge time
                t = "RuntimeFailedConfig"
        elif isinstance(t, str):
            pass
        else:
            t = "ErrorConfig"
        entries[key] = t
    if not all(params.values()):             # old caches without tune_params: rebuild
        seen: dict[str, dict] = {n: {} for n in names}
        for e in data["cache"].values():
            for n in names:
                seen[n].setdefault(str(e[n]), e[n])
        params = {n: tuple(sorted(seen[n].values())) for n in names}
    return KTCache(str(p), _device(data, p), str(data.get("kernel_name", "")),
                   _problem_size(data.get("problem_size"), p), params, entries)


def _problem_size(raw, p: Path) -> tuple:
    if raw is None or raw == "":
        return ()
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return (raw,)
    if isinstance(raw, (list, tuple)):
        return tuple(raw)
    raise SpecError(f"{p}: problem_size {raw!r} is neither a number nor a list")


def _stem(p: Path) -> str:
    return p.name.split(".json")[0]


def _device(data: dict, p: Path) -> str:
    """The GPU's name: `device_name`, else the `environment` block's, else the file name."""
    env = data.get("environment")
    for raw in (data.get("device_name"), env.get("device_name") if isinstance(env, dict) else None):
        if isinstance(raw, str) and raw.strip():
            return raw.strip()
    t1 = t1_beside(p)
    stem = _stem(p)
    if t1 is not None:
        return stem[len(t1.name) - len(".T1.json") + 1:] or stem
    return stem.rsplit("_", 1)[-1] if "_" in stem else stem


def t1_beside(path: str | Path) -> Path | None:
    """The T1 file of the cache's kernel in the cache's folder: the longest `NAME.T1.json` with
    the cache file named `NAME_<GPU>...`; GPU names may hold underscores (GTX_1080_Ti). None
    where there is none."""
    p = Path(path)
    stem = _stem(p)
    best = None
    for t1 in p.parent.glob("*.T1.json"):
        name = t1.name[:-len(".T1.json")]
        if stem.startswith(name + "_") and (best is None or len(name) > len(best[0])):
            best = (name, t1)
    return best[1] if best else None


def kt_space(cache: KTCache) -> tuple[dict[str, tuple], set[tuple]]:
    """(params, feasible): feasible = cached configurations other than InvalidConfig."""
    feasible = {cache.config(k) for k, t in cache.entries.items() if t != "InvalidConfig"}
    return dict(cache.params), feasible
