"""The service on one machine with one GPU: a local Redis (carried), a SQLite database, real
`porter worker` processes and `porter submit`, checked against `porter port` on the same job.

    A  one compile worker + one GPU worker (CUDA_VISIBLE_DEVICES=0), `porter submit gemm_mma
       --arch sm_90a --trials N --backend gpu --sizes 4096x4096x4096`: statuses, every trial
       recorded once, best configuration and its ratio to cuBLAS, wall time, trials/s
    B  the same job through `porter port` (embedded, in-process), same seed and budget: its best
       configuration and ratio beside A's
    C  two GPU workers sharing the one GPU + one compile worker, another submitted job of N
       trials: every trial recorded once, trials/s against A

The database is a SQLite file (there is no PostgreSQL on the device): the drivers of one job
serialise their proposals with an flock beside it (workers/tasks.py), as PostgreSQL's advisory
lock does, so two drivers never take the same configuration. Each phase has its own compile
cache (no phase profits from another's compiles). One JSON (default $OUT/service_h200.json, else
benchmarks/results/service_h200.json) is rewritten after every step, so a run cut short still
says how far it got; a summary is printed at the end, and under $OUT the workers' logs come back
too. Every process it starts (Redis, workers, `porter port`) leads its own process group, dies
with this script (PR_SET_PDEATHSIG) and is stopped on every exit path (atexit,
SIGTERM/SIGINT/SIGHUP, the overall --deadline, default 420 s).

Prepare here (x86-64, Python 3.12 wheels for the device; .whl/ and .redis/ are git-ignored):

    scripts/carry_redis.sh          # .redis/: redis-server and its libraries (17 MB)
    ../shared/tools/device-wheels 'celery[redis]==5.7.0' redis==8.1.0 optuna==5.1.0 sqlalchemy==2.1.9 alembic==1.20.1 && python3 -m pip download -q --no-deps --only-binary=:all: -d .whl tzdata==2026.6

(.whl/ then holds alembic amqp billiard celery click-didyoumean click-plugins click-repl colorlog
kombu mako optuna prompt-toolkit redis sqlalchemy tzdata tzlocal vine wcwidth, 8.4 MB: what
`porter worker`, `porter submit` and `porter port` import beyond the device image, which has
typer, rich, click, numpy, pyyaml, tqdm, packaging, python-dateutil, six, markupsafe, cupy,
cuda-bindings and nvidia-cuda-nvrtc. device-wheels drops tzdata as present, but kombu needs a
time zone database at import (ZoneInfo("UTC")), hence the second download; psycopg is not
needed with SQLite, nvidia-nvfatbin only for fatbin export.)

On the H200 (device `run`, carry [".whl", ".redis"], timeout_s 600; expected 3 to 4 minutes at
the defaults, never more than --deadline):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && python3 benchmarks/service_h200.py --out $OUT

Here, without a GPU (recorded H200 measurements; the drivers sleep each recorded GPU time):

    .venv/bin/python benchmarks/service_h200.py --backend replay --out /tmp/svc
"""
from __future__ import annotations

import argparse
import atexit
import collections
import datetime
import json
import os
import platform
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _service_procs import (ROOT, REPLAY, TEMPLATE, CLEANUP_S, Stop, Procs)  # noqa: E402
from _service_phases import Phases  # noqa: E402


