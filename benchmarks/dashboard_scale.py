"""The dashboard at scale: one gemm_mma job of 100,000 trials (70 % measured at two sizes, with
registers, shared memory, TFLOP/s and GB/s) among 100 jobs (the other 99 with 200 trials each),
synthetic rows bulk-inserted with SQLAlchemy core into SQLite. Timed two ways:

- render_s: each page's script run in Streamlit's AppTest (server side only);
- browser_s: `streamlit run` served for real and loaded in headless Chromium (Selenium), from
  navigation (or a tab click) until the page is fully drawn: its title and the open tab's
  content present, Streamlit idle, every Plotly chart's SVG drawn. The server is warm (one
  other job's page opened first, for imports) but the 100,000-trial job's data is not cached.

Writes benchmarks/results/dashboard_scale.json:

    .venv/bin/python benchmarks/dashboard_scale.py [--trials 100000]

tests/test_dashboard_scale.py renders a smaller copy of the same data and checks the pages'
content (no timing); tests/test_dashboard_browser.py holds the browser helpers used here.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

APP = str(ROOT / "dashboard" / "app.py")
RESULTS = ROOT / "benchmarks" / "results" / "dashboard_scale.json"
N_JOBS, BIG_TRIALS, SMALL_TRIALS = 100, 100_000, 200
LIMIT_S = 3.0
STATUSES = ["measured"] * 7 + ["compile_failed", "resource_rejected", "infeasible"]
PAGES = {"jobs": {}, "job": {"job": 1}, "best": {}, "compare": {}, "submit": {}}
# the text each Job tab shows once its script has run (the browser waits for it)
TAB_MARKERS = {"Convergence": "best so far", "Trials": "Select a row for its detail",
               "Analysis": "One-way ANOVA", "Analysis/Slice": "Slice: each point",
               "Analysis/Contour": "Contour: the best", "Analysis/EDF": "Empirical distribution",
               "Analysis/Parallel coordinates": "Parallel coordinates: one line",
               "Kernel": "Roofs for", "Kernel/Resources": "Occupancy from the",
               "Failures": "failed trials", "Top configurations": "source with this trial",
               "Export": "porter export"}


def fill(url: str, big_trials: int = BIG_TRIALS, n_jobs: int = N_JOBS,
         small_trials: int = SMALL_TRIALS) -> dict:
    """Bulk-inserts the jobs (job 1 the big one, gemm_mma on sm_90a), trials and measurements;
    returns the row counts."""
    from sqlalchemy import insert

    from db.engine import get_engine, normalize_url
    from db.models import Job, Measurement, Template, Trial
    from porter.job.jobs import template_record, template_snapshot
    from porter.spec.template import find_template
    from porter.store.base import open_store

    open_store(url)
    rng = random.Random(0)
    engine = get_engine(normalize_url(url))
    tpls = {n: find_template(n) for n in ("gemm_mma", "rmsnorm")}
    archs = ["sm_90a", "sm_80", "sm_86", "sm_89", "sm_100a"]
    now = time.time()
    counts = {"jobs": 0, "trials": 0, "measurements": 0}
    with engine.begin() as conn:
        for t in tpls.values():
            src, space = template_record(t)
            conn.execute(insert(Template).values(source_hash=t.source_hash, name=t.name,
                                                 version=t.version, source=src,
                                                 space_text=space, created_at=now,
                                                 files=template_snapshot(t)))
        tid = 0
        for j in range(1, n_jobs + 1):
            t = tpls["gemm_mma" if j % 2 else "rmsnorm"]
            arch = archs[(j - 1) % len(archs)]
            n_trials = big_trials if j == 1 else small_trials
            status = "running" if j > n_jobs - 3 else "done"
            sizes = [list(s) for s in t.default_sizes[:2]]
            spec = {"template": t.name, "arch": arch, "backend": "synthetic", "sampler": "auto",
                    "seed": 0, "trials": n_trials, "minutes": None, "replay": None,
                    "from_arch": None, "from_job": None, "sizes": sizes}
            conn.execute(insert(Job).values(
                id=j, spec=spec, template_name=t.name, template_hash=t.source_hash, arch=arch,
                status=status, message="synthetic (scale test)", created_at=now - 7200,
                started_at=now - 7200, finished_at=None if status == "running" else now,
                study_name=f"porter-job-{j}", cancel_requested=False))
            trials, meas = [], []
            for n in range(n_trials):
                tid += 1
                st = rng.choice(STATUSES)
                params = {p: rng.choice(v) for p, v in t.params.items()}
                obj = rng.lognormvariate(0.3, 0.3) * (1 + 2 / (1 + n / 50)) \
                    if st == "measured" else None
                trials.append(dict(
                    id=tid, job_id=j, number=n, params=params, status=st, backend="synthetic",
                    config_key=",".join(str(v) for v in params.values()), objective=obj,
                    message="synthetic", compile_log="error: synthetic" if st ==
                    "compile_failed" else "", registers=rng.randint(32, 255),
                    smem_bytes=rng.randint(0, 200_000), spill_bytes=0, stack_frame=0,
                    compile_seconds=1.0, device={"gpu": "synthetic"},
                    started_at=now - 7200 + n * 0.05, finished_at=now - 7200 + n * 0.05 + 0.04,
                    worker="synthetic"))
                if st == "measured":
                    for s in t.default_sizes[:2]:
                        work = math.prod(s)
                        ours = obj * rng.uniform(0.8, 1.2)
                        meas.append(dict(trial_id=tid, size="x".join(map(str, s)),
                                         ours_ms=ours, ours_spread=0.01, baseline="synthetic",
                                         baseline_ms=ours / obj, ratio=1 / obj,
                                         tflops=2 * work / ours / 1e9 / 1000,
                                         gbps=4 * work ** (2 / 3) / ours / 1e6))
            conn.execute(insert(Trial), trials)
            if meas:
                conn.execute(insert(Measurement), meas)
            counts["jobs"] += 1
            counts["trials"] += len(trials)
            counts["measurements"] += len(meas)
    return counts


def render(page: str, query: dict):
    """One page rendered once in AppTest; returns (the AppTest after its run, seconds)."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page(f"page_scripts/{page}.py")
    for k, v in query.items():
        at.query_params[k] = str(v)
    t = time.perf_counter()
    at.run()
    return at, time.perf_counter() - t


