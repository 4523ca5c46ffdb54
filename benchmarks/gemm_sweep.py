"""bf16 GEMM shape sweep: porter ports gemm_wgmma to each of SHAPES with a small budget
(at most 60 trials, warm-started from the nearest tuned shapes, stopped early once the search
has converged), then re-times its finalists (the fastest two, and near-ties of another
structure) interleaved with cuBLAS (the faster of cublasGemmEx and
torch.matmul, an L2 flush before every repeat) in the same process on the same GPU.

    python benchmarks/gemm_sweep.py --out DIR [--trials 60] [--shapes 3000x5000x1000,...]
                                    [--deep SHAPES] [--merge OLD.json] [--deadline-s 300]
                                    [--include COPY_OF_PORTER_INCLUDE] [--db FILE]
                                    [--warm-from OTHER_GPUS_RESULTS.json]
                                    [--vendor-kernels BASELINE_KERNELS.json]
    python benchmarks/gemm_sweep.py --plan       # no GPU: the shapes and their warm seeds
    python benchmarks/gemm_sweep.py --seed-check RESULTS.json   # no GPU: the warm start
                                                 # replayed on a results file's shapes

Writes DIR/gemm_sweep.json (after every shape): `records`, one per shape, with `gpu`, `shape`,
`params`, `trials`, `seconds` (the port's wall time), `ratio` (cuBLAS time / ours, the
confirmation run) and `baseline_pathological`; `summary` with the geomean over the shapes whose
baseline is not pathological. --merge: records of OLD.json for shapes not run now are kept
(a second visit that re-ports only some shapes).

Warm start (porter/search/warm.py): the nearest configurations of the tuned shapes of
benchmarks/results/gemm_wgmma_tpl6_tuned_{a,b,c}_h200.json and of every shape the sweep has
finished so far (the shapes run nearest-to-tuned first), then neighbours of the best along the
tile and schedule parameters, and tile shapes / splits that fill the waves better
(_sweep_port.py: N_SEEDS, N_VARY, VARY, N_WAVE, WAVE_VARY; the template's [sizes] align). --warm-from adds another
GPU's sweep results as sources, each shape's own answer there included (a port to a new GPU).
The H200 runs: benchmarks/results/gemm_sweep_h200.json (docs/notes/gemm_wgmma.md, "Sweep").

baseline_pathological (PATHOLOGY): cuBLAS reaches under half the median share of its roofline
floor it reaches over the sweep (floor: the larger of flops / BF16_TFLOPS and bytes / copy
bandwidth), and its time is over 1.25x ours. Such a ratio says cuBLAS took a slow path, not
that our kernel is fast: it is reported beside the figure and left out of the geomean.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from porter.search.warm import Tuned, size_distance, tuned_from_records  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TUNED = ("gemm_wgmma_tpl6_tuned_a_h200.json", "gemm_wgmma_tpl6_tuned_b_h200.json",
         "gemm_wgmma_tpl6_tuned_c_h200.json")
OUT_NAME = "gemm_sweep.json"
BF16_TFLOPS = 790.0          # the H200's bf16 matrix rate on random data (KINDS.md)
PATHOLOGY = (0.5, 1.25)      # share of cuBLAS's median roofline share; ratio above which
ACCEPT = (1.0, 0.97)         # geomean at least, every shape at least

# (category, M, N, K): what models run
SHAPES = [
    *[("square_pow2", s, s, s) for s in (1024, 2048, 4096, 8192)],
    *[("square", s, s, s) for s in (1536, 3072, 5120, 6144)],
    # LLM projections: M tokens against (N, K) of 7-70B models' layers
    *[("llm", *s) for s in [
        (16384, 4096, 4096), (16384, 14336, 4096), (8192, 28672, 8192), (8192, 8192, 28672),
        (4096, 14336, 4096), (4096, 4096, 14336), (4096, 5120, 5120), (2048, 8192, 8192),
        (2048, 5120, 5120), (1024, 28672, 8192), (512, 14336, 4096), (512, 8192, 28672),
        (256, 5120, 5120), (128, 14336, 4096)]],
    # skinny M (decode): memory-bound
    *[("skinny", *s) for s in [
        (1, 8192, 8192), (1, 14336, 4096), (8, 4096, 14336), (16, 28672, 8192), (32, 5120, 5120),
        (64, 8192, 28672), (64, 4096, 4096)]],
    # ragged: M and N multiples of no tile (N % 8 != 0 in two: no TMA-stored epilogue)
    *[("ragged", *s) for s in [
        (3000, 5000, 1000), (2500, 3500, 1000), (5000, 3000, 1024), (1000, 3000, 1000),
        (6000, 7000, 2000), (3000, 4000, 4104), (7000, 9000, 3000), (1500, 2500, 5000),
        (2999, 4004, 1000)]],
    *[("small_k", *s) for s in [
        (4096, 4096, 512), (8192, 8192, 1024), (8192, 8192, 256), (16384, 8192, 512)]],
    *[("huge_k", *s) for s in [
        (1024, 1024, 32768), (2048, 2048, 65536), (4096, 4096, 32768), (256, 8192, 32768)]],
]


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"shape {text!r}: write MxNxK, e.g. 3000x5000x1000") from None
    return m, n, k


def tuned_sources(files=TUNED) -> list[Tuned]:
    """The tuned shapes the warm start begins with (results records of gemm_wgmma)."""
    from porter.spec.template import find_template
    tpl = find_template("gemm_wgmma")
    defaults = {n: v[0] for n, v in tpl.params.items()}
    out = []
    for name in files:
        recs = json.loads((RESULTS / name).read_text())
        out += tuned_from_records(recs, "gemm_wgmma", defaults, source=name)
    return out


def other_gpu_sources(path) -> list[Tuned]:
    """A sweep's records on another GPU as warm-start sources (Tuned.other_gpu: the same
    shape's answer is a seed too)."""
    recs = json.loads(Path(path).read_text())["records"]
    return [dataclasses.replace(t, source=f"{Path(path).name}", other_gpu=True)
            for t in map(sweep_tuned, recs) if t]


