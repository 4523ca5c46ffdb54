"""benchmarks/service_h200.py's processes: starting, stopping and waiting for Redis, workers
and porter commands in their own process groups."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
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
