"""The dashboard's submit page (see dashboard/views.py)."""
from dashboard import views
from porter.store import db_url

views.submit_page(db_url())
