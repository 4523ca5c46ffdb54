"""Service-side writes (claims, heartbeats, reclaiming dead drivers, the cross-job measurement
cache), as methods that SqlStore inherits. Each write is one transaction through `self._tx`."""
from __future__ import annotations


class ServiceMixin:
    """Service-mode state of SqlStore (see db/store.py)."""
