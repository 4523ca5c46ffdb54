"""porter's database: schema (models, Alembic migrations) and every query.

`open_store(url)` returns a migrated SqlStore; porter finds it through the `porter.plugins`
entry point, so porter itself never imports this package.
"""
from .queries import BestConfig, JobProgress
from .store import SqlStore, TemplateInfo, UnknownJob, open_store

__all__ = ["BestConfig", "JobProgress", "SqlStore", "TemplateInfo", "UnknownJob", "open_store"]
