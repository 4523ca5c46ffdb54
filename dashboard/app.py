"""Kernel Porter's dashboard: `porter dashboard` (or `streamlit run dashboard/app.py`).

PORTER_DB_URL selects the database (default sqlite:///porter.db). Pages read through db/ only
(dashboard/queries.py); each page is a script in dashboard/page_scripts/ drawing from
dashboard/views.py, addressed as /jobs, /job?job=N, /best, /compare, /submit.
"""
from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run dashboard/app.py` puts dashboard/ on the path, not the project root
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from porter.errors import PorterError  # noqa: E402
from porter.store.base import db_url  # noqa: E402


PAGES = (("jobs", "Jobs"), ("job", "Job"), ("best", "Best configurations"),
         ("compare", "Compare"), ("submit", "Submit"))


def main() -> None:
    st.set_page_config(page_title="Kernel Porter", layout="wide")
    url = db_url()
    here = Path(__file__).resolve().parent / "page_scripts"
    # the root address also takes ?page=jobs|job|best|compare|submit (and &job=N)
    first = st.query_params.get("page", "jobs")
    first = first if first in dict(PAGES) else "jobs"
    pages = [st.Page(here / f"{name}.py", title=title, url_path=name, default=name == first)
             for name, title in PAGES]
    page = st.navigation(pages)
    st.sidebar.caption(f"database: {_safe(url)}")
    try:
        page.run()
    except PorterError as e:
        st.error(str(e))


def _safe(url: str) -> str:
    from db.engine import safe_url
    return safe_url(url)


main()
