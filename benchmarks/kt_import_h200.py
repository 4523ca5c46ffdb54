"""`porter import-kt` on a real Kernel Tuner kernel, tuned and verified on the GPU.

The kernel is `convolution_kernel` of convolution_milo.cu (a 2-D convolution of a 4096x4096 float
image with a 15x15 filter in constant memory; tunables block_size_x/y, tile_size_x/y, read_only,
use_padding, ...) from the Auto-Tuning Association's benchmark hub, with its T1 file (identical to
/work/shared/replay/convolution_milo.T1.json, whose Kernel Tuner caches live beside it). Both are
fetched into the git-ignored .kt_kernels/ by `bash scripts/fetch_kt_kernel.sh` (pinned commit,
SHA-256 checked; fetched code is never committed); a device run needs `.kt_kernels` carried.

    python benchmarks/kt_import_h200.py --out DIR [--trials 30]
    python benchmarks/kt_import_h200.py --out DIR --kernel vector_add \
        --sizes 1000000 --sizes 16777216        # tests/data/kt's vector add at two sizes
    python benchmarks/kt_import_h200.py --out DIR --backend compile-only    # no GPU
    python benchmarks/kt_import_h200.py --out DIR --backend replay \
        --replay /work/shared/replay/convolution_milo_A100.json.gz          # no GPU, recorded times

Steps (DIR/kt_import_h200.json is rewritten after each; a failure ends the run with one line
`error: ...` and exit status 1; every subprocess has a time limit):

1. `porter import-kt` of the kernel and its T1 file into DIR/template (NVRTC-compiled for the
   architecture by the port's probe).
2. `porter port DIR/template --arch sm_90a --backend gpu --trials 30` into a fresh SQLite database.
3. From the database: counts per status; every measured trial must have run on the GPU backend
   and been verified (its recorded error against the harness's reference <= the tolerance). An
   imported template's reference is the output of its reference_config (the T1 defaults; T1
   files carry no reference function), and every measured row says so.
4. Independently of that reference, a fresh process runs the best variant on fresh inputs and
   compares its output with a direct float64 computation with CuPy (the convolution, or a + b),
   at every size, and times it again (L2 flushed, CUDA events, median).

The convolution kernel fixes its image at 4096x4096 in its source (#define image_width), so
only the vector add (whose n follows --sizes through the imported [op]) ports at two sizes.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _scripting import (Failed, Report, check_packages, child_env, fail,  # noqa: E402
                        last_line, run)
KT_DIR = ROOT / ".kt_kernels"
KERNEL = KT_DIR / "convolution_milo.cu"
T1 = KT_DIR / "convolution_milo.T1.json"
SHA256 = {KERNEL.name: "14b74948ac333fc1ec00c4476bff1a2ea5063c622afab5f85a45685b13582948",
          T1.name: "7d64a0b6456ed3b3b075670b57e159624957bd3fcf6fee9e827ee2534d211b70"}
SOURCE = ("https://github.com/AutoTuningAssociation/benchmark_hub/blob/"
          "8eeb99e7179e6838af95d392ac6c60cebfd8c434/kernels/convolution_milo.cu")
INDEPENDENT_RTOL = 1e-4     # float32 sums of 225 products against float64; a wrong index is O(1)
VA_KERNEL = ROOT / "tests" / "data" / "kt" / "vector_add.cu"
VA_T1 = ROOT / "tests" / "data" / "kt" / "vector_add.T1.json"




def preflight(backend: str, kernel: str) -> None:
    for p in ((KERNEL, T1) if kernel == "convolution" else ()):
        if not p.is_file():
            raise Failed(f"{p.relative_to(ROOT)} is missing: run bash scripts/fetch_kt_kernel.sh "
                         "here and carry .kt_kernels to the device")
        got = hashlib.sha256(p.read_bytes()).hexdigest()
        if got != SHA256[p.name]:
            raise Failed(f"{p.relative_to(ROOT)} is not the pinned file (SHA-256 {got[:12]}...): "
                         "run bash scripts/fetch_kt_kernel.sh again")
    check_packages(backend)





def summarize(db: str, job: int, backend: str) -> dict:
    """Counts per status, the verification of every measured trial, and the best one."""
    from porter.store.base import open_store
    from porter.spec.template import find_template
    store = open_store(db)
    info = store.get_job(job)
    tpl = find_template(info.spec.template)
    rtol = tpl.rtol or tpl.op_spec.default_rtol()
    trials = store.trials(job)
    counts = collections.Counter(t.status for t in trials)
    measured = [t for t in trials if t.status == "measured"]
    unverified = [t.number for t in measured
                  if not t.measurements or t.backend != backend or
                  any(m.error is None or not m.error <= rtol for m in t.measurements)]
    first_msgs = {}
    for t in trials:
        if t.status not in ("measured", "compiled") and t.status not in first_msgs:
            first_msgs[t.status] = f"trial {t.number}: {t.message[:200]}"
    out = {"job": job, "job_status": info.status, "trials": len(trials),
           "counted_trials": sum(1 for t in trials if t.status != "infeasible"),
           "counts": dict(sorted(counts.items())), "rtol": rtol,
           "measured": len(measured), "unverified_measured": unverified,
           "all_measured_verified": bool(measured) and not unverified,
           "backends": sorted({t.backend for t in trials}), "example_messages": first_msgs}
    if measured:
        ref = min(measured, key=lambda t: t.number)
        best = min(measured, key=lambda t: t.measurements[0].ours_ms)
        m = best.measurements[0]
        out["reference_trial"] = {"number": ref.number, "params": ref.params,
                                  "error": ref.measurements[0].error}
        out["best"] = {"trial": best.number, "params": best.params,
                       "per_size": [{"size": list(x.size), "ms": x.ours_ms, "error": x.error,
                                     "spread": x.ours_spread} for x in best.measurements],
                       "ms": m.ours_ms, "registers": best.registers,
                       "smem_bytes": best.smem_bytes, "note": best.message}
        out["times_ms"] = sorted(t.measurements[0].ours_ms for t in measured)
        dev = best.device
        out["device"] = {k: dev.get(k) for k in ("gpu", "driver", "cuda_driver", "cuda_runtime",
                                                 "nvrtc", "cc", "sm_clock_mhz", "temp_c",
                                                 "power_w", "measured_at", "replay_source")
                         if dev.get(k) is not None}
    return out


# ---- step 4, in its own process (CUDA lives only here) ----------------------------------------
def verify(folder: str, arch_name: str, params: dict, seed: int, sizes: list) -> dict:
    sys.path.insert(0, str(ROOT))
    import statistics
    import cupy as cp
    from porter.spec.arch import get_arch
    from porter.measure.backends.gpu_child import Child
    from porter.build.compile import compile_variant
    from porter.measure.ops import make_op
    from porter.spec.template import load_template
    tpl, arch = load_template(folder), get_arch(arch_name)
    res = compile_variant(tpl, params, arch)
    if not res.ok:
        raise Failed(f"the best configuration does not compile: {res.log[:200]}")
    child = Child({"seed": seed, "min_repeats": 20, "max_repeats": 200, "target_ms": 60.0})
    op = make_op(tpl.op, folder)
    mod = cp.RawModule(path=res.cubin_path)
    func = mod.get_function(tpl.kernel)
    rows = []
    for size in [tuple(s) for s in sizes] or [tpl.default_sizes[0]]:
        state = op.setup(size, seed)
        for name, arr in op.constants(state).items():
            sym = mod.get_global(name)
            cp.cuda.runtime.memcpy(sym.ptr, arr.data.ptr, arr.nbytes,
                                   cp.cuda.runtime.memcpyDeviceToDevice)
        launch = tpl.launch(params, arch, size)
        s = {"grid": launch.grid, "block": launch.block, "smem": launch.smem,
             "cluster": launch.cluster, "tensor_maps": []}
        run_ = child._launcher(func, s, state, op.args(state, 0), op)
        if isinstance(run_, str):
            raise Failed(f"the best configuration cannot launch: {run_}")
        op.poison(state)
        run_()
        cp.cuda.Device().synchronize()
        bufs = state["arrays"]
        if "output_image" in bufs:                  # the convolution
            width, height = size                     # Kernel Tuner: ProblemSize[0] is x
            fh, fw = int(params["filter_height"]), int(params["filter_width"])
            image = bufs["input_image"][: (height + fh - 1) * (width + fw - 1)]
            image = image.astype(cp.float64).reshape(height + fh - 1, width + fw - 1)
            filt = bufs["d_filter"][: fh * fw].astype(cp.float64).reshape(fh, fw)
            ref = cp.zeros((height, width), dtype=cp.float64)
            for i in range(fh):
                for j in range(fw):
                    ref += image[i:i + height, j:j + width] * filt[i, j]
            out = bufs["output_image"][: height * width].astype(cp.float64)
            out = out.reshape(height, width)
        else:                                         # the vector add: c = a + b
            ref = bufs["a"].astype(cp.float64) + bufs["b"].astype(cp.float64)
            out = bufs["c"].astype(cp.float64)
        finite = bool(cp.isfinite(out).all())
        rel = float(cp.linalg.norm((out - ref).ravel()) / cp.linalg.norm(ref.ravel()))
        times = []
        for _ in range(3):
            times += child.time_fn(run_)
        rows.append({"size": list(size), "finite": finite, "rel_error": rel,
                     "max_abs_diff": float(cp.abs(out - ref).max()),
                     "ms": statistics.median(times), "repeats": len(times)})
    return {"params": params, "sizes": rows,
            "device": {k: child.device.get(k) for k in ("gpu", "driver", "cuda_driver")}}


# ---- the orchestration -------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--backend", default="gpu", choices=("gpu", "compile-only", "replay"))
    ap.add_argument("--replay", help="Kernel Tuner cache for --backend replay")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/porter-kt-cache"),
                    help="compile cache (PORTER_CACHE_DIR)")
    ap.add_argument("--budget-s", type=float, default=175.0, help="wall limit for everything")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernel", default="convolution", choices=("convolution", "vector_add"))
    ap.add_argument("--sizes", action="append", help="problem size (repeatable)")
    ap.add_argument("--result", default="kt_import_h200.json")
    ap.add_argument("--verify", nargs=4, metavar=("FOLDER", "ARCH", "PARAMS", "SIZES"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.verify:
        res = verify(a.verify[0], a.verify[1], json.loads(a.verify[2]), a.seed + 11,
                     json.loads(a.verify[3]))
        print("VERIFY " + json.dumps(res), flush=True)
        return 0

    t_start = time.monotonic()
    deadline = t_start + a.budget_s
    a.out.mkdir(parents=True, exist_ok=True)
    a.out = a.out.resolve()
    kernel, t1 = (KERNEL, T1) if a.kernel == "convolution" else (VA_KERNEL, VA_T1)
    dbfile = a.out / f"kt_import_{a.kernel}.db"
    for p in (dbfile, dbfile.with_suffix(".db-wal"), dbfile.with_suffix(".db-shm")):
        p.unlink(missing_ok=True)
    db = f"sqlite:///{dbfile}"
    folder = a.out / f"template_{a.kernel}"
    info = ({"name": "convolution_kernel", "file": "convolution_milo.cu",
             "source": SOURCE, "sha256": SHA256[KERNEL.name],
             "t1": "convolution_milo.json of the same commit (= /work/shared/replay/"
                   "convolution_milo.T1.json)"} if a.kernel == "convolution" else
            {"name": "vector_add", "file": "tests/data/kt/vector_add.cu",
             "t1": "tests/data/kt/vector_add.T1.json"})
    rep = Report(a.out / a.result, check="porter import-kt on a Kernel Tuner kernel, tuned and "
                 "verified on the GPU", kernel=info, sizes=a.sizes,
                 date=datetime.datetime.now().isoformat(timespec="seconds"), arch=a.arch,
                 backend=a.backend, trials_asked=a.trials, status="running", step="preflight")
    try:
        preflight(a.backend, a.kernel)
        if a.backend == "replay" and not (a.replay and Path(a.replay).is_file()):
            raise Failed("--backend replay needs --replay FILE (a Kernel Tuner cache)")
        a.cache.mkdir(parents=True, exist_ok=True)
        env = child_env(a.cache, columns=200)
        os.environ["PORTER_CACHE_DIR"] = str(a.cache)
        sys.path.insert(0, str(ROOT))

        rep["step"] = "import-kt"
        log = a.out / "import_kt.log"
        rc = run([sys.executable, "-m", "porter.cli", "import-kt", str(kernel), str(t1), "-o",
                  str(folder)], min(60.0, deadline - time.monotonic()), log, env)
        if rc != 0:
            raise Failed(f"porter import-kt failed (exit {rc}): {last_line(log)}")
        rep["import"] = {"folder": str(folder), "said": last_line(log)}

        rep["step"] = "port"
        log = a.out / "port.log"
        cmd = [sys.executable, "-m", "porter.cli", "port", str(folder), "--arch", a.arch,
               "--trials", str(a.trials), "--backend", a.backend, "--db", db,
               "--seed", str(a.seed)]
        for sz in a.sizes or ():
            cmd += ["--sizes", sz]
        if a.backend == "replay":
            cmd += ["--replay", str(Path(a.replay).resolve())]
        t0 = time.monotonic()
        rc = run(cmd, deadline - time.monotonic() - (45 if a.backend == "gpu" else 5), log, env)
        rep["port"] = {"rc": rc, "wall_s": round(time.monotonic() - t0, 1), "log": log.name,
                       "command": " ".join(cmd[1:])}
        from porter.store.base import open_store
        jobs = [j.id for j in open_store(db).list_jobs(10)]
        if not jobs:
            raise Failed(f"porter port recorded no job (exit {rc}): {last_line(log)}")
        summary = summarize(db, jobs[0] if len(jobs) == 1 else max(jobs), a.backend)
        rep["summary"] = summary
        if rc is None:
            raise Failed(f"porter port ran past its time limit after {summary['trials']} trials "
                         f"(partial counts in the result file); see {log}")
        if rc != 0:
            raise Failed(f"porter port failed (exit {rc}): {last_line(log)}")
        if a.backend == "compile-only":
            if not summary["counts"].get("compiled"):
                raise Failed("the compile-only port compiled nothing: "
                             f"{summary['example_messages']}")
            rep["step"] = "done"
            rep["status"] = "ok (compile-only: imported and compiled; nothing measured)"
            print(f"kt_import: compile-only ok, {summary['counts']}")
            return 0
        if summary["backends"] != [a.backend] or not summary["measured"]:
            raise Failed(f"nothing was measured on the {a.backend} backend (backends "
                         f"{summary['backends']}, counts {summary['counts']}); see {log}")
        if a.backend == "replay":
            summary["verification"] = "none: replayed times carry no outputs to verify"
            rep["summary"] = summary
        elif summary["unverified_measured"]:
            raise Failed(f"measured trials {summary['unverified_measured'][:5]} carry no "
                         f"verified result within {summary['rtol']:g}")
        if a.backend == "gpu":
            rep["step"] = "independent check"
            log = a.out / "verify.log"
            rc = run([sys.executable, str(Path(__file__).resolve()), "--out", str(a.out),
                      "--seed", str(a.seed), "--verify", str(folder), a.arch,
                      json.dumps(summary["best"]["params"]),
                      json.dumps([x["size"] for x in summary["best"]["per_size"]])],
                     min(90.0, deadline - time.monotonic()), log, env)
            line = next((ln for ln in log.read_text().splitlines()
                         if ln.startswith("VERIFY ")), None)
            if rc is None:
                raise Failed(f"the independent check ran past its time limit; see {log}")
            if rc != 0 or line is None:
                raise Failed(f"the independent check failed (exit {rc}): {last_line(log)}")
            check = json.loads(line[len("VERIFY "):])
            check["rtol"] = INDEPENDENT_RTOL
            rep["independent_check"] = check
            rep.data.update(gpu=check["device"]["gpu"], driver=check["device"]["driver"])
            for row in check["sizes"]:
                if not (row["finite"] and row["rel_error"] <= INDEPENDENT_RTOL):
                    raise Failed(f"the best variant disagrees with a direct float64 computation"
                                 f" at {row['size']} (relative error {row['rel_error']:.3g} > "
                                 f"{INDEPENDENT_RTOL:g})")
        rep.data["wall_s"] = round(time.monotonic() - t_start, 1)
        rep["step"] = "done"
        rep["status"] = "ok"
        b = summary["best"]
        verified = "replayed" if a.backend == "replay" else "verified"
        print(f"kt_import: {info['name']} on {summary.get('device', {}).get('gpu')}: "
              f"{summary['counts']}, all {summary['measured']} measured {verified}; best "
              f"{b['ms']:.4f} ms {b['params']}")
        return 0
    except Exception as e:  # noqa: BLE001 - one line, the rest in the result file
        return fail(rep, e, t_start)


if __name__ == "__main__":
    sys.exit(main())
