"""The Job page's tabs on trials: convergence, the trial table with a trial's detail, failures,
top configurations and exports. Each draws from frames the store returns already filtered,
paged or downsampled; charts get at most a few thousand points whatever the job's size."""
from __future__ import annotations

import io

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from . import data
from .exports import export_zip

EXPORT_FORMATS = ("cu", "cubin", "ptx", "fatbin", "python", "header", "json", "kt-cache")
PAGE_ROWS = 50
HIGHER = {"objective": False, "ratio": True, "gbps": True, "tflops": True}


def metrics_of(job: dict) -> list[str]:
    """The objectives this job has values for: time always; ratio, GB/s, TFLOP/s if measured."""
    return ["objective", "ratio", "gbps", "tflops"] if job["n_measured"] else ["objective"]


def convergence(u: str, job: dict, ver: tuple) -> None:
    c = st.columns([2, 1, 1])
    metric = c[0].segmented_control("metric", metrics_of(job), default="objective",
                                    key="conv_metric", format_func=data.METRIC_LABELS.get)
    x = c[1].segmented_control("x axis", ["trials", "minutes"], default="trials", key="conv_x")
    log = c[2].toggle("log scale", key="conv_log")
    df = data.convergence(u, job["id"], ver, metric or "objective")
    if df.empty or df["best"].isna().all():
        st.info("No measured or compiled trial yet.")
        return
    t0 = job["started_at"] or df["t"].min()
    xs = df["idx"] if x != "minutes" else (df["t"] - t0) / 60
    label = data.METRIC_LABELS[metric or "objective"]
    fig = go.Figure()
    pts = df["value"].notna()
    # the warm start's trials apart from the search's (trials recorded before origins: one set)
    warm = df["origin"].fillna("").map(lambda o: bool(o) and not o.startswith("search"))
    for name, sel, size in (("trial", pts & ~warm, 4), ("warm start", pts & warm, 7)):
        if sel.any():
            fig.add_scatter(x=xs[sel], y=df.loc[sel, "value"], mode="markers", name=name,
                            marker={"size": size, "opacity": 0.45 if name == "trial" else 0.8},
                            customdata=df.loc[sel, ["number", "origin"]].to_numpy(),
                            hovertemplate="trial %{customdata[0]}: %{y:.4g}<br>"
                                          "%{customdata[1]}<extra></extra>")
    fig.add_scatter(x=xs, y=df["best"], mode="lines", name="best so far",
                    line={"shape": "hv", "width": 2.5}, connectgaps=True)
    fig.update_layout(height=430, margin={"t": 30, "b": 40}, xaxis_title=x or "trials",
                      yaxis_title=label, yaxis_type="log" if log else "linear",
                      legend={"orientation": "h", "y": 1.08})
    st.plotly_chart(fig, key="conv_chart")
    st.caption(f"{len(df)} of {job['n_trials']} trials drawn: every improvement of the best so "
               "far, every k-th trial and the last; failed trials carry the best forward. "
               "Larger markers: the warm start's trials (hover for their origin). The "
               "objective is the search's: our time over the vendor's (geometric mean over "
               "sizes), or milliseconds where the op has no vendor baseline.")


def _filters(u: str, job: dict) -> tuple[tuple, tuple]:
    tpl = data.template(u, job["template_hash"])
    statuses = sorted(job["counts"])
    c = st.columns([3, 2])
    picked = c[0].multiselect("status", statuses, key="tr_status",
                              placeholder="every status")
    ranges = []
    with c[1].popover("parameter ranges"):
        for name, vals in data.numeric_params(tpl).items():
            if len(vals) < 2:
                continue
            lo, hi = st.select_slider(name, vals, value=(vals[0], vals[-1]), key=f"tr_rng_{name}")
            if (lo, hi) != (vals[0], vals[-1]):
                ranges.append((name, (lo, hi)))
    return tuple(picked), tuple(ranges)


def trials(u: str, job: dict, ver: tuple) -> None:
    statuses, ranges = _filters(u, job)
    tpl = data.template(u, job["template_hash"])
    sorts = ["number", "objective", "ratio", "gbps", "tflops", "status", "registers",
             "smem_bytes", "spill_bytes", "compile_seconds", "finished_at",
             *(f"param:{n}" for n in data.numeric_params(tpl))]
    c = st.columns([2, 1, 1])
    sort = c[0].selectbox("sort by", sorts, key="tr_sort")
    desc = c[1].toggle("descending", key="tr_desc")
    page = c[2].number_input("page", min_value=1, value=1, key="tr_page")
    df, total = data.trial_page(u, job["id"], ver, statuses, ranges, sort, desc, PAGE_ROWS,
                                (int(page) - 1) * PAGE_ROWS)
    st.caption(f"{total} trials match; page {int(page)} of {max(1, -(-total // PAGE_ROWS))}. "
               "Select a row for its detail.")
    ev = st.dataframe(df, hide_index=True, key="tr_table", on_select="rerun",
                      selection_mode="single-row", width="stretch",
                      column_config={"ratio": st.column_config.NumberColumn(format="%.3fx"),
                                     "objective": st.column_config.NumberColumn(format="%.4g")})
    c = st.columns(2)
    args = (u, job["id"], statuses, ranges, sort, desc)
    c[0].download_button("CSV (all matching trials)", data=lambda: _all(*args, "csv"),
                         file_name=f"job{job['id']}_trials.csv", mime="text/csv",
                         key="tr_csv", on_click="ignore")
    c[1].download_button("Parquet (all matching trials)", data=lambda: _all(*args, "parquet"),
                         file_name=f"job{job['id']}_trials.parquet",
                         mime="application/octet-stream", key="tr_parquet", on_click="ignore")
    rows = ev.selection.rows if ev else []
    if rows:
        trial_detail(u, job, int(df.iloc[rows[0]]["number"]))


