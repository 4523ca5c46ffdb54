"""Round trip of the `python` export on a GPU: the exported module, launched through
cuda-bindings in a fresh process, gives the same output as the engine's best variant on the
same inputs and a time within 5% of it, measured side by side in one process.

    python benchmarks/export_check.py --out DIR                   # short GPU ports, then the check
    python benchmarks/export_check.py --out DIR --db URL --job 3  # an existing measured job
    python benchmarks/export_check.py --out DIR --backend compile-only   # no GPU: port, export,
                                                                         # import; no launch

Steps (DIR/export_check.json is rewritten after each, so a run cut short still says how far it
got; every failure ends the run with one line `error: ...` and exit status 1):

1. `porter port` (a subprocess with a timeout) of rmsnorm at 32768x8192 and gemm_mma at 4096^3
   with a few trials each on the GPU backend, into a fresh SQLite database in DIR.
2. Per job, `porter export` to `python`, `cu`, `cubin` and `fatbin` (NVRTC only, no CUDA). The
   exported cubin must equal the engine's cached cubin byte for byte, and the `cu` file must
   compile on its own (NVRTC, -DPORTER_NO_HOST).
3. The module is imported by an isolated interpreter (`python -I`: neither porter nor the
   checkout on the path) that checks its table and geometry without a GPU.
4. A fresh process imports the module (before anything of porter), sets up the op's inputs, runs
   the engine's best variant exactly as the measuring child does (its cubin, launcher and
   workspace) and the module's `launch`, compares the outputs bit for bit (bf16 bits; the max
   absolute difference and both errors against the op's reference are kept), then times both
   with the engine's own timing routine (warm-up, L2 flushed before every repeat, CUDA events),
   alternating five rounds of each, and takes the medians. Pass: identical bits (or, only for a
   kernel whose own output differs run to run, both within the op's tolerance of the reference)
   and |export/engine - 1| <= 5%.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _scripting import (Failed, Report, check_packages, child_env, fail,  # noqa: E402
                        last_line, run)
PORTS = (("rmsnorm", "32768x8192", 6), ("gemm_mma", "4096x4096x4096", 6))
FORMATS = ("python", "cu", "cubin", "fatbin")
OUTPUT = {"gemm": "C", "rmsnorm": "y"}       # the op's output buffer
TOLERANCE = 0.05




def preflight(backend: str) -> None:
    check_packages(backend)


# ---- steps 1 and 2: port and export (this process never initialises CUDA) --------------------
def port(args, rep: Report, env: dict, deadline: float) -> list[int]:
    from porter.store.base import open_store
    jobs = []
    for item in args.ports.split(","):
        name, size, trials = item.split(":")
        log = args.out / f"port_{name}.log"
        cmd = [sys.executable, "-m", "porter.cli", "port", name, "--arch", args.arch,
               "--sizes", size, "--trials", str(trials), "--backend", args.backend,
               "--db", args.db, "--seed", "0"]
        t0 = time.monotonic()
        rc = run(cmd, min(args.port_timeout, deadline - time.monotonic()), log, env)
        store = open_store(args.db)
        job = max((j.id for j in store.list_jobs(100) if j.template_name == name), default=None)
        rep["ports"] = rep.data.get("ports", []) + [{"template": name, "size": size,
                                                     "trials": trials, "job": job, "rc": rc,
                                                     "wall_s": round(time.monotonic() - t0, 1),
                                                     "log": log.name}]
        if rc is None:
            raise Failed(f"porter port {name} ran past its time limit; see {log}")
        if rc != 0 or job is None:
            raise Failed(f"porter port {name} failed (exit {rc}): {last_line(log)}")
        trials_ = store.trials(job)
        if args.backend == "gpu" and not any(t.status == "measured" and t.backend == "gpu"
                                             for t in trials_):
            why = "no GPU of this architecture here" if all(
                t.backend != "gpu" for t in trials_) else "no trial was measured"
            raise Failed(f"porter port {name} measured nothing on the GPU ({why}); see {log}")
        jobs.append(job)
    return jobs


def export_job(args, rep: Report, job: int) -> dict:
    from porter.spec.arch import get_arch
    from porter.build.compile import BASE_OPTIONS, _nvrtc_compile, compile_variant
    from porter.export.export import _variant_name, export, tuning_table
    from porter.store.base import open_store
    store = open_store(args.db)
    tpl, arch, rows = tuning_table(store, job)
    out = args.out / "export" / f"job{job}_{tpl.name}"
    entry = {"job": job, "template": tpl.name, "arch": arch, "dir": str(out), "formats": {}}
    for fmt in FORMATS:
        paths = export(store, job, fmt, out / fmt)
        entry["formats"][fmt] = sorted(p.name for p in paths)
    a = get_arch(arch)
    for r in rows:      # the exported cubin is the one the engine measured
        res = compile_variant(tpl, r["params"], a)
        name = f"{_variant_name(tpl, r['params'])}.{arch}.cubin"
        if (out / "cubin" / name).read_bytes() != Path(res.cubin_path).read_bytes():
            raise Failed(f"job {job}: exported {name} differs from the engine's cubin")
    for cu in sorted((out / "cu").glob("*.cu")):   # the standalone source compiles alone
        ok, log, _ = _nvrtc_compile(cu.read_text(), cu.name, [
            *BASE_OPTIONS, f"--gpu-architecture={arch}", "-DPORTER_NO_HOST"])
        if not ok:
            first = next((ln for ln in log.splitlines() if "error" in ln), log[:200])
            raise Failed(f"job {job}: exported {cu.name} does not compile: {first.strip()}")
    entry["cubin_matches_engine"] = True
    entry["cu_compiles"] = True
    return entry


ISOLATED = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("tuned", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
import os
e = m.TABLE[0]
assert os.path.isfile(os.path.join(m._HERE, e["file"])), e["file"]
g = m.geometry(e, e["size"])
man = json.load(open(os.path.join(m._HERE, "manifest.json")))
L = next(x["launch"] for x in man["measurements"] if x["size"] == e["size"])
assert list(g[0]) == L["grid"] and list(g[1]) == L["block"] and g[2] == L["smem_bytes"], g
assert m.nearest(e["size"]) is e
print(json.dumps({"kernel": m.SPEC["kernel"], "arch": m.SPEC["arch"], "entries": len(m.TABLE),
                  "porter_loaded": any(k.split(".")[0] == "porter" for k in sys.modules)}))
"""


