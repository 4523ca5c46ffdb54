"""The Jobs page: every job, searchable by id, template, architecture, name or status, a page
at a time, refreshed every few seconds (a Streamlit fragment), so a job started after the page
opened shows up and running jobs' progress moves."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from . import data

REFRESH_SECONDS = 3
PAGE_ROWS = 50
STATUSES = ("running", "queued", "done", "failed", "interrupted", "cancelled")


def jobs_page() -> None:
    st.title("Jobs")
    u = data.url()
    c = st.columns([3, 1, 1])
    search = c[0].text_input("find jobs", key="jobs_search",
                             placeholder="job id, template, architecture, name or status")
    status = c[1].selectbox("status", ["any", *STATUSES], key="jobs_status")
    page = c[2].number_input("page", min_value=1, value=1, step=1, key="jobs_page")

    @st.fragment(run_every=REFRESH_SECONDS)
    def table():
        store = data.store(u)
        counts = store.job_status_counts()
        cols = st.columns(len(STATUSES))
        for col, s in zip(cols, STATUSES):
            col.metric(s, counts.get(s, 0))
        rows, total = store.job_rows(PAGE_ROWS, (int(page) - 1) * PAGE_ROWS, search,
                                     None if status == "any" else status)
        if not total:
            st.info("No job matches." if search or status != "any" else
                    "No jobs yet. Submit one on the Submit page or run `porter port`.")
            return
        df = pd.DataFrame(rows)
        df["link"] = "job?job=" + df["job"].astype(str)
        df["created"] = pd.to_datetime(df["created_at"], unit="s")
        first = (int(page) - 1) * PAGE_ROWS
        st.caption(f"jobs {first + 1}-{first + len(df)} of {total}"
                   + (f" matching “{search}”" if search else "")
                   + f" · refreshed every {REFRESH_SECONDS} s")
        st.dataframe(
            df[["link", "name", "template", "arch", "backend", "status", "progress", "trials",
                "budget", "measured", "best_ratio", "minutes", "created", "message"]],
            hide_index=True, key="jobs_table", width="stretch",
            column_config={
                "link": st.column_config.LinkColumn("job", display_text=r"job\?job=(\d+)"),
                "progress": st.column_config.ProgressColumn("progress", min_value=0.0,
                                                            max_value=1.0, format="percent"),
                "best_ratio": st.column_config.NumberColumn(
                    "best ratio", format="%.3fx",
                    help="baseline time / our time, geometric mean over sizes"),
                "minutes": st.column_config.NumberColumn("minutes", format="%.1f"),
            })
    table()
