"""Development bench for the gemm_wgmma template (Hopper, sm_90a).

Two steps, so the GPU machine needs no NVRTC of its own:

  here (CPU):   python benchmarks/dev_wgmma.py build [--out out_wgmma] [--set NAME]
                compiles the variants below to cubins + manifest.json (ptxas resources kept)
  device:       python3 benchmarks/dev_wgmma.py run [--cubins out_wgmma] [--reps 50]
                loads each cubin (cuModuleLoadData), launches it with TMA descriptors built from
                space.toml's [[tensor_maps]] (porter.measure.tma), checks it against an fp32
                torch reference (relative Frobenius error, poisoned output), and times it
                interleaved with torch.matmul (cuBLAS) using CUDA events, L2 flushed before each
                repetition; median over reps. Writes JSON to $OUT (or benchmarks/results/).

  device:       ncu --clock-control none --set full --kernel-name regex:'gemm|nvjet|xmma' \
                  -o REP python3 benchmarks/dev_wgmma.py run --profile --tag _prof ...
                launches each variant and cuBLAS once (no reference, checks or timing);
                (benchmarks/ncu_summary.py keeps the figures of `ncu --import REP --page details`)

A kernel that does not finish within --hang-s seconds is recorded as a hang; the JSON written so
far is kept and the process exits (its context cannot be reused).
"""
from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEMPLATE_DIR = ROOT / "search_spaces" / "gemm_wgmma"

# name -> config; order = from the simplest (least likely to hang) to the most involved.
# A "_again" entry repeats a configuration, to show the run-to-run spread.
VARIANTS = {
    "v1_c1_128x128_s4": dict(BM=128, BN=128, BK=64, STAGES=4, CONSUMERS=1, GROUP_M=8,
                              PERSIST=0, CLUSTER=1, EPI=0),
    "c2_128x256_s4": dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8,
                           PERSIST=0, CLUSTER=1, EPI=0),
    "c2_128x256_s4_p": dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8,
                             PERSIST=1, CLUSTER=1, EPI=0),
    "c2_128x256_s4_p_e1": dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8,
                                PERSIST=1, CLUSTER=1, EPI=1),
    "c2_128x256_s4_p_e1_g16": dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16,
                                    PERSIST=1, CLUSTER=1, EPI=1),
    "c2_128x256_s4_p_e1_g4": dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=4,
                                   PERSIST=1, CLUSTER=1, EPI=1),
    "c2_256x128_s4_p_e1": dict(BM=256, BN=128, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8,
                                PERSIST=1, CLUSTER=1, EPI=1),
    "c2_128x256_s3_p_e1": dict(BM=128, BN=256, BK=64, STAGES=3, CONSUMERS=2, GROUP_M=8,
                                PERSIST=1, CLUSTER=1, EPI=1),
    "c2_128x256_s4_p_cl2": dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8,
                                 PERSIST=1, CLUSTER=2, EPI=0),
    "c2_128x256_s4_p_cl2_e1": dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8,
                                    PERSIST=1, CLUSTER=2, EPI=1),
    "c2_128x256_s4_cl2_e1": dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8,
                                  PERSIST=0, CLUSTER=2, EPI=1),
    "c2_128x256_s4_p_e1_g16_again": dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16,
                                          PERSIST=1, CLUSTER=1, EPI=1),
    "c2_128x256_s3_p_e1_g16": dict(BM=128, BN=256, BK=64, STAGES=3, CONSUMERS=2, GROUP_M=16,
                                    PERSIST=1, CLUSTER=1, EPI=1),
    "c2_256x128_s4_p_e1_g16": dict(BM=256, BN=128, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16,
                                    PERSIST=1, CLUSTER=1, EPI=1),
    "c2_128x256_s4_p_cl2_e1_g16": dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16,
                                        PERSIST=1, CLUSTER=2, EPI=1),
    "c2_128x256_s3_p_cl2_e1_g16": dict(BM=128, BN=256, BK=64, STAGES=3, CONSUMERS=2, GROUP_M=16,
                                        PERSIST=1, CLUSTER=2, EPI=1),
}

