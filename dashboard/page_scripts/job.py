"""The Job page (dashboard/job_view.py)."""
from dashboard import job_view

job_view.job_page()
