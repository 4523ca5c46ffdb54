"""The exports run outside porter, on the GPU: for gemm_wgmma at 4096^3 and at a ragged shape,
and for rmsnorm, the `cu` standalone program, the `python` module and the `torch` op each run,
are checked against the op's reference, and are timed beside porter's own launch of the same
cubin and the vendor baseline.

    python benchmarks/export_runs.py prepare DIR      # here, no GPU: jobs, exports, cu programs
    python benchmarks/export_runs.py run DIR --out benchmarks/results/export_runs_h200.json

(run starts one process per case: `export_runs.py case DIR --case NAME --out FILE`.)

prepare: one job per case in DIR/porter.db holding one known-good configuration (the H200
tunings in benchmarks/results/, compiled here: a compile-only job), exported as cu, python and
torch; each cu file is built with nvcc -DPORTER_MAIN (where nvcc exists) into DIR/CASE/prog.
run (needs CuPy, cuda-bindings and torch; not optuna or a database): per case, porter's launch
(the measuring child's launcher over the exported cubin, as the engine measures), the python
module's launch, the torch op (out variant) and the vendor baselines are timed interleaved
repeat by repeat (L2 flushed before each, CUDA events, medians: the engine's own routine); the
cu program times itself the same way in its own process, right after. Each output is checked
against the op's reference (relative error within the op's tolerance). torch._dynamo.explain
counts graph breaks of a small compiled function around each torch op. One record per
(template, shape, format): template, format, gpu, shape, correct, time_ms, porter_ms,
time_vs_porter (export / porter), baseline, baseline_ms, ratio (vendor / export).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ARCH = "sm_90a"
_TUNED_4096 = {"BM": 128, "BN": 256, "BK": 64, "STAGES": 4, "CONSUMERS": 2, "GROUP_M": 16,
               "PERSIST": 1, "CLUSTER": 1, "EPI": 3, "SPLITK": 1, "STREAMK": 0, "SWAP": 0,
               "TAILW": 224}          # gemm_wgmma_tpl6_tuned_a_h200.json, 1.005x cuBLAS
CASES = [   # (case, template, size, params); None: the template's default configuration
    ("gemm_wgmma_4096", "gemm_wgmma", (4096, 4096, 4096), _TUNED_4096),
    ("gemm_wgmma_ragged", "gemm_wgmma", (3000, 4040, 4104), None),
    ("rmsnorm_16384x4096", "rmsnorm", (16384, 4096),     # rmsnorm_h200.json, 1.20x torch
     {"VEC": 4, "THREADS": 128, "ROWS": 1, "PER_THREAD": 0, "UNROLL": 4}),
]
OUTPUT = {"gemm": "C", "rmsnorm": "y"}


# ---- prepare (CPU) ----------------------------------------------------------------------------
def record_job(store, template: str, size, params) -> int:
    """A compile-only job holding one compiled configuration (what a port would have found)."""
    from porter.build.check import static_check
    from porter.build.compile import compile_variant
    from porter.job.jobs import make_spec, template_record, template_snapshot
    from porter.records import TrialRecord
    spec, tpl, a = make_spec(template, ARCH, ["x".join(map(str, size))], trials=1,
                             backend="compile-only")
    params = params or tpl.start_configs()[0]
    why = static_check(tpl, a, params, spec.sizes)
    if why:
        raise SystemExit(f"error: {template} {params} at {size}: {why}")
    res = compile_variant(tpl, params, a)
    if not res.ok:
        raise SystemExit(f"error: {template} does not compile: {res.log[:300]}")
    src, space = template_record(tpl)
    job = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                           snapshot=template_snapshot(tpl))
    store.record_trial(job, TrialRecord(
        number=0, params=dict(params), config_key=tpl.config_key(params), status="compiled",
        backend="compile-only", registers=res.resources.registers, cubin_key=res.key,
        message="known-good configuration from the H200 tunings in benchmarks/results"))
    store.set_job_status(job, "done", "one configuration, compiled")
    return job


def prepare(out: Path) -> None:
    import porter
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    db = f"sqlite:///{out / 'porter.db'}"
    from porter.store.base import open_store
    store = open_store(db)
    nvcc = shutil.which("nvcc")
    for case, template, size, params in CASES:
        job = porter.get_job(record_job(store, template, size, params), db)
        for fmt in ("cu", "python", "torch"):
            job.export(fmt, out / case / fmt)
        cu = next((out / case / "cu").glob("*.cu"))
        if nvcc:
            r = subprocess.run([nvcc, f"-arch={ARCH}", "-O3", "-DPORTER_MAIN", str(cu), "-o",
                                str(out / case / "prog")], capture_output=True, text=True)
            print(f"{case}: nvcc {'ok' if r.returncode == 0 else 'FAILED ' + r.stderr[-500:]}")
        print(f"{case}: job {job.id} exported to {out / case}")


# ---- run (GPU) --------------------------------------------------------------------------------
def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _check(op, state, fn, rtol) -> tuple[bool, float]:
    import cupy as cp
    op.poison(state)
    fn()
    cp.cuda.Device().synchronize()
    err = float(op.error(state))
    return err <= rtol, err


def run_case(child, case_dir: Path, size, rec_base: dict) -> list[dict]:
    import cupy as cp
    import torch
    from porter.measure.ops import get_op
    from porter.measure.ops._bf16 import torch_view
    man = json.loads((case_dir / "python" / "manifest.json").read_text())
    tpl_name, entry = man["template"], man["measurements"][0]
    L = entry["launch"]
    op = get_op("gemm" if tpl_name.startswith("gemm") else "rmsnorm")
    rtol = op.rtol
    state = op.setup(tuple(size), 1234)
    # porter: the exported cubin through the measuring child's own launcher
    py = _import(case_dir / "python" / f"{tpl_name}_tuned.py", f"{tpl_name}_tuned")
    cubin = case_dir / "python" / py.TABLE[0]["file"]
    mod = cp.RawModule(path=str(cubin))
    func = mod.get_function(py.SPEC["kernel"])
    ws = cp.zeros(max(L["workspace_bytes"], 16), dtype=cp.uint8)
    s = {"grid": L["grid"], "block": L["block"], "smem": L["smem_bytes"],
         "cluster": L["cluster"], "tensor_maps": [(m["buffer"], m["box"], m["swizzle"])
                                                  for m in L.get("tensor_maps", [])]}
    porter_fn = child._launcher(func, s, state, op.args(state, ws.data.ptr), op)
    # python module and torch op on the same buffers
    names = [a for a, k in py.SPEC["args"] if k != "workspace"]
    plain = [state[n] if n in state else None for n in names]
    dims = dict(zip(py.DIMS, size))
    args = [p if p is not None else (dims[n] if n in dims else 1e-6)
            for p, n in zip(plain, names)]
    python_fn = lambda: py.launch(*args)   # noqa: E731
    sys.path.insert(0, str(case_dir / "torch"))
    tmod = importlib.import_module(f"{tpl_name}_torch")
    ops = getattr(torch.ops.porter, tpl_name)
    ops_out = getattr(torch.ops.porter, f"{tpl_name}_out")
    if op.name == "gemm":
        ta, tb, tc = (torch_view(state[k]) for k in "ABC")
        torch_fn = lambda: ops_out(ta, tb, tc)     # noqa: E731
        functional = lambda: tc.copy_(ops(ta, tb))  # noqa: E731
        compiled_arg = (ta, tb)
    else:
        cols = size[1]
        tx, tw, ty = torch_view(state["x"]), torch_view(state["w"]).view(cols), \
            torch_view(state["y"])
        torch_fn = lambda: ops_out(tx, tw, 1e-6, ty)   # noqa: E731
        functional = lambda: ty.copy_(ops(tx, tw, 1e-6))  # noqa: E731
        compiled_arg = (tx, tw)
    checks = {"porter": _check(op, state, porter_fn, rtol),
              "python": _check(op, state, python_fn, rtol),
              "torch": _check(op, state, torch_fn, rtol),
              "torch_functional": _check(op, state, functional, rtol)}
    bases = op.baselines(state)
    times = child.time_interleaved([porter_fn, python_fn, torch_fn, *bases.values()])
    meds = [statistics.median(t) for t in times]
    porter_ms, python_ms, torch_ms = meds[:3]
    base = dict(zip(bases, meds[3:]))
    base_name = min(base, key=base.get)
    base_ms = base[base_name]
    # the cu program, in its own process right after (it times itself the same way)
    cu = {"correct": False, "time_ms": None, "note": "no program (nvcc absent where prepared)"}
    prog = case_dir / "prog"
    if not prog.exists() and shutil.which("nvcc"):
        src = next((case_dir / "cu").glob("*.cu"))
        subprocess.run(["nvcc", f"-arch={ARCH}", "-O3", "-DPORTER_MAIN", str(src), "-o",
                        str(prog)], check=False)
    if prog.exists():
        r = subprocess.run([str(prog), "x".join(map(str, size))], capture_output=True,
                           text=True, timeout=300)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("{")), None)
        cu = json.loads(line) if line else {"correct": False, "time_ms": None,
                                            "note": (r.stdout + r.stderr)[-500:]}
    # torch.compile: graph breaks of a small function around the op
    import torch._dynamo as dynamo
    dynamo.reset()
    if op.name == "gemm":
        def small(a, b):
            return (getattr(torch.ops.porter, tpl_name)(a, b).float() * 2).sum()
    else:
        def small(x, w):
            return getattr(torch.ops.porter, tpl_name)(x, w, 1e-6).float().abs().mean()
    explain = dynamo.explain(small)(*compiled_arg)
    eager = small(*compiled_arg)
    try:
        compiled = torch.compile(small, fullgraph=True)(*compiled_arg)
        compile_ok = bool(torch.allclose(eager, compiled, rtol=1e-3))
    except Exception as e:  # noqa: BLE001 - recorded: a graph break fails fullgraph
        compile_ok = f"torch.compile(fullgraph=True) failed: {str(e)[:300]}"
    out = []
    common = dict(rec_base, template=tpl_name, shape=list(size), params=entry["params"],
                  porter_ms=porter_ms, baseline=base_name, baseline_ms=base_ms,
                  porter_ratio=base_ms / porter_ms, porter_correct=checks["porter"][0])
    for fmt, ok_err, ms in (("cu", (cu.get("correct"), cu.get("error")), cu.get("time_ms")),
                            ("python", checks["python"], python_ms),
                            ("torch", checks["torch"], torch_ms)):
        rec = dict(common, format=fmt, correct=bool(ok_err[0]), error=ok_err[1], time_ms=ms,
                   time_vs_porter=ms / porter_ms if ms else None,
                   ratio=base_ms / ms if ms else None)
        if fmt == "cu":
            rec["timed"] = "its own process (-DPORTER_MAIN), right after the interleaved run"
            rec["note"] = cu.get("note")
        if fmt == "torch":
            rec.update(functional_correct=checks["torch_functional"][0],
                       graph_breaks=explain.graph_break_count, graphs=explain.graph_count,
                       compiled_matches_eager=compile_ok)
        out.append(rec)
    return out


def run_one(out_dir: Path, case: str, result: Path) -> None:
    """One case in this process (its torch op registers `porter::TEMPLATE` once per process:
    each case runs in a process of its own)."""
    from porter.measure.backends.gpu_child import Child
    child = Child({"seed": 0, "min_repeats": 20, "max_repeats": 400, "target_ms": 200.0})
    dev = child.device
    size = next(c[2] for c in CASES if c[0] == case)
    base = {"arch": ARCH, "gpu": dev.get("gpu"), "driver": dev.get("driver"),
            "date": datetime.date.today().isoformat()}
    result.write_text(json.dumps({"records": run_case(child, out_dir / case, size, base),
                                  "device": dev}, default=str))


def run(out_dir: Path, result: Path) -> None:
    records, errors, device = [], {}, {}
    for case, _, _, _ in CASES:
        part = out_dir / f"{case}.result.json"
        part.unlink(missing_ok=True)
        r = subprocess.run([sys.executable, __file__, "case", str(out_dir), "--case", case,
                            "--out", str(part)], capture_output=True, text=True, timeout=400)
        if r.returncode == 0 and part.exists():
            data = json.loads(part.read_text())
            records += data["records"]
            device = device or data["device"]
        else:
            errors[case] = (r.stdout + r.stderr)[-3000:]
        result.write_text(json.dumps({"records": records, "errors": errors, "device": device},
                                     indent=1, default=str))
    for r in records:
        print(f"{r['template']:11s} {'x'.join(map(str, r['shape'])):>16s} {r['format']:6s} "
              f"correct={r['correct']} export/porter={r['time_vs_porter'] or 0:.3f} "
              f"vendor/export={r['ratio'] or 0:.3f}"
              + (f" graph_breaks={r['graph_breaks']}" if r["format"] == "torch" else ""))
    for case, tail in errors.items():
        print(f"{case}: FAILED\n{tail}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=("prepare", "run", "case"))
    p.add_argument("dir", type=Path)
    p.add_argument("--case", help="with `case`: the one case to run in this process")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                   "export_runs_h200.json")
    a = p.parse_args()
    if a.step == "prepare":
        prepare(a.dir)
    elif a.step == "case":
        run_one(a.dir, a.case, a.out)
    else:
        run(a.dir, a.out)


if __name__ == "__main__":
    main()