def order(shapes, tuned: list[Tuned]):
    """Nearest to a tuned shape first, so later shapes warm-start from earlier ones."""
    def dist(s):
        return min((size_distance(s[1:], t.size) for t in tuned), default=0.0)
    return sorted(shapes, key=lambda s: (dist(s), s[1:]))


def sweep_tuned(rec: dict, tpl=None) -> Tuned | None:
    """A finished shape as a warm-start source for the next ones: configurations recorded
    before the template gained a parameter take its default; one with a parameter the
    template no longer has ran another kernel and is left out."""
    if tpl is None:
        from porter.spec.template import find_template
        tpl = find_template("gemm_wgmma")
    usable = [c for c in (rec.get("params"), *(f["params"] for f in sorted(
        rec.get("finalists", ()), key=lambda f: -f["ratio"]))) if c and set(c) <= set(tpl.params)]
    cfgs = []
    for c in map(tpl.complete, usable):
        if c not in cfgs:
            cfgs.append(c)
    return Tuned(tuple(rec["shape"]), tuple(cfgs), "sweep", rec.get("ratio")) if cfgs else None


def vendor_kernels(path) -> dict[tuple, list[str]]:
    """The kernel names cuBLAS ran for each bf16 shape, from benchmarks/baseline_kernels.py's
    file (the vendor's seed, porter.search.vendor)."""
    return {tuple(r["shape"]): list(r["kernels"])
            for r in json.loads(Path(path).read_text())["records"] if r.get("op") == "gemm_bf16"}


def record_sources(records) -> list[Tuned]:
    """A results file's records as warm-start sources (those with a usable configuration)."""
    return [t for t in map(sweep_tuned, records) if t]


