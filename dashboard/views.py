"""The dashboard's pages. Each reads through dashboard.queries (db/) and draws; none computes a
measurement. Submit queues a job through the same path as `porter submit`."""
from __future__ import annotations

import math

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from . import queries as q
from .exports import export_zip

EXPORT_FORMATS = ("cu", "cubin", "ptx", "fatbin", "python", "header", "json", "kt-cache")
REFRESH_SECONDS = 5


def _fmt_ratio(r) -> str:
    return "-" if r is None or (isinstance(r, float) and math.isnan(r)) else f"{r:.3f}x"


# ---- Jobs -----------------------------------------------------------------------------------

def jobs_page(url: str) -> None:
    st.title("Jobs")
    with q.connect(url) as conn:
        running = q.active_jobs(conn)
    every = REFRESH_SECONDS if running else None
    if running:
        st.caption(f"{running} job(s) queued or running: refreshing every {REFRESH_SECONDS} s")

    @st.fragment(run_every=every)
    def table():
        with q.connect(url) as conn:
            df = q.jobs(conn, 200)
        if df.empty:
            st.info("No jobs yet. Submit one on the Submit page or run `porter port`.")
            return
        cols = st.columns(4)
        for c, s in zip(cols, ("running", "queued", "done", "failed")):
            c.metric(s, int((df["status"] == s).sum()))
        df = df.assign(link="job?job=" + df["job"].astype(str))
        st.dataframe(
            df[["link", "template", "arch", "backend", "status", "progress", "trials", "budget",
                "measured", "best_ratio", "minutes", "created", "message"]],
            hide_index=True, key="jobs_table",
            column_config={
                "link": st.column_config.LinkColumn("job", display_text=r"job\?job=(\d+)"),
                "progress": st.column_config.ProgressColumn("progress", min_value=0.0,
                                                            max_value=1.0, format="percent"),
                "best_ratio": st.column_config.NumberColumn("best ratio", format="%.3fx",
                                                            help="baseline time / our time, "
                                                            "geometric mean over sizes"),
                "minutes": st.column_config.NumberColumn("minutes", format="%.1f"),
            })
    table()


# ---- Job ------------------------------------------------------------------------------------

def _pick_job(conn) -> int | None:
    ids = q.job_ids(conn)
    if not ids:
        st.info("No jobs yet.")
        return None
    labels = dict(ids)
    wanted = st.query_params.get("job")
    default = 0
    if wanted is not None and str(wanted).isdigit() and int(wanted) in labels:
        default = [i for i, _ in ids].index(int(wanted))
    job_id = st.selectbox("job", [i for i, _ in ids], index=default,
                          format_func=lambda i: labels[i], key="job_pick")
    st.query_params["job"] = str(job_id)
    return job_id


def job_page(url: str) -> None:
    st.title("Job")
    with q.connect(url) as conn:
        job_id = _pick_job(conn)
        if job_id is None:
            return
        job = q.job_row(conn, job_id)
        df = q.trials(conn, job_id)
        counts = q.status_counts(conn, job_id)
        fails = q.failures(conn, job_id)
        top = q.top_configs(conn, job_id, 10)
        src = q.template_source(conn, job.template_hash)
    spec = job.spec or {}
    sizes = ", ".join("x".join(map(str, s)) for s in spec.get("sizes", []))
    st.markdown(f"**{job.template_name}** on **{job.arch}** · backend `{spec.get('backend')}` · "
                f"sampler `{spec.get('sampler')}` · sizes {sizes} · status **{job.status}**"
                + (f" · {job.message}" if job.message else ""))
    measured = df[df["status"] == "measured"]
    c = st.columns(4)
    c[0].metric("trials", len(df))
    c[1].metric("measured", len(measured))
    c[2].metric("best ratio", _fmt_ratio(measured["ratio"].max() if len(measured) else None))
    c[3].metric("failed", sum(n for s, n in counts.items() if s in q.FAILED))
    if spec.get("backend") == "compile-only" or (len(df) and not len(measured)
                                                 and "compiled" in counts):
        st.warning("Compile-only job: variants were compiled, not measured.")

    tabs = st.tabs(["Convergence", "Parameters", "Statuses", "Top configurations", "Export"])
    with tabs[0]:
        _convergence(df)
    with tabs[1]:
        _parameters(url, df, list((df["params"].iloc[0] or {}).keys()) if len(df) else [], job)
    with tabs[2]:
        _statuses(counts, fails)
    with tabs[3]:
        _top(top, src, spec)
    with tabs[4]:
        _exports(url, job_id, len(df))


