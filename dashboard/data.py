"""The dashboard's reads: the store's methods (porter's Store plugin, i.e. db/read.py), returned
as pandas frames and cached on the job's version (a light query that changes whenever a trial is
recorded or the job's status or notes change). A finished job's frames are built once; a running
job's are rebuilt only when it has new trials. No SQL here: filtering, paging, sampling and
aggregation happen in the database."""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from porter.store.base import db_url, open_store

FAILED = ("compile_failed", "resource_rejected", "launch_failed", "wrong_result", "timeout",
          "crashed")
LIVE = ("queued", "running")
# points a chart gets at most: SVG markers cost the browser about a millisecond each on a small
# CPU-only machine, so the series come downsampled from the store (every improvement kept)
CONVERGENCE_POINTS = 1000
SAMPLE_ROWS = 500
MARKERS = 300    # per scatter or parallel-coordinates chart (see thin)
# "objective" is the search's: our time over the vendor's (geometric mean over sizes), or
# milliseconds where the op has no vendor baseline; lower is better
METRIC_LABELS = {"objective": "objective (lower is better)",
                 "ratio": "ratio (vendor time / ours)", "gbps": "GB/s", "tflops": "TFLOP/s"}


def url() -> str:
    return db_url()


def safe(u: str) -> str:
    """The URL without its password."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", u)


@st.cache_resource(show_spinner=False)
def store(u: str):
    """One migrated store per database URL and server process."""
    return open_store(u)


def version(u: str, job_id: int) -> tuple:
    return store(u).job_version(job_id)


@st.cache_data(show_spinner=False, max_entries=64)
def job(u: str, job_id: int, ver: tuple) -> dict | None:
    """The job's row, counts and bests (db/read.py job_detail) at this version."""
    return store(u).job_detail(job_id)


@st.cache_data(show_spinner=False, max_entries=64, ttl=5)
def job_choices(u: str, search: str, limit: int = 100) -> tuple[list[dict], int]:
    """The newest jobs matching a search (the pickers' options; a few seconds old at most)."""
    return store(u).job_rows(limit, 0, search, stats=False)


@st.cache_resource(show_spinner=False, max_entries=32)
def template(u: str, template_hash: str):
    """The Template a job owns, from its stored snapshot (never from disk by name)."""
    from porter.spec.snapshot import load_snapshot
    return load_snapshot(template_hash, store(u).template_snapshot(template_hash))


def numeric_params(tpl) -> dict[str, list]:
    """Parameters whose values are all numbers (they get range filters and numeric axes)."""
    return {n: sorted(v) for n, v in tpl.params.items()
            if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)}


@st.cache_data(show_spinner=False, max_entries=64)
def convergence(u: str, job_id: int, ver: tuple, metric: str) -> pd.DataFrame:
    rows = store(u).convergence(job_id, metric, CONVERGENCE_POINTS)
    df = pd.DataFrame(rows, columns=["idx", "number", "status", "t", "value", "best", "origin"])
    return df


@st.cache_data(show_spinner=False, max_entries=64)
def sample(u: str, job_id: int, ver: tuple, statuses: tuple = ("measured",),
           max_rows: int = SAMPLE_ROWS) -> pd.DataFrame:
    """The analysis set (every k-th trial plus the best), one column per parameter."""
    rows = store(u).trial_sample(job_id, max_rows=max_rows, statuses=statuses)
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    params = pd.DataFrame(list(df.pop("params")), index=df.index)
    return pd.concat([df, params.add_prefix("p:")], axis=1)


def thin(df: pd.DataFrame, y: pd.Series, higher: bool, n: int = MARKERS,
         best: int = 50) -> tuple[pd.DataFrame, pd.Series]:
    """At most about n rows of a sample for one chart: the `best` by y and every k-th."""
    if len(df) <= n:
        return df, y
    top = (y.rank(ascending=higher, method="first") > len(df) - best).to_numpy()
    keep = top | ((np.arange(len(df)) % max(1, len(df) // max(1, n - best))) == 0)
    return df[keep], y[keep]


RESOURCE_STATUSES = ("measured", "compiled", "resource_rejected")


def measurements(u: str, job_id: int, ver: tuple) -> pd.DataFrame:
    """One row per size of each sampled measured trial (the roofline's points; the same
    sample as the resource views)."""
    df = sample(u, job_id, ver, RESOURCE_STATUSES)
    rows = [dict(m, number=n) for n, ms in zip(df.get("number", []), df.get("measurements", []))
            for m in ms]
    return pd.DataFrame(rows, columns=["number", "trial_id", "size", "ours_ms", "ratio", "gbps",
                                       "tflops"])


@st.cache_data(show_spinner=False, max_entries=64)
def trial_page(u: str, job_id: int, ver: tuple, statuses: tuple, ranges: tuple, sort: str,
               descending: bool, limit: int | None, offset: int) -> tuple[pd.DataFrame, int]:
    rows, total = store(u).trial_page(job_id, statuses or None, dict(ranges), sort, descending,
                                      limit, offset)
    return trial_frame(rows), total


def trial_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    cols = ["number", "status", "objective", "ratio", "gbps", "tflops", "registers",
            "smem_bytes", "spill_bytes", "compile_seconds", "finished", "reused from", "origin",
            "message", "note"]
    if not rows:
        return pd.DataFrame(columns=cols + ["params"])
    df = pd.DataFrame(rows)
    df["finished"] = pd.to_datetime(df["finished_at"], unit="s")
    # a trial that reuses an earlier job's measurement names the trial that measured it
    df["reused from"] = df["reused_from"].map(reused_label)
    # where the configuration came from: the search, or the warm start's source
    df["origin"] = df["origin"].fillna("") if "origin" in df else ""
    df["params"] = df["params"].map(lambda p: " ".join(f"{k}={v}" for k, v in p.items()))
    return df[cols + ["params"]]


def reused_label(link) -> str:
    """'job J #N' for a trial reusing job J's trial N (porter.job.cache), else ''."""
    return f"job {link[0]} #{link[1]}" if link else ""


def job_label(r: dict) -> str:
    name = f" “{r['name']}”" if r.get("name") else ""
    return f"{r['job']}: {r['template']} on {r['arch']} ({r['status']}){name}"


def leaderboard(u: str, template: str | None = None, arch: str | None = None) -> pd.DataFrame:
    """The best measured configuration per (template, arch, size) over all jobs."""
    return _leaderboard(u, template, arch, store(u).data_version())


@st.cache_data(show_spinner=False, max_entries=32)
def _leaderboard(u: str, template: str | None, arch: str | None, ver: tuple) -> pd.DataFrame:
    rows = store(u).leaderboard(template, arch)
    return pd.DataFrame([{
        "template": b.template, "arch": b.arch, "size": "x".join(map(str, b.size)),
        "ratio": b.ratio, "ours_ms": b.ours_ms, "baseline": b.baseline,
        "baseline_ms": b.baseline_ms, "tflops": b.tflops, "gbps": b.gbps,
        "registers": b.registers, "smem_bytes": b.smem_bytes, "job": b.job_id,
        "trial": b.trial_number, "gpu": (b.device or {}).get("gpu", ""), "params": b.params,
        "config": " ".join(f"{k}={v}" for k, v in b.params.items())} for b in rows],
        columns=["template", "arch", "size", "ratio", "ours_ms", "baseline", "baseline_ms",
                 "tflops", "gbps", "registers", "smem_bytes", "job", "trial", "gpu", "params",
                 "config"])


def fmt_ratio(r) -> str:
    return "-" if r is None or r != r else f"{r:.3f}x"
