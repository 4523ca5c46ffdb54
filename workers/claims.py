"""Claims on trials, kept in the job's Optuna study (the same database as everything else).

A proposal is an Optuna trial in state RUNNING. The process evaluating it stamps the trial's
user attribute `claim` = {worker, hb, attempt} every HEARTBEAT_S seconds from a thread. A RUNNING
trial whose stamp is older than stale_s() lost its worker: another worker takes it over (the same
trial number, so it can only be recorded once) with attempt + 1, and after MAX_ATTEMPTS the trial
is recorded as `crashed` instead of being tried again.
"""
from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger(__name__)
HEARTBEAT_S = 2.0
MAX_ATTEMPTS = 3
CLAIM = "claim"


def stale_s() -> float:
    return float(os.environ.get("PORTER_STALE_S", "20"))


class Claims:
    """The trials this process holds, and the thread that keeps their stamps fresh."""

    def __init__(self, worker: str):
        self.worker = worker
        self._held: dict[int, tuple[object, int]] = {}   # trial_id -> (storage, attempt)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, storage, trial_id: int, attempt: int = 1) -> None:
        self._stamp(storage, trial_id, attempt)
        with self._lock:
            self._held[trial_id] = (storage, attempt)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._beat, name="porter-claims",
                                                daemon=True)
                self._thread.start()

    def release(self, trial_id: int) -> None:
        with self._lock:
            self._held.pop(trial_id, None)

    def holds(self, trial_id: int) -> bool:
        with self._lock:
            return trial_id in self._held

    def _stamp(self, storage, trial_id: int, attempt: int) -> None:
        storage.set_trial_user_attr(trial_id, CLAIM, {"worker": self.worker, "hb": time.time(),
                                                      "attempt": attempt})

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            with self._lock:
                held = list(self._held.items())
            for trial_id, (storage, attempt) in held:
                try:
                    self._stamp(storage, trial_id, attempt)
                except Exception as e:  # noqa: BLE001 - finished trial, or the db blinked
                    log.debug("claim stamp of trial %s: %s", trial_id, e)


def claim_of(trial) -> dict:
    """The claim of a FrozenTrial; a trial nobody stamped yet counts from its start."""
    c = dict(trial.user_attrs.get(CLAIM) or {})
    if "hb" not in c:
        start = trial.datetime_start
        c["hb"] = start.timestamp() if start else 0.0
    c.setdefault("attempt", 1)
    return c


def is_stale(trial, now: float | None = None) -> bool:
    return (now or time.time()) - claim_of(trial)["hb"] > stale_s()