# Version 3 of the template: split-K and stream-K (SPLITK, STREAMK) and BN=64.
_BEST = dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=16, PERSIST=1, CLUSTER=1,
             EPI=1, SPLITK=1, STREAMK=0, SWAP=0)
_SMALL = dict(BM=64, BN=128, BK=64, STAGES=6, CONSUMERS=1, GROUP_M=8, PERSIST=1, CLUSTER=1,
              EPI=1, SPLITK=1, STREAMK=0, SWAP=0)
VARIANTS.update({
    "v3_best": _BEST,
    "v3_best_sk": dict(_BEST, STREAMK=1),
    "v3_best_sk_cl2": dict(_BEST, STREAMK=1, CLUSTER=2),
    "v3_256x128_sk": dict(_BEST, BM=256, BN=128, STREAMK=1),
    "v3_small_64x128": _SMALL,
    "v3_small_64x128_k2": dict(_SMALL, SPLITK=2),
    "v3_small_64x128_k4": dict(_SMALL, SPLITK=4),
    "v3_small_64x128_k4_np": dict(_SMALL, SPLITK=4, PERSIST=0),
    "v3_small_64x128_k8": dict(_SMALL, SPLITK=8),
    "v3_small_64x64_k4": dict(_SMALL, BN=64, SPLITK=4),
    "v3_small_64x256_k8": dict(_SMALL, BN=256, SPLITK=8, STAGES=4),
    "v3_small_64x128_sk": dict(_SMALL, STREAMK=1),
    "v3_small_128x128_k2": dict(_SMALL, BM=128, CONSUMERS=2, SPLITK=2, STAGES=5),
    "v3_small_128x128_k4": dict(_SMALL, BM=128, CONSUMERS=2, SPLITK=4, STAGES=5),
    "v3_small_128x128_sk": dict(_SMALL, BM=128, CONSUMERS=2, STREAMK=1, STAGES=5),
    "v3_small_64x192_s6": dict(_SMALL, BN=192),
    "v3_small_64x128_s8": dict(_SMALL, STAGES=8),
    "v3_small_64x128_k2_s8": dict(_SMALL, STAGES=8, SPLITK=2),
    "v3_small_64x64_k2_s8": dict(_SMALL, BN=64, STAGES=8, SPLITK=2),
    "v3_small_64x128_sk_s8": dict(_SMALL, STAGES=8, STREAMK=1),
    "v3_best_sk_g8": dict(_BEST, STREAMK=1, GROUP_M=8),
    "v3_small_64x128_s10_e0": dict(_SMALL, STAGES=10, EPI=0),
    "v3_swap_64x16_s8": dict(_SMALL, BN=16, SWAP=1, EPI=0, STAGES=8),
    "v3_swap_64x16_s12": dict(_SMALL, BN=16, SWAP=1, EPI=0, STAGES=12),
    "v3_swap_128x16_c2_s8": dict(_SMALL, BM=128, CONSUMERS=2, BN=16, SWAP=1, EPI=0, STAGES=8),
    "v3_swap_128x16_c1_s8": dict(_SMALL, BM=128, BN=16, SWAP=1, EPI=0, STAGES=8),
    "v3_swap_64x16_k2_s8": dict(_SMALL, BN=16, SWAP=1, EPI=0, STAGES=8, SPLITK=2),
    "v3_swap_64x16_bk128_s6": dict(_SMALL, BN=16, SWAP=1, EPI=0, STAGES=6, BK=128),
    "v3_swap_64x128_s6": dict(_SMALL, BN=128, SWAP=1, EPI=0, STAGES=6),
    "v3_swap_64x64_s8": dict(_SMALL, BN=64, SWAP=1, EPI=0, STAGES=8),
    "v3_swap_128x64_c2_s8": dict(_SMALL, BM=128, CONSUMERS=2, BN=64, SWAP=1, EPI=0, STAGES=8),
    "v3_small_64x64_s12": dict(_SMALL, BN=64, STAGES=12),
    "v3_small_64x128_bk128_s4": dict(_SMALL, BK=128, STAGES=4),
    "v3_small_64x128_bk128_s5_e0": dict(_SMALL, BK=128, STAGES=5, EPI=0),
    "v3_small_64x64_bk128_s6": dict(_SMALL, BN=64, BK=128, STAGES=6),
    "v3_small_64x128_bk128_s4_k2": dict(_SMALL, BK=128, STAGES=4, SPLITK=2),
    "v3_small_64x256_bk128_s3": dict(_SMALL, BN=256, BK=128, STAGES=3),
    "v3_best_bk128_s2": dict(_BEST, BK=128, STAGES=2),
    "v3_128x128_bk128_s3": dict(_BEST, BN=128, BK=128, STAGES=3),
    "v3_128x256_c2_bk128_s2_cl2": dict(_BEST, BK=128, STAGES=2, CLUSTER=2),
})

