"""The Celery application of the service: Redis broker, no result backend (results live in the
database), late acknowledgement and one message at a time per worker process."""
from __future__ import annotations

import os

from celery import Celery

BROKER_URL = os.environ.get("PORTER_BROKER_URL", "redis://127.0.0.1:6379/0")
# a drive_job task lives as long as its job: an unacknowledged message is handed to another
# worker only after this long, so it must exceed the longest job a worker may be driving
VISIBILITY_TIMEOUT_S = int(os.environ.get("PORTER_VISIBILITY_TIMEOUT_S", "3600"))

app = Celery("porter", broker=BROKER_URL, include=["workers.tasks"])
app.conf.update(
    result_backend=None,
    task_ignore_result=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_connection_retry=True,
    broker_connection_max_retries=None,
    broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_S},
    task_serializer="json", accept_content=["json"],
    task_default_queue="compile",
    task_routes={"workers.tasks.prefetch_compiles": {"queue": "compile"}},
    # drive_job goes to gpu.<arch>, named per message by the submitter
    worker_hijack_root_logger=False,
    worker_cancel_long_running_tasks_on_connection_loss=False,
    # unreadable messages go to the dead-letter list (workers/deadletter.py)
    worker_consumer="workers.deadletter:Consumer",
)
