"""Brings a database to the newest schema with Alembic, from code (no alembic.ini needed)."""
from __future__ import annotations

import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.exc import SQLAlchemyError

from porter.errors import StoreError

from .engine import get_engine, one_line, safe_url

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "porter_alembic_version"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # '%' would be read as interpolation by configparser
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head() -> str | None:
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def current(url: str) -> str | None:
    with get_engine(url).connect() as conn:
        return MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def upgrade(url: str, revision: str = "head") -> None:
    """`alembic upgrade head` on the engine of `url`. On PostgreSQL concurrent callers serialise
    on an advisory lock; on SQLite a caller that loses the race retries and finds the schema
    done."""
    cfg = alembic_config(url)
    attempts = 3 if url.startswith("sqlite") else 1
    for attempt in range(attempts):
        try:
            with get_engine(url).begin() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
            return
        except SQLAlchemyError as e:
            if attempt + 1 == attempts:
                raise StoreError(f"cannot migrate database {safe_url(url)}: "
                                 f"{one_line(e)}") from e
            time.sleep(0.2 * (attempt + 1))
        finally:
            cfg.attributes.pop("connection", None)
