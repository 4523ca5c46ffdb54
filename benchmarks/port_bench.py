"""Tunes templates on the GPU with `porter port`'s engine, then times each size's best
configuration against the vendor baseline side by side in one process, and writes DESIGN.md's
results records. Run on a GPU machine:

    python benchmarks/port_bench.py --out DIR [--only gemm_mma,rmsnorm,planted] [--trials N]

Writes DIR/porter.db (the jobs), DIR/results_<template>.json (records), DIR/<template>_h200.json.gz
(replay recordings for CI) and prints a table.
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from porter.measure.backends.gpu import GpuBackend  # noqa: E402
from porter.measure.backends.replay import recording  # noqa: E402
from porter.job.loop import Engine  # noqa: E402
from porter.job.jobs import make_spec, template_record, template_snapshot  # noqa: E402
from porter.store.base import open_store  # noqa: E402

JOBS = {
    "gemm_mma": dict(sizes=["4096x4096x4096", "8192x8192x8192"], trials=100),
    "rmsnorm": dict(sizes=["16384x4096", "32768x8192", "4096x16384"], trials=60),
    "planted": dict(sizes=["1024x1024"], trials=8, templates_dir="tests/data/templates",
                    timeout=10),
    "gemm_wgmma": dict(sizes=["4096x4096x4096", "8192x8192x8192", "4096x8192x8192",
                              "4096x28672x8192", "4096x8192x28672", "128x8192x8192",
                              "16x8192x8192"], trials=60, per_shape=True),
}


def copy_gbps() -> float:
    import cupy as cp
    n = 1 << 30
    a, b = cp.ones(n // 4, cp.float32), cp.empty(n // 4, cp.float32)
    ts = []
    for _ in range(20):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        b[...] = a
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e))
    return 2 * n / statistics.median(ts[2:]) / 1e6


def side_by_side(be, tpl, arch, config, size, repeats=5):
    """Ours and the baseline interleaved repeat by repeat, `repeats` measurements in the
    measuring process of `be` (a GpuBackend with fresh_baseline set); medians."""
    from porter.build.compile import compile_variant
    compiled = compile_variant(tpl, config, arch)
    rows = []
    for _ in range(repeats):
        out = be.measure(tpl, arch, config, compiled, [size])
        if out.status != "measured":
            return None, out
        rows.append(out.measurements[0])
    med = lambda xs: statistics.median(xs)  # noqa: E731
    m = rows[0]
    return {"ours_ms": med([r.ours_ms for r in rows]),
            "baseline": m.baseline, "baseline_ms": med([r.baseline_ms for r in rows]),
            "ratio": med([r.ratio for r in rows]),
            "ratio_min": min(r.ratio for r in rows), "ratio_max": max(r.ratio for r in rows),
            "tflops": med([r.tflops for r in rows]) if m.tflops else None,
            "gbps": med([r.gbps for r in rows]) if m.gbps else None,
            "error": max(r.error for r in rows)}, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="gemm_mma,rmsnorm,planted")
    ap.add_argument("--trials", type=int, default=None)
    ap.add_argument("--sampler", default="auto")
    ap.add_argument("--sizes", default=None, help="comma-separated sizes instead of the job's")
    ap.add_argument("--finalists", type=int, default=3,
                    help="re-time this many of the fastest configurations side by side, pick "
                         "the best ratio among them and time that one once more (the figure)")
    ap.add_argument("--retime-results", default=None,
                    help="comma-separated results JSON files: re-time each record's finalists "
                         "side by side with the baseline (no tuning, no database)")
    ap.add_argument("--retime", default=None,
                    help="comma-separated porter.db files of earlier runs: re-time their jobs' "
                         "fastest configurations instead of tuning")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = copy_gbps()
    print(f"device-to-device copy: {bw:.0f} GB/s", flush=True)
    if args.retime_results:
        return retime_results(args, bw)
    if args.retime:
        return retime(args, bw)
    store = open_store(f"sqlite:///{out / 'porter.db'}")
    table = []
    for name in args.only.split(","):
        cfg = dict(JOBS[name])
        if args.sizes:
            cfg["sizes"] = args.sizes.split(",")
        groups = [[s] for s in cfg["sizes"]] if cfg.get("per_shape") else [cfg["sizes"]]
        records = []
        for sizes in groups:
            done = len(table)
            records += run_job(name, cfg, sizes, args, store, out, bw, table)
            # written after every job: a run cut short by its time limit keeps what it finished
            (out / f"results_{name}.json").write_text(json.dumps(records, indent=1))
            print("\n".join(table[done:]), flush=True)
    print("\n".join(table))


def retime(args, bw):
    """Re-times the tuned jobs of earlier runs (porter.db files): their fastest configurations
    side by side with the baseline, as a tuning run ends. For a changed timing protocol, without
    tuning again."""
    from porter.spec.template import find_template
    from porter.spec.arch import get_arch
    out = Path(args.out)
    table, records = [], []
    for db in args.retime.split(","):
        store = open_store(f"sqlite:///{db}")
        for info in sorted(store.list_jobs(None), key=lambda j: j.id):
            if args.only and info.template_name not in args.only.split(","):
                continue
            tpl, arch = find_template(info.template_name), get_arch(info.spec.arch)
            trials = store.trials(info.id)
            dev = next((t.device for t in trials if t.status == "measured"), {})
            counts: dict[str, int] = {}
            for t in trials:
                counts[t.status] = counts.get(t.status, 0) + 1
            stats = {"job": info.id, "db": str(db), "counts": counts, "trials": len(trials),
                     "retimed": True}
            records += finals(info.template_name, tpl, arch, info.spec.sizes, trials, stats,
                              dev, args, bw, table)
            (out / "results_retime.json").write_text(json.dumps(records, indent=1))
            if table:
                print(table[-1], flush=True)
    print("\n".join(table))


def retime_results(args, bw):
    """Re-times the configurations a results file reports (each record's finalists) with the
    current code: after a change that must leave the tuned kernels' speed as it was."""
    from porter.records import Measurement, TrialRecord
    from porter.spec.arch import get_arch
    from porter.spec.template import find_template
    out = Path(args.out)
    table, records = [], []
    for path in args.retime_results.split(","):
        for old in json.loads(Path(path).read_text()):
            if "params" not in old or (args.only and old["template"] not in args.only):
                continue
            tpl, arch = find_template(old["template"]), get_arch(old["arch"])
            size = tuple(old["shape"])
            fins = old.get("finalists") or [{"params": old["params"],
                                             "ours_ms": old["ours_ms"]}]
            trials = [TrialRecord(number=i, params=tpl.complete(f["params"]),
                                  config_key=tpl.config_key(tpl.complete(f["params"])),
                                  status="measured", measurements=(Measurement(
                    size=size, ours_ms=f.get("tuning_ms", f["ours_ms"])),))
                for i, f in enumerate(fins)]
            stats = {"retimed_from": path, "before": {"ratio": old["ratio"],
                                                      "params": old["params"]}}
            recs = finals(old["template"], tpl, arch, [size], trials, stats, {}, args, bw,
                          table)
            for r in recs:
                r["ratio_before"] = old["ratio"]
                r["gpu"], r["driver"] = _device_names()
            records += recs
            (out / "results_retime.json").write_text(json.dumps(records, indent=1))
            print(table[-1] + f"  (before {old['ratio']:.3f})", flush=True)
    print("\n".join(table))


def _device_names():
    import cupy as cp
    props = cp.cuda.runtime.getDeviceProperties(0)
    drv = cp.cuda.runtime.driverGetVersion()
    try:
        import subprocess
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip() or drv
    except OSError:
        pass
    return props["name"].decode(), str(drv)


def finals(name, tpl, arch, sizes, trials, stats, dev, args, bw, table):
    """The fastest few configurations of a tuning job timed again side by side with the
    baseline (one measuring process per size); the best of those is timed once more, and that
    confirmation is the figure. Returns DESIGN.md results records."""
    records = []
    for size in sizes:
        def ms(t):
            return next((m.ours_ms for m in t.measurements if tuple(m.size) == tuple(size)),
                        float("inf"))
        cands = sorted((t for t in trials if t.status == "measured"), key=ms)
        be = GpuBackend(seed=123)
        be.fresh_baseline = True
        try:
            # The tuning run's timings carry a percent or two of noise, so the fastest few are
            # timed again side by side with the baseline.
            fin = []
            for t in cands[:max(1, args.finalists)]:
                r, _ = side_by_side(be, tpl, arch, t.params, size)
                if r is not None:
                    fin.append((r, t))
            if not fin:
                continue
            sel, best = max(fin, key=lambda f: f[0]["ratio"])
            # The best of several noisy re-timings is biased upwards: the winner is timed once
            # more, and that confirmation is the reported figure.
            res, _ = side_by_side(be, tpl, arch, best.params, size)
        finally:
            be.close()
        res = res or sel
        res = {**res, "selection_ratio": sel["ratio"], "timing": "interleaved",
               "finalists": [{"params": t.params, "tuning_ms": ms(t),
                              "ratio": r["ratio"], "ours_ms": r["ours_ms"]}
                             for r, t in fin]}
        rec = {"template": name, "arch": arch.name, "gpu": dev.get("gpu", ""),
               "driver": dev.get("driver", ""), "date": datetime.date.today().isoformat(),
               "shape": list(size), "params": best.params, **res,
               "nvrtc": dev.get("nvrtc", ""), "job": stats}
        if tpl.op == "rmsnorm":
            rec["copy_gbps"] = bw
            rec["gbps_over_copy"] = res["gbps"] / bw
        records.append(rec)
        table.append(f"{name:10s} {'x'.join(map(str, size)):>16s} ours {res['ours_ms']:.4f} "
                     f"ms  {res['baseline']} {res['baseline_ms']:.4f} ms  ratio "
                     f"{res['ratio']:.3f}" + (f"  {res['gbps']:.0f} GB/s ({res['gbps']/bw:.2f}"
                                               " of copy)" if tpl.op == "rmsnorm" else
                                               f"  {res['tflops'] or 0:.0f} TFLOP/s"))
    return records


def run_job(name, cfg, sizes, args, store, out, bw, table):
    tdir = [Path(cfg["templates_dir"])] if "templates_dir" in cfg else None
    spec, tpl, arch = make_spec(name, "sm_90a", sizes, args.trials or cfg["trials"],
                                sampler=args.sampler, templates_dir=tdir)
    src, space = template_record(tpl)
    job = store.create_job(spec, tpl.name, tpl.source_hash, src, space, status="running",
                           snapshot=template_snapshot(tpl))
    be = GpuBackend(seed=1, timeout_s=cfg.get("timeout", 30))
    try:
        summary = Engine(store, tpl, arch, be).run(job, spec)
    finally:
        be.close()
    trials = store.trials(job)
    dev = next((t.device for t in trials if t.status == "measured"), {})
    print(f"{name}: job {job} {summary.counts} wall {summary.wall_s:.1f}s gpu share "
          f"{summary.gpu_share:.2f} compiled {summary.compiled} in {summary.compile_s:.1f}"
          " core-s", flush=True)
    if not cfg.get("per_shape"):
        with gzip.open(out / f"{name}_h200.json.gz", "wt") as f:
            json.dump(recording(tpl.name, arch.name, tpl.param_names, dev, trials), f)
    stats = {"job": job, "counts": summary.counts, "wall_s": summary.wall_s,
             "gpu_share": summary.gpu_share, "compiled": summary.compiled,
             "compile_core_s": summary.compile_s, "trials": len(trials)}
    records = finals(name, tpl, arch, spec.sizes, trials, stats, dev, args, bw, table)
    if name == "planted":
        records.append({"template": name, "statuses": {t.config_key: t.status
                                                       for t in trials}, "job": stats})
    return records


if __name__ == "__main__":
    main()
