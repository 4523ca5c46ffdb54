"""A seed from the vendor library's own choice. cuBLAS and cuBLASLt name their Hopper GEMM
kernels after the tile, the k-step and stages, and the cluster they run:
`nvjet_sm90_tst_200x128_64x5_1x4_h_bz_coopA_TNN` is a 200 x 128 tile in cuBLAS's column-major
view (for torch's row-major `a @ b.t()`: 128 rows of C by 200 columns), 64-wide k-steps, 5
stages, clusters of 1 x 4 (4 CTAs along C's rows). Where a port's nearest tuned shapes miss the
structure the vendor picked for this shape (at 1000x3000x1000 a 128 x 200 tile in clusters of
4, which no warm seed had on an H100 and which read 0.979 of cuBLAS there against the port's
0.951), the vendor's choice, put into the template's terms, is one seed more; where the vendor runs
clusters, the same tile without one is another (`vendor_seeds`: at 1536^3 cuBLAS runs 128 x 144
in clusters of 2, which read 0.971 of cuBLAS for our port on an H100 while the same tile without
a cluster read 0.986-0.994 in the same visit, and the search, started from the clustered seed,
never tried it). A kernel whose name lacks `coop` is the vendor's ping-pong schedule: the seed
comes with PINGPONG 1 too, where the template maps it (`nvjet_pingpong`).

Nothing here runs a GPU: the caller gets the kernel names (the GPU backend's `vendor_kernels`
takes them from torch's profiler around the op's baselines) and passes the shape's static check,
which the seed is fitted to. A template asks for these seeds with a [vendor] section
(`kernels = "nvjet"`; `params` maps the name's fields to its parameters where they differ)."""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping, Sequence

from porter.search.warm import repair

KEEP = ("BM", "BN", "CLUSTER")   # what a repair of the vendor's seed tries to keep first

NVJET = re.compile(r"nvjet_sm\d+a?_\w+?_(\d+)x(\d+)_(\d+)x(\d+)_(\d+)x(\d+)_")
# the kernel-name families a template's [vendor] section can name, with the fields each yields
# (nvjet's PINGPONG: 1 for a kernel whose name lacks `coop`, the vendor's ping-pong schedule)
DECODERS = {"nvjet": ("BM", "BN", "BK", "STAGES", "CLUSTER", "PINGPONG")}


def nvjet_tile(name: str) -> dict | None:
    """The tile (BM rows, BN columns of a row-major C = A B^T), BK, STAGES and CLUSTER (CTAs a
    cluster) an nvjet kernel name encodes; None for another kernel (a reduction, a memset)."""
    m = NVJET.search(name)
    if m is None:
        return None
    cols, rows, bk, stages, cn, cm = map(int, m.groups())
    return {"BM": rows, "BN": cols, "BK": bk, "STAGES": stages, "CLUSTER": cn * cm}


def nvjet_pingpong(name: str) -> bool | None:
    """Whether an nvjet kernel runs the ping-pong schedule (two consumer warpgroups taking
    whole tiles in turn): cuBLAS marks its cooperative kernels (`coopA`, `coopB`) and names the
    others without a mark, as at 1536^3 (`..._144x128_64x6_1x2_h_bz_TNN`) and for cuBLASLt's
    fp8 kernel with row and column scales (`..._128x128_128x6_1x2_h_bz_ovscale_TNT`). None for
    another kernel."""
    if nvjet_tile(name) is None:
        return None
    return "_coop" not in name


def _first_nvjet(kernels: Iterable[str]) -> str | None:
    """The first nvjet kernel among `kernels` (the one the seeds follow), or None."""
    return next((k for k in kernels if nvjet_tile(k) is not None), None)


def _fields(names: Mapping[str, str] | None) -> dict[str, str]:
    """The template's parameter for each nvjet field (`names`; None: each field's own name)."""
    return {f: f for f in DECODERS["nvjet"]} if names is None else dict(names)


