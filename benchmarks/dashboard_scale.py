"""The dashboard at scale: 100 jobs and 50,000 trials (synthetic rows, bulk-inserted with
SQLAlchemy core; two measured sizes per measured trial), each page rendered once (Streamlit
AppTest, after one warm-up render for imports) and timed. The aim is under 2 s a page on CI's
2-core machine. Writes benchmarks/results/dashboard_scale.json:

    .venv/bin/python benchmarks/dashboard_scale.py

tests/test_dashboard_scale.py renders the same data and checks the pages' content (no timing).
"""
from __future__ import annotations

import datetime
import json
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
N_JOBS, N_TRIALS = 100, 50_000
LIMIT_S = 2.0
STATUSES = ["measured"] * 7 + ["compile_failed", "resource_rejected", "infeasible"]
PAGES = {"jobs": {}, "job": {"job": 1}, "best": {}, "compare": {}, "submit": {}}


def fill(url: str) -> dict:
    """Bulk-inserts the jobs, trials and measurements; returns {job id: template}."""
    from sqlalchemy import insert

    from db.engine import get_engine, normalize_url
    from db.models import Job, Measurement, Template, Trial
    from porter.job.jobs import template_record
    from porter.store.base import open_store
    from porter.spec.template import find_template

    open_store(url)
    rng = random.Random(0)
    engine = get_engine(normalize_url(url))
    tpls = {n: find_template(n) for n in ("gemm_mma", "rmsnorm")}
    archs = ["sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a"]
    now = time.time()
    per_job = N_TRIALS // N_JOBS
    jobs, trials, meas = [], [], []
    with engine.begin() as conn:
        for t in tpls.values():
            src, space = template_record(t)
            conn.execute(insert(Template).values(source_hash=t.source_hash, name=t.name,
                                                 version=t.version, source=src,
                                                 space_text=space, created_at=now))
        for j in range(1, N_JOBS + 1):
            t = tpls["gemm_mma" if j % 2 else "rmsnorm"]
            arch = archs[j % len(archs)]
            status = "running" if j > N_JOBS - 3 else "done"
            spec = {"template": t.name, "arch": arch, "backend": "synthetic", "sampler": "auto",
                    "seed": 0, "trials": per_job, "minutes": None, "replay": None,
                    "from_arch": None, "from_job": None,
                    "sizes": [list(s) for s in t.default_sizes[:2]]}
            jobs.append(dict(id=j, spec=spec, template_name=t.name, template_hash=t.source_hash,
                             arch=arch, status=status, message="synthetic (scale test)",
                             created_at=now - 3600, started_at=now - 3600,
                             finished_at=None if status == "running" else now,
                             study_name=f"porter-job-{j}", cancel_requested=False))
            for n in range(per_job):
                tid = len(trials) + 1
                st = rng.choice(STATUSES)
                params = {p: rng.choice(v) for p, v in t.params.items()}
                obj = rng.lognormvariate(0.3, 0.3) if st == "measured" else None
                trials.append(dict(
                    id=tid, job_id=j, number=n, params=params, status=st, backend="synthetic",
                    config_key=",".join(str(v) for v in params.values()), objective=obj,
                    message="synthetic", compile_log="error: synthetic" if st ==
                    "compile_failed" else "", registers=rng.randint(32, 255),
                    smem_bytes=rng.randint(0, 200_000), spill_bytes=0, stack_frame=0,
                    compile_seconds=1.0, device={"gpu": "synthetic"}, started_at=now - 3600 + n,
                    finished_at=now - 3600 + n + 1, worker="synthetic"))
                if st == "measured":
                    for s in t.default_sizes[:2]:
                        ours = rng.uniform(0.1, 3.0)
                        meas.append(dict(trial_id=tid, size="x".join(map(str, s)),
                                         ours_ms=ours, ours_spread=0.01, baseline="synthetic",
                                         baseline_ms=ours / obj, ratio=1 / obj))
        conn.execute(insert(Job), jobs)
        conn.execute(insert(Trial), trials)
        conn.execute(insert(Measurement), meas)
    return {"jobs": len(jobs), "trials": len(trials), "measurements": len(meas)}


def render(page: str, query: dict):
    """One page rendered once; returns (the AppTest after its run, seconds)."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["page"] = page
    for k, v in query.items():
        at.query_params[k] = str(v)
    t = time.perf_counter()
    at.run()
    return at, time.perf_counter() - t


def main() -> int:
    import os
    from streamlit.testing.v1 import AppTest
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/scale.db"
        t0 = time.perf_counter()
        counts = fill(url)
        fill_s = time.perf_counter() - t0
        os.environ["PORTER_DB_URL"] = url
        AppTest.from_file(APP, default_timeout=60).run()   # imports (plotly, pandas) once
        figures = {}
        for page, query in PAGES.items():
            at, s = render(page, query)
            if at.exception:
                print(f"page {page} failed: {at.exception[0].value}")
                return 1
            figures[page] = round(s, 3)
    print(f"filled {counts} in {fill_s:.1f} s; render seconds: {figures}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "dashboard page render time (Streamlit AppTest, one script run)",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(), "python": platform.python_version(),
        "database": "SQLite (file)", "data": dict(counts, synthetic=True),
        "limit_s": LIMIT_S, "render_s": figures,
        "under_limit": all(s < LIMIT_S for s in figures.values())}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