class Bench(Phases):
    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.hard_end = self.t0 + args.deadline
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / "service_h200.json"
        self.work = Path(tempfile.mkdtemp(prefix="porter-svc-", dir=args.workdir))
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.db_path = self.work / "porter.db"
        self.db_url = f"sqlite:///{self.db_path}"
        self.procs = Procs(self.logs)
        self.stopping = False   # set once a signal or the deadline stops the run
        self.redis_proc = None
        self.broker = ""
        self.res: dict = {
            "what": "service mode on one GPU: Redis + SQLite + porter workers vs porter port",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv[1:], "template": TEMPLATE, "arch": args.arch,
            "sizes": args.sizes, "trials": args.trials, "seed": args.seed,
            "backend": args.backend, "replay": str(args.replay) if args.replay else None,
            "deadline_s": args.deadline,
            "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                        "python": platform.python_version(), "platform": platform.platform()},
            "workdir": str(self.work), "status": "running", "phases": {}, "checks": {},
            "notes": [],
        }

    # ---- bookkeeping
    def left(self) -> float:
        return self.hard_end - CLEANUP_S - time.time()

    def save(self):
        self.res["elapsed_s"] = round(time.time() - self.t0, 1)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.res, indent=1, default=str) + "\n")
        os.replace(tmp, self.path)

    def say(self, msg: str):
        print(f"[{time.time() - self.t0:6.1f}s] {msg}", flush=True)

    def env(self, **extra) -> dict:
        e = dict(os.environ, PORTER_DB_URL=self.db_url, PORTER_BROKER_URL=self.broker,
                 PYTHONUNBUFFERED="1", TERM="dumb", NO_COLOR="1", COLUMNS="160")
        e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), e.get("PYTHONPATH")) if p)
        e.pop("PORTER_DRIVERS", None)
        if self.args.backend == "replay":
            e["PORTER_REPLAY_HOLD"] = "1"   # a driver is busy for each recorded GPU time
            # the service replays only from its data folder: the recording's own
            e["PORTER_REPLAY_DIR"] = str(Path(self.args.replay or REPLAY).resolve().parent)
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def porter(self, *args) -> list[str]:
        return [sys.executable, "-m", "porter.cli", *args]

    def job_args(self) -> list[str]:
        a = [TEMPLATE, "--arch", self.args.arch, "--trials", str(self.args.trials),
             "--seed", str(self.args.seed), "--backend", self.args.backend]
        for s in self.args.sizes:
            a += ["--sizes", s]
        if self.args.backend == "replay":
            a += ["--replay", str(self.args.replay)]
        return a

    # ---- steps
    def analyse(self, store, job: int) -> dict:
        info = store.get_job(job)
        trials = store.trials(job)
        counts = collections.Counter(t.status for t in trials)
        counted = [t for t in trials if t.status != "infeasible"]
        # rows straight from the table: a (job, number) is there once
        with sqlite3.connect(self.db_path, timeout=30) as con:
            rows = con.execute("SELECT number, COUNT(*) FROM porter_trials WHERE job_id = ? "
                               "GROUP BY number HAVING COUNT(*) > 1", (job,)).fetchall()
            n_rows = con.execute("SELECT COUNT(*) FROM porter_trials WHERE job_id = ?",
                                 (job,)).fetchone()[0]
        numbers = [t.number for t in trials]
        configs = collections.Counter(t.config_key for t in trials)
        # the shared Optuna study: every finished trial recorded, nothing left running
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name=info.study_name or f"porter-job-{job}",
                                  storage=store.optuna_storage())
        st = collections.Counter(t.state.name for t in study.get_trials(deepcopy=False))
        finished = {t.number for t in study.get_trials(deepcopy=False, states=(
            optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL))}
        recorded = set(numbers)
        span = (max(t.finished_at for t in trials) - min(t.started_at for t in trials)) \
            if trials else 0.0
        best = store.best_trials(job, 5)
        out = {
            "counts": dict(sorted(counts.items())),
            "recorded": len(trials), "counted": len(counted), "budget": self.args.trials,
            "rows": n_rows,
            "numbers_unique": not rows and len(numbers) == len(recorded),
            "duplicate_numbers": [list(r) for r in rows],
            "duplicate_configs": {k: n for k, n in configs.items() if n > 1},
            "study_states": dict(st),
            "told_not_recorded": sorted(finished - recorded),
            "recorded_not_told": sorted(recorded - finished),
            "study_running": st.get("RUNNING", 0),
            "trial_span_s": round(span, 2),
            "trials_per_s": round(len(counted) / span, 3) if span else None,
            "workers": dict(collections.Counter(t.worker for t in trials)),
            "compile_s_sum": round(sum(t.compile_seconds or 0 for t in trials), 2),
        }
        out["recorded_once"] = bool(
            out["numbers_unique"] and not out["told_not_recorded"]
            and not out["recorded_not_told"] and not out["study_running"]
            and n_rows == len(trials))
        out["best"] = [_trial_summary(t) for t in best]
        dev = next((t.device for t in trials if t.status == "measured"), None)
        if dev:
            keys = ("gpu", "driver", "cuda_driver", "cuda_runtime", "cupy", "nvrtc",
                    "sm_clock_mhz", "temp_c", "power_w")
            out["device"] = {k: dev.get(k) for k in keys if k in dev}
        return out

    # ---- comparisons
    def compare(self):
        ph = self.res["phases"]
        a, b, c = ph.get("A", {}), ph.get("B", {}), ph.get("C", {})
        chk = self.res["checks"]
        for k, p in (("A", a), ("C", c)):
            if "recorded_once" in p:
                chk[f"{k}_every_trial_recorded_once"] = p["recorded_once"]
                chk[f"{k}_budget_met"] = p["counted"] == self.args.trials
                chk[f"{k}_no_duplicate_configs"] = not p["duplicate_configs"]
        for k, p in ph.items():
            if "counts" in p:
                chk[f"{k}_measured"] = p["counts"].get("measured", 0)
        if c.get("workers") is not None:
            chk["C_both_gpu_workers_drove"] = len(c["workers"]) >= 2
        if a.get("best") and b.get("best"):
            ba, bb = a["best"][0], b["best"][0]
            ra, rb = ba.get("ratio"), bb.get("ratio")
            same = ba["params"] == bb["params"]
            top_a = {json.dumps(t["params"], sort_keys=True) for t in a["best"]}
            top_b = {json.dumps(t["params"], sort_keys=True) for t in b["best"]}
            chk["A_vs_B"] = {
                "same_best_config": same, "ratio_A": ra, "ratio_B": rb,
                "ratio_A_over_B": round(ra / rb, 4) if ra and rb else None,
                "top5_shared": len(top_a & top_b),
                "like_porter_port": bool(ra and rb and abs(ra / rb - 1) <= 0.05),
            }
        if a.get("trials_per_s") and c.get("trials_per_s"):
            chk["C_over_A_trials_per_s"] = round(c["trials_per_s"] / a["trials_per_s"], 3)
        self.save()

    def summary(self) -> str:
        lines = [f"service_h200: {self.res['status']} in {self.res.get('elapsed_s')} s; "
                 f"gpu {(self.res.get('gpu') or {}).get('name', '-')}, "
                 f"driver {(self.res.get('gpu') or {}).get('driver', '-')}; backend "
                 f"{self.args.backend}; {TEMPLATE} {self.args.arch} {' '.join(self.args.sizes)}, "
                 f"{self.args.trials} trials, seed {self.args.seed}"]
        for k, p in self.res["phases"].items():
            best = (p.get("best") or [{}])[0]
            lines.append(
                f"  {k}: job {p.get('job', '-')} {p.get('status')}; {p.get('counts', {})}; "
                f"recorded once: {p.get('recorded_once', '-')}; "
                f"{p.get('trials_per_s', '-')} trials/s over {p.get('trial_span_s', '-')} s "
                f"(job wall {p.get('job_wall_s', p.get('wall_s', '-'))} s); best ratio "
                f"{best.get('ratio', '-')} {best.get('params', '')}")
        for k, v in self.res["checks"].items():
            lines.append(f"  check {k}: {v}")
        for n in self.res["notes"]:
            lines.append(f"  note: {n}")
        lines.append(f"  results: {self.path}; logs: {self.logs}")
        return "\n".join(lines)

    def run(self):
        phases = self.args.phases.upper().split(",")
        self.preflight()
        self.start_redis()
        # shares of the time left, phase by phase (A leaves room for B and C, B for C)
        shares = {"A": 0.4, "B": 0.45, "C": 0.95}
        for name in ("A", "B", "C"):
            if name not in phases:
                continue
            if self.left() < 30:
                self.res["notes"].append(f"phase {name} skipped: {self.left():.0f} s left")
                continue
            try:
                if name == "B":
                    self.phase_port(shares[name] if "C" in phases else 0.95)
                else:
                    later = name == "A" and ("B" in phases or "C" in phases)
                    self.phase_service(name, 1 if name == "A" else 2,
                                       shares[name] if later else 0.95)
            except Stop:
                raise
            except Exception as e:  # noqa: BLE001 - one phase failing leaves the others to run
                self.res["phases"].setdefault(name, {})["error"] = f"{type(e).__name__}: {e}"
                self.res["phases"][name]["status"] = "error"
                self.say(f"phase {name} failed: {type(e).__name__}: {e}")
                self.save()
            self.compare()
        errors = [k for k, p in self.res["phases"].items() if p.get("status") != "done"]
        self.res["status"] = "done" if not errors else f"done with problems in {errors}"


