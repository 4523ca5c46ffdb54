"""Small Redis helpers beside Celery: locks, delivery counts, queue lengths.

Everything here is an optimisation or a bound, never the only record of anything: Redis may be
restarted empty (the service's Redis keeps no snapshot), and the database stays the truth.
Each helper answers a safe default when Redis is unreachable.
"""
from __future__ import annotations

import logging

import redis

from .app import broker_url

log = logging.getLogger(__name__)
PREFIX = "porter:"
# kombu's Redis transport keeps one list per priority step besides the plain queue name
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")
_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(broker_url(), socket_timeout=5, socket_connect_timeout=3)
    return _client


def lock(name: str, ttl_s: float, default: bool = True) -> bool:
    """True if this process took the named lock (it expires by itself after ttl_s)."""
    try:
        return bool(client().set(PREFIX + name, "1", nx=True, px=int(ttl_s * 1000)))
    except redis.RedisError as e:
        log.warning("redis unreachable for lock %s: %s", name, e)
        return default


def count(name: str, ttl_s: float) -> int:
    """Increments and returns a counter that expires ttl_s after its last increment (0 if
    Redis is unreachable)."""
    try:
        pipe = client().pipeline()
        pipe.incr(PREFIX + name)
        pipe.expire(PREFIX + name, int(ttl_s))
        return int(pipe.execute()[0])
    except redis.RedisError as e:
        log.warning("redis unreachable for counter %s: %s", name, e)
        return 0


def queue_length(queue: str) -> int | None:
    """Messages waiting in a Celery queue; None when Redis cannot be asked."""
    try:
        pipe = client().pipeline()
        for suffix in _PRIORITY_SUFFIXES:
            pipe.llen(queue + suffix)
        return sum(pipe.execute())
    except redis.RedisError:
        return None
