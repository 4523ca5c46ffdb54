"""flash_attention_fwd on the H200: porter's engine tunes the template at each anchor shape, then
the tuned kernel is re-timed interleaved with torch SDPA's cuDNN and flash backends.

    python3 benchmarks/attention.py [--trials 24] [--minutes 0.5] [--shapes 0,3] [--out DIR]
    python3 benchmarks/attention.py --variants NAME,...   # time named configurations instead

1. Per anchor shape, one porter job (porter.job.loop.run_job, GPU backend, sampler auto) with
   a budget of --trials trials or --minutes minutes, warm-started with the winners of --warm
   (an earlier results file): every measured trial verified against fp32 in the measuring
   child (benchmarks/_attention_port.py).
2. In this process (torch): the job's best configuration, from porter's compile cache with
   the template's launch geometry and tensor maps, verified on the shape (O and LSE of three
   heads against fp32, output NaN-poisoned) and timed interleaved repeat by repeat with SDPA
   cuDNN and SDPA flash, L2 flushed (256 MB written) before every call, median of --reps.
3. Every winner on the ragged shapes (S not a multiple of the tiles, causal and not, GQA,
   D = 64 and 128) against fp32, all rows.

Writes DIR/attention_h200.json ({"gpu", "driver", "date", "records": [one per shape: gpu,
shape, params, ours_ms, tflops, ratio_cudnn, ratio_flash (baseline ms over ours), baselines,
errors, the engine's job]}) and DIR/attention_engine_h200.json (every trial of every job).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _attention_check import (Kernel, make_problem, ragged_checks, rel_err, sdpa,  # noqa: E402
                              time_interleaved, verify)
from _attention_port import known_winners, port_shape, print_port, size_text, warm_configs  # noqa: E402,E501

# --variants: named configurations timed instead of the engine's winners (the sweeps of
# docs/notes/attention.md's runs 1-5). HD is added per shape, EPI and CAUSAL_SKIP default.
VARIANTS = {
    "plain_bn128": dict(BN=128, STAGES=2, CONSUMERS=2, INTRA=0, PINGPONG=0, PERSIST=0),
    "intra_bn128": dict(BN=128, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=0, PERSIST=0),
    "pp_bn128": dict(BN=128, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=1, PERSIST=0),
    "pp_bn128_s3": dict(BN=128, STAGES=3, CONSUMERS=2, INTRA=1, PINGPONG=1, PERSIST=0),
    "pp_bn176": dict(BN=176, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=1, PERSIST=0),
    "pp_bn128_persist": dict(BN=128, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=1, PERSIST=1),
    "pp_bn176_persist": dict(BN=176, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=1, PERSIST=1),
    "c3_bn128": dict(BN=128, STAGES=2, CONSUMERS=3, INTRA=1, PINGPONG=1, PERSIST=0),   # D = 64
    "c3_bn96": dict(BN=96, STAGES=2, CONSUMERS=3, INTRA=1, PINGPONG=1, PERSIST=0),     # D = 64
    # v2: TMA-stored epilogue, persistent variants without ping-pong, 3 consumers persistent
    "intra_bn176": dict(BN=176, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=0, PERSIST=0),
    "intra_bn128_persist": dict(BN=128, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=0, PERSIST=1),
    "intra_bn176_persist": dict(BN=176, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=0, PERSIST=1),
    "intra_bn128_epi": dict(BN=128, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=0, PERSIST=0, EPI=1),
    "pp_bn128_persist_epi": dict(BN=128, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=1, PERSIST=1, EPI=1),
    "intra_bn128_persist_epi": dict(BN=128, STAGES=2, CONSUMERS=2, INTRA=1, PINGPONG=0, PERSIST=1, EPI=1),
    "c3_bn128_persist": dict(BN=128, STAGES=2, CONSUMERS=3, INTRA=1, PINGPONG=1, PERSIST=1),
    "c3_bn128_persist_s4": dict(BN=128, STAGES=4, CONSUMERS=3, INTRA=1, PINGPONG=1, PERSIST=1),
    "c3_bn128_persist_epi": dict(BN=128, STAGES=2, CONSUMERS=3, INTRA=1, PINGPONG=1, PERSIST=1, EPI=1),
}
for _d in VARIANTS.values():
    _d.setdefault("EPI", 0)
    _d.setdefault("CAUSAL_SKIP", 1)

# (B, H, HKV, S, D, causal)
ANCHORS = [
    (32, 16, 16, 1024, 128, False), (32, 16, 16, 1024, 128, True),
    (8, 16, 16, 4096, 128, False), (8, 16, 16, 4096, 128, True),
    (2, 16, 16, 16384, 128, False), (2, 16, 16, 16384, 128, True),
    (8, 16, 16, 4096, 64, False),
    (8, 32, 8, 4096, 128, False),     # GQA: 4 query heads per KV head
]
RESULTS = ROOT / "benchmarks" / "results"


def run_ports(shapes, args) -> dict:
    """The engine's job at every shape, one measuring child for all of them."""
    from porter.measure.backends.gpu import GpuBackend, local_device
    from porter.spec.template import find_template
    from porter.store.base import open_store
    tpl = find_template("flash_attention_fwd")
    known = known_winners(Path(args.warm))
    store = open_store(f"sqlite:///{Path(args.out) / 'attention_ports.db'}")
    dev = local_device()
    backend = GpuBackend(seed=0, sms=dev[1] if dev else 0)
    ports = {}
    try:
        for shape in shapes:
            ports[shape] = port_shape(store, backend, shape, args.trials, args.minutes or None,
                                      args.workers, warm_configs(tpl, shape, known))
            print_port(shape, ports[shape])
    finally:
        backend.close()
    return ports