def _trial_summary(t) -> dict:
    m = t.measurements[0] if t.measurements else None
    return {"number": t.number, "params": t.params, "status": t.status,
            "objective": round(t.objective, 5) if t.objective is not None else None,
            "ratio": round(m.ratio, 4) if m and m.ratio else None,
            "ours_ms": round(m.ours_ms, 5) if m else None,
            "baseline": m.baseline if m else None,
            "baseline_ms": round(m.baseline_ms, 5) if m and m.baseline_ms else None,
            "tflops": round(m.tflops, 1) if m and m.tflops else None,
            "worker": t.worker}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=40, help="trials per job (default 40)")
    ap.add_argument("--backend", choices=("gpu", "replay"), default="gpu")
    ap.add_argument("--replay", type=Path, default=None,
                    help=f"recording for --backend replay (default {REPLAY.relative_to(ROOT)})")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--sizes", action="append", default=None,
                    help="problem size (repeatable; default 4096x4096x4096)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phases", default="A,B,C")
    ap.add_argument("--deadline", type=float, default=420.0,
                    help="seconds for the whole run, cleanup included (default 420)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks/results"),
                    help="folder for service_h200.json (default $OUT, else benchmarks/results)")
    ap.add_argument("--redis-dir", default=str(ROOT / ".redis"))
    ap.add_argument("--workdir", default=None, help="parent of the scratch folder (default: "
                    "the system's temporary folder)")
    ap.add_argument("--compile-concurrency", type=int, default=None,
                    help="processes of the compile worker (default: porter's, cores - 1)")
    args = ap.parse_args()
    args.sizes = args.sizes or ["4096x4096x4096"]
    if args.backend == "replay":
        args.replay = (args.replay or REPLAY).resolve()
    elif args.replay:
        ap.error("--replay needs --backend replay")
    if args.trials <= 0 or args.deadline < 60:
        ap.error("--trials must be positive and --deadline at least 60 s")

    bench = Bench(args)

    def on_signal(signum, _frame):
        if not bench.stopping:      # the first one stops the run; later ones are ignored
            bench.stopping = True
            raise Stop(signal.Signals(signum).name)

    def on_alarm(_signum, _frame):
        if not bench.stopping:
            bench.stopping = True
            raise Stop(f"overall deadline of {args.deadline:.0f} s")

    def cleanup():
        bench.procs.stop(grace_s=5)

    atexit.register(cleanup)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    signal.signal(signal.SIGALRM, on_alarm)
    # the hard stop: leaves CLEANUP_S / 2 to stop the processes and write the results
    signal.setitimer(signal.ITIMER_REAL, max(1.0, args.deadline - CLEANUP_S / 2))
    code = 0
    try:
        bench.say(f"scratch folder {bench.work}; results {bench.path}")
        bench.run()
    except Stop as e:
        bench.res["status"] = f"stopped: {e}"
        bench.say(f"stopping: {e}")
        code = 3
    except SystemExit as e:
        bench.res["status"] = f"error: {e}"
        print(e, file=sys.stderr)
        code = 2
    except Exception as e:  # noqa: BLE001 - keep what was measured, say what broke
        bench.res["status"] = f"error: {type(e).__name__}: {e}"
        bench.say(f"error: {type(e).__name__}: {e}")
        code = 1
    finally:
        bench.stopping = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        bench.procs.stop(grace_s=5)
        try:
            bench.compare()
        except Exception as e:  # noqa: BLE001
            bench.res["notes"].append(f"comparison failed: {e}")
        bench.save()
    print(bench.summary(), flush=True)
    if os.environ.get("OUT") and Path(args.out).resolve() == Path(os.environ["OUT"]).resolve():
        # the logs of the run come back with the results (at most a few files, 2 MB each)
        for name in ("A-gpu0", "C-gpu0", "C-gpu1", "B-port", "A-compile"):
            f = bench.logs / f"{name}.log"
            if f.is_file():
                data = f.read_bytes()[-2_000_000:]
                (Path(args.out) / f"service_h200_{name}.log").write_bytes(data)
    return code


if __name__ == "__main__":
    sys.exit(main())
