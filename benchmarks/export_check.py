"""Round trip of the `python` export on a GPU: the exported module, loaded with CuPy, gives the
same output as the engine's best variant and a time within a few percent of it.

    python benchmarks/export_check.py --db sqlite:///DIR/porter.db --job 1 --out DIR
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from porter.export import export  # noqa: E402
from porter.store import open_store  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--job", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    store = open_store(a.db)
    out = Path(a.out) / "export_python"
    export(store, a.job, "python", out)
    mod_path = next(out.glob("*_tuned.py"))
    spec = importlib.util.spec_from_file_location("tuned", mod_path)
    tuned = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tuned)

    import cupy as cp
    from porter.ops.gemm import GemmOp
    from porter.ops._bf16 import from_bf16, rel_error
    op = GemmOp()
    rows = []
    for entry in tuned.TABLE:
        size = tuple(entry["size"])
        st = op.setup(size, seed=7)
        M, N, K = size
        args = (st["A"], st["B"], st["C"], cp.int32(M), cp.int32(N), cp.int32(K))
        st["C"].fill(0xFFFF)
        tuned.launch(*args, size=size)
        cp.cuda.Device().synchronize()
        err = rel_error(from_bf16(st["C"]), st["ref"])
        ts = []
        for _ in range(30):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            tuned.launch(*args, size=size)
            e.record()
            e.synchronize()
            ts.append(cp.cuda.get_elapsed_time(s, e))
        best = next(t for t in store.best_trials(a.job, 1000)
                    if t.params == entry["params"])
        engine_ms = next(m.ours_ms for m in best.measurements if m.size == size)
        ms = statistics.median(ts[5:])
        rows.append({"size": list(size), "params": entry["params"], "error": err,
                     "export_ms": ms, "engine_ms": engine_ms, "time_ratio": ms / engine_ms})
        print(rows[-1], flush=True)
    rec = {"check": "python export round trip", "date": datetime.date.today().isoformat(),
           "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "job": a.job,
           "rows": rows, "note": "export_ms times launches back to back without an L2 flush; "
           "engine_ms is the engine's flushed median"}
    (Path(a.out) / "export_check.json").write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
