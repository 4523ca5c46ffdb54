"""benchmarks/service_h200.py's phases: the preflight, Redis, the workers, submitting, and the
service and embedded runs it times (a mixin of its Bench)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from _service_procs import (ROOT, CLEANUP_S, NEEDED, NEEDED_GPU, free_port, redis_command, wait_for)


class Phases:
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
