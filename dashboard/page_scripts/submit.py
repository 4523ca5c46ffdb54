"""The Submit page (dashboard/submit_view.py)."""
from dashboard import submit_view

submit_view.submit_page()
