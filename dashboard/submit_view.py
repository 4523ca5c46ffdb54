"""The Submit page. With a reachable broker (PORTER_BROKER_URL, Celery installed) a job can go to
the service's workers, as `porter submit` does; without one it runs here, as `porter port` in a
background process of its own (so it survives the page and the dashboard's reruns). Mistakes
print one line; a submission that fails leaves no job row behind."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import streamlit as st

from . import data

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED = "here (a background `porter port` process)"
SERVICE = "the service's workers (`porter submit`)"
_JOB_LINE = re.compile(r"^job (\d+):", re.M)


def broker_problem() -> str | None:
    """None when jobs can be queued; otherwise why not, in one line."""
    url = os.environ.get("PORTER_BROKER_URL", "")
    if not url:
        return "PORTER_BROKER_URL is not set"
    try:
        import celery  # noqa: F401
    except ImportError:
        return "Celery is not installed (pip install -e '.[service]')"
    p = urlparse(url)
    try:
        socket.create_connection((p.hostname or "127.0.0.1", p.port or 6379), timeout=1).close()
    except OSError as e:
        return f"the broker {p.hostname}:{p.port or 6379} is unreachable ({e.strerror or e})"
    return None


def port_command(spec, db: str) -> list[str]:
    """`porter port` with the spec's arguments (the background run)."""
    cmd = [sys.executable, "-m", "porter.cli", "port", spec.template, "--arch", spec.arch,
           "--sampler", spec.sampler, "--seed", str(spec.seed), "--backend", spec.backend,
           "--db", db]
    for s in spec.sizes:
        cmd += ["--sizes", "x".join(map(str, s))]
    if spec.trials:
        cmd += ["--trials", str(spec.trials)]
    if spec.minutes:
        cmd += ["--minutes", str(spec.minutes)]
    if spec.replay:
        cmd += ["--replay", str(spec.replay)]
    if spec.from_arch:
        cmd += ["--from-arch", spec.from_arch]
    if spec.fresh:
        cmd += ["--fresh"]
    if spec.cold:
        cmd += ["--cold"]
    return cmd


def run_embedded(spec, db: str, wait_s: float = 120.0) -> int:
    """Starts `porter port` in its own session and returns the job id it prints once the job
    is recorded. If it exits first, its one-line error becomes a PorterError (the CLI leaves
    nothing half-written in the database)."""
    from porter.errors import PorterError
    log = Path(tempfile.mkdtemp(prefix="porter-dashboard-run-")) / "port.log"
    env = dict(os.environ, COLUMNS="200", TERM="dumb", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with open(log, "wb") as out:
        proc = subprocess.Popen(port_command(spec, db), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=ROOT, env=env,
                                start_new_session=True)
    threading.Thread(target=proc.wait, daemon=True).start()   # reaps it when it ends
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if m := _JOB_LINE.search(text):
            return int(m.group(1))
        if proc.poll() is not None:
            err = [ln for ln in text.splitlines() if ln.startswith("error:")]
            raise PorterError(err[-1][7:] if err else
                              f"porter port exited with status {proc.returncode} ({log})")
        time.sleep(0.2)
    raise PorterError(f"porter port did not record its job within {wait_s:.0f} s (log: {log})")


def submit_service(spec, db: str) -> int:
    """`porter submit`; if the broker fails after the job row was written, the row goes."""
    from porter.errors import PorterError
    from porter.store.base import plugin
    try:
        return plugin("service")().submit(spec, db)
    except PorterError as e:
        m = re.search(r"job (\d+) recorded but not queued", str(e))
        if m:
            data.store(db).delete_job(int(m.group(1)))
            raise PorterError(f"not queued: {str(e).split(': ', 1)[-1]}") from None
        raise


def submit_page() -> None:
    from porter.errors import PorterError
    from porter.records import BACKENDS, SAMPLERS
    from porter.spec.arch import ARCHS
    from porter.spec.template import discover
    st.title("Submit a porting job")
    u = data.url()
    problem = broker_problem()
    modes = [EMBEDDED] if problem else [SERVICE, EMBEDDED]
    if problem:
        st.caption(f"No broker ({problem}): the job runs here, in a background process.")
    with st.form("submit"):
        template = st.selectbox("template", sorted(discover()), key="sub_template")
        arch = st.selectbox("architecture", list(ARCHS), key="sub_arch",
                            index=list(ARCHS).index("sm_90a") if "sm_90a" in ARCHS else 0)
        sizes = st.text_input("sizes (space separated, e.g. 4096x4096x4096; empty: default)",
                              key="sub_sizes")
        c = st.columns(3)
        trials = c[0].number_input("trials", min_value=0, value=100, step=10, key="sub_trials")
        minutes = c[1].number_input("minutes (0: none)", min_value=0.0, value=0.0,
                                    key="sub_minutes")
        seed = c[2].number_input("seed", min_value=0, value=0, key="sub_seed")
        c = st.columns(3)
        samplers = list(SAMPLERS)
        sampler = c[0].selectbox("sampler", samplers, index=samplers.index("auto"),
                                 key="sub_sampler")
        backend = c[1].selectbox("backend", list(BACKENDS), key="sub_backend")
        from_arch = c[2].selectbox("warm start from", ["", *ARCHS], key="sub_from")
        replay = st.text_input("replay source (for backend replay)", key="sub_replay")
        fresh = st.checkbox("fresh measurements (reuse no earlier job's measurement of the same "
                            "template, GPU, sizes and harness)", key="sub_fresh")
        cold = st.checkbox("cold start (not from the nearest sizes earlier jobs of the template "
                           "tuned)", key="sub_cold")
        mode = st.radio("run on", modes, key="sub_mode", horizontal=True)
        go_ = st.form_submit_button("Submit")
    if not go_:
        return
    from porter.job.jobs import make_spec
    try:
        spec, _, _ = make_spec(template, arch, sizes.split() or None, int(trials) or None,
                               float(minutes) or None, sampler, int(seed), backend,
                               replay or None, from_arch or None, fresh=fresh, cold=cold)
        if mode == SERVICE:
            job_id = submit_service(spec, u)
            st.success(f"queued job {job_id}")
        else:
            with st.spinner("starting porter port ..."):
                job_id = run_embedded(spec, u)
            st.success(f"job {job_id} is running here in a background process")
    except PorterError as e:
        st.error(str(e).splitlines()[0] if str(e) else type(e).__name__)
    else:
        st.page_link("page_scripts/job.py", label=f"open job {job_id}",
                     query_params={"job": str(job_id)})
