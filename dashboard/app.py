"""Kernel Porter's dashboard: `porter dashboard` (or `streamlit run dashboard/app.py`).

PORTER_DB_URL selects the database (default sqlite:///porter.db). Pages read through the store
(porter's Store plugin; the queries live in db/read.py), never through SQL of their own. Every
page has an address: / and /jobs (Jobs), /job?job=N&tab=NAME, /best, /compare, /submit; the
root also takes ?page=NAME (and &job=N).
"""
from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run dashboard/app.py` puts dashboard/ on the path, not the project root
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from dashboard import data  # noqa: E402
from porter.errors import PorterError  # noqa: E402

PAGES = (("jobs", "Jobs", ":material/list:"), ("job", "Job", ":material/query_stats:"),
         ("best", "Best configurations", ":material/emoji_events:"),
         ("compare", "Compare", ":material/compare_arrows:"),
         ("submit", "Submit", ":material/add_circle:"))
HERE = Path(__file__).resolve().parent / "page_scripts"


def main() -> None:
    st.set_page_config(page_title="Kernel Porter", layout="wide")
    # the root is a page of its own (hidden from the menu), so /jobs is a real address too
    home = st.Page(HERE / "home.py", title="Jobs", url_path="home", default=True,
                   visibility="hidden")
    pages = [home] + [st.Page(HERE / f"{name}.py", title=title, url_path=name, icon=icon)
                      for name, title, icon in PAGES]
    page = st.navigation(pages)
    st.sidebar.caption(f"database: {data.safe(data.url())}")
    try:
        page.run()
    except PorterError as e:
        st.error(str(e))


main()