def roofline_ms(shape, copy_gbps: float) -> float:
    m, n, k = shape
    return max(2 * m * n * k / (BF16_TFLOPS * 1e9), 2 * (m * k + n * k + m * n) / (copy_gbps * 1e6))


def mark_pathological(records: list[dict], copy_gbps: float) -> None:
    """Sets `baseline_pathological` and `baseline_roofline_share` on every record (see
    PATHOLOGY in the module's docstring)."""
    shares = []
    for r in records:
        if r.get("baseline_ms"):
            r["baseline_roofline_share"] = roofline_ms(r["shape"], copy_gbps) / r["baseline_ms"]
            shares.append(r["baseline_roofline_share"])
    med = statistics.median(shares) if shares else 0.0
    for r in records:
        share = r.get("baseline_roofline_share")
        r["baseline_pathological"] = bool(share is not None and r.get("ratio") and
                                          share < PATHOLOGY[0] * med and
                                          r["ratio"] > PATHOLOGY[1])


def summarize(records: list[dict]) -> dict:
    counted = [r for r in records if r.get("ratio") and not r["baseline_pathological"]]
    ratios = [r["ratio"] for r in counted]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    low = sorted(({"shape": r["shape"], "ratio": round(r["ratio"], 4)} for r in counted
                  if r["ratio"] < ACCEPT[1]), key=lambda x: x["ratio"])
    cats: dict[str, list[float]] = {}
    for r in counted:
        cats.setdefault(r["category"], []).append(math.log(r["ratio"]))
    trials = [r["trials"] for r in records if "trials" in r]
    return {"shapes": len(records), "counted": len(counted),
            "pathological": [r["shape"] for r in records if r["baseline_pathological"]],
            "not_measured": [r["shape"] for r in records if not r.get("ratio")],
            "geomean": geo, "min_ratio": min(ratios) if ratios else None,
            "below_0.97": low,
            "geomean_by_category": {c: math.exp(sum(v) / len(v)) for c, v in cats.items()},
            "max_trials": max(trials, default=0), "mean_trials": statistics.mean(trials)
            if trials else 0, "port_seconds": round(sum(r.get("seconds", 0) for r in records), 1),
            "accept": {"geomean_at_least_1": geo is not None and geo >= ACCEPT[0],
                       "none_below_0.97": not low and len(counted) == len(
                           [r for r in records if not r["baseline_pathological"]]),
                       "trials_at_most_60": max(trials, default=0) <= 60}}


def plan(args) -> None:
    """No GPU: each shape in sweep order with its warm seeds (static check at the H200's 132
    SMs)."""
    from _sweep_port import sweep_seeds
    from porter.spec.arch import get_arch
    from porter.spec.template import find_template
    tpl, arch = find_template("gemm_wgmma"), get_arch("sm_90a")
    tuned = tuned_sources() + (other_gpu_sources(args.warm_from) if args.warm_from else [])
    shapes = order(select(args), tuned)
    # as a run would: the merged file's shapes are sources too
    tuned += record_sources(json.loads(Path(args.merge).read_text())["records"]) \
        if args.merge else []
    vendor = vendor_kernels(args.vendor_kernels) if args.vendor_kernels else {}
    for cat, *shape in shapes:
        seeds = sweep_seeds(tpl, arch, shape, tuned, vendor.get(tuple(shape), ()))
        print(f"{cat:12s} {'x'.join(map(str, shape)):>18s} {len(seeds):2d} seeds:")
        for c in seeds:
            print("    " + tpl.config_key(c))