def _convergence(df: pd.DataFrame) -> None:
    conv = q.convergence(df)
    if conv.empty or conv["best_objective"].isna().all():
        st.info("No measured or compiled trial yet.")
        return
    y, label = ("best_ratio", "best ratio (baseline / ours)") \
        if conv["best_ratio"].notna().any() else ("best_objective", "best objective")
    left, right = st.columns(2)
    fig = px.line(conv, x="index", y=y, markers=False, labels={"index": "trials", y: label},
                  title="best so far vs trials", line_shape="hv")
    ok = conv[conv["status"] == "measured"]
    if len(ok) and y == "best_ratio":
        fig.add_scatter(x=ok["index"], y=ok["ratio"], mode="markers", name="trial",
                        marker={"size": 4, "opacity": 0.4})
    left.plotly_chart(fig, key="conv_trials")
    if conv["minutes"].notna().any():
        fig2 = px.line(conv, x="minutes", y=y, labels={y: label}, line_shape="hv",
                       title="best so far vs time (minutes)")
        right.plotly_chart(fig2, key="conv_time")


def _parameters(url: str, df: pd.DataFrame, names: list[str], job) -> None:
    pf = q.param_frame(df)
    if pf.empty:
        st.info("No measured trial: nothing to rank parameters by.")
        return
    imp = q.importance(pf, names)
    st.subheader("Parameter importance")
    st.caption("Share of the variance of log(objective) explained by each parameter's values "
               "(one-way ANOVA over measured trials; a cheap stand-in for fANOVA).")
    st.plotly_chart(px.bar(imp, x="importance", y="param", orientation="h"),
                    key="importance")
    if job.study_name and st.button("Optuna fANOVA importance (slower)", key="fanova"):
        try:
            import optuna
            study = optuna.load_study(study_name=job.study_name,
                                      storage=q.store_for(url).optuna_storage())
            st.write(optuna.importance.get_param_importances(study))
        except Exception as e:  # a study without finished trials, or none stored
            st.warning(f"Optuna importance unavailable: {e}")
    st.subheader("Parallel coordinates")
    color = "ratio" if pf["ratio"].notna().any() else "objective"
    dims = []
    for n in names:
        if n not in pf:
            continue
        vals = sorted(pf[n].unique(), key=lambda v: (str(type(v)), v))
        index = {v: i for i, v in enumerate(vals)}
        dims.append({"label": n, "values": pf[n].map(index), "tickvals": list(range(len(vals))),
                     "ticktext": [str(v) for v in vals]})
    dims.append({"label": color, "values": pf[color]})
    fig = go.Figure(go.Parcoords(line={"color": pf[color], "colorscale": "Viridis",
                                       "showscale": True}, dimensions=dims))
    st.plotly_chart(fig, key="parcoords")


def _statuses(counts: dict, fails: pd.DataFrame) -> None:
    if not counts:
        st.info("No trials yet.")
        return
    sc = pd.DataFrame(sorted(counts.items()), columns=["status", "trials"])
    st.plotly_chart(px.bar(sc, x="status", y="trials", color="status"),
                    key="statuses")
    st.subheader("Failures")
    if fails.empty:
        st.caption("No failed trial.")
        return
    for r in fails.itertuples():
        cfg = " ".join(f"{k}={v}" for k, v in (r.params or {}).items())
        with st.expander(f"trial {r.number}: {r.status} · {cfg}"):
            st.write(r.message or "")
            if r.compile_log:
                st.code(r.compile_log[-4000:], language="text")


def _top(top: pd.DataFrame, src, spec: dict) -> None:
    if top.empty:
        st.info("No measured or compiled trial yet.")
        return
    st.dataframe(top, hide_index=True, key="top_table",
                 column_config={"ratio": st.column_config.NumberColumn(format="%.3fx"),
                                "ours_ms": st.column_config.NumberColumn(format="%.4f"),
                                "baseline_ms": st.column_config.NumberColumn(format="%.4f")})
    st.subheader("Source of the best variant")
    best = top.iloc[0]
    defines = "\n".join(f"#define {kv.split('=')[0]} {kv.split('=')[1]}"
                        for kv in best["params"].split())
    if src:
        st.code(f"// trial {best['number']}: tuned constants\n{defines}\n\n{src[0]}",
                language="cpp")
    else:
        st.code(defines, language="cpp")