def isolated_import(module: Path) -> dict:
    """Imports the module in `python -I` (no PYTHONPATH, no checkout on the path)."""
    p = subprocess.run([sys.executable, "-I", "-B", "-c", ISOLATED, str(module)], cwd="/",
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise Failed(f"the exported module {module.name} does not import on its own: {tail}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    if res["porter_loaded"]:
        raise Failed(f"the exported module {module.name} imports porter")
    return res


# ---- step 4: the fresh process (CUDA lives only here) -----------------------------------------
def roundtrip(module: str, db: str, job: int, rounds: int) -> dict:
    spec = importlib.util.spec_from_file_location("tuned", module)
    tuned = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tuned)
    porter_first = any(k.split(".")[0] == "porter" for k in sys.modules)
    sys.path.insert(0, str(ROOT))
    import statistics
    import cupy as cp
    from porter.spec.arch import get_arch
    from porter.measure.backends.gpu_child import Child, _np_args
    from porter.build.compile import compile_variant
    from porter.measure.ops import get_op
    from porter.measure.ops._bf16 import from_bf16
    from porter.store.base import open_store
    from porter.spec.template import find_template

    store = open_store(db)
    info = store.get_job(job)
    tpl, arch = find_template(info.spec.template), get_arch(info.spec.arch)
    child = Child({"seed": 0, "min_repeats": 20, "max_repeats": 200, "target_ms": 40.0})
    op = get_op(tpl.op)
    op.configure(str(tpl.folder))
    rows = []
    for entry in tuned.TABLE:
        size, params = tuple(entry["size"]), entry["params"]
        state = op.setup(size, seed=7)
        out = state[OUTPUT[tpl.op]]
        # the engine's variant, launched by the measuring child's own code
        res = compile_variant(tpl, params, arch)
        mod = cp.RawModule(path=res.cubin_path)
        func = mod.get_function(tpl.kernel)
        launch = tpl.launch(params, arch, size)
        ws_bytes = tpl.workspace_bytes(params, arch, size)
        ws = cp.zeros(max(ws_bytes, 16), dtype=cp.uint8)
        s = {"grid": launch.grid, "block": launch.block, "smem": launch.smem,
             "cluster": launch.cluster, "tensor_maps": []}
        engine = child._launcher(func, s, state, op.args(state, ws.data.ptr), op)
        if isinstance(engine, str):
            raise Failed(f"{tpl.name}: the engine's variant cannot launch: {engine}")
        # the exported module, on the same buffers (it brings its own workspace)
        xargs = tuple(_np_args(op.args(state, 0)))
        if any(kind == "workspace" for _, kind in tuned.SPEC["args"]):
            xargs = xargs[:-1]

        def export():
            tuned.launch(*xargs, size=size)

        def result(fn):
            op.poison(state)
            fn()
            cp.cuda.Device().synchronize()
            return out.copy(), op.error(state)

        out_engine, err_engine = result(engine)
        out_engine2, _ = result(engine)
        out_export, err_export = result(export)
        identical = bool(cp.array_equal(out_engine, out_export))
        # a kernel that accumulates with atomics in no fixed order (gemm_mma's split-K with
        # SPLITK > 2) differs from itself run to run; then only the tolerance can be asked
        repeatable = bool(cp.array_equal(out_engine, out_engine2))
        rtol = tpl.rtol or op.rtol
        agrees = identical or (not repeatable and err_engine <= rtol and err_export <= rtol)
        diff = float(cp.abs(from_bf16(out_engine) - from_bf16(out_export)).max())
        for fn in (engine, export, engine, export):     # warm-up (clocks, caches, module load)
            fn()
        cp.cuda.Device().synchronize()
        t_engine, t_export = [], []
        for _ in range(rounds):                         # side by side, alternating
            t_engine += child.time_fn(engine)
            t_export += child.time_fn(export)
        engine_ms, export_ms = statistics.median(t_engine), statistics.median(t_export)
        recorded = next((m.ours_ms for t in store.trials(job, "measured")
                         if t.params == params for m in t.measurements
                         if tuple(m.size) == size), None)
        rows.append({"template": tpl.name, "size": list(size), "params": params,
                     "bitwise_identical": identical, "engine_repeatable": repeatable,
                     "outputs_agree": agrees, "comparison": "bitwise" if repeatable else
                     f"within the op's tolerance {rtol:g} (the engine's own output varies run "
                     "to run)", "max_abs_diff": diff,
                     "error_engine": err_engine, "error_export": err_export,
                     "engine_ms": engine_ms, "export_ms": export_ms,
                     "ratio_export_over_engine": export_ms / engine_ms,
                     "repeats": [len(t_engine), len(t_export)],
                     "spread_engine": _spread(t_engine), "spread_export": _spread(t_export),
                     "engine_recorded_ms": recorded, "module_imported_before_porter":
                     not porter_first})
    dev = child.device
    return {"rows": rows, "gpu": dev.get("gpu"), "driver": dev.get("driver"),
            "cuda_driver": dev.get("cuda_driver"), "cupy": dev.get("cupy")}


def _spread(ts: list[float]) -> float:
    import statistics
    q = statistics.quantiles(ts, n=10)
    return (q[-1] - q[0]) / statistics.median(ts)


# ---- the orchestration -------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--db", help="existing database (with --job); default: a fresh one in --out")
    ap.add_argument("--job", type=int, action="append", help="existing job(s) to check")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--backend", default="gpu", choices=("gpu", "compile-only"))
    ap.add_argument("--cache", type=Path, default=Path("/tmp/porter-export-check-cache"),
                    help="compile cache (PORTER_CACHE_DIR) shared by the ports and the check")
    ap.add_argument("--budget-s", type=float, default=170.0, help="wall limit for everything")
    ap.add_argument("--port-timeout", type=float, default=75.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ports", default=",".join(f"{t}:{s}:{n}" for t, s, n in PORTS),
                    help="TEMPLATE:SIZE:TRIALS,... to port (default %(default)s)")
    ap.add_argument("--roundtrip", nargs=3, metavar=("MODULE", "DB", "JOB"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.roundtrip:     # step 4, in its own process
        res = roundtrip(a.roundtrip[0], a.roundtrip[1], int(a.roundtrip[2]), a.rounds)
        print("ROUNDTRIP " + json.dumps(res), flush=True)
        return 0

    t_start = time.monotonic()
    deadline = t_start + a.budget_s
    a.out.mkdir(parents=True, exist_ok=True)
    a.out = a.out.resolve()
    if a.job and a.db is None:
        print("error: --job needs --db", file=sys.stderr)
        return 2
    if a.db is None:
        dbfile = a.out / "export_check.db"
        for p in (dbfile, dbfile.with_suffix(".db-wal"), dbfile.with_suffix(".db-shm")):
            p.unlink(missing_ok=True)
        a.db = f"sqlite:///{dbfile}"
    rep = Report(a.out / "export_check.json", check="python export round trip",
                 date=datetime.datetime.now().isoformat(timespec="seconds"), arch=a.arch,
                 backend=a.backend, tolerance=TOLERANCE, status="running", step="preflight")
    try:
        preflight(a.backend)
        a.cache.mkdir(parents=True, exist_ok=True)
        env = child_env(a.cache)
        os.environ["PORTER_CACHE_DIR"] = str(a.cache)
        sys.path.insert(0, str(ROOT))
        rep["step"] = "port"
        jobs = a.job or port(a, rep, env, deadline)
        rep["step"] = "export"
        exports = [export_job(a, rep, j) for j in jobs]
        for e in exports:
            mod = next(Path(e["dir"], "python").glob("*_tuned.py"))
            e["isolated_import"] = isolated_import(mod)
            e["module"] = str(mod)
        rep["exports"] = exports
        if a.backend != "gpu":
            rep["step"] = "done"
            rep["status"] = "ok (compile-only: exported and imported; nothing launched)"
            print(f"export_check: compile-only ok, {len(exports)} jobs exported and imported")
            return 0
        rep["step"] = "roundtrip"
        rows, device = [], {}
        for e in exports:
            log = a.out / f"roundtrip_job{e['job']}.log"
            rc = run([sys.executable, str(Path(__file__).resolve()), "--out", str(a.out),
                      "--rounds", str(a.rounds), "--roundtrip", e["module"], a.db, str(e["job"])],
                     min(120.0, deadline - time.monotonic()), log, env)
            if rc is None:
                raise Failed(f"the round trip of job {e['job']} ran past its time limit; "
                             f"see {log}")
            line = next((ln for ln in log.read_text().splitlines()
                         if ln.startswith("ROUNDTRIP ")), None)
            if rc != 0 or line is None:
                raise Failed(f"the round trip of job {e['job']} failed (exit {rc}): "
                             f"{last_line(log)}")
            res = json.loads(line[len("ROUNDTRIP "):])
            device = {k: res[k] for k in ("gpu", "driver", "cuda_driver", "cupy")}
            rows += res["rows"]
            rep.data.update(device)
            rep["rows"] = rows
        bad = [r for r in rows if not r["outputs_agree"]]
        slow = [r for r in rows if abs(r["ratio_export_over_engine"] - 1) > TOLERANCE]
        rep["wall_s"] = round(time.monotonic() - t_start, 1)
        rep["step"] = "done"
        if bad:
            raise Failed(f"{bad[0]['template']}: the exported module's output differs from the "
                         f"engine's (max abs diff {bad[0]['max_abs_diff']:g})")
        if slow:
            r = slow[0]
            raise Failed(f"{r['template']}: export {r['export_ms']:.4f} ms vs engine "
                         f"{r['engine_ms']:.4f} ms (ratio {r['ratio_export_over_engine']:.3f}, "
                         f"outside 1 +- {TOLERANCE})")
        rep["status"] = "ok"
        for r in rows:
            same = "identical output" if r["bitwise_identical"] else "output within tolerance"
            print(f"{r['template']} {'x'.join(map(str, r['size']))}: {same}, export "
                  f"{r['export_ms']:.4f} ms / engine {r['engine_ms']:.4f} ms = "
                  f"{r['ratio_export_over_engine']:.3f}")
        return 0
    except Exception as e:  # noqa: BLE001 - one line, the rest in the result file
        return fail(rep, e, t_start)


if __name__ == "__main__":
    sys.exit(main())
