"""flash_attention_fwd on the GPU: compile variants, verify them, time them against torch SDPA.

Runs on the device machine (torch, CuPy-free; cuda-bindings for NVRTC and the driver). Each
variant of search_spaces/flash_attention_fwd is compiled for sm_90a with porter's NVRTC options,
checked on ragged shapes (S not a multiple of the tiles, causal and not, GQA, D = 64 and 128)
against an fp32 reference, then timed on the anchor shapes interleaved with torch SDPA's cuDNN
and flash backends (L2 flushed before every call, median of the repeats). Every variant timed
on a shape is also verified on that shape (a sample of heads and rows against fp32, the whole
output against cuDNN, and NaN-poisoned outputs must all be written).

    python3 benchmarks/attention.py [--quick] [--out DIR] [--variants NAME,...]

Writes DIR/attention_h200.json ({"gpu", "driver", "date", "records": [...]}, one record per
shape: the best verified variant, its params, ours_ms, tflops, ratio_cudnn, ratio_flash) and
DIR/attention_all.json (every variant on every shape).
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import math
import os
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SRC = ROOT / "search_spaces" / "flash_attention_fwd" / "kernel.cu"
INCLUDE = ROOT / "porter" / "include"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from porter.build.compile import BASE_OPTIONS, _nvrtc_compile, parse_resources  # noqa: E402
from porter.measure.tma import launch, load_function  # noqa: E402
from _attention_check import (make_problem, rel_err, sdpa,  # noqa: E402
                              time_interleaved, verify)

# name -> defines. Head dim (HD) is added per shape.
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

# (B, H, HKV, S, D, causal)
ANCHORS = [
    (32, 16, 16, 1024, 128, False), (32, 16, 16, 1024, 128, True),
    (8, 16, 16, 4096, 128, False), (8, 16, 16, 4096, 128, True),
    (2, 16, 16, 16384, 128, False), (2, 16, 16, 16384, 128, True),
    (8, 16, 16, 4096, 64, False),
    (8, 32, 8, 4096, 128, False),     # GQA: 4 query heads per KV head
]
RAGGED = [  # verification only: sequence lengths that cut the tiles
    (2, 4, 4, 1000, 128, False), (2, 4, 4, 1000, 128, True), (1, 4, 2, 777, 128, True),
    (1, 2, 2, 130, 128, False), (1, 2, 1, 333, 64, True), (2, 3, 3, 1537, 64, False),
    (1, 2, 2, 64, 128, True), (1, 1, 1, 17, 128, False),
]


def fits(defs: dict, D: int) -> bool:
    """The space file's constraints, restated: shared memory and registers."""
    if smem_bytes(defs, D) > 227 * 1024:
        return False
    if defs["CONSUMERS"] == 3 and D * 0.5 + defs["BN"] * 0.75 > 128:   # 160 registers a thread
        return False
    return True


def smem_bytes(defs: dict, D: int) -> int:
    q = 64 * defs["CONSUMERS"] * D * 2
    return 1024 + q * (1 + defs["EPI"]) + 2 * defs["STAGES"] * defs["BN"] * D * 2 + \
        8 * (4 * defs["STAGES"] + 2)


