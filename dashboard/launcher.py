"""`porter dashboard`: Streamlit as a child process that never outlives its parent.

The parent forwards SIGINT, SIGTERM and SIGHUP to the child and waits for it (SIGKILL after a
grace period); on Linux the child also gets SIGTERM if the parent dies without a chance to
forward anything (prctl PR_SET_PDEATHSIG). Stopping `porter dashboard` by any of these signals
leaves nothing running.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_S = 10.0


def command(port: int, address: str) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.address", address,
            "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def serve(port: int = 8501, address: str = "127.0.0.1", db: str | None = None) -> int:
    """Runs the dashboard until it exits or this process is signalled; returns its exit
    status (128 + the signal's number when it was stopped by one we forwarded)."""
    env = dict(os.environ)
    if db:
        env["PORTER_DB_URL"] = db
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(APP.parent.parent),
                                                       env.get("PYTHONPATH")]))
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    child = subprocess.Popen(command(port, address), env=env, preexec_fn=preexec)
    got: list[int] = []

    def forward(signum, _frame):
        got.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        deadline = None
        while True:
            try:
                code = child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if got and deadline is None:
                    deadline = time.monotonic() + GRACE_S
                if deadline is not None and time.monotonic() > deadline:
                    child.kill()   # asked to stop and did not within the grace period
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if child.poll() is None:
            child.kill()
            child.wait()
    return 128 + got[0] if got else code