def retime(shape, candidates: dict, reps: int, sms: int, gpu: str) -> tuple[dict, list]:
    """The candidates (name -> params) verified on the shape and timed interleaved with both
    SDPA backends; returns the fastest verified one's record and a row per candidate."""
    import torch
    B, H, HKV, S, D, causal = shape
    q, k, v, o, lse = make_problem(B, H, HKV, S, D, seed=1 + S + D)
    scale = 1 / math.sqrt(D)
    flops = 4 * B * H * S * S * D // (2 if causal else 1)
    fns, meta = {}, {}
    for be in ("cudnn", "flash"):
        try:
            f, note = sdpa(be, q, k, v, causal, scale)
            f()
            fns[be], meta[be] = f, note
        except Exception as e:   # noqa: BLE001 - a backend that does not take the shape
            print(f"  {be} unavailable: {e}", flush=True)
    cud = fns["cudnn"]().float() if "cudnn" in fns else None
    for name, params in candidates.items():
        run = Kernel(params, q, k, v, o, lse, causal, scale, sms)
        eo, el = verify(run, q, k, v, o, lse, causal, scale)
        if not (eo < 1e-2 and el < 1e-3):
            print(f"  {name}: WRONG on the shape (O {eo:.2e}, LSE {el:.2e})", flush=True)
            continue
        fns[name] = run
        meta[name] = dict(err_o=eo, err_lse=el,
                          err_vs_cudnn=rel_err(o, cud) if cud is not None else None)
    t = time_interleaved(fns, reps if S * S * B * H < 2**33 else max(5, reps // 2))
    shape_d = dict(B=B, H=H, HKV=HKV, S=S, D=D, causal=causal)
    rows = [dict(gpu=gpu, shape=shape_d, variant=n, params=candidates[n], ours_ms=t[n],
                 tflops=flops / t[n] / 1e9,
                 ratio_cudnn=t["cudnn"] / t[n] if "cudnn" in t else None,
                 ratio_flash=t["flash"] / t[n] if "flash" in t else None, **meta[n])
            for n in t if n in candidates]
    print(f"B{B} H{H}/{HKV} S{S} D{D} causal={int(causal)}: " +
          ", ".join(f"{n} {t[n]:.3f} ms ({flops / t[n] / 1e9:.0f} TF)" for n in t), flush=True)
    best = min(rows, key=lambda r: r["ours_ms"], default=None)
    if best is not None:
        best = dict(best, baselines={be: dict(ms=t[be], tflops=flops / t[be] / 1e9,
                                              note=meta[be]) for be in ("cudnn", "flash")
                                     if be in t})
    del q, k, v, o, lse, fns, cud
    torch.cuda.empty_cache()
    return best, rows


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(RESULTS)))
    ap.add_argument("--shapes", default="", help="indices into ANCHORS, comma-separated")
    ap.add_argument("--trials", type=int, default=24, help="the engine's budget per shape")
    ap.add_argument("--minutes", type=float, default=0.0, help="and a deadline per shape")
    ap.add_argument("--workers", type=int, default=4, help="compile processes (each runs two "
                    "variants ahead of the measurement: more workers, fewer informed proposals)")
    ap.add_argument("--warm", default=str(RESULTS / "attention_h200.json"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", default="", help="time these named configurations instead "
                    "of porting (names of VARIANTS)")
    ap.add_argument("--no-ragged", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = [ANCHORS[int(i)] for i in args.shapes.split(",") if i] or ANCHORS
    t0 = time.monotonic()
    names = [n for n in args.variants.split(",") if n]
    ports = {} if names else run_ports(shapes, args)
    port_s = time.monotonic() - t0
    (out / "attention_engine_h200.json").write_text(json.dumps(     # kept if the rest fails
        [dict(shape=size_text(s), **p) for s, p in ports.items()], indent=1))

    import torch
    from porter.build.compile import nvrtc_version
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                 "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=30).stdout.strip()
    except Exception:   # noqa: BLE001
        driver = "unknown"
    print(f"{props.name}, {sms} SMs, torch {torch.__version__}; ports {port_s:.0f} s", flush=True)
    records, all_rows = [], []
    for shape in shapes:
        D = shape[4]
        if names:
            cands = {n: {**VARIANTS[n], "HD": D} for n in names}
        elif ports[shape]["best"] is not None:
            cands = {"engine": ports[shape]["best"]["params"]}
        else:
            continue
        best, rows = retime(shape, cands, args.reps, sms, props.name)
        all_rows += rows
        if best is None:
            continue
        if shape in ports:
            p = ports[shape]
            best["engine"] = {k: p[k] for k in ("job", "status", "seconds", "trials",
                                                "measured", "failed", "max_error", "warm")}
            best["engine"].update({k: p["best"][k] for k in ("trial", "ours_ms", "baseline",
                                                             "baseline_ms", "ratio")})
            best["trials"], best["seconds"] = p["trials"], round(p["seconds"], 1)
        records.append(best)
    ragged = [] if args.no_ragged else ragged_checks(
        list({json.dumps(r["params"], sort_keys=True): r["params"] for r in records}.values()),
        sms)
    doc = dict(gpu=props.name, driver=driver, date=datetime.date.today().isoformat(),
               torch=torch.__version__, nvrtc=nvrtc_version(),
               method=("named configurations (--variants), re-timed" if names else
                       "porter's engine ports each shape (auto sampler, warm-started), the "
                       "best measured trial re-timed interleaved with SDPA cuDNN and flash, "
                       "L2 flushed, median"),
               settings=dict(trials=args.trials, minutes=args.minutes, workers=args.workers,
                             reps=args.reps, warm=Path(args.warm).name),
               geomean_cudnn=geomean(r["ratio_cudnn"] for r in records),
               geomean_flash=geomean(r["ratio_flash"] for r in records),
               min_cudnn=min((r["ratio_cudnn"] for r in records if r["ratio_cudnn"]),
                             default=None),
               ragged_checks=len(ragged), ragged_wrong=sum(not c["ok"] for c in ragged),
               records=records)
    (out / "attention_h200.json").write_text(json.dumps(doc, indent=1))
    (out / "attention_engine_h200.json").write_text(json.dumps(dict(
        {k: doc[k] for k in ("gpu", "driver", "date", "nvrtc", "settings")},
        ports=[dict(shape=size_text(s), **{k: v for k, v in p.items()})
               for s, p in ports.items()], retimed=all_rows, ragged=ragged), indent=1))
    print("\nshape                      ours ms   TF/s  x cuDNN  x flash  params")
    for r in records:
        s = r["shape"]
        print(f"B{s['B']:<2} H{s['H']}/{s['HKV']} S{s['S']:<5} D{s['D']} c{int(s['causal'])}   "
              f"{r['ours_ms']:8.3f} {r['tflops']:6.0f} {r['ratio_cudnn'] or 0:8.3f} "
              f"{r['ratio_flash'] or 0:8.3f}  " +
              " ".join(f"{k}={v}" for k, v in r["params"].items() if k != "HD"))
    print(f"geomean x cuDNN {doc['geomean_cudnn'] or 0:.3f}, x flash "
          f"{doc['geomean_flash'] or 0:.3f}, lowest x cuDNN {doc['min_cudnn'] or 0:.3f}; ragged "
          f"checks {len(ragged)}, wrong {doc['ragged_wrong']}; {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
