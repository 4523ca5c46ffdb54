"""Alembic migrations for porter's tables (a package so that installs carry them)."""
