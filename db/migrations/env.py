"""Alembic environment for porter's tables.

Run programmatically by db.migrate.upgrade (which passes its connection in
`config.attributes["connection"]`), or from a shell for new revisions:
    alembic -c db/migrations/alembic.ini revision --autogenerate -m "..."
Porter keeps its revision in `porter_alembic_version`, because Optuna's migrations own
`alembic_version` in the same database, and only `porter_*` tables are compared or touched.
"""
from alembic import context
from sqlalchemy import create_engine, pool, text

from db.models import Base

VERSION_TABLE = "porter_alembic_version"
# any constant works; all porter processes must agree on it
PG_LOCK_KEY = 0x706F7274  # "port"

config = context.config
target_metadata = Base.metadata


def include_name(name, type_, parent_names):
    if type_ == "table":
        return name is None or name.startswith("porter_")
    return True


def _configure(**kwargs):
    context.configure(target_metadata=target_metadata, version_table=VERSION_TABLE,
                      include_name=include_name, render_as_batch=True,
                      compare_type=True, **kwargs)


def _url():
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from porter.store.base import db_url
        from db.engine import normalize_url
        url = normalize_url(db_url())
    return url


def run_offline():
    _configure(url=_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _run(connection):
    _configure(connection=connection)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # concurrent first starts wait here, then find the schema already at head
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_LOCK_KEY})
        context.run_migrations()


def run_online():
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        _run(connection)


if context.is_offline_mode():
    run_offline()
else:
    run_online()
