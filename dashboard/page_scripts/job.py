"""The dashboard's job page (see dashboard/views.py)."""
from dashboard import views
from porter.store.base import db_url

views.job_page(db_url())
