"""The dashboard's compare page (see dashboard/views.py)."""
from dashboard import views
from porter.store.base import db_url

views.compare_page(db_url())