def seed_check(path: str, aligns=((0.0, 0.0, 0.0), (0.0, 0.0, 1.0)), n: int = 16) -> dict:
    """No GPU: for every shape of a results file (pathological ones aside), the n nearest seeds
    the warm start gives it from the tuned shapes and all the file's other shapes; how often
    the shape's final configuration is among them, and (records with `tried`) how often one of
    them measured within 1 % of the best configuration tried there. Per `align` weighting."""
    from porter.build.check import static_check
    from porter.search.warm import seeds_for
    from porter.spec.arch import get_arch
    from porter.spec.template import find_template
    tpl, arch = find_template("gemm_wgmma"), get_arch("sm_90a")
    recs = [r for r in json.loads(Path(path).read_text())["records"]
            if r.get("params") and not r.get("baseline_pathological")]
    base, out = tuned_sources(), {}
    for align in aligns:
        hits = near = with_tried = 0
        for r in recs:
            shape = tuple(r["shape"])
            src = base + [t for o in recs if tuple(o["shape"]) != shape
                          if (t := sweep_tuned(o)) is not None]
            seeds = seeds_for(shape, src, tpl.params, lambda c: static_check(
                tpl, arch, c, [shape]) is None, n, align=align)
            keys = {tpl.config_key(c) for c in seeds}
            hits += tpl.config_key(tpl.complete(r["params"])) in keys
            tried = {old_key(tpl, k): v for k, _, v in r.get("tried", ()) if v}
            if tried:
                with_tried += 1
                near += max((tried[k] for k in keys if k in tried), default=0) >= \
                    0.99 * max(tried.values())
        out[str(align)] = {"final_among_seeds": hits, "shapes": len(recs),
                           "seed_within_1pct_of_best_tried": near, "shapes_with_tried": with_tried}
    return out


def select(args):
    if not args.shapes:
        return list(SHAPES)
    want = [parse_shape(s) for s in args.shapes.split(",")]
    known = {tuple(s[1:]): s for s in SHAPES}
    return [known.get(w, ("extra", *w)) for w in want]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--min-trials", type=int, default=24,
                    help="trials before the search may stop for lack of progress")
    ap.add_argument("--patience", type=int, default=14,
                    help="stop once this many trials in a row gained under 0.5%%")
    ap.add_argument("--shapes", default=None, help="comma-separated MxNxK (default: SHAPES)")
    ap.add_argument("--deep", default="", help="comma-separated MxNxK searched longer "
                    "(--deep-min-trials before the search may stop)")
    ap.add_argument("--deep-min-trials", type=int, default=44)
    ap.add_argument("--merge", default=None, help="an earlier results file to merge into")
    ap.add_argument("--deadline-s", type=float, default=330.0,
                    help="start no new shape after this many seconds")
    ap.add_argument("--label", default="", help="a name for this run, kept in its records")
    ap.add_argument("--warm-from", default=None, metavar="RESULTS",
                    help="a sweep's results on another GPU: its shapes (the same shape "
                         "included) are warm-start sources, as a port to a new GPU would use")
    ap.add_argument("--db", default=None, help="the jobs' database (default: OUT/sweep.db)")
    ap.add_argument("--vendor-kernels", default=None, metavar="BASELINE_KERNELS",
                    help="benchmarks/baseline_kernels.py's file: the tile, stages and cluster "
                         "of the kernel cuBLAS ran for a shape become its second seed")
    ap.add_argument("--include", default=None,
                    help="compile against this copy of porter/include (e.g. one taken from a "
                         "commit with git archive) instead of the working tree's")
    ap.add_argument("--plan", action="store_true", help="list shapes and seeds; no GPU")
    ap.add_argument("--seed-check", default=None, metavar="RESULTS",
                    help="no GPU: how well the warm start's seeds match a results file")
    args = ap.parse_args(argv)
    if args.plan:
        return plan(args)
    if args.seed_check:
        return print(json.dumps(seed_check(args.seed_check), indent=1))
    if not args.out:
        raise SystemExit("--out DIR is needed (or --plan)")
    if not 1 <= args.trials <= 60:
        raise SystemExit("--trials: 1 to 60 (the sweep's budget a shape)")
    from _sweep_port import SweepPorter, shared_compiles
    from port_bench import copy_gbps
    from porter.store.base import open_store
    t_start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    old = json.loads(Path(args.merge).read_text())["records"] if args.merge else []
    tuned = tuned_sources() + (other_gpu_sources(args.warm_from) if args.warm_from else [])
    deep = {parse_shape(s) for s in args.deep.split(",") if s}
    # the shapes not searched longer first (in sweep order), then the deep ones
    shapes = sorted(order(select(args), tuned), key=lambda s: tuple(s[1:]) in deep)
    tuned += record_sources(old)
    bw = copy_gbps()
    print(f"device-to-device copy: {bw:.0f} GB/s", flush=True)
    records, skipped = [], []
    with shared_compiles() as pool:
        porter = SweepPorter(open_store(f"sqlite:///{args.db or out / 'sweep.db'}"), args.trials,
                             args.min_trials, args.patience, args.include, compiles=pool,
                             vendor=vendor_kernels(args.vendor_kernels)
                             if args.vendor_kernels else None)
        seeds = {tuple(s[1:]): porter.seeds(s[1:], tuned) for s in shapes}
        pre = porter.precompile([c for v in seeds.values() for c in v], pool)
        print(f"precompiled the warm seeds in {pre:.1f} s", flush=True)
        for cat, *shape in shapes:
            if time.monotonic() - t_start > args.deadline_s:
                skipped.append(shape)
                continue
            # the shapes finished so far are warm-start sources too
            seed = porter.seeds(shape, tuned) if records else seeds[tuple(shape)]
            try:
                rec = porter.record(shape, cat, seed,
                                    args.deep_min_trials if tuple(shape) in deep else None)
            except Exception as e:  # noqa: BLE001 - one shape's failure is its record
                rec = {"shape": list(shape), "category": cat, "ratio": None, "trials": 0,
                       "seconds": 0.0, "stopped": "error", "error": f"{type(e).__name__}: {e}"}
            rec["run"] = args.label
            records.append(rec)
            if (t := sweep_tuned(rec)) is not None:
                tuned.append(t)
            print(f"{cat:12s} {'x'.join(map(str, shape)):>18s} ratio "
                  f"{rec.get('ratio') or 0:.3f} (search {rec.get('search_ratio') or 0:.3f}, "
                  f"best seed {rec.get('best_warm_seed_ratio') or 0:.3f}) {rec['trials']} "
                  f"trials {rec['seconds']:.1f} s {rec['stopped']}", flush=True)
            write(out, merged(old, records), bw, skipped, args, t_start)
    porter.close()
    doc = write(out, merged(old, records), bw, skipped, args, t_start)
    print(json.dumps(doc["summary"], indent=1))


