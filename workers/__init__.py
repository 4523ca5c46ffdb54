"""Service mode: porter's trial steps as thin, idempotent Celery tasks (see docs/SERVICE.md).

`service()` is the `porter.plugins` entry point behind `porter submit/worker/cancel`.
"""
