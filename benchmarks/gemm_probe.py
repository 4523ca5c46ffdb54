"""gemm_wgmma configurations chosen by hand for given shapes, each timed interleaved with cuBLAS
(port_bench.side_by_side: the faster of cublasGemmEx and torch.matmul, an L2 flush before every
repeat) in one process on one GPU. A development probe: it answers "does this tile, cluster or
split help this shape?" before the space or the warm start is changed; porter's search
(gemm_sweep.py) is what makes the sweep's figures.

    python benchmarks/gemm_probe.py --out DIR [--probes FILE.json] [--repeats 3]
    python benchmarks/gemm_probe.py --compile-only   # no GPU: every probe compiles, no spills
    ncu ... python benchmarks/gemm_probe.py --ncu --out DIR --probes FILE   # profile, few launches

FILE.json: {"MxNxK": [{param: value, ...}, ...], ...}; a configuration names only what differs
from BASE. Default: PROBES below. Writes DIR/gemm_probe.json after every shape: `records`, one
per (shape, configuration), with `gpu`, `shape`, `params`, `ratio`, `ours_ms`, `baseline_ms`,
`tflops`, or `status` and `reason` for one that does not fit the shape.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

BASE = dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=1,
            EPI=3, SPLITK=1, STREAMK=0, SWAP=0, TAILW=0, PINGPONG=0)

# The sweep's weak shapes (gemm_sweep_h200.json, below 0.97): its best configuration first (the
# control, re-timed in the same process), then tiles whose counts fill whole waves of 132 SMs,
# clusters of 4 (a quarter of the B requests where K's pitch is off 128-byte lines) and splits.
PROBES: dict[str, list[dict]] = {
    "1536x1536x1536": [dict(BN=192, GROUP_M=8, PERSIST=0, EPI=1),
                       dict(BN=144), dict(BN=144, PERSIST=0), dict(BN=144, EPI=1, PERSIST=0),
                       dict(BN=144, CLUSTER=2, PERSIST=0), dict(BN=128, STREAMK=2),
                       dict(BN=128, STREAMK=1)],
    "256x5120x5120": [dict(BN=128, STAGES=6, GROUP_M=4, PERSIST=0, EPI=1),
                      dict(BN=80, STAGES=6, PERSIST=0), dict(BN=80, STAGES=8, PERSIST=0),
                      dict(BN=80, CLUSTER=2, STAGES=6, PERSIST=0),
                      dict(BM=64, BN=160, CONSUMERS=1, STAGES=6, PERSIST=0),
                      dict(BN=80, CONSUMERS=1, STAGES=6, PERSIST=0)],
    "1000x3000x1000": [dict(CLUSTER=2, GROUP_M=4),
                       dict(BN=192, CLUSTER=2, GROUP_M=4), dict(BN=192, CLUSTER=4, GROUP_M=4),
                       dict(BN=192, GROUP_M=4), dict(CLUSTER=4, GROUP_M=4),
                       dict(BN=192, CLUSTER=2, GROUP_M=4, PERSIST=0)],
    "7000x9000x3000": [dict(CLUSTER=2, GROUP_M=8, EPI=1), dict(CLUSTER=4, GROUP_M=8, EPI=1),
                       dict(CLUSTER=4, GROUP_M=8), dict(CLUSTER=4, GROUP_M=16, STAGES=4)],
    "3000x5000x1000": [dict(CLUSTER=2, GROUP_M=4), dict(CLUSTER=4, GROUP_M=4),
                       dict(BN=232, GROUP_M=4), dict(BN=240, CLUSTER=2, GROUP_M=4)],
    "64x4096x4096": [dict(BM=64, BN=64, BK=128, STAGES=6, CONSUMERS=1, PERSIST=0, SWAP=1, EPI=0),
                     dict(BM=64, BN=64, BK=128, STAGES=6, CONSUMERS=1, PERSIST=0, SWAP=1, EPI=0,
                          SPLITK=2),
                     dict(BM=64, BN=64, BK=128, STAGES=4, CONSUMERS=1, PERSIST=0, SWAP=1, EPI=0,
                          SPLITK=2),
                     dict(BM=64, BN=64, BK=64, STAGES=8, CONSUMERS=1, PERSIST=0, SWAP=1, EPI=0,
                          SPLITK=2)],
    "2048x5120x5120": [dict(STREAMK=1), dict(BN=216), dict(BN=216, GROUP_M=8),
                       dict(BN=160), dict(BN=160, CLUSTER=2)],
    "3000x4000x4104": [dict(CLUSTER=2), dict(CLUSTER=4), dict(CLUSTER=4, GROUP_M=8)],
    "1024x1024x32768": [dict(BM=64, BN=128, STAGES=8, CONSUMERS=1, GROUP_M=4),
                        dict(SPLITK=4, PERSIST=0), dict(BN=128, SPLITK=2, PERSIST=0),
                        dict(STREAMK=1), dict(BM=64, BN=128, CONSUMERS=1, STAGES=8, SPLITK=2,
                                              PERSIST=0)],
    "5000x3000x1024": [dict(BN=192, GROUP_M=8), dict(BN=232), dict(BN=232, GROUP_M=8),
                       dict(BN=240), dict(BN=240, CLUSTER=2)],
    "3072x3072x3072": [dict(BN=192), dict(BN=192, CLUSTER=2), dict(BN=192, CLUSTER=4),
                       dict(STREAMK=1), dict(BN=184)],
    "6000x7000x2000": [dict(STAGES=3, EPI=2, STREAMK=2), dict(CLUSTER=2), dict(CLUSTER=4)],
    "32x5120x5120": [dict(BM=64, BN=32, BK=128, STAGES=8, CONSUMERS=1, GROUP_M=8, PERSIST=0,
                          SWAP=1, EPI=0),
                     dict(BM=64, BN=32, BK=128, STAGES=4, CONSUMERS=1, PERSIST=0, SWAP=1, EPI=0,
                          SPLITK=2)],
}


def configs(probes, template: str = "gemm_wgmma") -> list[tuple[tuple[int, int, int], dict]]:
    """(shape, configuration) for each probe: BASE under it (those of its parameters the
    template has: a copy of gemm_wgmma takes all, gemm_fp8 the ones it shares), the template's
    defaults for the parameters neither names, and any development macro (DEV_...) it names
    kept."""
    from porter.spec.template import find_template
    tpl = find_template(template)
    complete = tpl.complete
    base = {k: v for k, v in BASE.items() if k in tpl.params}
    out = []
    for s, cs in probes.items():
        for c in cs:
            named = {**base, **c}
            out.append((tuple(int(x) for x in s.split("x")), {**complete(named), **named}))
    return out


def _compile(args):
    """One configuration compiled (a worker process): None, or why it failed."""
    from porter.build.compile import compile_variant
    from porter.spec.arch import get_arch
    from porter.spec.template import find_template
    cfg, sms, template = args
    tpl = find_template(template)
    c = compile_variant(tpl, cfg, get_arch("sm_90a").with_sms(sms))
    if not c.ok:
        lines = [ln for ln in (c.log or "").splitlines() if "error" in ln] or ["failed"]
        return lines[0][:200]
    r = c.resources
    if r.spill_stores or r.spill_loads or r.stack_frame:
        return f"spills {r.spill_stores}/{r.spill_loads} bytes, stack {r.stack_frame}"
    return None


def check(items, sms: int, template: str = "gemm_wgmma") -> dict:
    """Static check (the space's constraints) and a compile for every probe."""
    from porter.build.check import static_check
    from porter.spec.arch import get_arch
    from porter.spec.template import find_template
    tpl, arch = find_template(template), get_arch("sm_90a").with_sms(sms)
    bad, todo = {}, []
    for shape, cfg in items:
        why = static_check(tpl, arch, cfg, [shape])
        key = (shape, tpl.config_key(cfg))
        if why is not None:
            bad[key] = f"infeasible: {why}"
        else:
            todo.append((key, cfg))
    uniq = {tpl.config_key(c): c for _, c in todo}
    with ProcessPoolExecutor(min(12, os.cpu_count() or 2)) as ex:
        errs = dict(zip(uniq, ex.map(_compile, [(c, sms, template) for c in uniq.values()])))
    for key, cfg in todo:
        if errs[key[1]]:
            bad[key] = f"compile: {errs[key[1]]}"
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--probes", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--template", default="gemm_wgmma",
                    help="a template folder to probe instead (a changed copy of gemm_wgmma)")
    ap.add_argument("--ncu", action="store_true",
                    help="for a run under Nsight Compute: each kernel launched a few times "
                         "(one timing repeat), not timed for a figure")
    args = ap.parse_args(argv)
    probes = json.loads(Path(args.probes).read_text()) if args.probes else PROBES
    items = configs(probes, args.template)
    if args.compile_only:
        bad = check(items, 132, args.template)
        for (shape, key), why in bad.items():
            print("x".join(map(str, shape)), key, why)
        print(f"{len(items) - len(bad)} of {len(items)} probes fit and compile")
        return 1 if any(w.startswith("compile") for w in bad.values()) else 0
    from port_bench import side_by_side
    from porter.measure.backends.gpu import GpuBackend
    from porter.measure.tma import l2_promotion
    # the maps' promotion: PORTER_TMA_L2_PROMOTION's for all of them, else by each one's pitch
    promotion = l2_promotion() if os.environ.get("PORTER_TMA_L2_PROMOTION", "").strip() else \
        "by row pitch (NONE off 32-byte sectors, else L2_256B)"
    from porter.spec.arch import get_arch
    from porter.spec.template import find_template
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    be = GpuBackend(seed=123, min_repeats=1, max_repeats=1, target_ms=0.0) if args.ncu else \
        GpuBackend(seed=123, min_repeats=10, target_ms=40.0)
    if args.ncu:
        args.repeats = 1
    be.fresh_baseline = True
    dev = be.device_info()
    be.sms = int(dev.get("sms") or 0)
    tpl, arch = find_template(args.template), get_arch("sm_90a").with_sms(be.sms)
    t0 = time.monotonic()
    bad = check(items, be.sms, args.template)
    print(f"checked and compiled {len(items)} probes in {time.monotonic() - t0:.0f} s", flush=True)
    records = []
    for shape, cfg in items:
        rec = {"gpu": dev.get("gpu", ""), "driver": dev.get("driver", ""),
               "date": datetime.date.today().isoformat(), "shape": list(shape), "params": cfg,
               "template": args.template, "l2_promotion": promotion}
        why = bad.get((shape, tpl.config_key(cfg)))
        if why:
            rec.update(status="skipped", reason=why)
        else:
            res, outcome = side_by_side(be, tpl, arch, cfg, shape, repeats=args.repeats)
            if res is None:
                rec.update(status=outcome.status, reason=outcome.message)
            else:
                rec.update(status="measured", **res)
        records.append(rec)
        diff = {k: v for k, v in cfg.items() if BASE.get(k) != v}
        print(f"{'x'.join(map(str, shape)):>16s} {rec.get('ratio') or 0:6.3f} "
              f"{rec.get('tflops') or 0:6.0f} TF/s {diff} {rec.get('reason') or ''}", flush=True)
        (out / "gemm_probe.json").write_text(json.dumps(
            {"benchmark": "gemm_probe", "base": BASE, "records": records}, indent=1))
    be.close()


if __name__ == "__main__":
    sys.exit(main())