def _exports(url: str, job_id: int, n_trials: int) -> None:
    if not n_trials:
        st.info("Nothing to export yet.")
        return
    st.caption("Each button runs `porter export` for this job and downloads the files as a "
               "zip (with manifest.json). Binary formats compile on first click.")
    cols = st.columns(4)
    for i, fmt in enumerate(EXPORT_FORMATS):
        cols[i % 4].download_button(
            fmt, data=lambda fmt=fmt: export_zip(url, job_id, fmt, n_trials),
            file_name=f"job{job_id}_{fmt}.zip", mime="application/zip",
            key=f"export_{fmt}", on_click="ignore")


# ---- Best configurations --------------------------------------------------------------------

def best_page(url: str) -> None:
    st.title("Best configurations")
    st.caption("Per template, architecture and problem size: the best measured configuration "
               "over all jobs, and its ratio to the vendor baseline on the same GPU.")
    with q.connect(url) as conn:
        lb = q.leaderboard(conn)
    if lb.empty:
        st.info("No measured trial yet.")
        return
    templates = sorted(lb["template"].unique())
    pick = st.multiselect("templates", templates, default=templates, key="best_templates")
    lb = lb[lb["template"].isin(pick)]
    lb = lb.assign(cell=[f"{_fmt_ratio(r)} · {c}" for r, c in zip(lb["ratio"], lb["config"])])
    grid = lb.pivot_table(index=["template", "size"], columns="arch", values="cell",
                          aggfunc="first").reset_index()
    st.subheader("Grid")
    st.dataframe(grid, hide_index=True, key="best_grid")
    ratios = lb.pivot_table(index=["template", "size"], columns="arch", values="ratio",
                            aggfunc="first")
    if ratios.notna().any().any():
        fig = px.imshow(ratios.values, x=list(ratios.columns),
                        y=[f"{t} {s}" for t, s in ratios.index], color_continuous_scale="RdYlGn",
                        color_continuous_midpoint=1.0, text_auto=".2f", aspect="auto",
                        labels={"color": "ratio"})
        st.plotly_chart(fig, key="best_heatmap")
    st.subheader("Details")
    st.dataframe(lb.drop(columns=["params", "cell"]), hide_index=True,
                 key="best_details")


# ---- Compare --------------------------------------------------------------------------------

def compare_page(url: str) -> None:
    st.title("Compare")
    with q.connect(url) as conn:
        ta = q.templates_and_archs(conn)
        if not ta:
            st.info("No jobs yet.")
            return
        template = st.selectbox("template", sorted(ta), key="cmp_template")
        archs = ta[template]
        if len(archs) < 2:
            st.info(f"{template} has jobs on one architecture only ({archs[0]}).")
            return
        c = st.columns(2)
        a = c[0].selectbox("from", archs, index=0, key="cmp_a")
        b = c[1].selectbox("to", archs, index=1, key="cmp_b")
        df = q.compare(conn, template, a, b)
    st.caption("speedup = time on the first / time on the second (different GPUs: this "
               "compares hardware and port together); ratio = vendor time / ours, per GPU.")
    if df.empty:
        st.info("Neither architecture has a measured trial yet.")
        return
    st.dataframe(df, hide_index=True, key="cmp_table",
                 column_config={"speedup": st.column_config.NumberColumn(format="%.2fx")})
    if df["speedup"].notna().any():
        st.plotly_chart(px.bar(df, x="size", y="speedup"),
                        key="cmp_chart")


# ---- Submit ---------------------------------------------------------------------------------

def submit_page(url: str) -> None:
    from porter.spec.arch import ARCHS
    from porter.errors import PorterError
    from porter.records import BACKENDS, SAMPLERS
    from porter.spec.template import discover
    st.title("Submit a porting job")
    st.caption("Queues the job for the service's workers, like `porter submit`.")
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
        sampler = c[0].selectbox("sampler", SAMPLERS, index=SAMPLERS.index("auto"),
                                 key="sub_sampler")
        backend = c[1].selectbox("backend", BACKENDS, key="sub_backend")
        from_arch = c[2].selectbox("warm start from", ["", *ARCHS], key="sub_from")
        replay = st.text_input("replay source (for backend replay)", key="sub_replay")
        go_ = st.form_submit_button("Submit")
    if go_:
        from porter.job.jobs import make_spec
        from porter.store.base import plugin
        try:
            spec, _, _ = make_spec(template, arch, sizes.split() or None, int(trials) or None,
                                   float(minutes) or None, sampler, int(seed), backend,
                                   replay or None, from_arch or None)
            job_id = plugin("service")().submit(spec, url)
        except PorterError as e:
            st.error(str(e))
        else:
            st.success(f"queued job {job_id}")
            st.markdown(f"[open job {job_id}](job?job={job_id})")
