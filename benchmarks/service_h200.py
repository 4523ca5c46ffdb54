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
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "tests/data/replay/gemm_mma_h200.json.gz"
TEMPLATE = "gemm_mma"
CLEANUP_S = 20          # kept back from --deadline for stopping processes and writing results
NEEDED = {"celery": "celery", "kombu": "kombu", "billiard": "billiard", "vine": "vine",
          "redis": "redis", "optuna": "optuna", "sqlalchemy": "sqlalchemy",
          "alembic": "alembic", "typer": "typer", "rich": "rich", "click_repl": "click-repl",
          "click_didyoumean": "click-didyoumean", "click_plugins": "click-plugins",
          "tzlocal": "tzlocal", "dateutil": "python-dateutil", "numpy": "numpy"}
NEEDED_GPU = {"cupy": "cupy-cuda13x", "cuda.bindings": "cuda-bindings"}


class Stop(Exception):
    """A signal or the overall deadline: stop everything, keep what was measured."""


# ---- processes ----------------------------------------------------------------------------

def _die_with_parent():
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort; the process group is stopped anyway
        pass


class Procs:
    """Child processes, each the leader of its own process group (same session, so whatever
    ends this script's session ends them too)."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.running: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "ab")
        p = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, process_group=0,
                             preexec_fn=_die_with_parent)
        log.close()
        self.running.append((name, p))
        return p

    def stop(self, which: list[tuple[str, subprocess.Popen]] | None = None,
             grace_s: float = 8.0) -> None:
        """SIGTERM to each leader (a Celery worker then finishes its task, if any, stops its
        pool and exits), then SIGKILL to each whole group: what is left after grace_s, and any
        helper (pool process, measuring child) that outlived its leader."""
        which = list(self.running if which is None else which)
        for _, p in which:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        end = time.time() + grace_s
        for _, p in which:
            try:
                p.wait(max(0.1, end - time.time()))
            except subprocess.TimeoutExpired:
                pass
        for _, p in which:
            _signal_group(p, signal.SIGKILL)   # the leader's helpers (pool, GPU child) too
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        ids = {id(p) for _, p in which}
        self.running = [(n, p) for n, p in self.running if id(p) not in ids]


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_command(folder: Path) -> tuple[list[str], dict, str]:
    """How to start the carried redis-server: with its libraries on LD_LIBRARY_PATH, or, where
    this machine's C library is too old for it, through the carried loader."""
    exe = folder / "redis-server"
    if not exe.is_file():
        raise SystemExit(f"error: {exe} is missing: run scripts/carry_redis.sh here and carry "
                         f"{folder.name}")
    env = dict(os.environ, LD_LIBRARY_PATH=str(folder / "lib"))
    r = subprocess.run([str(exe), "--version"], env=env, capture_output=True, text=True,
                       timeout=20)
    if r.returncode == 0 and "Redis server" in r.stdout:
        return [str(exe)], env, "carried redis-server, system loader"
    loader = next(iter(sorted((folder / "glibc").glob("ld-linux*.so.*"))), None)
    if loader is None:
        raise SystemExit(f"error: {exe} does not start here ({(r.stderr or r.stdout).strip()}) "
                         "and no carried loader")
    argv = [str(loader), "--library-path", f"{folder / 'lib'}:{folder / 'glibc'}", str(exe)]
    r2 = subprocess.run(argv + ["--version"], capture_output=True, text=True, timeout=20)
    if r2.returncode != 0:
        raise SystemExit(f"error: the carried redis-server does not start: "
                         f"{(r.stderr or r.stdout).strip()} / {(r2.stderr or r2.stdout).strip()}")
    return argv, dict(os.environ), "carried redis-server through the carried loader"


def wait_for(what: str, check, until: float, procs: list[subprocess.Popen] = (),
             every: float = 0.25):
    while True:
        got = check()
        if got:
            return got
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{what}: a process it needs exited ({p.returncode})")
        if time.time() >= until:
            raise TimeoutError(f"{what}: not within the time left")
        time.sleep(every)


# ---- the run --------------------------------------------------------------------------------

