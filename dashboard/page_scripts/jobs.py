"""The Jobs page (dashboard/jobs_view.py)."""
from dashboard import jobs_view

jobs_view.jobs_page()
