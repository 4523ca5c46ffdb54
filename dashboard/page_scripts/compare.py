"""The Compare page (dashboard/best_view.py): two architectures, or several jobs overlaid."""
from dashboard import best_view

best_view.compare_page()
