"""Read-side queries for the dashboard and reports, as methods that SqlStore inherits.

Methods here run through `self._read(what)` (a connection in a read transaction) and do their
filtering, paging and aggregation in SQL; callers outside db/ see only the returned values.
"""
from __future__ import annotations


class ReadMixin:
    """Dashboard and report queries of SqlStore (see db/store.py)."""
