"""Kernel Porter's dashboard (Streamlit). Reads the database through db/ only; run it with
`porter dashboard`. Pages: Jobs, Job, Best configurations, Compare; pick one in the sidebar or
with ?page=jobs|job|best|compare&job=N in the address."""
from __future__ import annotations

import io
import os
import tempfile
import zipfile
from pathlib import Path

import pandas as pd
import plotly.express as px
import streamlit as st

from db import open_store

PAGES = ("Jobs", "Job", "Best configurations", "Compare")


@st.cache_resource
def store():
    return open_store(os.environ.get("PORTER_DB_URL", "sqlite:///porter.db"))


def jobs_page(s):
    st.header("Jobs")

    @st.fragment(run_every=5)
    def table():
        jobs = s.list_jobs(200)
        rows = [{"job": j.id, "template": j.template_name, "arch": j.spec.arch,
                 "backend": j.spec.backend, "status": j.status, "trials": j.n_trials,
                 "measured": j.n_measured, "best ratio": j.best_ratio, "message": j.message}
                for j in jobs]
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        if not rows:
            st.info("No jobs yet: run `porter port TEMPLATE --arch ARCH`.")
    table()


def _trials_frame(trials):
    rows = []
    for t in trials:
        m = t.measurements[0] if t.measurements else None
        rows.append({"trial": t.number, "status": t.status, "objective": t.objective,
                     "finished": t.finished_at, "registers": t.registers, "smem": t.smem_bytes,
                     "spills": t.spill_bytes, "ms": m.ours_ms if m else None,
                     "ratio": m.ratio if m else None, **t.params})
    return pd.DataFrame(rows)


def job_page(s):
    st.header("Job")
    jobs = s.list_jobs(1000)
    if not jobs:
        st.info("No jobs yet.")
        return
    ids = [j.id for j in jobs]
    wanted = int(st.query_params.get("job", ids[0]))
    job_id = st.selectbox("job", ids, index=ids.index(wanted) if wanted in ids else 0)
    info = s.get_job(job_id)
    st.write(f"**{info.template_name}** on **{info.spec.arch}**, {info.status} "
             f"({info.spec.backend}); {info.message}")
    trials = s.trials(job_id)
    df = _trials_frame(trials)
    if df.empty:
        st.info("No trials yet.")
        return
    st.subheader("Statuses")
    st.bar_chart(df["status"].value_counts())
    ok = df[df["objective"].notna()].sort_values("trial")
    if not ok.empty:
        ok = ok.assign(best=ok["objective"].cummin())
        st.subheader("Convergence")
        st.plotly_chart(px.line(ok, x="trial", y="best", title="best objective (ours/vendor)"),
                        width="stretch")
        st.plotly_chart(px.line(ok, x="finished", y="best", title="best objective over time"),
                        width="stretch")
        params = [p for p in trials[0].params if ok[p].nunique() > 1]
        if params:
            st.subheader("Parameter importance")
            spread = {p: float(ok.groupby(p)["objective"].mean().std() or 0) for p in params}
            st.bar_chart(pd.Series(spread, name="spread of mean objective"))
            st.plotly_chart(px.parallel_coordinates(ok, dimensions=params + ["objective"],
                                                    color="objective"),
                            width="stretch")
    st.subheader("Top configurations")
    st.dataframe(df[df["objective"].notna()].sort_values("objective").head(10),
                 hide_index=True, width="stretch")
    failed = [t for t in trials if t.status not in ("measured", "compiled")]
    if failed:
        st.subheader("Failures")
        for t in failed[:20]:
            with st.expander(f"trial {t.number}: {t.status}: {t.message[:80]}"):
                st.code(t.compile_log[-4000:] or t.message)
    st.subheader("Source")
    st.code(_template_source(s, info), language="cpp")
    st.subheader("Export")
    cols = st.columns(4)
    for i, fmt in enumerate(("cu", "cubin", "ptx", "fatbin", "python", "header", "json",
                             "kt-cache")):
        cols[i % 4].download_button(f"{fmt}", data=_export_zip(job_id, fmt),
                                    file_name=f"job{job_id}_{fmt}.zip", key=f"dl-{fmt}")


def _template_source(s, info):
    getter = getattr(s, "get_template", None)
    if getter is None:
        return ""
    try:
        return getter(info.template_hash).source
    except Exception:  # noqa: BLE001 - a missing template row shows as empty source
        return ""


@st.cache_data(show_spinner=False)
def _export_zip(job_id: int, fmt: str) -> bytes:
    from porter.errors import PorterError
    from porter.export import export
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory() as d, zipfile.ZipFile(buf, "w") as z:
        try:
            for p in export(store(), job_id, fmt, d):
                z.write(p, Path(p).name)
        except PorterError as e:
            z.writestr("ERROR.txt", str(e))
    return buf.getvalue()


def best_page(s):
    st.header("Best configurations")
    rows = [{"template": b.template, "arch": b.arch, "size": "x".join(map(str, b.size)),
             "ratio": b.ratio, "ms": b.ours_ms, "job": b.job_id,
             "params": " ".join(f"{k}={v}" for k, v in b.params.items())}
            for b in s.leaderboard()]
    if not rows:
        st.info("No measured trials yet.")
        return
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


def compare_page(s):
    st.header("Compare")
    board = s.leaderboard()
    templates = sorted({b.template for b in board})
    if not templates:
        st.info("No measured trials yet.")
        return
    t = st.selectbox("template", templates)
    archs = sorted({b.arch for b in board if b.template == t})
    a1 = st.selectbox("architecture A", archs, index=0)
    a2 = st.selectbox("architecture B", archs, index=len(archs) - 1)
    rows = []
    for b in board:
        if b.template == t and b.arch == a1:
            other = next((o for o in board if o.template == t and o.arch == a2
                          and o.size == b.size), None)
            moved = {k: (v, other.params.get(k)) for k, v in b.params.items()
                     if other and other.params.get(k) != v}
            rows.append({"size": "x".join(map(str, b.size)), f"{a1} ms": b.ours_ms,
                         f"{a2} ms": other.ours_ms if other else None,
                         "speedup B/A": (b.ours_ms / other.ours_ms) if other else None,
                         "parameters that moved": str(moved)})
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


def main():
    st.set_page_config(page_title="Kernel Porter", layout="wide")
    slugs = {"jobs": "Jobs", "job": "Job", "best": "Best configurations", "compare": "Compare"}
    wanted = slugs.get(st.query_params.get("page", "jobs"), "Jobs")
    page = st.sidebar.radio("page", PAGES, index=PAGES.index(wanted))
    {"Jobs": jobs_page, "Job": job_page, "Best configurations": best_page,
     "Compare": compare_page}[page](store())


main()