def old_key(tpl, key: str) -> str:
    """A configuration key recorded before the template gained parameters, completed."""
    return tpl.config_key(tpl.complete(dict(zip(tpl.param_names, key.split(",")))))


def merged(old: list[dict], new: list[dict]) -> list[dict]:
    """The new records, and the old ones of shapes not run again."""
    done = {tuple(r["shape"]) for r in new}
    return [r for r in old if tuple(r["shape"]) not in done] + new


def write(out: Path, records, bw, skipped, args, t_start) -> dict:
    records = sorted(records, key=lambda r: [s[1:] for s in SHAPES].index(tuple(r["shape"]))
                     if tuple(r["shape"]) in [tuple(s[1:]) for s in SHAPES] else 999)
    mark_pathological(records, bw)
    doc = {"benchmark": "benchmarks/gemm_sweep.py", "copy_gbps": bw,
           "bf16_tflops_assumed": BF16_TFLOPS, "pathology_rule": PATHOLOGY,
           "trials_budget": args.trials, "min_trials": args.min_trials,
           "deep": args.deep, "deep_min_trials": args.deep_min_trials, "merged": args.merge,
           "patience": args.patience, "warm_from": args.warm_from,
           "skipped_for_time": skipped,
           "wall_s": round(time.monotonic() - t_start, 1),
           "summary": summarize(records), "records": records}
    (out / OUT_NAME).write_text(json.dumps(doc, indent=1, default=str))
    return doc


if __name__ == "__main__":
    main()
