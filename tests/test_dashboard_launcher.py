"""`porter dashboard` stops its Streamlit child: SIGTERM, SIGINT or SIGHUP to the command reach
the child and nothing is left running; a SIGKILLed command takes the child with it (Linux)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _start(tmp_path):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "porter.cli", "dashboard", "--port", str(port),
         "--db", f"sqlite:///{tmp_path / 'porter.db'}"], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health",
                                      timeout=2).status == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("porter dashboard did not start")
        time.sleep(0.3)
    children = _children(proc.pid)
    assert children, "streamlit runs as a child of porter dashboard"
    return proc, children, port


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_porter_dashboard_stops_streamlit(tmp_path, sig):
    proc, children, port = _start(tmp_path)
    proc.send_signal(sig)
    assert proc.wait(30) == 128 + sig
    for c in children:
        assert not _alive(c), f"streamlit child {c} still running after {sig.name}"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)


def test_a_killed_porter_dashboard_takes_streamlit_with_it(tmp_path):
    proc, children, _ = _start(tmp_path)
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 20
    while any(_alive(c) for c in children):
        if time.monotonic() > deadline:
            for c in children:
                if _alive(c):
                    os.kill(c, signal.SIGKILL)
            pytest.fail("streamlit outlived a SIGKILLed porter dashboard")
        time.sleep(0.2)
