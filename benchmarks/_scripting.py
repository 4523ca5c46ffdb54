"""What the device-side check scripts (export_check.py, kt_import_h200.py) share: a result file
rewritten after every step, a package preflight with one-line failures, and subprocesses in
their own process groups with a time limit."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDED = {"numpy": "numpy", "cuda.bindings": "cuda-bindings", "optuna": "optuna",
          "sqlalchemy": "sqlalchemy", "alembic": "alembic", "typer": "typer", "rich": "rich"}


class Failed(Exception):
    """A check that cannot go on: its message is the one line the script prints."""


class Report:
    """The result file, rewritten whole (atomically) after every step."""

    def __init__(self, path: Path, **fields):
        self.path = path
        self.data = dict(fields)
        self.write()

    def __setitem__(self, key, value):
        self.data[key] = value
        self.write()

    def write(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def check_packages(backend: str) -> None:
    need = dict(NEEDED)
    if backend == "gpu":
        need["cupy"] = "cupy-cuda13x"
    for mod, pkg in need.items():
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            found = False
        if not found and mod == "cupy":
            raise Failed("CuPy is missing: the GPU backend needs it (pip install cupy-cuda13x)")
        if not found:
            raise Failed(f"python package {pkg} is missing (install the carried wheels, e.g. "
                         "pip install --no-index --target /tmp/site .whl/*.whl, and put "
                         "/tmp/site on PYTHONPATH)")


def child_env(cache: Path, columns: int = 160) -> dict:
    env = dict(os.environ, PORTER_CACHE_DIR=str(cache), TERM="dumb", NO_COLOR="1",
               COLUMNS=str(columns), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def run(cmd: list[str], timeout: float, log: Path, env: dict) -> int | None:
    """Runs cmd in its own process group with output to log; None if it ran past timeout
    (the whole group is killed)."""
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                             start_new_session=True)
        try:
            return p.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return None


def last_line(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def fail(rep: Report, e: BaseException, t_start: float | None = None) -> int:
    """Records a failure in the result file and prints one line; exit status 1."""
    if t_start is not None:
        rep.data["wall_s"] = round(time.monotonic() - t_start, 1)
    if isinstance(e, Failed):
        rep["status"] = f"failed: {e}"
        print(f"error: {e}", file=sys.stderr)
        return 1
    import traceback
    rep.data["traceback"] = traceback.format_exception(e)
    rep["status"] = f"failed: {type(e).__name__}: {e}"
    print(f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
          file=sys.stderr)
    return 1
