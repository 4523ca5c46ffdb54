"""The tensor pipe's rate for gemm_wgmma's k-loop, tile shape by tile shape, with no GEMM around
it (benchmarks/wgmma_rate.cu): which share of the SM's 2048 bf16 MACs a clock a 256x152 or
256x192 tile's MMAs reach beside a 128x256 tile's, first alone (LOADS=0), then with a producer
refilling every stage from L2 (LOADS=1). A development probe for the open question of
docs/notes/gemm_wgmma.md (256-row tiles lose ~8 % a MAC against cuBLAS's same tile): if the
MMAs alone already run slower at 256 x 152, the loss is in how the k-loop issues them (MT = 2
m64 tiles a consumer, the width), not in the loads, the epilogue or the schedule.

    python benchmarks/wgmma_rate.py --out DIR [--iters 2000]   # GPU: DIR/wgmma_rate.json
    python benchmarks/wgmma_rate.py --compile-only             # no GPU: every case compiles

Each record: `tile` (BM x BN), `BN`, `MT` (m64 tiles a consumer), `WGS` (consumer warpgroups),
`LOADS`, `FP8` (1: gemm_fp8's e4m3 MMAs, k-tiles of 128 along K), `stages`, `cycles_per_ktile`
(median over CTAs of the slowest consumer's clock64 cycles, per k-tile), `mac_per_clk` (the
CTA's MACs a cycle), `pipe_share` (of 2048, the dense bf16 rate of an sm_90 SM, or of 4096 for
fp8), `clock_ghz` (cycles over the event time of the launch) and
`registers`; the file has `gpu`, `driver`, `date`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCE = Path(__file__).with_suffix(".cu")
PEAK_MAC_PER_CLK = 2048            # dense bf16 MACs a cycle of one sm_90 SM
SMEM_LIMIT = 232448                # opt-in dynamic shared memory a block (sm_90)

# (BM x BN, MT, WGS): gemm_wgmma's tiles on two consumers (MT = BM / 128), three for BM = 192,
# one for the 64-row tiles
CASES = [("128x256", 1, 2), ("128x192", 1, 2), ("128x152", 1, 2), ("128x128", 1, 2),
         ("256x192", 2, 2), ("256x160", 2, 2), ("256x152", 2, 2), ("256x128", 2, 2),
         ("192x192", 1, 3), ("64x256", 1, 1),
         # a ping-pong consumer's k-loop: one warpgroup holding a whole 128-row tile (MT = 2)
         ("128x128", 2, 1), ("128x192", 2, 1)]
# gemm_fp8's tiles (e4m3, k-tiles of 128: twice the MACs a byte of bf16's)
CASES_FP8 = [("128x256", 1, 2), ("128x192", 1, 2), ("128x144", 1, 2), ("128x128", 1, 2),
             ("128x128", 2, 1)]   # the ping-pong consumer's (gemm_fp8 PINGPONG = 1)


def stages_for(bm: int, bn: int, want: int = 4) -> int:
    stage = bm * 128 + bn * 128
    return max(2, min(want, (SMEM_LIMIT - 1024 - 16 * want) // stage))


def cases(loads=(0, 1)):
    for fp8, table in ((0, CASES), (1, CASES_FP8)):
        for tile, mt, wgs in table:
            bm, bn = map(int, tile.split("x"))
            assert bm == wgs * mt * 64, tile
            for ld in loads:
                yield dict(tile=tile, BN=bn, MT=mt, WGS=wgs, LOADS=ld, STAGES=stages_for(bm, bn),
                           FP8=fp8)


def compile_case(case: dict):
    """(ok, log, cubin, registers, spill bytes) for one case, NVRTC as porter compiles."""
    from porter.build.compile import BASE_OPTIONS, _nvrtc_compile
    from porter.build.cubin import read_resources
    from porter.spec.template import INCLUDE_DIR
    opts = [*BASE_OPTIONS, "--gpu-architecture=sm_90a", f"-I{INCLUDE_DIR}",
            *(f"-D{k}={case.get(k, 0)}" for k in ("BN", "MT", "WGS", "LOADS", "STAGES", "FP8"))]
    ok, log, cubin = _nvrtc_compile(SOURCE.read_text(), "wgmma_rate.cu", opts)
    if not ok or re.search(r"C75\d\d|serializ", log):   # no cubin, or wgmma serialized
        return False, log, b"", 0, 0
    res = read_resources(cubin, "wgmma_rate")
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill", log))
    return True, log, cubin, (res.registers if res else 0), spills + (res.stack_frame if res else 0)


def run(out: Path, iters: int) -> dict:
    import cupy as cp
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    sms = props["multiProcessorCount"]
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = ""
    doc = {"benchmark": "wgmma_rate", "gpu": props["name"].decode(), "driver": driver,
           "date": datetime.date.today().isoformat(), "sms": sms, "iters": iters,
           "peak_mac_per_clk": PEAK_MAC_PER_CLK, "records": []}
    out.mkdir(parents=True, exist_ok=True)
    for case in cases():
        rec = dict(case)
        doc["records"].append(rec)
        ok, log, cubin, regs, spills = compile_case(case)
        rec["registers"] = regs
        if not ok or spills:
            rec.update(status="compile_failed", reason=(log or "spills")[-300:])
            continue
        path = out / f".wgmma_rate_{case['tile']}_{case['WGS']}_{case['LOADS']}.cubin"
        path.write_bytes(cubin)
        mod = cp.RawModule(path=str(path))
        fn = mod.get_function("wgmma_rate")
        bm = case["WGS"] * case["MT"] * 64
        smem = case["STAGES"] * (bm + case["BN"]) * 128 + 1024 + 16 * case["STAGES"]
        fn.max_dynamic_shared_size_bytes = smem
        src = cp.asarray((cp.random.standard_normal(8 * (bm + case["BN"]) * 64) * 0.5)
                         .astype(cp.float16).view(cp.uint8))
        cyc = cp.zeros(sms * case["WGS"], dtype=cp.int64)
        threads = 128 * (case["WGS"] + 1)
        args = (src, cyc, cp.int32(iters))
        try:
            fn((sms,), (threads,), args, shared_mem=smem)   # warm-up
            runs = []
            for _ in range(3):
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record()
                fn((sms,), (threads,), args, shared_mem=smem)
                e1.record()
                e1.synchronize()
                ms = cp.cuda.get_elapsed_time(e0, e1)
                per_cta = cyc.reshape(sms, case["WGS"]).max(axis=1).get().tolist()
                runs.append((statistics.median(per_cta), ms))
        except Exception as e:  # noqa: BLE001 - one case's launch failure is recorded, not fatal
            rec.update(status="launch_failed", reason=str(e)[:300])
            continue
        finally:
            path.unlink(missing_ok=True)
        cycles, ms = sorted(runs)[1]
        fp8 = case.get("FP8", 0)
        macs = bm * case["BN"] * (128 if fp8 else 64) * iters
        peak = PEAK_MAC_PER_CLK * (2 if fp8 else 1)
        rec.update(status="measured", cycles_per_ktile=round(cycles / iters, 2),
                   mac_per_clk=round(macs / cycles, 1), pipe_share=round(macs / cycles / peak, 4),
                   clock_ghz=round(cycles / (ms * 1e6), 3), event_ms=round(ms, 4))
        print(f"{case['tile']:>8s}{' fp8' if fp8 else ''} MT {case['MT']} WGS {case['WGS']} "
              f"LOADS {case['LOADS']} stages {case['STAGES']}: "
              f"{rec['cycles_per_ktile']:8.1f} cycles a k-tile, "
              f"{rec['pipe_share']:.3f} of the pipe, {rec['clock_ghz']:.2f} GHz", flush=True)
        (out / "wgmma_rate.json").write_text(json.dumps(doc, indent=1))
    (out / "wgmma_rate.json").write_text(json.dumps(doc, indent=1))
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args(argv)
    if args.compile_only:
        bad = 0
        for case in cases():
            ok, log, _, regs, spills = compile_case(case)
            state = "ok" if ok and not spills else ("spills" if ok else "FAILED")
            bad += state != "ok"
            print(f"{case['tile']:>8s}{' fp8' if case['FP8'] else ''} MT {case['MT']} "
                  f"WGS {case['WGS']} LOADS {case['LOADS']} stages {case['STAGES']}: {state}, "
                  f"{regs} registers"
                  + ("" if ok else "\n" + log[-400:]))
        return 1 if bad else 0
    if not args.out:
        ap.error("--out DIR (or --compile-only)")
    run(Path(args.out), args.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