def vendor_seed(kernels: Iterable[str], base: Mapping[str, Any],
                params: Mapping[str, Sequence],
                feasible: Callable[[dict], bool] | None = None,
                cluster: int | None = None,
                names: Mapping[str, str] | None = None) -> dict | None:
    """`base` (a whole configuration, say the nearest tuned shape's best) with the tile, k-step,
    stages and cluster of the first nvjet kernel among `kernels`, each set to the nearest value
    the template offers (ties to the smaller); parameters the template lacks are left out.
    None without an nvjet kernel. `cluster`: this many CTAs a cluster instead of the vendor's.
    `names`: the template's parameter for each of the name's fields (nvjet_tile's keys); fields
    it leaves out set nothing. None: each field sets the parameter of its own name.
    With `feasible`, a configuration it accepts or None: the
    vendor's stages, or else the most that fit below them (the template's epilogue may take
    shared memory the vendor's does not), with one other parameter changed at most, then two
    (KEEP and the stages kept); else repaired keeping KEEP; else repaired."""
    name = _first_nvjet(kernels)
    if name is None:
        return None
    tile = nvjet_tile(name)
    if cluster is not None:
        tile = {**tile, "CLUSTER": cluster}
    rename = _fields(names)
    tile = {rename[f]: v for f, v in tile.items() if rename.get(f)}
    keep = tuple(rename[f] for f in KEEP if rename.get(f))
    stage_p = rename.get("STAGES") or "STAGES"
    cfg = dict(base)
    for p, v in tile.items():
        values = [x for x in params.get(p, ()) if isinstance(x, int)]
        if values and p in cfg:
            cfg[p] = min(values, key=lambda x: (abs(x - v), x))
    if feasible is None:
        return cfg
    stages = sorted((x for x in params.get(stage_p, ()) if x <= cfg.get(stage_p, 0)),
                    reverse=True)
    for changes in (1, 2):
        for s in stages:
            fixed = repair({**cfg, stage_p: s}, params, feasible, changes, keep=(*keep, stage_p))
            if fixed is not None:
                return fixed
    return repair(cfg, params, feasible, keep=keep) or repair(cfg, params, feasible)


def vendor_seeds(kernels: Iterable[str], base: Mapping[str, Any],
                 params: Mapping[str, Sequence],
                 feasible: Callable[[dict], bool] | None = None,
                 names: Mapping[str, str] | None = None) -> list[dict]:
    """The vendor's seed (`vendor_seed`, the schedule left as `base` has it); then, where the
    vendor's kernel is a ping-pong one (`nvjet_pingpong`) and the template maps PINGPONG, the
    same seed with the ping-pong schedule, where that is feasible with at most two other
    parameters changed (tile, cluster and stages kept); then, where the vendor runs clusters and
    the template offers CLUSTER 1, the same tile without a cluster, fitted the same way: a
    cluster's gain, like the schedule's, depends on the rest of the kernel, and the search steps
    away from a seed's cluster or schedule only by chance. Repeats left out; [] without an
    nvjet kernel."""
    kernels = list(kernels)
    out = []
    first = vendor_seed(kernels, base, params, feasible, names=names)
    rename = _fields(names)
    cl, pp = rename.get("CLUSTER"), rename.get("PINGPONG")
    if first is not None:
        out.append(first)
        if pp and pp in first and nvjet_pingpong(_first_nvjet(kernels)) and 1 in params.get(pp, ()) \
                and first[pp] != 1:
            turn = {**first, pp: 1}
            if feasible is not None:
                keep = [pp, rename.get("STAGES") or "STAGES", *(rename.get(f) for f in KEEP)]
                turn = repair(turn, params, feasible, 2, keep=[k for k in keep if k])
            if turn is not None and turn not in out:
                out.append(turn)
        if cl and first.get(cl, 1) != 1 and 1 in params.get(cl, ()):
            alone = vendor_seed(kernels, base, params, feasible, cluster=1, names=names)
            if alone is not None and alone not in out:
                out.append(alone)
    return out
