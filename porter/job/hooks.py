"""What differs between the ways a job is run, as small objects the one job loop
(porter.job.loop.run_job) is given: where variants compile (`InlineCompiles` in this process,
`PoolCompiles` in a process pool running ahead of the GPU, made per run or lent by the caller
for many runs) and how a run coordinates with others (`JobHooks`: the embedded defaults; the
service's drivers subclass it in workers/). Also the retry of transient database errors, which
both ways share."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import nullcontext
from typing import Any, Callable, Iterable, TypeVar

from porter.build.compile import CompileResult
from porter.job.trial import compile_safely
from porter.spec.arch import Arch
from porter.spec.template import Template

log = logging.getLogger("porter.job")
T = TypeVar("T")


# ---- where variants compile ---------------------------------------------------------------

class InlineCompiles:
    """Each variant compiles in this process when its turn comes (through the compile cache,
    which the service's compile workers fill ahead). One trial in flight at a time."""
    ahead = 1

    def __init__(self, needs_compile: bool):
        self.needs_compile = needs_compile
        self._queue: deque = deque()

    def pending(self) -> int:
        return len(self._queue)

    def submit(self, token: Any, tpl: Template, config: dict, arch: Arch) -> None:
        self._queue.append((token, tpl, config, arch))

    def finished(self) -> list[tuple[Any, CompileResult | None]]:
        token, tpl, config, arch = self._queue.popleft()
        return [(token, compile_safely(tpl, config, arch) if self.needs_compile else None)]

    def drop_pending(self) -> None:
        """Forgets the variants submitted and not yet collected."""
        self._queue.clear()

    def close(self) -> None:
        self.drop_pending()


def _lower_priority():
    try:
        os.nice(10)
    except OSError:
        pass


class PoolCompiles:
    """Variants compile in a pool of processes (spawned, niced), `ahead` of the one being
    measured (2 per process unless told).

    A run that makes its pool closes it when it ends; a pool lent to runs (run_job's and
    Engine's `compiles`) outlives them: each run leaves it with nothing pending
    (drop_pending), and its owner closes it."""

    def __init__(self, workers: int, ahead: int | None = None):
        self.ahead = ahead or workers * 2
        self._pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                         initializer=_lower_priority)
        self._futures: dict[Future, Any] = {}

    def pending(self) -> int:
        return len(self._futures)

    def submit(self, token: Any, tpl: Template, config: dict, arch: Arch) -> None:
        self._futures[self._pool.submit(compile_safely, tpl, config, arch)] = token

    def finished(self) -> list[tuple[Any, CompileResult | None]]:
        done, _ = wait(list(self._futures), return_when=FIRST_COMPLETED)
        out = []
        for fut in done:
            token = self._futures.pop(fut)
            try:
                out.append((token, fut.result()))
            except Exception as e:  # noqa: BLE001 - the pool lost its process: this trial's
                out.append((token, CompileResult(ok=False, key="", log=f"compiler died: {e}")))
        return out

    def drop_pending(self) -> None:
        """Forgets the variants submitted and not yet collected (their trials were abandoned):
        those not started are cancelled; those compiling finish into the compile cache. The
        pool stays open for the next run."""
        for fut in self._futures:
            fut.cancel()
        self._futures.clear()

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)
        self._futures.clear()


Compiles = InlineCompiles | PoolCompiles


def compiles_for(needs_compile: bool, workers: int | None) -> InlineCompiles | PoolCompiles:
    """A pool when the backend compiles and more than one compile process is wanted."""
    if needs_compile and workers and workers > 0:
        return PoolCompiles(workers)
    return InlineCompiles(needs_compile)


# ---- how a run coordinates with others ----------------------------------------------------

class JobHooks:
    """The embedded run's answers; a service driver overrides them (workers/driver.py).

    lock(): held around reading the job's state and asking, so that drivers sharing a study
    never propose the same configuration. beat(): called once a round; returns "cancel" when
    the job should stop, "stop" when another party finished it, else None. reclaim(): given
    the study's RUNNING trials that no live party of this run owns (not recorded, not ours),
    fails those whose owner is gone and returns their numbers; an embedded job has no other
    party, so every such trial is a leftover of an interrupted run."""

    wait_s = 0.2                # pause while only other parties' trials are in flight
    sole = True                 # no other party runs this job at the same time
    db_retry_s = float(os.environ.get("PORTER_DB_RETRY_S", "60"))

    def lock(self):
        return nullcontext()

    def start(self, store, job_id: int) -> None:
        self.store, self.job_id = store, job_id

    def beat(self) -> str | None:
        return "cancel" if self.store.cancel_requested(self.job_id) else None

    def reclaim(self, study, foreign: list) -> set[int]:
        return fail_trials(study, [t.number for t in foreign])

    def asked(self, number: int) -> None:
        pass

    def told(self, number: int) -> None:
        pass

    def stop(self) -> None:
        pass


def fail_trials(study, numbers: Iterable[int]) -> set[int]:
    """Marks RUNNING trials of the study FAIL (those already finished are left as they are)."""
    import optuna
    done = set()
    for n in numbers:
        try:
            study.tell(n, state=optuna.trial.TrialState.FAIL)
        except (ValueError, RuntimeError):
            pass
        done.add(n)
    return done


# ---- transient database errors ------------------------------------------------------------

def is_transient(e: BaseException) -> bool:
    """A lost or refused database connection (a restart, a failover), anywhere in the chain of
    causes; not a constraint violation or a bad query."""
    from sqlalchemy import exc
    try:
        from optuna.exceptions import StorageInternalError
    except ImportError:       # pragma: no cover
        StorageInternalError = ()   # noqa: N806
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, (exc.OperationalError, exc.InterfaceError, exc.DisconnectionError)):
            return True
        if isinstance(e, exc.DBAPIError) and e.connection_invalidated:
            return True
        # a driver's own DB-API connection (PEP 249 names its connection-level class so)
        if type(e).__name__ == "OperationalError" and type(e).__module__.startswith("psycopg"):
            return True
        if StorageInternalError and isinstance(e, StorageInternalError):
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def retrying(fn: Callable[[], T], what: str, budget_s: float) -> T:
    """fn(), tried again with backoff (0.2 s doubling to 5 s) while it fails with a transient
    database error, for at most budget_s; then the error goes up."""
    t0 = time.monotonic()
    delay = 0.2
    while True:
        try:
            return fn()
        except Exception as e:
            if not is_transient(e) or time.monotonic() - t0 + delay > budget_s:
                raise
            log.warning("%s: database unavailable (%s); retrying in %.1f s", what,
                        type(e).__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
