"""The dashboard's jobs page (see dashboard/views.py)."""
from dashboard import views
from porter.store.base import db_url

views.jobs_page(db_url())
