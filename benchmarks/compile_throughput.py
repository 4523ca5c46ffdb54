"""Compile throughput of a template's variants through NVRTC on this machine: distinct feasible
configurations compiled cold (empty cache) by a process pool of one worker per core.

    python benchmarks/compile_throughput.py [--template gemm_mma] [--arch sm_90a] [--n 48]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from porter.spec.arch import get_arch  # noqa: E402
from porter.build.check import static_check  # noqa: E402
from porter.build.compile import compile_variant, nvrtc_version  # noqa: E402
from porter.spec.template import find_template  # noqa: E402


def _one(args):
    name, arch, config = args
    r = compile_variant(find_template(name), config, get_arch(arch), use_cache=False)
    return r.ok, r.seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", default="gemm_mma")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--out", default="benchmarks/results/compile_throughput.json")
    a = ap.parse_args()
    tpl, arch = find_template(a.template), get_arch(a.arch)
    feasible = [c for c in tpl.iter_configs()
                if static_check(tpl, arch, c, tpl.default_sizes) is None]
    configs = random.Random(0).sample(feasible, min(a.n, len(feasible)))
    cores = os.cpu_count() or 1
    os.environ["PORTER_CACHE_DIR"] = tempfile.mkdtemp()
    t0 = time.perf_counter()
    with ProcessPoolExecutor(cores) as pool:
        results = list(pool.map(_one, [(a.template, a.arch, c) for c in configs]))
    wall = time.perf_counter() - t0
    ok = sum(1 for r in results if r[0])
    rec = {"template": a.template, "arch": a.arch, "date": datetime.date.today().isoformat(),
           "machine": f"{platform.processor() or platform.machine()}, {cores} cores",
           "nvrtc": nvrtc_version(), "variants": len(configs), "compiled_ok": ok,
           "wall_s": wall, "variants_per_s": len(configs) / wall,
           "variants_per_s_per_core": len(configs) / wall / cores,
           "mean_compile_s": sum(r[1] for r in results) / len(results)}
    Path(a.out).write_text(json.dumps(rec, indent=1) + "\n")
    print(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