def _browser_helpers():
    spec = importlib.util.spec_from_file_location(
        "dashboard_browser", ROOT / "tests" / "test_dashboard_browser.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod      # its dataclasses look themselves up there
    spec.loader.exec_module(mod)
    return mod


def browser_times(url: str, tmp: Path) -> dict[str, float]:
    """Seconds from navigation (or a tab click) to a fully drawn page in headless Chromium."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    b = _browser_helpers()
    reason = b.have_browser()
    if reason:
        raise SystemExit(reason)
    proc, base, log = b.start_server(url, tmp / "streamlit.log")
    driver = b.new_browser(tmp / "downloads", tmp / "profile")
    out: dict[str, float] = {}

    def until(marker: str | None, title: str, t0: float) -> float:
        def ready(d):
            body = d.find_element(By.TAG_NAME, "body").text
            return title in body and (marker is None or marker in body) and b.drawn(d)
        WebDriverWait(driver, 120, poll_frequency=0.02).until(ready)
        s = time.perf_counter() - t0
        err = b.exception_text(driver)
        if err:
            raise SystemExit(f"the page shows an exception: {err}")
        return round(s, 3)
    try:
        driver.get(f"{base}/job?job=2")         # warm: imports, the browser's own caches
        until(TAB_MARKERS["Convergence"], "Job", time.perf_counter())
        t0 = time.perf_counter()
        driver.get(f"{base}/job?job=1")
        out["job"] = until(TAB_MARKERS["Convergence"], "Job", t0)
        for tab, marker in TAB_MARKERS.items():
            if tab == "Convergence":
                continue
            t0 = time.perf_counter()
            b.click_tab(driver, tab.split("/")[-1])
            out[f"job/{tab}"] = until(marker, "Job", t0)
        t0 = time.perf_counter()
        b.click_tab(driver, "Convergence")
        out["job/Convergence"] = until(TAB_MARKERS["Convergence"], "Job", t0)
        for page, title, marker in (("jobs", "Jobs", "refreshed every"),
                                    ("best", "Best configurations", "Across architectures"),
                                    ("compare", "Compare", "speedup"),
                                    ("submit", "Submit a porting job", "replay source")):
            t0 = time.perf_counter()
            driver.get(f"{base}/{page}")
            out[page] = until(marker, title, t0)
    finally:
        driver.quit()
        b.stop_server(proc, log)
    return out


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
            "load_1min": round(os.getloadavg()[0], 2), "python": platform.python_version(),
            "os": platform.platform()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=BIG_TRIALS, help="trials of the big job")
    args = ap.parse_args()
    import streamlit
    from streamlit.testing.v1 import AppTest
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/scale.db"
        t0 = time.perf_counter()
        counts = fill(url, args.trials)
        fill_s = time.perf_counter() - t0
        print(f"filled {counts} in {fill_s:.1f} s")
        os.environ["PORTER_DB_URL"] = url
        mach = machine()
        browser = browser_times(url, Path(tmp))
        print(f"browser seconds: {browser}")
        AppTest.from_file(APP, default_timeout=120).run()   # imports (plotly, pandas) once
        render_s = {}
        for page, query in PAGES.items():
            at, s = render(page, query)
            if at.exception:
                print(f"page {page} failed: {at.exception[0].value}")
                return 1
            render_s[page] = round(s, 3)
        print(f"AppTest render seconds: {render_s}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "dashboard at scale: page load in headless Chromium (browser_s) and "
                     "one script run in Streamlit AppTest (render_s)",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": mach, "streamlit": streamlit.__version__,
        "database": "SQLite (file)",
        "data": dict(counts, big_job_trials=args.trials, synthetic=True),
        "limit_s": LIMIT_S, "browser_s": browser, "render_s": render_s,
        "under_limit": all(s <= LIMIT_S for s in browser.values())}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