# Version 4: the epilogue stored by TMA from stmatrix-written smem boxes (EPI=2: the whole tile
# staged, so the stores overlap the next tile's MMAs; EPI=3: 64 x 128 at a time).
VARIANTS.update({
    "v4_best_e1": _BEST,
    "v4_e2_s3": dict(_BEST, EPI=2, STAGES=3),
    "v4_e3_s4": dict(_BEST, EPI=3),
    "v4_e1_s3": dict(_BEST, STAGES=3),
    "v4_e2_s3_cl2": dict(_BEST, EPI=2, STAGES=3, CLUSTER=2),
    "v4_e3_s4_cl2": dict(_BEST, EPI=3, CLUSTER=2, GROUP_M=8),
    "v4_256x128_e2_s3": dict(_BEST, BM=256, BN=128, EPI=2, STAGES=3, GROUP_M=4),
    "v4_256x128_e3_s4": dict(_BEST, BM=256, BN=128, EPI=3, GROUP_M=4),
    "v4_e3_s4_sk": dict(_BEST, EPI=3, STREAMK=1),
    "v4_small_e2_s8": dict(_SMALL, STAGES=8, EPI=2),
    "v4_small_e1_s8": dict(_SMALL, STAGES=8),
    "v4_e2_s3_again": dict(_BEST, EPI=2, STAGES=3),
    "v4_best_e1_again": _BEST,
    "v4_e3_s4_sk2": dict(_BEST, EPI=3, STREAMK=2),
    "v4_e3_s4_sk2_g8": dict(_BEST, EPI=3, STREAMK=2, GROUP_M=8),
    "v4_e2_s3_sk2": dict(_BEST, EPI=2, STAGES=3, STREAMK=2),
    "v4_e3_s4_again": dict(_BEST, EPI=3),
    # split tiles whose fp32 slots are scratch (only the counters are zeroed again)
    "v5_small_k2_s8": dict(_SMALL, STAGES=8, SPLITK=2),
})

