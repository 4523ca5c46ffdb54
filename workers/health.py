"""A worker's checks before it takes work, and its reaper.

preflight(): the database answers, its schema is the one this code knows (migrated to head
first), and the broker answers; otherwise the worker refuses to start with one line.

Reaper: a thread of every worker's main process that, every PORTER_REAP_S seconds, claims the
running jobs whose drivers have all stopped beating for PORTER_DRIVER_STALE_S seconds (a
SIGKILLed worker, a lost host) and queues a new driver for each, so a job never waits for the
broker's visibility timeout. Only jobs that the service drove (they beat) are ever claimed.
"""
from __future__ import annotations

import logging
import os
import threading

from porter.errors import PorterError

log = logging.getLogger("porter.worker")
DRIVER_STALE_S = float(os.environ.get("PORTER_DRIVER_STALE_S", "45"))
REAP_S = float(os.environ.get("PORTER_REAP_S", "10"))


def preflight(db_url: str | None, broker_url: str) -> None:
    """Raises PorterError (one line) unless the database and the broker answer and the
    database's schema is at this code's head."""
    from db import migrate
    from db.engine import normalize_url, safe_url
    from porter.store.base import db_url as resolve, open_store
    url = normalize_url(resolve(db_url))
    try:
        open_store(url)                      # connects and migrates to head
        current, head = migrate.current(url), migrate.head()
    except Exception as e:  # noqa: BLE001 - any failure here means: do not start
        raise PorterError(f"worker not started: the database {safe_url(url)} is unusable "
                          f"({_first_line(e)}); check PORTER_DB_URL") from None
    if current != head:
        raise PorterError(f"worker not started: the database {safe_url(url)} has schema "
                          f"{current}, this worker needs {head}; upgrade the worker's code")
    try:
        import redis
        redis.Redis.from_url(broker_url, socket_connect_timeout=5, socket_timeout=5).ping()
    except Exception as e:  # noqa: BLE001
        raise PorterError(f"worker not started: the broker {_safe_broker(broker_url)} does not "
                          f"answer ({_first_line(e)}); check PORTER_BROKER_URL") from None


def reap_once(store) -> list[int]:
    """Queues a driver for each running job whose drivers are gone; returns their ids."""
    from .tasks import enqueue
    claimed = store.claim_stale_jobs(DRIVER_STALE_S)
    for job_id, arch in claimed:
        log.warning("job %s: no heartbeat for %.0f s; queuing a new driver", job_id,
                    DRIVER_STALE_S)
        enqueue(job_id, arch, drivers=1, prefetch=False)
    return [j for j, _ in claimed]


def start_reaper(db_url: str | None) -> threading.Thread:
    from porter.store.base import open_store

    def loop():
        stop = threading.Event()
        while True:
            try:
                reap_once(open_store(db_url))
            except Exception as e:  # noqa: BLE001 - the database or broker is away: next round
                log.warning("reaper: %s", _first_line(e))
            stop.wait(REAP_S)

    t = threading.Thread(target=loop, daemon=True, name="porter-reaper")
    t.start()
    return t


def _first_line(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]


def _safe_broker(url: str) -> str:
    if "@" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
