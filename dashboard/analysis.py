"""The Job page's Analysis tab, over the job's analysis set (every k-th measured trial plus the
best, at most a few thousand, from the store): parameter importance with its method named
(one-way ANOVA by default, Optuna's fANOVA on request, both on the same trials), slice plots,
a contour of two parameters, the empirical distribution (EDF) and parallel coordinates on the
axes the user picks."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from . import data
from .job_tabs import HIGHER, metrics_of

ANOVA_NOTE = ("One-way ANOVA: for each parameter alone, the share of the variance of "
              "log(objective) that its values explain (eta squared). Cheap, but a parameter "
              "that matters only together with another scores low.")
FANOVA_NOTE = ("fANOVA (Optuna's evaluator: a random forest fitted to the same trials, then "
               "each parameter's share of the variance of its marginal). It credits "
               "interactions and smooths noise, so its ranking can differ from ANOVA's.")


def _objective(df: pd.DataFrame, metric: str) -> pd.Series:
    return df[metric]


def anova(df: pd.DataFrame, y: pd.Series, names: list[str]) -> pd.DataFrame:
    """eta squared of log(y) per parameter."""
    ok = y > 0
    if ok.sum() < 3:
        return pd.DataFrame(columns=["param", "importance"])
    ly = np.log(y[ok])
    total = float(((ly - ly.mean()) ** 2).sum()) or 1.0
    rows = []
    for n in names:
        g = ly.groupby(df.loc[ok, f"p:{n}"].astype(str))
        rows.append({"param": n,
                     "importance": float((g.count() * (g.mean() - ly.mean()) ** 2).sum())
                     / total})
    return pd.DataFrame(rows).sort_values("importance", ascending=False)


def fanova(df: pd.DataFrame, y: pd.Series, names: list[str]) -> pd.DataFrame:
    """Optuna's fANOVA over an in-memory study of the same trials."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {n: CategoricalDistribution(sorted(df[f"p:{n}"].dropna().unique().tolist(),
                                               key=lambda v: (str(type(v)), v)))
             for n in names}
    dists = {n: d for n, d in dists.items() if len(d.choices) > 1}
    study = optuna.create_study()
    study.add_trials([optuna.trial.create_trial(
        params={n: r[f"p:{n}"] for n in dists}, distributions=dists, value=math.log(v))
        for (_, r), v in zip(df.iterrows(), y) if v and v > 0])
    imp = optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
    return pd.DataFrame(list(imp.items()), columns=["param", "importance"])


def _bar(imp: pd.DataFrame, key: str) -> None:
    fig = go.Figure(go.Bar(x=imp["importance"], y=imp["param"], orientation="h"))
    fig.update_layout(height=60 + 28 * len(imp), margin={"t": 10, "b": 30},
                      yaxis={"autorange": "reversed"})
    st.plotly_chart(fig, key=key)


def analysis(u: str, job: dict, ver: tuple) -> None:
    df = data.sample(u, job["id"], ver)
    if df.empty:
        st.info("No measured trial: nothing to analyse.")
        return
    names = [c[2:] for c in df.columns if c.startswith("p:") and df[c].nunique() > 1]
    c = st.columns([2, 1])
    metric = c[0].segmented_control("metric", metrics_of(job), default="objective",
                                    key="an_metric",
                                    format_func=data.METRIC_LABELS.get) or "objective"
    log = c[1].toggle("log scale", key="an_log")
    y = _objective(df, metric)
    st.caption(f"{len(df)} measured trials (every k-th and the 50 best) of {job['n_measured']}.")

    imp = anova(df, y, names)
    ranked = list(imp["param"]) or names
    views = st.tabs(list(VIEWS), key="an_view", bind="query-params")
    for view, draw in zip(views, VIEWS.values()):
        if view.open:
            with view:
                draw(df, y, names, ranked, imp, metric, log, job)


def _importance(df, y, names, ranked, imp, metric, log, job) -> None:
    left, right = st.columns(2)
    left.markdown("**ANOVA** (one parameter at a time)")
    with left:
        _bar(imp, "imp_anova")
    left.caption(ANOVA_NOTE)
    right.markdown("**fANOVA** (Optuna)")
    if right.button("compute fANOVA (a few seconds)", key="fanova"):
        try:
            with right:
                _bar(fanova(df, y, names), "imp_fanova")
        except Exception as e:  # noqa: BLE001 - too few distinct trials, and the like
            right.warning(f"fANOVA unavailable on these trials: {e}")
    right.caption(FANOVA_NOTE)