# Session 4: where stream-K's time goes at 4096^3 (DEV_NOFIX: the split without its fix-up,
# results wrong, timed anyway), and the memory-bound small-M shapes.
_E3 = dict(_BEST, EPI=3)
_S16 = dict(_SMALL, BN=16, SWAP=1, EPI=0, STAGES=6, BK=128)
VARIANTS.update({
    "v6_e3": _E3,
    "v6_e3_sk2": dict(_E3, STREAMK=2),
    "v6_e3_sk2_nofix": dict(_E3, STREAMK=2, DEV_NOFIX=1),
    "v6_e3_sk1": dict(_E3, STREAMK=1),
    "v6_e3_sk1_nofix": dict(_E3, STREAMK=1, DEV_NOFIX=1),
    "v6_s16": _S16,
    "v6_s16_sk2": dict(_S16, STREAMK=2),
    "v6_s16_sk2_nofix": dict(_S16, STREAMK=2, DEV_NOFIX=1),
    "v6_s16_s8": dict(_S16, STAGES=8),
    "v6_s16_s10": dict(_S16, STAGES=10),
    "v6_s16_s10_sk2": dict(_S16, STAGES=10, STREAMK=2),
    "v6_s16_bk64_s12": dict(_S16, BK=64, STAGES=12),
    "v6_s16_np": dict(_S16, PERSIST=0),
    "v6_s128": dict(_SMALL, STAGES=8, GROUP_M=4, PERSIST=0),
    "v6_s128_sk2": dict(_SMALL, STAGES=8, GROUP_M=4, STREAMK=2),
    "v6_s128_swap": dict(_SMALL, BN=128, SWAP=1, EPI=0, STAGES=6),
    "v6_s128_swap_sk2": dict(_SMALL, BN=128, SWAP=1, EPI=0, STAGES=6, STREAMK=2),
    "v6_s128_swap_bk128": dict(_SMALL, BN=128, SWAP=1, EPI=0, STAGES=3, BK=128),
    "v6_s128_c2_64": dict(_SMALL, BM=128, CONSUMERS=2, BN=64, STAGES=8, GROUP_M=4, PERSIST=0),
    "v6_s128_bk128": dict(_SMALL, STAGES=4, BK=128, GROUP_M=4, PERSIST=0),
})

# BN = 200 / 224: whole waves of 132 tiles at N = 8192 / 28672 (the columns past the last
# 64-wide group stored straight from the accumulators)
VARIANTS.update({
    "v7_200_e3_s4": dict(_E3, BN=200),
    "v7_200_e3_s5": dict(_E3, BN=200, STAGES=5),
    "v7_200_e1_s5": dict(_BEST, BN=200, STAGES=5),
    "v7_200_e3_s5_g8": dict(_E3, BN=200, STAGES=5, GROUP_M=8),
    "v7_224_e3_s4": dict(_E3, BN=224),
    "v7_224_e3_s4_cl2": dict(_E3, BN=224, CLUSTER=2, GROUP_M=8),
    "v7_192_e3_s4": dict(_E3, BN=192),
    "v7_192_e3_s5": dict(_E3, BN=192, STAGES=5),
})
# stream-K runs reordered (the head of the last tile first: all CTAs at one k offset)
VARIANTS.update({
    "v8_e3_sk2": dict(_E3, STREAMK=2),
    "v8_e3_sk2_nofix": dict(_E3, STREAMK=2, DEV_NOFIX=1),
    "v8_e3_sk1": dict(_E3, STREAMK=1),
    "v8_e3_sk1_nofix": dict(_E3, STREAMK=1, DEV_NOFIX=1),
    "v8_200_sk1": dict(_E3, BN=200, STREAMK=1),
})

SIZES = [(4096, 4096, 4096), (8192, 8192, 8192), (2999, 4001, 4104)]


# Session 5: the fix-up of stream-K's split tiles at 4096^3, taken apart (DEV_NOSTORE: the
# earlier part does not store its partial tile; DEV_NOREAD: the last part does not read them;
# both give wrong results and are timed anyway).
VARIANTS.update({
    "v9_e3_sk1": dict(_E3, STREAMK=1),
    "v9_e3_sk2_nostore": dict(_E3, STREAMK=2, DEV_NOSTORE=1),
    "v9_e3_sk2_noread": dict(_E3, STREAMK=2, DEV_NOREAD=1),
})

