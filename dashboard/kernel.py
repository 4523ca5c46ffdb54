"""The Job page's Kernel tab: where each variant sits against the hardware (a roofline of
achieved TFLOP/s against arithmetic intensity, under the architecture's peak compute and
bandwidth), and what it costs in resources (registers, shared memory, theoretical occupancy)
over the job's time and against its speed.

PEAKS is a small table of published figures (dense BF16 tensor TFLOP/s and memory TB/s of the
product each architecture row stands for). MEASURED holds what was measured on the lent H200
(/work/shared/anchors/README.md, 2026-12-02: cuBLAS BF16 GEMM 4096^3 at 728 TFLOP/s, a 2 GiB
device-to-device copy at 4.25 TB/s): the roof a kernel can reach in practice there.
"""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from . import data

# arch -> (product, dense BF16 tensor TFLOP/s, memory TB/s), from the vendors' datasheets;
# None where we hold no figure we trust (the roofline then draws the points alone)
PEAKS = {"sm_80": ("A100 SXM 80 GB", 312.0, 2.039), "sm_86": ("RTX A6000", 154.8, 0.768),
         "sm_89": ("L40S", 362.0, 0.864), "sm_90": ("H200 SXM", 989.0, 4.8),
         "sm_90a": ("H200 SXM", 989.0, 4.8), "sm_100a": ("B200", 2250.0, 8.0)}
MEASURED = {"sm_90a": ("H200, measured (anchors)", 728.0, 4.25)}
STATUS_COLORS = {"measured": "#2e7d32", "compiled": "#1565c0", "resource_rejected": "#c62828"}


