"""Engines, one per URL per process, and the translation of SQLAlchemy errors into StoreError.

SQLite is set up for several writing processes (WAL, a busy timeout, foreign keys on).
"""
from __future__ import annotations

import math
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from porter.errors import StoreError

SQLITE_BUSY_SECONDS = 30.0

_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def normalize_url(url: str) -> str:
    """`postgresql://` and `postgres://` name the psycopg (3) driver this project installs; any
    explicit `+driver` is kept."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def safe_url(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def one_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def get_engine(url: str) -> Engine:
    """The process's engine for `url`, created on first use."""
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = _create(url)
        return engine


def _create(url: str) -> Engine:
    try:
        u = make_url(url)
    except ArgumentError as e:
        raise StoreError(f"malformed database URL {url!r}: {one_line(e)}") from e
    kwargs: dict = {}
    memory = False
    if u.get_backend_name() == "sqlite":
        memory = u.database in (None, "", ":memory:")
        if memory:
            # one connection, or every checkout would see a fresh empty database
            kwargs["poolclass"] = StaticPool
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_SECONDS, "check_same_thread": False}
    else:
        kwargs["pool_pre_ping"] = True
        if u.get_backend_name() == "postgresql":
            # an unreachable host fails in seconds (the callers retry), not after TCP's minutes
            kwargs["connect_args"] = {"connect_timeout": 10}
    try:
        if u.get_backend_name() == "sqlite" and not memory and not u.database.startswith("file:"):
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(u, **kwargs)
    except (SQLAlchemyError, ImportError, OSError) as e:
        raise StoreError(f"cannot open database {safe_url(url)}: {one_line(e)}") from e
    if u.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_setup)
    return engine


def _sqlite_setup(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_SECONDS * 1000)}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        try:
            cur.execute("SELECT ln(1.0), exp(0.0)")
        except Exception:
            # SQLite built without its math functions: the geometric means need ln and exp
            dbapi_conn.create_function("ln", 1, math.log, deterministic=True)
            dbapi_conn.create_function("exp", 1, math.exp, deterministic=True)
    finally:
        cur.close()


def dispose_all() -> None:
    """Forgets every cached engine (tests, or a process that is about to exit)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def _after_fork() -> None:
    # a forked child must not share the parent's pooled connections
    for engine in list(_engines.values()):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_after_fork)


@contextmanager
def translate(what: str, url: str) -> Iterator[None]:
    """Turns SQLAlchemy errors raised inside into a one-line StoreError, original attached."""
    try:
        yield
    except SQLAlchemyError as e:
        raise StoreError(f"{what} failed on {safe_url(url)}: {one_line(e)}") from e


@contextmanager
def transaction(engine: Engine, what: str, url: str) -> Iterator[Connection]:
    """One transaction: committed if the block returns, rolled back if it raises."""
    with translate(what, url), engine.begin() as conn:
        yield conn
