"""The Celery app. Broker from PORTER_BROKER_URL; no result backend (results live in the db).

Reliability settings: late acknowledgement with requeue when a worker process is lost, one
message reserved per GPU process, endless reconnection to the broker, and a visibility timeout
longer than any task (a drive task runs one slice of a job, SLICE_S, plus one trial's timeout).
"""
from __future__ import annotations

import os

from celery import Celery

DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
VISIBILITY_TIMEOUT_S = 900


def broker_url() -> str:
    return os.environ.get("PORTER_BROKER_URL") or DEFAULT_BROKER_URL


app = Celery("porter", include=["workers.tasks"])
app.conf.update(
    broker_url=broker_url(),
    result_backend=None,
    task_ignore_result=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_default_queue="compile",
    task_create_missing_queues=True,
    broker_connection_retry=True,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_S,
                              "socket_timeout": 10, "socket_connect_timeout": 5,
                              "retry_on_timeout": True, "health_check_interval": 10},
    broker_pool_limit=4,
    worker_cancel_long_running_tasks_on_connection_loss=False,
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    task_send_sent_event=False,
)