def _slice(df, y, names, ranked, imp, metric, log, job) -> None:
    label = data.METRIC_LABELS[metric]
    st.caption("Slice: each point a trial, its objective against one parameter's value "
               "(colour: trial number, later trials brighter).")
    pick = st.multiselect("parameters", names, default=ranked[:4], key="an_slice")
    df, y = data.thin(df, y, HIGHER[metric])
    if pick:
        fig = make_subplots(rows=1, cols=len(pick), shared_yaxes=True, subplot_titles=pick)
        for i, n in enumerate(pick, 1):
            fig.add_scatter(x=df[f"p:{n}"].astype(str), y=y, mode="markers", row=1, col=i,
                            marker={"size": 5, "opacity": 0.5, "color": df["number"],
                                    "coloraxis": "coloraxis"}, showlegend=False)
        fig.update_layout(height=340, margin={"t": 40, "b": 30}, coloraxis={
            "colorbar": {"title": "trial"}}, yaxis_type="log" if log else "linear",
                          yaxis_title=label)
        st.plotly_chart(fig, key="an_slice_chart")


def _contour(df, y, names, ranked, imp, metric, log, job) -> None:
    st.caption("Contour: the best objective reached at each pair of values of two "
               "parameters.")
    c = st.columns(2)
    if len(names) >= 2:
        px_ = c[0].selectbox("x", names, index=names.index(ranked[0]), key="an_cx")
        py_ = c[1].selectbox("y", names, index=names.index(
            next(n for n in ranked if n != px_)), key="an_cy")
        best = (pd.DataFrame({"x": df[f"p:{px_}"], "y": df[f"p:{py_}"], "v": y})
                .groupby(["y", "x"])["v"].agg("max" if HIGHER[metric] else "min").unstack())
        fig = go.Figure(go.Contour(z=best.values, x=[str(v) for v in best.columns],
                                   y=[str(v) for v in best.index], connectgaps=True,
                                   colorscale="Viridis", colorbar={"title": metric}))
        fig.update_layout(height=380, margin={"t": 20}, xaxis_title=px_, yaxis_title=py_)
        st.plotly_chart(fig, key="an_contour")
    else:
        st.caption("A contour needs two parameters that vary.")


def _edf(df, y, names, ranked, imp, metric, log, job) -> None:
    label = data.METRIC_LABELS[metric]
    st.caption("Empirical distribution: the fraction of measured trials at or below each "
               "objective value (the Compare page overlays several jobs).")
    v = np.sort(y.dropna().to_numpy())
    fig = go.Figure(go.Scatter(x=v, y=np.arange(1, len(v) + 1) / max(1, len(v)),
                               mode="lines", line={"shape": "hv"}, name=f"job {job['id']}"))
    fig.update_layout(height=300, margin={"t": 20}, xaxis_title=label,
                      yaxis_title="fraction of trials ≤ x", xaxis_type="log" if log else "linear")
    st.plotly_chart(fig, key="an_edf")


def _parcoords(df, y, names, ranked, imp, metric, log, job) -> None:
    st.caption("Parallel coordinates: one line per trial through the chosen parameters to "
               "its objective; drag along an axis to filter.")
    axes = st.multiselect("axes", names, default=ranked[:6], key="an_axes")
    df, y = data.thin(df, y, HIGHER[metric])      # WebGL: every line costs
    dims = []
    for n in axes:
        vals = sorted(df[f"p:{n}"].dropna().unique(), key=lambda v: (str(type(v)), v))
        index = {v: i for i, v in enumerate(vals)}
        dims.append({"label": n, "values": df[f"p:{n}"].map(index),
                     "tickvals": list(range(len(vals))), "ticktext": [str(v) for v in vals]})
    dims.append({"label": metric, "values": y})
    fig = go.Figure(go.Parcoords(line={"color": y, "colorscale": "Viridis", "showscale": True,
                                       "reversescale": not HIGHER[metric]}, dimensions=dims))
    fig.update_layout(height=420, margin={"t": 50})
    st.plotly_chart(fig, key="an_parcoords")


VIEWS = {"Importance": _importance, "Slice": _slice, "Contour": _contour,
         "EDF": _edf, "Parallel coordinates": _parcoords}
