"""The Best configurations page (dashboard/best_view.py)."""
from dashboard import best_view

best_view.best_page()