def occupancy(arch, threads: int, registers: int | None, smem: int | None) -> float | None:
    """Theoretical occupancy (resident threads / the SM's maximum) from the arch table: blocks
    per SM limited by threads, registers (allocated per warp in units of 256) and shared
    memory."""
    if not threads or registers is None:
        return None
    warps = math.ceil(threads / 32)
    per_warp = math.ceil(max(1, registers) * 32 / 256) * 256
    limits = [arch.max_blocks_per_sm, arch.max_threads_per_sm // threads,
              arch.regs_per_sm // (per_warp * warps)]
    if smem:
        limits.append(arch.smem_per_sm // smem)
    blocks = max(0, min(limits))
    return blocks * threads / arch.max_threads_per_sm


def _threads(tpl, arch, size, params: dict) -> int | None:
    try:
        return tpl.launch(params, arch, size).threads
    except Exception:  # noqa: BLE001 - a configuration the template cannot evaluate
        return None


def roofline(u: str, job: dict, ver: tuple) -> None:
    m = data.measurements(u, job["id"], ver)
    m = m[(m["gbps"] > 0)] if not m.empty else m
    if m.empty:
        st.info("No measured trial with a bandwidth figure: nothing to place on a roofline.")
        return
    arch = job["arch"]
    roofs = [r for r in (PEAKS.get(arch), MEASURED.get(arch)) if r]
    if m["tflops"].notna().any() and (m["tflops"] > 0).any():
        m = m[m["tflops"] > 0].assign(ai=lambda d: 1000 * d["tflops"] / d["gbps"])
        fig = go.Figure()
        for size, g in m.groupby("size"):
            fig.add_scatter(x=g["ai"], y=g["tflops"], mode="markers", name=size,
                            marker={"size": 6, "opacity": 0.6}, customdata=g["number"],
                            hovertemplate="trial %{customdata}<br>%{x:.3g} FLOP/B, "
                                          "%{y:.4g} TFLOP/s<extra></extra>")
        lo, hi = m["ai"].min() / 4, m["ai"].max() * 4
        for (name, tf, tb), dash in zip(roofs, ("solid", "dash")):
            knee = tf / tb
            xs = [min(lo, knee / 4), knee, max(hi, knee * 4)]
            fig.add_scatter(x=xs, y=[min(tf, x * tb) for x in xs], mode="lines",
                            name=f"{name}: {tf:g} TFLOP/s, {tb:g} TB/s",
                            line={"dash": dash, "color": "black"})
        fig.update_layout(height=450, margin={"t": 20}, xaxis_type="log", yaxis_type="log",
                          xaxis_title="arithmetic intensity (FLOP per byte moved)",
                          yaxis_title="achieved TFLOP/s")
    else:
        fig = go.Figure()
        for size, g in m.groupby("size"):
            fig.add_scatter(x=g["number"], y=g["gbps"], mode="markers", name=size)
        for (name, _, tb), dash in zip(roofs, ("solid", "dash")):
            fig.add_hline(y=tb * 1000, line_dash=dash, annotation_text=f"{name}: {tb:g} TB/s")
        fig.update_layout(height=420, xaxis_title="trial", yaxis_title="achieved GB/s")
    st.plotly_chart(fig, key="roofline")
    if roofs:
        st.caption(f"Roofs for {arch}: " + "; ".join(
            f"{n} ({tf:g} TFLOP/s dense BF16, {tb:g} TB/s)" for n, tf, tb in roofs)
            + ". Datasheet figures are peaks; the measured ones are what cuBLAS and a copy "
              "reached on the lent H200.")
    else:
        st.caption(f"No peak figures for {arch} in the dashboard's table: points only.")


def resources(u: str, job: dict, ver: tuple) -> None:
    from porter.spec.arch import get_arch
    df = data.sample(u, job["id"], ver, data.RESOURCE_STATUSES)
    if df.empty or df["registers"].isna().all():
        st.info("No trial with resource figures (registers, shared memory) yet.")
        return
    df, _ = data.thin(df, df["objective"].fillna(float("inf")), False)
    tpl = data.template(u, job["template_hash"])
    arch = get_arch(job["arch"])
    sizes = (job["spec"] or {}).get("sizes") or [tpl.default_sizes[0]]
    size = tuple(sizes[0])
    names = [c for c in df.columns if c.startswith("p:")]
    threads = [_threads(tpl, arch, size, {c[2:]: r[c] for c in names})
               for _, r in df[names].iterrows()]
    df = df.assign(threads=threads, smem_kib=df["smem_bytes"] / 1024)
    df["occupancy"] = [occupancy(arch, t, r, s) for t, r, s in
                       zip(df["threads"], df["registers"], df["smem_bytes"])]
    t0 = job["started_at"] or df["finished_at"].min()
    df["minutes"] = (df["finished_at"] - t0) / 60
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=("registers per thread", "shared memory per block (KiB)",
                                        "theoretical occupancy"))
    for status, g in df.groupby("status"):
        for row, col in enumerate(("registers", "smem_kib", "occupancy"), 1):
            fig.add_scatter(x=g["minutes"], y=g[col], mode="markers", name=status,
                            legendgroup=status, showlegend=row == 1, row=row, col=1,
                            marker={"size": 4, "opacity": 0.55,
                                    "color": STATUS_COLORS.get(status)})
    fig.update_layout(height=560, margin={"t": 30}, legend={"orientation": "h", "y": 1.06})
    fig.update_xaxes(title_text="minutes since the job started", row=3, col=1)
    st.plotly_chart(fig, key="resources_time")
    ok = df[df["status"] == "measured"]
    if not ok.empty:
        fig = make_subplots(rows=1, cols=3, shared_yaxes=True,
                            subplot_titles=("registers", "shared memory (KiB)", "occupancy"))
        for i, col in enumerate(("registers", "smem_kib", "occupancy"), 1):
            fig.add_scatter(x=ok[col], y=ok["objective"], mode="markers", row=1, col=i,
                            showlegend=False, marker={"size": 4, "opacity": 0.5})
        fig.update_layout(height=320, margin={"t": 30}, yaxis_title="objective (lower is better)")
        st.plotly_chart(fig, key="resources_speed")
    st.caption(f"Occupancy from the {arch.name} table at size {'x'.join(map(str, size))}: "
               "blocks per SM limited by threads, registers and shared memory.")


def kernel_views(u: str, job: dict, ver: tuple) -> None:
    roof, res = st.tabs(["Roofline", "Resources"], key="kv", bind="query-params")
    if roof.open:
        with roof:
            roofline(u, job, ver)
    if res.open:
        with res:
            resources(u, job, ver)


def peaks_frame() -> pd.DataFrame:
    rows = [{"arch": a, "product": p, "TFLOP/s": tf, "TB/s": tb, "source": "datasheet"}
            for a, (p, tf, tb) in PEAKS.items()]
    rows += [{"arch": a, "product": p, "TFLOP/s": tf, "TB/s": tb, "source": "measured"}
             for a, (p, tf, tb) in MEASURED.items()]
    return pd.DataFrame(rows)
