"""Poison messages: a message a worker cannot read goes to the dead-letter list
`porter.dead-letter` in the broker (one JSON entry: queue, reason, the raw payload, time) with one
log line, and the worker goes on. Never does a message's content stop a worker.

Three layers, each where the message is first read:
- the Redis transport parses each queue entry as a JSON envelope; an entry that is not JSON, or
  not an envelope, would raise inside kombu's event loop and take the worker down. `install()`
  makes that parse tolerant: such an entry becomes an envelope of a content type no worker
  accepts, carrying the raw text, so Celery refuses it as undecodable (below);
- Celery's consumer (`Consumer`, set as `worker_consumer`) sends undecodable, unknown and
  invalid messages to the dead-letter list and acknowledges them;
- the tasks send arguments that are not a job id there (workers.tasks).
"""
from __future__ import annotations

import base64
import json
import logging
import time
import uuid

from celery.worker.consumer import Consumer as CeleryConsumer

log = logging.getLogger("porter.worker")
DEAD_LETTER = "porter.dead-letter"
POISON_TYPE = "application/x-porter-unreadable"
_MAX_KEEP = 64 * 1024           # characters of a payload kept in the list


def _envelope_ok(msg) -> bool:
    props = msg.get("properties") if isinstance(msg, dict) else None
    return isinstance(msg, dict) and isinstance(msg.get("body"), (str, bytes)) and \
        isinstance(props, dict) and "delivery_tag" in props and \
        isinstance(props.get("delivery_info", {}), dict) and \
        isinstance(msg.get("headers", {}), dict)


def _poison_envelope(raw: str, reason: str) -> dict:
    return {"body": base64.b64encode(raw[:_MAX_KEEP].encode()).decode(),
            "content-type": POISON_TYPE, "content-encoding": "binary",
            "headers": {"porter_reason": reason},
            "properties": {"body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
                           "delivery_info": {"exchange": "", "routing_key": ""},
                           "priority": 0}}


def tolerant_loads(text, _loads=None):
    """kombu's Redis transport's envelope parser, refusing nothing: see the module doc."""
    from kombu.utils.json import loads
    try:
        msg = loads(text)
    except (ValueError, TypeError) as e:
        return _poison_envelope(str(text), f"not JSON: {e}")
    if not _envelope_ok(msg):
        return _poison_envelope(str(text), "JSON, but not a message envelope")
    return msg


def install() -> None:
    """Makes the Redis transport's parse of queue entries tolerant (a module-level name of
    kombu's, replaced in worker processes only; nothing else of kombu changes)."""
    import kombu.transport.redis as kredis
    kredis.loads = tolerant_loads


def push(reason: str, payload, queue: str = "") -> None:
    """Adds an entry to the dead-letter list and logs one line (Redis away: the line only)."""
    from .tasks import redis_try
    if isinstance(payload, bytes):
        payload = payload.decode("utf-8", "replace")
    if not isinstance(payload, str):
        try:
            payload = json.dumps(payload, default=repr)
        except (TypeError, ValueError):
            payload = repr(payload)
    entry = json.dumps({"queue": queue, "reason": reason[:500], "payload": payload[:_MAX_KEEP],
                        "at": time.time()})
    redis_try(lambda r: r.lpush(DEAD_LETTER, entry))
    log.error("dead-lettered a message from %s: %s", queue or "?", reason[:200])


def _queue_of(message) -> str:
    try:
        return str(message.delivery_info.get("routing_key") or "")
    except AttributeError:
        return ""


class Consumer(CeleryConsumer):
    """Celery's consumer, with unreadable messages dead-lettered instead of only logged."""

    def on_decode_error(self, message, exc):
        headers = message.headers if isinstance(message.headers, dict) else {}
        reason = headers.get("porter_reason") or f"undecodable: {exc}"
        # the transport has undone the envelope's base64: body is the raw entry
        push(str(reason), message.body, _queue_of(message))
        message.ack()

    def on_unknown_message(self, body, message):
        push("not a task message", message.body, _queue_of(message))
        message.ack()

    def on_unknown_task(self, body, message, exc):
        push(f"unknown task: {exc}", message.body, _queue_of(message))
        message.ack()

    def on_invalid_task(self, body, message, exc):
        push(f"invalid task: {exc}", message.body, _queue_of(message))
        message.ack()