# Session 6: the last rows of tiles re-cut along N into TAILW / TAILW + 8 wide pieces (no split
# along K, no fix-up): at 4096^3 each CTA gets 3 tiles and a 224-232 wide piece, or 2 and two.
# v11_e3_tw240 (TAILW = 240: 0.991-0.995 at 4096^3 in runs 11 and 12) was measured too; its
# wgmma widths (240, 248) left the kernel with it.
VARIANTS.update({
    "v11_e3": _E3,
    "v11_e3_tw224": dict(_E3, TAILW=224),
    "v11_224_tw192": dict(_E3, BN=224, TAILW=192),
    "v11_e3_tw224_g8": dict(_E3, TAILW=224, GROUP_M=8),
    "v11_e2_s3_tw224": dict(_E3, EPI=2, STAGES=3, TAILW=224),
    "v11_e3_again": _E3,
})


def build(out: Path, names: list[str]) -> None:
    from porter.spec.arch import get_arch
    from porter.build.compile import compile_variant
    from porter.spec.template import load_template
    tpl = load_template(TEMPLATE_DIR)
    arch = get_arch("sm_90a")
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name in names:
        cfg = VARIANTS[name]
        r = compile_variant(tpl, cfg, arch)
        print(f"{name:22s} ok={r.ok} regs={r.resources.registers} "
              f"spills={r.resources.spill_stores}/{r.resources.spill_loads} "
              f"stack={r.resources.stack_frame} {r.seconds:.2f}s")
        if not r.ok:
            print(r.log)
            continue
        (out / f"{name}.cubin").write_bytes(Path(r.cubin_path).read_bytes())
        manifest[name] = {"config": cfg, "resources": r.resources.__dict__,
                          "log_warnings": [ln for ln in r.log.splitlines() if "arning" in ln]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


# ---------------------------------------------------------------------------------- device side
def _gpu_info() -> dict:
    info = {}
    try:
        q = ("name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,"
             "power.draw,power.limit")
        txt = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        info = dict(zip(q.split(","), [s.strip() for s in txt.split(",")]))
    except Exception as e:  # noqa: BLE001
        info["error"] = str(e)
    return info


def run(cubins: Path, reps: int, hang_s: float, out_dir: Path, only: list[str] | None,
        tag: str = "", sizes=None, profile: bool = False) -> None:
    import torch
    from porter.spec.arch import get_arch
    from porter.measure.backends import tma
    from porter.spec.template import load_template

    tpl = load_template(TEMPLATE_DIR)
    arch = get_arch("sm_90a")
    manifest = json.loads((cubins / "manifest.json").read_text())
    names = [n for n in manifest if not only or n in only]

    torch.cuda.init()
    dev = torch.device("cuda")
    torch.empty(1, device=dev)          # makes the primary context current
    tma.ensure_context()
    props = torch.cuda.get_device_properties(0)
    stream = torch.cuda.current_stream().cuda_stream
    record = {"date": dt.datetime.now(dt.timezone.utc).isoformat(), "template": "gemm_wgmma",
              "arch": "sm_90a", "gpu": props.name, "sms": props.multi_processor_count,
              "torch": torch.__version__, "smi_before": _gpu_info(), "results": []}
    out_dir.mkdir(parents=True, exist_ok=True)
    out_file = out_dir / f"dev_wgmma{tag}.json"

    def save():
        out_file.write_text(json.dumps(record, indent=1))

    funcs = {}
    for n in names:
        mod, fn = tma.load_function((cubins / f"{n}.cubin").read_bytes(), "gemm_wgmma")
        funcs[n] = (mod, fn)

    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device=dev)

    def wait_or_die(ev, what):
        t0 = time.time()
        while not ev.query():
            if time.time() - t0 > hang_s:
                record["results"].append({"name": what, "status": "hang"})
                save()
                print(f"HANG: {what}; exiting", flush=True)
                os._exit(3)
            time.sleep(0.001)

    rows = []
    for (M, N, K) in (sizes or SIZES):
        g = torch.Generator(device=dev).manual_seed(M + N + K)
        a = torch.randn(M, K, device=dev, generator=g).to(torch.bfloat16)
        b = torch.randn(N, K, device=dev, generator=g).to(torch.bfloat16)
        c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * M * N * K

        def cublas():
            return torch.matmul(a, b.T)

        if profile:   # no fp32 reference: under ncu, only ours and cuBLAS's kernels run
            ref = None
        else:
            ref = a.float() @ b.float().T
            ref_norm = ref.norm().item()
            err_cublas = ((cublas().float() - ref).norm() / ref_norm).item()
        for n in names:
            # variants older than a parameter leave it at its off value
            cfg = {"SPLITK": 1, "STREAMK": 0, "SWAP": 0, "TAILW": 0, **manifest[n]["config"]}
            size = (M, N, K)
            env = tpl.env(cfg, arch, size)
            bad = [cexpr.text for cexpr in tpl.constraints if not cexpr(env)]
            res = {"name": n, "params": cfg, "shape": [M, N, K],
                   "resources": manifest[n]["resources"]}
            if bad:
                res["status"] = "infeasible"
                res["why"] = bad
                record["results"].append(res)
                continue
            L = tpl.launch(cfg, arch, size)
            maps = []
            for buf, box, swizzle in tpl.map_boxes(env):
                if not all(box):   # a zero extent: this configuration does not use the map
                    maps.append(bytes(128))
                    continue
                t = {"A": a, "B": b, "C": c}[buf]
                rows_, cols_ = t.shape
                maps.append(tma.encode_tiled_2d(t.data_ptr(), rows_, cols_, t.stride(0) * 2,
                                                box[0], box[1], swizzle))
            ws_bytes = tpl.workspace_bytes(cfg, arch, size)
            ws_clean = tpl.workspace_clean_bytes(cfg, arch, size)
            ws = torch.zeros(max(ws_bytes, 16), dtype=torch.uint8, device=dev)
            args = [ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()),
                    ctypes.c_void_p(c.data_ptr()), ctypes.c_int(M), ctypes.c_int(N),
                    ctypes.c_int(K), ctypes.c_void_p(ws.data_ptr()), *maps]
            fn = funcs[n][1]

            def ours():
                tma.launch(fn, L.grid, L.block, L.smem, L.cluster, args, stream=stream)

            if profile:   # one launch of ours and one of cuBLAS each, for a profiler
                ours()
                cublas()
                torch.cuda.synchronize()
                res["status"] = "profiled"
                record["results"].append(res)
                save()
                continue
            # correctness: poison (bf16 NaN), one launch, watchdog
            c.view(torch.int16).fill_(-1)
            try:
                ours()
            except Exception as e:  # noqa: BLE001
                res["status"] = "launch_failed"
                res["error"] = str(e)
                record["results"].append(res)
                save()
                print(f"{n} {M}x{N}x{K}: launch failed: {e}", flush=True)
                continue
            ev = torch.cuda.Event()
            ev.record()
            wait_or_die(ev, f"{n} {M}x{N}x{K}")
            torch.cuda.synchronize()
            out = c.float()
            finite = bool(torch.isfinite(out).all().item())
            err = ((out - ref).norm() / ref_norm).item() if finite else float("inf")
            res["rel_err"] = err
            res["rel_err_cublas"] = err_cublas
            dev_only = any(k.startswith("DEV_") for k in cfg)   # timed whatever it computes
            ok = dev_only or (finite and err < 1e-2)
            if ws_clean and bool(ws[:ws_clean].any().item()):
                ok = False
                res["workspace_dirty"] = True
            if not ok:
                res["status"] = "wrong_result"
                # where is it wrong: first bad row/col
                diff = (out - ref).abs() > (0.05 * ref.abs() + 0.5)
                diff |= ~torch.isfinite(out)
                idx = diff.nonzero()[:5].tolist()
                res["first_bad"] = idx
                res["bad_fraction"] = diff.float().mean().item()
                record["results"].append(res)
                save()
                print(f"{n} {M}x{N}x{K}: WRONG err={err:.3e} bad={res['bad_fraction']:.3f} "
                      f"first={idx}", flush=True)
                continue
            # a second launch must give the same answer (the workspace was left clean)
            c.view(torch.int16).fill_(-1)
            ours()
            torch.cuda.synchronize()
            out2 = c.float()
            err2 = ((out2 - ref).norm() / ref_norm).item() \
                if bool(torch.isfinite(out2).all().item()) else float("inf")
            if err2 >= 1e-2 and not dev_only:
                res.update(status="wrong_result", second_launch_err=err2)
                record["results"].append(res)
                save()
                print(f"{n} {M}x{N}x{K}: WRONG on the second launch err={err2:.3e}", flush=True)
                continue
            # timing, interleaved
            for _ in range(3):
                ours(); cublas()
            torch.cuda.synchronize()
            t_ours, t_cub = [], []
            for _ in range(reps):
                for which, fn_, acc in (("ours", ours, t_ours), ("cublas", cublas, t_cub)):
                    flush.zero_()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                        enable_timing=True)
                    e0.record(); fn_(); e1.record()
                    acc.append((e0, e1))
            torch.cuda.synchronize()
            t_ours = [x.elapsed_time(y) for x, y in t_ours]
            t_cub = [x.elapsed_time(y) for x, y in t_cub]
            mo, mc = statistics.median(t_ours), statistics.median(t_cub)
            res.update(status="measured", ours_ms=mo, baseline="cublas(torch.matmul)",
                       baseline_ms=mc, ratio=mc / mo, tflops=flops / mo / 1e9,
                       baseline_tflops=flops / mc / 1e9,
                       ours_spread_ms=[min(t_ours), max(t_ours)],
                       baseline_spread_ms=[min(t_cub), max(t_cub)],
                       launch={"grid": L.grid, "block": L.block, "smem": L.smem})
            record["results"].append(res)
            save()
            rows.append(res)
            print(f"{n:22s} {M}x{N}x{K}: err={err:.2e} ours={mo:.3f}ms ({res['tflops']:.0f} TF/s)"
                  f" cublas={mc:.3f}ms ({res['baseline_tflops']:.0f}) ratio={mc / mo:.3f}",
                  flush=True)
        del a, b, c, ref
        torch.cuda.empty_cache()
    record["smi_after"] = _gpu_info()
    save()
    print("\n| variant | shape | ours TF/s | cuBLAS TF/s | ratio | rel err |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in record["results"]:
        if r.get("status") == "measured":
            print(f"| {r['name']} | {'x'.join(map(str, r['shape']))} | {r['tflops']:.0f} | "
                  f"{r['baseline_tflops']:.0f} | {r['ratio']:.3f} | {r['rel_err']:.2e} |")
        else:
            print(f"| {r['name']} | {'x'.join(map(str, r.get('shape', [])))} | "
                  f"{r.get('status')} | | | {r.get('rel_err', '')} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", default=str(ROOT / "out_wgmma"))
    b.add_argument("--only", nargs="*", default=None)
    r = sub.add_parser("run")
    r.add_argument("--cubins", default=str(ROOT / "out_wgmma"))
    r.add_argument("--reps", type=int, default=50)
    r.add_argument("--hang-s", type=float, default=10.0)
    r.add_argument("--only", nargs="*", default=None)
    r.add_argument("--tag", default="", help="suffix of the JSON file name")
    r.add_argument("--sizes", nargs="*", default=None, help="MxNxK ... (default: SIZES)")
    r.add_argument("--profile", action="store_true",
                   help="launch ours and cuBLAS once per variant and size, no checks or timing "
                        "(run under ncu --kernel-name regex:'gemm|nvjet|xmma')")
    args = ap.parse_args()
    if args.cmd == "build":
        build(Path(args.out), args.only or list(VARIANTS))
    else:
        out = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
        sizes = [tuple(int(x) for x in z.lower().split("x")) for z in args.sizes or []] or None
        run(Path(args.cubins), args.reps, args.hang_s, out, args.only, args.tag, sizes,
            args.profile)


if __name__ == "__main__":
    main()