class Bench:
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
    def preflight(self):
        import importlib.util
        def missing(need: dict) -> list[str]:
            out = []
            for mod, pkg in need.items():
                try:
                    found = importlib.util.find_spec(mod) is not None
                except ModuleNotFoundError:
                    found = False
                if not found:
                    out.append(pkg)
            return out
        self.res["python_path"] = os.environ.get("PYTHONPATH", "")
        if self.args.backend == "gpu" and missing(NEEDED_GPU):
            self.res["notes"].append(f"GPU packages missing ({' '.join(missing(NEEDED_GPU))}): "
                                     "the jobs run compile-only, nothing is measured")
            self.say(f"warning: {self.res['notes'][-1]}")
        if missing(NEEDED):
            raise SystemExit(f"error: python packages missing: {' '.join(missing(NEEDED))} "
                             "(install the carried wheels into /tmp/site and put it on "
                             "PYTHONPATH: see this script's docstring)")
        versions = {}
        from importlib.metadata import PackageNotFoundError, version
        for pkg in ("celery", "kombu", "redis", "optuna", "sqlalchemy", "alembic", "typer",
                    "cupy-cuda13x", "cuda-bindings", "nvidia-cuda-nvrtc", "torch"):
            try:
                versions[pkg] = version(pkg)
            except PackageNotFoundError:
                pass
        self.res["packages"] = versions
        gpu = {}
        if shutil.which("nvidia-smi"):
            try:
                r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                                    "clocks.max.sm,power.limit", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=30)
                line = r.stdout.strip().splitlines()[0] if r.stdout.strip() else ""
                if line:
                    f = [x.strip() for x in line.split(",")]
                    gpu = dict(zip(("name", "driver", "memory", "sm_clock_max", "power_limit"), f))
                    gpu["count"] = len(r.stdout.strip().splitlines())
            except (subprocess.SubprocessError, OSError) as e:
                gpu = {"error": str(e)}
        self.res["gpu"] = gpu or None
        if self.args.backend == "gpu" and not gpu:
            self.res["notes"].append("no nvidia-smi answer: the GPU backend will fall back to "
                                     "compile-only (every trial says so)")
        self.save()

    def start_redis(self):
        argv, env, how = redis_command(Path(self.args.redis_dir).resolve())
        port = free_port()
        self.redis_proc = self.procs.start("redis", argv + [
            "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--dir", str(self.work), "--protected-mode", "yes"], env)
        self.broker = f"redis://127.0.0.1:{port}/0"
        import redis
        client = redis.Redis.from_url(self.broker, socket_connect_timeout=1, socket_timeout=2)

        def ping():
            try:
                return client.ping()
            except redis.RedisError:
                return False
        wait_for("redis", ping, time.time() + 30, [self.redis_proc])
        self.redis = client
        self.res["redis"] = {"how": how, "port": port,
                             "version": client.info("server").get("redis_version")}
        self.say(f"redis {self.res['redis']['version']} on port {port} ({how})")
        self.save()

    def start_workers(self, phase: str, n_gpu: int, cache: Path, started: list) -> None:
        env_c = self.env(PORTER_CACHE_DIR=cache, CUDA_VISIBLE_DEVICES="",
                         PORTER_WORKER_NAME=f"compile-{phase}@%h")
        cargs = ["worker", "--queues", "compile"]
        if self.args.compile_concurrency:
            cargs += ["--concurrency", str(self.args.compile_concurrency)]
        started.append((f"{phase}-compile", self.procs.start(f"{phase}-compile",
                                                             self.porter(*cargs), env_c)))
        for i in range(n_gpu):
            env_g = self.env(PORTER_CACHE_DIR=cache, CUDA_VISIBLE_DEVICES="0",
                             PORTER_WORKER_NAME=f"gpu{i}-{phase}@%h")
            name = f"{phase}-gpu{i}"
            started.append((name, self.procs.start(
                name, self.porter("worker", "--queues", f"gpu.{self.args.arch}"), env_g)))
        t = time.time()

        def all_ready():
            for name, _ in started:
                text = (self.logs / f"{name}.log").read_text(errors="replace")
                if " ready." not in text:
                    return False
            return True
        wait_for(f"phase {phase} workers", all_ready,
                 min(time.time() + 120, self.hard_end - CLEANUP_S), [p for _, p in started])
        self.say(f"phase {phase}: {len(started)} workers ready in {time.time() - t:.1f} s")

    def submit(self, drivers: int, cache: Path) -> tuple[int, float]:
        env = self.env(PORTER_DRIVERS=drivers, PORTER_CACHE_DIR=cache)
        t = time.time()
        r = subprocess.run(self.porter("submit", *self.job_args()), env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=max(10, min(120, self.left())))
        if r.returncode != 0:
            raise RuntimeError(f"porter submit failed ({r.returncode}): "
                               f"{(r.stderr or r.stdout).strip()[-500:]}")
        return int(r.stdout.split()[-1]), t

    def drivers_ended(self, names: list[str]) -> tuple[int, list[str]]:
        """drive_job tasks that ended in the GPU workers' logs, and the errors they raised."""
        ended, errors = 0, []
        for name in names:
            f = self.logs / f"{name}.log"
            if not f.is_file():
                continue
            lines = f.read_text(errors="replace").splitlines()
            for i, line in enumerate(lines):
                if "workers.tasks.drive_job[" in line:
                    if " succeeded in " in line:
                        ended += 1
                    elif " raised unexpected" in line:
                        ended += 1
                        errors.append(line.split(" raised unexpected: ", 1)[-1][:400])
        return ended, errors

    def wait_job(self, store, job: int, until: float, procs, label: str,
                 drivers: int) -> dict:
        """Waits for the job to finish; past `until` it is cancelled (and waited for briefly).
        Returns early when every driver of the job has ended but the job has not (a driver
        that raised leaves it running) or when a worker exits."""
        last = 0.0
        cancelled = False
        stuck_since = None
        gpu_logs = [n for n, _ in procs if "-gpu" in n]
        while True:
            info = store.get_job(job)
            if info.status in ("done", "failed", "cancelled"):
                return {"status": info.status, "message": info.message,
                        "cancelled_by_deadline": cancelled}
            dead = [n for n, p in procs if p.poll() is not None]
            if dead:
                self.res["notes"].append(f"{label}: worker(s) {dead} exited during the job")
                return {"status": info.status, "message": f"workers exited: {dead}",
                        "cancelled_by_deadline": cancelled}
            now = time.time()
            ended, errors = self.drivers_ended(gpu_logs)
            if ended >= drivers:
                stuck_since = stuck_since or now
                if now - stuck_since > 5:
                    msg = f"every driver ended, the job is still {info.status}"
                    if errors:
                        msg += f"; a driver raised: {errors[0]}"
                    self.say(f"{label}: {msg}")
                    return {"status": info.status, "message": msg, "driver_errors": errors,
                            "cancelled_by_deadline": cancelled}
            if now - last >= 10:
                last = now
                self.say(f"{label}: job {job} {info.status}, {info.n_trials} trials recorded, "
                         f"{info.n_measured} measured"
                         + (f", best ratio {info.best_ratio:.3f}" if info.best_ratio else ""))
            if now >= until and not cancelled:
                self.say(f"{label}: out of time, cancelling job {job}")
                store.request_cancel(job)
                cancelled = True
                until = now + 20
            elif cancelled and now >= until:
                return {"status": info.status, "message": "still running after the cancel",
                        "cancelled_by_deadline": True}
            time.sleep(0.5)

    def phase_service(self, phase: str, n_gpu: int, share: float) -> dict:
        from porter.store.base import open_store
        budget_end = time.time() + share * self.left()
        cache = self.work / f"cache-{phase}"
        what = f"{n_gpu} GPU worker(s) + 1 compile worker, porter submit"
        if n_gpu > 1:
            what += ("; the drivers measure on the one GPU at the same time, so their timings "
                     "(and ratios) overlap: this phase is about throughput and bookkeeping")
        ph = self.res["phases"][phase] = {"what": what, "gpu_workers": n_gpu,
                                          "compile_workers": 1, "drivers": n_gpu,
                                          "status": "starting"}
        self.save()
        self.redis.flushdb()
        t_start = time.time()
        started: list = []
        job = None
        store = open_store(self.db_url)
        try:
            self.start_workers(phase, n_gpu, cache, started)
            ph["workers_start_s"] = round(time.time() - t_start, 2)
            job, t_submit = self.submit(n_gpu, cache)
            ph.update(job=job, status="submitted")
            self.say(f"phase {phase}: submitted job {job}")
            self.save()
            end = self.wait_job(store, job, budget_end, started, f"phase {phase}", n_gpu)
            ph["job_wall_s"] = round(time.time() - t_submit, 2)
            ph.update(end)
            ph.update(self.analyse(store, job))
            ph["status"] = end["status"]
        finally:
            if job is not None and "counts" not in ph:
                # cut short (a signal, the deadline, an error): stop the job, keep its trials
                try:
                    info = store.get_job(job)
                    if info.status not in ("done", "failed", "cancelled"):
                        store.request_cancel(job)
                    ph["status"] = f"cut short ({info.status})"
                    ph.update(self.analyse(store, job))
                except Exception as e:  # noqa: BLE001
                    ph["analyse_error"] = f"{type(e).__name__}: {e}"
            t = time.time()
            self.procs.stop(started, grace_s=3 if self.stopping else 8)
            ph["workers_stop_s"] = round(time.time() - t, 2)
            self.save()
        return ph

    def phase_port(self, share: float) -> dict:
        from porter.store.base import open_store
        budget = max(10.0, share * self.left())
        cache = self.work / "cache-B"
        ph = self.res["phases"]["B"] = {"what": "porter port (embedded engine, in-process)",
                                        "status": "running"}
        self.save()
        store = open_store(self.db_url)
        before = {j.id for j in store.list_jobs(None)}
        argv = self.porter("port", *self.job_args(), "--db", self.db_url)
        env = self.env(PORTER_CACHE_DIR=cache)
        env.pop("PORTER_REPLAY_HOLD", None)
        t = time.time()
        p = None
        try:
            p = self.procs.start("B-port", argv, env)
            try:
                p.wait(budget)
            except subprocess.TimeoutExpired:
                self.say("phase B: out of time, stopping porter port")
                ph["cancelled_by_deadline"] = True
        finally:
            if p is not None:
                self.procs.stop([(n, q) for n, q in self.procs.running if q is p], grace_s=5)
                ph["returncode"] = p.returncode
            ph["wall_s"] = round(time.time() - t, 2)
            new = sorted({j.id for j in store.list_jobs(None)} - before)
            if not new:
                ph["status"] = "failed"
                ph["error"] = "porter port recorded no job: " + \
                    (self.logs / "B-port.log").read_text(errors="replace")[-800:]
            else:
                job = new[-1]
                info = store.get_job(job)
                ph.update(job=job, status=info.status, message=info.message)
                ph.update(self.analyse(store, job))
            self.save()
        return ph

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
