"""The root address: the Jobs page, or the page that ?page=NAME names (with its other query
parameters, e.g. /?page=job&job=3)."""
import streamlit as st

from dashboard import jobs_view

KNOWN = ("jobs", "job", "best", "compare", "submit")
wanted = st.query_params.get("page")
if wanted in KNOWN and wanted != "jobs":
    rest = {k: v for k, v in st.query_params.to_dict().items() if k != "page"}
    st.switch_page(f"page_scripts/{wanted}.py", query_params=rest)
jobs_view.jobs_page()