def _all(u, job_id, statuses, ranges, sort, desc, fmt) -> bytes:
    rows, _ = data.store(u).trial_page(job_id, statuses or None, dict(ranges), sort, desc, None)
    df = pd.DataFrame(rows)
    if df.empty:
        return b""
    df["reused_from"] = df["reused_from"].map(data.reused_label)
    params = pd.DataFrame(list(df.pop("params")), index=df.index).add_prefix("param_")
    df = pd.concat([df, params], axis=1)
    if fmt == "csv":
        return df.to_csv(index=False).encode()
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def trial_detail(u: str, job: dict, number: int) -> None:
    t = data.store(u).trial_detail(job["id"], number)
    if t is None:
        st.error(f"Job {job['id']} has no trial {number}.")
        return
    st.subheader(f"Trial {number}: {t['status']}")
    if t["reused_job"] is not None:
        st.info(f"Reused: measured as trial {t['reused_number']} of job {t['reused_job']} "
                "(same template snapshot, architecture, GPU, sizes and harness); this job "
                "measured nothing for it.")
    if t.get("origin"):
        st.caption(f"Origin: {t['origin']}")
    if t["message"]:
        st.write(t["message"])
    c = st.columns(6)
    for col, (k, label) in zip(c, (("registers", "registers"), ("smem_bytes", "shared memory B"),
                                   ("spill_bytes", "spills B"), ("stack_frame", "stack B"),
                                   ("compile_seconds", "compile s"), ("objective", "objective"))):
        v = t[k]
        col.metric(label, "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else v))
    if t["measurements"]:
        st.dataframe(pd.DataFrame(t["measurements"]).drop(columns=["id", "trial_id"]),
                     hide_index=True, key="tr_meas")
    note = st.text_input("note on this trial", value=t["note"], key=f"tr_note_{number}")
    if note != t["note"]:
        data.store(u).set_trial_note(job["id"], number, note)
        st.toast(f"note on trial {number} saved")
    tpl = data.template(u, job["template_hash"])
    defines = "\n".join(f"#define {k} {int(v) if isinstance(v, bool) else v}"
                        for k, v in t["params"].items())
    with st.expander("source with this trial's constants"):
        st.code(f"// job {job['id']} trial {number}\n{defines}\n\n{tpl.source}", language="cpp")
    if t["compile_log"]:
        with st.expander("compile log", expanded=t["status"] == "compile_failed"):
            st.code(t["compile_log"][-8000:], language="text")
    if t["device"]:
        with st.expander("device"):
            st.json(t["device"])


def failures(u: str, job: dict, ver: tuple) -> None:
    counts = job["counts"]
    if not counts:
        st.info("No trials yet.")
        return
    sc = pd.DataFrame(sorted(counts.items()), columns=["status", "trials"])
    fig = go.Figure(go.Bar(x=sc["status"], y=sc["trials"], text=sc["trials"]))
    fig.update_layout(height=300, margin={"t": 20, "b": 40})
    st.plotly_chart(fig, key="statuses")
    failed = tuple(s for s in counts if s in data.FAILED)
    if not failed:
        st.caption("No failed trial.")
        return
    df, total = data.trial_page(u, job["id"], ver, failed, (), "number", False, 20, 0)
    st.caption(f"The first {len(df)} of {total} failed trials; the Trials tab filters them all.")
    st.dataframe(df[["number", "status", "message", "params"]], hide_index=True,
                 key="fail_table", width="stretch")
    number = st.selectbox("detail of", df["number"], index=None, key="fail_pick",
                          placeholder="a failed trial's compile log, source and resources")
    if number is not None:
        trial_detail(u, job, int(number))

def top(u: str, job: dict, ver: tuple) -> None:
    df, _ = data.trial_page(u, job["id"], ver, ("measured", "compiled"), (), "objective",
                            False, 10, 0)
    if df.empty:
        st.info("No measured or compiled trial yet.")
        return
    st.dataframe(df.drop(columns=["message", "note"]), hide_index=True, key="top_table",
                 column_config={"ratio": st.column_config.NumberColumn(format="%.3fx")})
    trial_detail(u, job, int(df.iloc[0]["number"]))


def exports(u: str, job: dict, ver: tuple) -> None:
    if not job["n_trials"]:
        st.info("Nothing to export yet.")
        return
    st.caption("Each button runs `porter export` for this job and downloads the files as a "
               "zip (with manifest.json). Binary formats compile on first click.")
    cols = st.columns(4)
    for i, fmt in enumerate(EXPORT_FORMATS):
        cols[i % 4].download_button(
            fmt, data=lambda fmt=fmt: export_zip(u, job["id"], fmt, ver),
            file_name=f"job{job['id']}_{fmt}.zip", mime="application/zip",
            key=f"export_{fmt}", on_click="ignore")
