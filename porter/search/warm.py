"""Warm starts for a problem size nobody tuned yet: the best configurations of the nearest tuned
sizes, nearest first, each repaired into the new size's feasible set.

A tuned size is a `Tuned` (the size and its configurations, best first), read from a porter
database (`tuned_from_store`: every job of one size) or from results records
(`tuned_from_records`: DESIGN.md's records, `shape` and `params`, with their `finalists`).
`nearest_seeds` orders (source, rank) pairs by the distance between the sizes in log2 units
plus RANK_COST per rank, so the nearest size's best few come before a farther size's best, and
drops repeats. `repair` turns a seed the new size rules out (say a TMA-stored epilogue where
N % 8 != 0) into the nearest feasible configuration: one parameter changed, else two, the
parameters at the end of the template's order first (templates list the tile shape first and
the scheduling and epilogue options after it), so the tile shape is what is kept longest.

Nothing here compiles or measures: `feasible` is the caller's static check."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

ALIGN_CAP = 6            # alignment counts powers of two up to 2^6 (64 bf16: a 128-byte row)
RANK_COST = 1.5          # log2 units a lower rank costs: the nearest size's 2nd best comes
                         # before the best of a size 1.5 doublings farther
MAX_CHANGES = 2          # repair changes at most this many parameters


@dataclass(frozen=True)
class Tuned:
    size: tuple[int, ...]
    configs: tuple[dict, ...]          # best first
    source: str = ""
    ratio: float | None = field(default=None, compare=False)   # the best one's, if known
    # tuned on another GPU model: a port to this one may start from the same size's answer
    other_gpu: bool = field(default=False, compare=False)


def size_distance(a: Sequence[int], b: Sequence[int],
                  weights: Sequence[float] | None = None,
                  align: Sequence[float] | None = None) -> float:
    """Sum over dimensions of |log2 a - log2 b| (times the dimension's weight), plus, with
    `align`, its weight times the difference in the powers of two that divide the two (up to
    2^ALIGN_CAP): a GEMM's K of 1000 has rows 2000 bytes apart, not whole 128-byte lines, and
    such a size is nearer to another misaligned one than to K = 1024."""
    if len(a) != len(b):
        return math.inf
    w = weights or (1.0,) * len(a)
    d = sum(wi * abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for wi, x, y in zip(w, a, b))
    if align:
        d += sum(wi * abs(_twos(x) - _twos(y)) for wi, x, y in zip(align, a, b))
    return d


def _twos(x: int) -> int:
    """The exponent of the largest power of two dividing x, at most ALIGN_CAP."""
    x = int(x)
    return ALIGN_CAP if x == 0 else min((x & -x).bit_length() - 1, ALIGN_CAP)


def nearest_seeds(size: Sequence[int], tuned: Iterable[Tuned], n: int = 16,
                  weights: Sequence[float] | None = None, per_source: int = 4,
                  exclude_size: bool = True, align: Sequence[float] | None = None
                  ) -> list[dict]:
    """Up to n configurations for `size`, best guess first (see the module's docstring).
    exclude_size: a source of exactly this size is left out (a sweep re-porting a size must
    not start from its own answer), unless it was tuned on another GPU (Tuned.other_gpu: a port
    to a new GPU starts from the old GPU's answer for the same size)."""
    return [cfg for cfg, _ in _nearest(size, tuned, n, weights, per_source, exclude_size, align)]


def _nearest(size, tuned, n, weights, per_source=4, exclude_size=True, align=None
             ) -> list[tuple[dict, tuple]]:
    """nearest_seeds' configurations, each with the size it was tuned for."""
    items = []
    for t in tuned:
        if exclude_size and not t.other_gpu and tuple(t.size) == tuple(size):
            continue
        d = size_distance(size, t.size, weights, align)
        if not math.isfinite(d):
            continue
        for rank, cfg in enumerate(t.configs[:per_source]):
            items.append((d + RANK_COST * rank, rank, t.source, cfg, tuple(t.size)))
    items.sort(key=lambda x: (x[0], x[1], x[2]))
    out, seen = [], set()
    for _, _, _, cfg, src in items:
        key = tuple(sorted(cfg.items()))
        if key not in seen:
            seen.add(key)
            out.append((dict(cfg), src))
        if len(out) >= n:
            break
    return out


def repair(config: Mapping[str, Any], params: Mapping[str, Sequence],
           feasible: Callable[[dict], bool], max_changes: int = MAX_CHANGES,
           keep: Sequence[str] = ()) -> dict | None:
    """`config` if feasible, else the feasible configuration that differs from it in the
    fewest parameters (at most max_changes; never those in `keep`) and, among those, moves
    them the fewest steps along the template's value orders (256 x 192 tiles that overflow
    shared memory lose a pipeline stage, STAGES 4 -> 3, one step, rather than the TMA-stored
    epilogue, EPI 3 -> 0, two), ties going to the template's last parameters first and each
    one's values in the template's order; None if there is none that close."""
    cfg = {k: config[k] for k in params if k in config}
    if len(cfg) != len(params):
        return None
    if feasible(dict(cfg)):
        return dict(cfg)
    names = [p for p in list(params)[::-1] if p not in keep]
    pos = {p: {v: i for i, v in enumerate(params[p])} for p in names}
    for k in range(1, max_changes + 1):
        cands = []
        for group in itertools.combinations(names, k):
            choices = [[v for v in params[p] if v != cfg[p]] for p in group]
            for values in itertools.product(*choices):
                steps = sum(abs(pos[p][v] - pos[p].get(cfg[p], 0)) for p, v in zip(group, values))
                cands.append((steps, len(cands), group, values))
        for _, _, group, values in sorted(cands, key=lambda c: (c[0], c[1])):
            trial = {**cfg, **dict(zip(group, values))}
            if feasible(trial):
                return trial
    return None


def unforce(config: Mapping[str, Any], params: Mapping[str, Sequence], source: Sequence[int],
            feasible_at: Callable[[dict, Sequence[int] | None], bool]) -> dict:
    """`config` with each parameter that its source size forced off the template's first
    (preferred) value set back to it where that is feasible again: a seed from a size with
    N % 8 != 0 ran the plain epilogue because the TMA store was ruled out there, not because it
    won, and a new size with N % 8 == 0 should start from the TMA store. A value its source
    could have had and did not take is kept."""
    cfg = dict(config)
    for p, values in params.items():
        first = values[0]
        if p not in cfg or cfg[p] == first:
            continue
        trial = {**cfg, p: first}
        if not feasible_at(trial, source) and feasible_at(trial, None):
            cfg = trial
    return cfg


def variants(config: Mapping[str, Any], params: Mapping[str, Sequence],
             vary: Sequence[str], feasible: Callable[[dict], bool]) -> list[dict]:
    """The configurations one parameter of `vary` away from `config` (each repaired, the
    varied parameter kept), round robin over `vary` and, within a parameter, its values
    nearest in the template's order first: where a tuned tile or schedule stops fitting a new
    size (a ragged last wave, fewer tiles than multiprocessors), the neighbours along those
    parameters are what to try first."""
    queues = []
    for p in vary:
        vals = list(params.get(p, ()))
        if config.get(p) not in vals:
            continue
        i = vals.index(config[p])
        queues.append([(p, v) for _, v in sorted((abs(j - i), v) for j, v in enumerate(vals)
                                                 if j != i)])
    out = []
    for step in itertools.zip_longest(*queues):
        for pv in step:
            if pv is not None:
                fixed = repair({**config, pv[0]: pv[1]}, params, feasible, 1, keep=(pv[0],))
                if fixed is not None:
                    out.append(fixed)
    return out


def wave_variants(config: Mapping[str, Any], params: Mapping[str, Sequence],
                  feasible: Callable[[dict], bool], cost: Callable[[dict], float | None],
                  vary: Sequence[str], n: int = 4) -> list[dict]:
    """Up to n configurations one to three parameters of `vary` (the tile shape, a split, a
    cluster) away from `config`, each repaired (up to two more changes), whose estimated cost
    (a template's Template.wave_cost: whole waves of tiles times a tile's time) is below
    config's, cheapest first. A tile tuned for
    another size can leave a ragged last wave or idle multiprocessors here (1536^3 at
    128 x 192: 96 tiles on 132 SMs; 128 x 144: 132); this finds the tile that fits."""
    base = cost(dict(config))
    if base is None:
        return []
    vary = [p for p in vary if p in params and p in config]
    found: dict[tuple, tuple[float, dict]] = {}
    for k in (1, 2, 3):
        for group in itertools.combinations(vary, k):
            choices = [[v for v in params[p] if v != config[p]] for p in group]
            for values in itertools.product(*choices):
                trial = {**config, **dict(zip(group, values))}
                c = cost(trial)
                if c is None or c >= base:
                    continue
                fixed = repair(trial, params, feasible, 2, keep=group)
                if fixed is None:
                    continue
                key = tuple(fixed[p] for p in params)
                c = cost(fixed)
                if c is not None and c < base and (key not in found or c < found[key][0]):
                    found[key] = (c, fixed)
    return [cfg for _, cfg in sorted(found.values(), key=lambda x: x[0])[:n]]


def seeds_for(size: Sequence[int], tuned: Iterable[Tuned], params: Mapping[str, Sequence],
              feasible: Callable[[dict], bool], n: int = 16,
              weights: Sequence[float] | None = None, vary: Sequence[str] = (),
              n_vary: int = 0, align: Sequence[float] | None = None,
              cost: Callable[[dict], float | None] | None = None,
              wave_vary: Sequence[str] = (), n_wave: int = 0,
              feasible_at: Callable[[dict, Sequence[int] | None], bool] | None = None,
              exclude_size: bool = True) -> list[dict]:
    """What a port of `size` proposes first: nearest_seeds, each repaired for this size
    (feasible(config) judges it), repeats dropped; with `vary`, n_vary of those n are the
    best seed's `variants` along those parameters, after the first n - n_vary - n_wave seeds;
    with `cost`, n_wave before them are the best seed's `wave_variants` along wave_vary.
    feasible_at(config, size) (None: this size): each seed is first `unforce`d.
    exclude_size: as in nearest_seeds."""
    near, seen = [], set()
    for cfg, src in _nearest(size, tuned, 4 * n, weights, align=align,
                             exclude_size=exclude_size):
        if feasible_at is not None:
            cfg = unforce(cfg, params, src, feasible_at)
        fixed = repair(cfg, params, feasible)
        if fixed is None:
            continue
        key = tuple(fixed[p] for p in params)
        if key not in seen:
            seen.add(key)
            near.append(fixed)
        if len(near) >= n:
            break
    waves = wave_variants(near[0], params, feasible, cost, wave_vary, n_wave) \
        if near and cost is not None and n_wave > 0 else []
    if not near or (not waves and (not vary or n_vary <= 0)):
        return near
    keep = n - len(waves) - (n_vary if vary else 0)
    out = near[:max(keep, 1)]
    seen = {tuple(c[p] for p in params) for c in out}
    for cfg in waves:
        key = tuple(cfg[p] for p in params)
        if key not in seen and len(out) < n:
            seen.add(key)
            out.append(cfg)
    more = variants(near[0], params, vary, feasible) if vary and n_vary > 0 else []
    for cfg in more + near[max(keep, 1):]:
        key = tuple(cfg[p] for p in params)
        if key not in seen and len(out) < n:
            seen.add(key)
            out.append(cfg)
    return out


def tuned_from_records(records: Iterable[Mapping], template: str,
                       defaults: Mapping[str, Any] | None = None, source: str = "",
                       finalists: bool = True) -> list[Tuned]:
    """Tuned sizes from results records of `template` (records with `shape` and `params`;
    their `finalists`, best ratio first, follow the reported configuration). defaults: values
    for parameters an older record lacks (a template that grew a parameter whose first value
    keeps the old code); records with parameters the template no longer has are left out."""
    by_size: dict[tuple, list[tuple[float, dict]]] = {}
    ratios: dict[tuple, float] = {}
    for r in records:
        if r.get("template") != template or "params" not in r or "shape" not in r:
            continue
        size = tuple(int(x) for x in r["shape"])
        cands = [(-(r.get("ratio") or 0.0) - 1.0, r["params"])]   # the reported one first
        if finalists:
            cands += [(-(f.get("ratio") or 0.0), f["params"]) for f in r.get("finalists", ())
                      if "params" in f]
        for score, p in cands:
            cfg = _complete(p, defaults)
            if cfg is not None:
                by_size.setdefault(size, []).append((score, cfg))
        if r.get("ratio"):
            ratios[size] = max(ratios.get(size, 0.0), r["ratio"])
    return [Tuned(size, tuple(_dedupe(c for _, c in sorted(v, key=lambda x: x[0]))), source,
                  ratios.get(size)) for size, v in by_size.items()]


def tuned_from_store(store, template: str, arch: str | None = None, per_job: int = 4,
                     exclude_job: int | None = None,
                     defaults: Mapping[str, Any] | None = None) -> list[Tuned]:
    """Tuned sizes from a porter database: each measured job of `template` (on `arch`) that
    ran one size, but exclude_job, with its best configurations; several jobs of one size are
    merged. defaults: as in tuned_from_records (configurations of an older template)."""
    by_size: dict[tuple, list[tuple[float, dict]]] = {}
    for info in store.list_jobs(None, template=template, arch=arch):
        if len(info.spec.sizes) != 1 or info.id == exclude_job:
            continue
        for t in store.best_trials(info.id, per_job):
            cfg = _complete(t.params, defaults)
            if t.objective is not None and cfg is not None:
                by_size.setdefault(tuple(info.spec.sizes[0]), []).append((t.objective, cfg))
    return [Tuned(size, tuple(_dedupe(c for _, c in sorted(v, key=lambda x: x[0]))),
                  f"{store.url}", 1.0 / min(o for o, _ in v))
            for size, v in by_size.items()]


def _complete(params: Mapping[str, Any], defaults: Mapping[str, Any] | None) -> dict | None:
    if defaults is None:
        return dict(params)
    if set(params) - set(defaults):
        return None
    return {k: params.get(k, v) for k, v in defaults.items()}


def _dedupe(configs: Iterable[dict]) -> list[dict]:
    out, seen = [], set()
    for c in configs:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
