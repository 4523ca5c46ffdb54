"""The Best configurations page (the best measured configuration per template, architecture and
size over all jobs, and one template's best configurations side by side across architectures
and sizes with what moved) and the Compare page (one template on two architectures; several
jobs' convergence and distributions overlaid)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from . import data
from .job_tabs import HIGHER


def best_page() -> None:
    st.title("Best configurations")
    st.caption("Per template, architecture and problem size: the best measured configuration "
               "over all jobs, and its ratio to the vendor baseline on the same GPU.")
    u = data.url()
    lb = data.leaderboard(u)
    if lb.empty:
        st.info("No measured trial yet.")
        return
    templates = sorted(lb["template"].unique())
    pick = st.multiselect("templates", templates, default=templates, key="best_templates")
    lb = lb[lb["template"].isin(pick)]
    lb = lb.assign(cell=[f"{data.fmt_ratio(r)} · {c}" for r, c in zip(lb["ratio"], lb["config"])])
    grid = lb.pivot_table(index=["template", "size"], columns="arch", values="cell",
                          aggfunc="first").reset_index()
    left, right = st.columns([3, 2])
    left.subheader("Grid")
    left.dataframe(grid, hide_index=True, key="best_grid")
    ratios = lb.pivot_table(index=["template", "size"], columns="arch", values="ratio",
                            aggfunc="first")
    if ratios.notna().any().any():
        fig = go.Figure(go.Heatmap(z=ratios.values, x=list(ratios.columns),
                                   y=[f"{t} {s}" for t, s in ratios.index],
                                   colorscale="RdYlGn", zmid=1.0, texttemplate="%{z:.2f}",
                                   colorbar={"title": "ratio"}))
        fig.update_layout(height=120 + 30 * len(ratios), margin={"t": 20})
        right.subheader("Ratio to the vendor")
        right.plotly_chart(fig, key="best_heatmap")
    across(lb)
    st.subheader("Details")
    st.dataframe(lb.drop(columns=["params", "cell"]), hide_index=True, key="best_details")


def across(lb: pd.DataFrame) -> None:
    """One template: each parameter's tuned value per (architecture, size); cells that differ
    from the first column are what moved."""
    st.subheader("Across architectures and sizes")
    if lb.empty:
        return
    template = st.selectbox("template", sorted(lb["template"].unique()), key="best_across")
    t = lb[lb["template"] == template].sort_values(["arch", "size"])
    cols = [f"{a} · {s}" for a, s in zip(t["arch"], t["size"])]
    params = list(dict.fromkeys(k for p in t["params"] for k in p))
    table = pd.DataFrame({c: [p.get(k) for k in params] for c, p in zip(cols, t["params"])},
                         index=params).astype(str)
    head = pd.DataFrame([[data.fmt_ratio(r) for r in t["ratio"]],
                         [f"{v:.4g}" for v in t["ours_ms"]], [str(j) for j in t["job"]]],
                        index=["ratio", "ms", "job"], columns=cols)
    full = pd.concat([head, table])
    ref = table.iloc[:, 0]
    moved = table.ne(ref, axis=0)

    def style(df: pd.DataFrame) -> pd.DataFrame:
        out = pd.DataFrame("", index=df.index, columns=df.columns)
        out.loc[params] = np.where(moved, "background-color: #fff3b0; font-weight: bold", "")
        return out
    st.dataframe(full.style.apply(style, axis=None), key="best_across_table")
    n = moved.any(axis=1)
    st.caption(f"Highlighted: values that differ from {cols[0]}. Moved: "
               + (", ".join(n[n].index) if n.any() else "nothing") + ".")


def compare_page() -> None:
    st.title("Compare")
    u = data.url()
    store = data.store(u)
    arch_tab, overlay_tab = st.tabs(["Two architectures", "Overlay jobs"], key="cmp_tab",
                                    bind="query-params")
    if arch_tab.open:
        with arch_tab:
            _two_archs(u, store)
    if overlay_tab.open:
        with overlay_tab:
            overlay(u, store)


def _two_archs(u: str, store) -> None:
    ta = store.templates_and_archs()
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
    la = data.leaderboard(u, template, a).set_index("size")
    lb = data.leaderboard(u, template, b).set_index("size")
    st.caption("speedup = time on the first / time on the second (different GPUs: this "
               "compares hardware and port together); ratio = vendor time / ours, per GPU.")
    rows = []
    for size in sorted(set(la.index) | set(lb.index)):
        ra = la.loc[size] if size in la.index else None
        rb = lb.loc[size] if size in lb.index else None
        both = ra is not None and rb is not None
        moved = [f"{k}: {ra['params'].get(k)} -> {rb['params'].get(k)}" for k in ra["params"]
                 if ra["params"].get(k) != rb["params"].get(k)] if both else []
        rows.append({"size": size, f"ms {a}": None if ra is None else ra["ours_ms"],
                     f"ms {b}": None if rb is None else rb["ours_ms"],
                     "speedup": ra["ours_ms"] / rb["ours_ms"] if both else None,
                     f"ratio {a}": None if ra is None else ra["ratio"],
                     f"ratio {b}": None if rb is None else rb["ratio"],
                     "params moved": ", ".join(moved) or ("-" if both else "n/a")})
    df = pd.DataFrame(rows)
    if df.empty:
        st.info("Neither architecture has a measured trial yet.")
        return
    st.dataframe(df, hide_index=True, key="cmp_table",
                 column_config={"speedup": st.column_config.NumberColumn(format="%.2fx")})
    if df["speedup"].notna().any():
        fig = go.Figure(go.Bar(x=df["size"], y=df["speedup"]))
        fig.update_layout(height=320, yaxis_title="speedup")
        st.plotly_chart(fig, key="cmp_chart")


def overlay(u: str, store) -> None:
    """Several jobs' best so far and EDFs on shared axes (the same template on two GPUs, or two
    samplers on one)."""
    search = st.text_input("find jobs", key="ov_search",
                           placeholder="id, template, architecture, name or status")
    rows, _ = data.job_choices(u, search, 200)
    labels = {r["job"]: data.job_label(r) for r in rows}
    wanted = [int(j) for j in st.query_params.get_all("jobs") if j.isdigit()]
    for j in wanted:
        if j not in labels and (d := store.job_detail(j)) is not None:
            labels[j] = data.job_label({"job": j, "template": d["template_name"],
                                        "arch": d["arch"], "status": d["status"],
                                        "name": d["name"]})
    started = [r for r in rows if r["status"] != "queued"]
    default = [j for j in wanted if j in labels] or [   # the newest job and its template's others
        r["job"] for r in started if started and r["template"] == started[0]["template"]][:3]
    picked = st.multiselect("jobs", list(labels), default=default, format_func=labels.get,
                            key="ov_jobs")
    c = st.columns([2, 1, 1])
    metric = c[0].segmented_control("metric", ["objective", "ratio", "gbps", "tflops"],
                                    default="objective", key="ov_metric",
                                    format_func=data.METRIC_LABELS.get) or "objective"
    x = c[1].segmented_control("x axis", ["trials", "minutes"], default="trials", key="ov_x")
    log = c[2].toggle("log scale", key="ov_log")
    if not picked:
        st.info("Pick jobs to overlay.")
        return
    conv, edf = go.Figure(), go.Figure()
    for j in picked:
        ver = data.version(u, j)
        d = data.job(u, j, ver)
        if d is None:
            continue
        df = data.convergence(u, j, ver, metric)
        if df["best"].notna().any():
            t0 = d["started_at"] or df["t"].min()
            xs = df["idx"] if x != "minutes" else (df["t"] - t0) / 60
            conv.add_scatter(x=xs, y=df["best"], mode="lines", line={"shape": "hv"},
                             name=labels.get(j, str(j)))
        s = data.sample(u, j, ver)
        if not s.empty:
            v = np.sort(s[metric].dropna().to_numpy())
            edf.add_scatter(x=v, y=np.arange(1, len(v) + 1) / max(1, len(v)), mode="lines",
                            line={"shape": "hv"}, name=labels.get(j, str(j)))
    label = data.METRIC_LABELS[metric]
    conv.update_layout(height=400, margin={"t": 30}, xaxis_title=x or "trials",
                       yaxis_title=f"best so far: {label}", yaxis_type="log" if log else "linear",
                       legend={"orientation": "h", "y": -0.2})
    edf.update_layout(height=360, margin={"t": 30}, xaxis_title=label,
                      yaxis_title="fraction of trials ≤ x", xaxis_type="log" if log else "linear",
                      legend={"orientation": "h", "y": -0.25})
    left, right = st.columns(2)
    left.plotly_chart(conv, key="ov_conv")
    right.plotly_chart(edf, key="ov_edf")
    st.caption(("Higher is better" if HIGHER[metric] else "Lower is better")
               + "; curves come from each job's downsampled series (every improvement kept).")
