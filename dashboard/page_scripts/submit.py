"""The dashboard's submit page (see dashboard/views.py)."""
from dashboard import views
from porter.store.base import db_url

views.submit_page(db_url())
