"""Where a gemm_wgmma kernel's time goes: each configuration is built a second time with
DEV_TRACE=1 (porter/include/hopper/trace.cuh), launched once after an L2 flush, and every CTA's
timeline (%globaltimer at its entry, first full stage, k-loop end, epilogue issued, stores
drained, exit) is read back; the untraced build is timed interleaved with cuBLAS in the same
process for the figure the phases add up to. A development tool on a GPU machine:

    python benchmarks/gemm_trace.py --out DIR --probes FILE.json [--template gemm_fp8]

FILE.json as gemm_probe.py's ({"MxNxK": [{param: value, ...}], ...}, BASE filling the rest);
with --template gemm_fp8 the sizes are MxNxKxSCALINGxACCUM, BASE fills the parameters gemm_fp8
shares with it (the same values as gemm_fp8's plain configuration), the template's defaults the
rest, and the baseline is torch._scaled_mm of the same accumulation (gemm_fp8 stamps the same
slots; its k-tile slots only in the loop without PSETS 2 or PSPLIT 2).
Writes DIR/gemm_trace.json: `records`, one per (shape, configuration), with `gpu`, `shape`,
`params`, `ours_ms`, `baseline_ms`, `ratio` (event-timed, untraced) and two timelines:
`traced` (after an L2 flush, as timed) and `warm` (the launch right after it). Each has
`phases_us` (median, max, min over CTAs of each phase), `span_us` (first entry to last end)
and `raw` (per CTA: the slots in ns from the first entry).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gemm_probe import _compile, configs  # noqa: E402

SLOTS = 32
# slot: what kernel.cu's TRACE(...) stamps there
NAMES = ("entry first_load c0_data c0_kend c0_epi c1_data c1_kend c1_epi c0_last_kend c0_last_epi "
         "c0_drained exit c0_items smid loads_done c0_last_data synced p_regs p_prefetched "
         "p_acquired c0_regs c0_data2 c0_refill c0_data_last p_drained").split()
ENTRY, FIRST_LOAD, C0_DATA, C0_KEND, C0_EPI, C1_DATA, C1_KEND, C1_EPI, C0_LAST_KEND, \
    C0_LAST_EPI, C0_DRAINED, EXIT, C0_ITEMS, SMID, LOADS_DONE, C0_LAST_DATA, SYNCED, P_REGS, \
    P_PREFETCHED, P_ACQUIRED, C0_REGS, C0_DATA2, C0_REFILL, C0_DATA_LAST, P_DRAINED = \
    range(len(NAMES))
# phases: (name, from slot, to slot)
PHASES = [("launch_skew", None, ENTRY), ("to_synced", ENTRY, SYNCED),
          ("synced_to_p_regs", SYNCED, P_REGS), ("prefetch", P_REGS, P_PREFETCHED),
          ("to_acquired", P_PREFETCHED, P_ACQUIRED), ("acquired_to_load", P_ACQUIRED, FIRST_LOAD),
          ("synced_to_c0_regs", SYNCED, C0_REGS), ("to_first_load", ENTRY, FIRST_LOAD),
          ("load_to_data", FIRST_LOAD, C0_DATA), ("data1_to_data2", C0_DATA, C0_DATA2),
          ("data_to_refill", C0_DATA, C0_REFILL), ("refill_to_last", C0_REFILL, C0_DATA_LAST),
          ("last_data_to_kend", C0_DATA_LAST, C0_KEND),
          ("first_data", ENTRY, C0_DATA), ("kloop_first", C0_DATA, C0_KEND),
          ("epi_first", C0_KEND, C0_EPI), ("c1_vs_c0_kend", C0_KEND, C1_KEND),
          ("kloop_last", C0_LAST_DATA, C0_LAST_KEND), ("epi_last", C0_LAST_KEND, C0_LAST_EPI),
          ("drain", C0_LAST_EPI, C0_DRAINED), ("to_exit", C0_DRAINED, EXIT),
          ("loads_to_p_drained", LOADS_DONE, P_DRAINED),
          ("cta_total", ENTRY, "end")]


def phases(trace, nctas: int) -> dict:
    rows = [list(map(int, trace[i * SLOTS:(i + 1) * SLOTS])) for i in range(nctas)]
    rows = [r + [max(r[EXIT], r[C0_DRAINED])] for r in rows if r[ENTRY]]   # "end": the CTA's
    t0 = min(r[ENTRY] for r in rows)
    col = {"end": SLOTS}
    out = {}
    for name, a, b in PHASES:
        a, b = col.get(a, a), col.get(b, b)
        vals = [(r[b] - (t0 if a is None else r[a])) / 1e3 for r in rows
                if r[b] and (a is None or r[a])]
        if vals:
            out[name] = {"median": round(statistics.median(vals), 3), "max": round(max(vals), 3),
                         "min": round(min(vals), 3)}
    items = [r[C0_ITEMS] for r in rows]
    raw = [[(v - t0) if (j not in (C0_ITEMS, SMID) and v) else v for j, v in enumerate(r)]
           for r in rows]
    return {"ctas": len(rows), "span_us": round((max(r[SLOTS] for r in rows) - t0) / 1e3, 3),
            "items_max": max(items), "items_min": min(items), "phases_us": out, "raw": raw}


def builds(cfg) -> list[tuple[str, dict]]:
    """The untraced build (timed) and the traced one (its timeline)."""
    return [("plain", cfg), ("traced", {**cfg, "DEV_TRACE": 1})]


def show(tag, shape, ph):
    print(f"{tag:>8s} {'x'.join(map(str, shape)):>16s} span {ph['span_us']:6.1f} | " + " ".join(
        f"{k} {v['median']:.2f}/{v['max']:.2f}" for k, v in ph["phases_us"].items()), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--probes", required=True)
    ap.add_argument("--template", default="gemm_wgmma")
    args = ap.parse_args(argv)
    import cupy as cp
    from porter.build.compile import compile_variant
    from porter.measure.backends.gpu_child import Child
    from porter.measure.ops import make_op
    from porter.spec.arch import get_arch
    from porter.spec.template import find_template

    tpl = find_template(args.template)
    child = Child(dict(seed=123, min_repeats=10, max_repeats=200, target_ms=40.0))
    dev = child.device
    arch = get_arch("sm_90a").with_sms(int(dev.get("sms") or 132))
    op = make_op(tpl.op, str(tpl.folder))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    items = configs(json.loads(Path(args.probes).read_text()), tpl.name)
    # every build compiled up front in parallel (compile_variant's cache serves them below)
    with ProcessPoolExecutor(min(12, os.cpu_count() or 2)) as ex:
        list(ex.map(_compile, [(c, arch.sms, tpl.name) for _, cfg in items
                               for _, c in builds(cfg)]))
    records = []
    for shape, cfg in items:
        rec = {"gpu": dev.get("gpu", ""), "driver": dev.get("driver", ""),
               "date": datetime.date.today().isoformat(), "shape": list(shape), "params": cfg}
        records.append(rec)
        state = child.state(op, shape)
        launch = tpl.launch(cfg, arch, shape)
        env = tpl.env(cfg, arch, shape)
        s = {"grid": launch.grid, "block": launch.block, "smem": launch.smem,
             "cluster": launch.cluster, "tensor_maps": tpl.map_boxes(env)}
        ws = cp.zeros(max(tpl.workspace_bytes(cfg, arch, shape), 16), dtype=cp.uint8)
        fns = {}
        for tag, c in builds(cfg):
            comp = compile_variant(tpl, c, arch)
            if not comp.ok:
                rec.update(status="compile_failed", reason=(comp.log or "")[-300:])
                break
            mod = cp.RawModule(path=comp.cubin_path)
            fn = child._launcher(mod.get_function(tpl.kernel), s, state,
                                 op.args(state, ws.data.ptr), op)
            if isinstance(fn, str):
                rec.update(status="launch_failed", reason=fn)
                break
            fns[tag] = (mod, fn)
        if "status" in rec:
            continue
        times = child.time_interleaved([fns["plain"][1], *op.baselines(state).values()])
        ours = statistics.median(times[0])
        base = min(statistics.median(t) for t in times[1:])
        rec.update(status="measured", ours_ms=ours, baseline_ms=base, ratio=base / ours,
                   grid=list(launch.grid), cluster=list(launch.cluster))
        print(f"{'x'.join(map(str, shape)):>16s} {rec['ratio']:.3f} ours {ours * 1e3:7.1f} us "
              f"baseline {base * 1e3:7.1f} us {dict((k, v) for k, v in cfg.items() if v)}",
              flush=True)
        nctas = launch.grid[0] * launch.grid[1] * launch.grid[2]
        # traced: once after an L2 flush (as timed), once right after (code and data warm)
        for tag, flush in (("traced", True), ("warm", False)):
            mod, fn = fns["traced"]
            op.poison(state)
            glob = mod.get_global("porter_trace")
            arr = cp.ndarray((1024 * SLOTS,), dtype=cp.uint64, memptr=glob)
            try:   # the table's 256 bytes of static smem may not fit beside the largest rings
                fn()
                arr.fill(0)
                if flush:
                    child.flush.fill(7)
                fn()
                cp.cuda.Device().synchronize()
            except Exception as e:  # noqa: BLE001 - this build's launch failed: say so, go on
                rec[tag] = {"status": "launch_failed", "reason": str(e)[:200]}
                break
            ph = phases(arr[:nctas * SLOTS].get().tolist(), nctas)
            if tag == "traced":
                rec["error"] = op.error(state)
            rec[tag] = ph
            show(tag, shape, ph)
        (out / "gemm_trace.json").write_text(json.dumps(
            {"benchmark": "gemm_trace", "slots": NAMES, "records": records}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
