"""Which kernels the baselines launch (torch profiler names: cuBLAS/cuBLASLt encode tile,
cluster and schedule in them), for the fp8 modes and bf16 shapes the sweep finds weak. A
development probe on a GPU: it says what ours is measured against, not how fast.

    python benchmarks/baseline_kernels.py --out DIR   # DIR/baseline_kernels.json
    python benchmarks/baseline_kernels.py --out DIR --bf16 1000x3000x1000,... --no-fp8
        # those bf16 shapes only: gemm_sweep.py --vendor-kernels DIR/baseline_kernels.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FP8 = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 28672, 8192), (4096, 8192, 28672)]
BF16 = [(1000, 3000, 1000), (3000, 5000, 1000), (1536, 1536, 1536), (7000, 9000, 3000),
        (3000, 4000, 4104), (4096, 4096, 4096)]


def kernels_of(fn) -> list[str]:
    """Names of the CUDA kernels one call of fn launches (after a warm-up call)."""
    import torch
    from porter.measure.backends.gpu_child import kernel_names
    return kernel_names(fn, torch.cuda.synchronize)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--bf16", default=None, help="comma-separated MxNxK (default: BF16)")
    ap.add_argument("--no-fp8", action="store_true", help="the bf16 shapes only")
    args = ap.parse_args(argv)
    bf16 = [tuple(int(x) for x in s.split("x")) for s in args.bf16.split(",")] \
        if args.bf16 else BF16
    import torch
    from porter.measure.ops import get_op
    from porter.measure.ops.gemm_fp8 import scaled_mm
    op = get_op("gemm_fp8")
    rows = []
    for M, N, K in ([] if args.no_fp8 else FP8):
        for scaling in (1, 2):
            state = op.setup((M, N, K, scaling, 1), seed=3)
            for fast in (True, False):
                rows.append({"op": "gemm_fp8", "shape": [M, N, K],
                             "scaling": "per-tensor" if scaling == 1 else "per-row/column",
                             "use_fast_accum": fast, "kernels": kernels_of(scaled_mm(state, fast))})
                print(rows[-1], flush=True)
            del state
    for M, N, K in bf16:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        rows.append({"op": "gemm_bf16", "shape": [M, N, K], "call": "torch.matmul(a, b.t())",
                     "kernels": kernels_of(lambda: torch.matmul(a, b.t()))})
        print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "baseline_kernels.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
         "date": datetime.date.today().isoformat(), "records": rows}, indent=1))


if __name__ == "__main__":
    main()
