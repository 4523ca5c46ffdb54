"""gemm_fp8.py --ab: the picks timed as two copies of the template in one process, a development
check of whether a change to the kernel moved anything (gemm_fp8_ab_h100.json)."""
from __future__ import annotations

import datetime
import json

from gemm_fp8 import _short, device_names


def do_ab(r, other, out, picks):
    """Each pick of every shape and mode timed as this template and as `other` (an earlier
    copy) interleaved with both baselines in one run: DIR/ab.json."""
    from porter.measure.ops.gemm_fp8 import scaled_mm
    gpu, drv = device_names()
    rows = []
    for (M, N, K, scaling, accum), cfgs in sorted(picks.items()):
        size = (M, N, K, scaling, accum)
        state = r.op.setup(size, seed=23)
        for cfg in cfgs:
            if not r.feasible(cfg, size):
                continue
            ms = r.time([r.launcher(cfg, size, state), other.launcher(cfg, size, state),
                         scaled_mm(state, True), scaled_mm(state, False)])
            base = ms[2] if accum == 1 else ms[3]
            rows.append({"gpu": gpu, "size": list(size), "params": cfg, "ours_ms": ms[0],
                         "other_ms": ms[1], "baseline_ms": base, "ratio": base / ms[0],
                         "other_ratio": base / ms[1], "gain": ms[1] / ms[0]})
            print(f"ab {size} {_short(cfg)}: ratio {base / ms[0]:.3f} other {base / ms[1]:.3f} "
                  f"gain {ms[1] / ms[0]:.3f}", flush=True)
        del state
        (out / "ab.json").write_text(json.dumps(
            {"driver": drv, "other": str(other.tpl.folder),
             "date": datetime.date.today().isoformat(), "records": rows}, indent=1))
    return rows