def sample_space(n: int, seed: int = 0) -> dict:
    """n random configurations of the space (space.toml's parameters and constraints)."""
    import itertools
    import random
    P = dict(BN=[128, 176, 64, 96, 144, 160, 192], STAGES=[2, 3, 4], CONSUMERS=[2, 3, 1],
             INTRA=[1, 0], PINGPONG=[0, 1], PERSIST=[1, 0], EPI=[1, 0], CAUSAL_SKIP=[1, 0])
    feasible = []
    for vals in itertools.product(*P.values()):
        d = dict(zip(P, vals))
        if d["PINGPONG"] and not (d["INTRA"] and d["CONSUMERS"] >= 2):
            continue
        if any(fits(d, D) and d["BN"] * 3 // 4 + D // 2 <= 200 for D in (64, 128)):
            feasible.append(d)
    return {f"sample{i}": d for i, d in enumerate(random.Random(seed).sample(feasible, n))}


_modules: dict = {}


def build(defs: dict, D: int):
    key = tuple(sorted({**defs, "HD": D}.items()))
    if key in _modules:
        return _modules[key]
    opts = [*BASE_OPTIONS, "--gpu-architecture=sm_90a", f"-I{INCLUDE}"] + \
        [f"-D{k}={v}" for k, v in key]
    t0 = time.perf_counter()
    ok, log, cubin = _nvrtc_compile(SRC.read_text(), "flash_attention_fwd.cu", opts)
    if not ok:
        raise RuntimeError(f"compile failed for {dict(key)}:\n{log[:3000]}")
    res = parse_resources(log, "flash_attention_fwd")
    if res.spill_stores or res.stack_frame:
        raise RuntimeError(f"{dict(key)} spills: {res}")
    mod, fn = load_function(cubin, "flash_attention_fwd")
    _modules[key] = (mod, fn, res, time.perf_counter() - t0, log)
    return _modules[key]


def encode_3d(t, rows_box: int) -> bytes:
    """A 3-D bf16 tensor map over [heads, S, D] (innermost first {D, S, heads}), box 64 x rows."""
    from cuda.bindings import driver as drv
    heads, S, D = t.shape[0] * t.shape[1], t.shape[2], t.shape[3]
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    err, tmap = drv.cuTensorMapEncodeTiled(
        drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, t.data_ptr(),
        [u64(D), u64(S), u64(heads)], [u64(D * 2), u64(S * D * 2)],
        [u32(64), u32(rows_box), u32(1)], [u32(1), u32(1), u32(1)],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled: {err}")
    return struct.pack("<16Q", *[int(w) for w in tmap.opaque])


class Ours:
    """One compiled variant bound to one problem's tensors; calling it launches the kernel."""

    def __init__(self, defs, q, k, v, o, lse, causal, scale, sms):
        import torch
        B, H, S, D = q.shape
        self.mod, self.fn, self.res, self.compile_s, _ = build(defs, D)
        bm = 64 * defs["CONSUMERS"]
        nmb = -(-S // bm)
        # persistent: units of two query tiles (kernel.cu, decode_persistent), one CTA per SM
        self.grid = min(B * H * ((nmb + 1) // 2), sms) if defs["PERSIST"] else nmb * B * H
        self.block = 128 * (defs["CONSUMERS"] + 1)
        self.smem = smem_bytes(defs, D)
        self.keep = (q, k, v, o, lse)
        self.args = [ctypes.c_void_p(q.data_ptr()), ctypes.c_void_p(k.data_ptr()),
                     ctypes.c_void_p(v.data_ptr()), ctypes.c_void_p(o.data_ptr()),
                     ctypes.c_void_p(lse.data_ptr()), ctypes.c_int(B), ctypes.c_int(H),
                     ctypes.c_int(k.shape[1]), ctypes.c_int(S), ctypes.c_int(int(causal)),
                     ctypes.c_float(scale), ctypes.c_void_p(0),
                     encode_3d(q, bm), encode_3d(k, defs["BN"]), encode_3d(v, defs["BN"]),
                     encode_3d(o, 64)]
        self.stream = torch.cuda.current_stream().cuda_stream

    def __call__(self):
        launch(self.fn, (self.grid,), (self.block,), self.smem, args=self.args, stream=self.stream)


def op_check(sms: int) -> None:
    """porter's `attention` op harness (porter/measure/ops/attention.py) driving the kernel:
    its inputs, arguments, rank-3 tensor maps, poisoned outputs, sampled reference, baselines."""
    import cupy as cp
    from porter.measure.ops import get_op
    op = get_op("attention")
    for size in [(2, 4, 4, 1000, 128, 2), (1, 4, 2, 777, 128, 1), (2, 16, 16, 4096, 64, 2),
                 (1, 16, 4, 8192, 128, 1)]:
        B, H, HKV, S, D, mask = size
        defs = VARIANTS["c3_bn128_persist_epi" if D == 64 else "intra_bn128_persist_epi"]
        st = op.setup(size, seed=5)
        op.poison(st)
        fn = build(defs, D)[1]
        bm = 64 * defs["CONSUMERS"]
        nmb = -(-S // bm)
        grid = min(B * H * ((nmb + 1) // 2), sms) if defs["PERSIST"] else nmb * B * H
        maps = [op.tensor_map(st, "Q", (64, bm)), op.tensor_map(st, "K", (64, defs["BN"])),
                op.tensor_map(st, "V", (64, defs["BN"])),
                op.tensor_map(st, "O", (64, 64) if defs["EPI"] else (0, 0))]
        launch(fn, (grid,), (128 * (defs["CONSUMERS"] + 1),), smem_bytes(defs, D),
               args=op.args(st, 0) + maps)
        cp.cuda.runtime.deviceSynchronize()
        err = op.error(st)
        names = []
        for name, f in op.baselines(st).items():
            f()
            names.append(name)
        cp.cuda.runtime.deviceSynchronize()
        print(f"op check {size}: error {err:.2e} {'ok' if err < op.rtol else 'WRONG'}; "
              f"baselines {names}", flush=True)


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "benchmarks" / "results")))
    ap.add_argument("--variants", default="")
    ap.add_argument("--shapes", default="", help="indices into ANCHORS, comma-separated")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--op-check", action="store_true", help="drive the kernel through porter's "
                    "attention op harness instead (small; needs CuPy)")
    ap.add_argument("--no-ragged", action="store_true", help="skip the ragged-shape checks")
    ap.add_argument("--sample", type=int, default=0,
                    help="also check this many random configurations of the space (ragged shapes)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.variants.split(",") if n] or list(VARIANTS)
    if args.sample:
        VARIANTS.update(sample_space(args.sample))
        names += [n for n in VARIANTS if n.startswith("sample")]
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    try:
        import subprocess
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:   # noqa: BLE001
        driver = "unknown"
    print(f"{props.name}, {sms} SMs, torch {torch.__version__}", flush=True)
    if args.op_check:
        op_check(sms)
        return

    # ---- verification on ragged shapes, every variant that fits
    bad = set()
    for name in names:
        for (B, H, HKV, S, D, causal) in ([] if args.no_ragged else RAGGED):
            defs = VARIANTS[name]
            if not fits(defs, D) or defs["BN"] * 3 // 4 + D // 2 > 200:
                continue
            q, k, v, o, lse = make_problem(B, H, HKV, S, D, seed=S * 7 + D + causal)
            scale = 1 / math.sqrt(D)
            try:
                run = Ours(defs, q, k, v, o, lse, causal, scale, sms)
                eo, el = verify(run, q, k, v, o, lse, causal, scale, full_rows=True)
            except Exception as e:   # noqa: BLE001
                eo = el = float("inf")
                print(f"  {name} {S} {D}: {e}", flush=True)
            ok = eo < 1e-2 and el < 1e-3
            if not ok:
                bad.add(name)
            print(f"check {name:18s} {defs if name.startswith('sample') else ''} B{B} H{H}/{HKV} S{S} D{D} causal={int(causal)}: "
                  f"O {eo:.2e} LSE {el:.2e} {'ok' if ok else 'WRONG'}", flush=True)
    print(f"checked {len(names)} configurations; wrong: {sorted(bad) or 'none'}", flush=True)
    if args.check_only:
        return

    # ---- timing on the anchor shapes
    shapes = [ANCHORS[int(i)] for i in args.shapes.split(",") if i] or ANCHORS
    all_rows, records = [], []
    for (B, H, HKV, S, D, causal) in shapes:
        q, k, v, o, lse = make_problem(B, H, HKV, S, D, seed=1 + S + D)
        scale = 1 / math.sqrt(D)
        flops = 4 * B * H * S * S * D // (2 if causal else 1)
        fns, meta = {}, {}
        for be in ("cudnn", "flash"):
            try:
                f, note = sdpa(be, q, k, v, causal, scale)
                f()
                fns[be], meta[be] = f, note
            except Exception as e:   # noqa: BLE001
                print(f"  {be} unavailable: {e}", flush=True)
        cud = fns["cudnn"]().float() if "cudnn" in fns else None
        for name in names:
            defs = VARIANTS[name]
            if name in bad or not fits(defs, D):
                continue
            run = Ours(defs, q, k, v, o, lse, causal, scale, sms)
            eo, el = verify(run, q, k, v, o, lse, causal, scale)
            ec = rel_err(o, cud) if cud is not None else None
            if not (eo < 1e-2 and el < 1e-3):
                print(f"  {name}: WRONG on the shape (O {eo:.2e}, LSE {el:.2e})", flush=True)
                continue
            fns[name] = run
            meta[name] = dict(err_o=eo, err_lse=el, err_vs_cudnn=ec)
        reps = args.reps if S * S * B * H < 2**33 else max(5, args.reps // 2)
        t = time_interleaved(fns, reps)
        shape = dict(B=B, H=H, HKV=HKV, S=S, D=D, causal=causal)
        for name in fns:
            if name in VARIANTS:
                row = dict(gpu=props.name, shape=shape, variant=name, params={**VARIANTS[name], "HD": D},
                           ours_ms=t[name], tflops=flops / t[name] / 1e9,
                           ratio_cudnn=t["cudnn"] / t[name] if "cudnn" in t else None,
                           ratio_flash=t["flash"] / t[name] if "flash" in t else None, **meta[name])
                all_rows.append(row)
        best = min((r for r in all_rows if r["shape"] == shape), key=lambda r: r["ours_ms"], default=None)
        base = {be: dict(ms=t[be], tflops=flops / t[be] / 1e9, note=meta[be]) for be in ("cudnn", "flash") if be in t}
        print(f"B{B} H{H}/{HKV} S{S} D{D} causal={int(causal)}: " +
              ", ".join(f"{n} {t[n]:.3f} ms ({flops / t[n] / 1e9:.0f} TF)" for n in t), flush=True)
        if best:
            records.append({k2: best[k2] for k2 in ("gpu", "shape", "params", "ours_ms", "tflops",
                                                     "ratio_cudnn", "ratio_flash")} |
                           {"variant": best["variant"], "baselines": base,
                            "err_o": best["err_o"], "err_vs_cudnn": best["err_vs_cudnn"]})
        del q, k, v, o, lse, fns
        torch.cuda.empty_cache()

    doc = dict(gpu=props.name, driver=driver, date=datetime.date.today().isoformat(),
               torch=torch.__version__, records=records)
    (out / "attention_h200.json").write_text(json.dumps(doc, indent=1))
    (out / "attention_all.json").write_text(json.dumps(dict(doc, records=all_rows), indent=1))
    print("\nshape                      variant             ours TF/s  x cuDNN  x flash")
    for r in records:
        s = r["shape"]
        print(f"B{s['B']:<2} H{s['H']}/{s['HKV']} S{s['S']:<5} D{s['D']} c{int(s['causal'])}    "
              f"{r['variant']:18s} {r['tflops']:8.0f} {r['ratio_cudnn'] or 0:8.3f} {r['ratio_flash'] or 0:8.3f}")
    g = [r["ratio_cudnn"] for r in records if r["ratio_cudnn"]]
    if g:
        print(f"geomean x cuDNN {math.exp(sum(map(math.log, g)) / len(g)):.3f}")


if __name__ == "__main__":
    main()
