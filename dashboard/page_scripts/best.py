"""The dashboard's best page (see dashboard/views.py)."""
from dashboard import views
from porter.store.base import db_url

views.best_page(db_url())
