"""One slice of a job on one GPU worker: claim proposals from the shared study, have them compiled
ahead (compile queue, shared cache), measure, record, tell; until the slice, the budget, the
search or the job ends.

Several workers run slices of one job at the same time. They agree through the database only:
- a proposal is an Optuna trial; its number is the trial's number in porter's store, where
  record_trial is idempotent, so a trial is recorded once whoever finishes it;
- the budget is exact without a shared counter: a feasible trial's rank among the study's
  feasible trials (static checks are deterministic) decides whether it is within the budget;
- a trial whose claim went stale (claims.py) is taken over, at most MAX_ATTEMPTS times.
"""
from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from porter.backends.base import Outcome
from porter.compile import CompileResult, cache_dir, compile_variant, nvrtc_version, variant_key
from porter.engine import MAX_INFEASIBLE_FACTOR, evaluate, trial_record

from . import broker
from .claims import MAX_ATTEMPTS, Claims, claim_of, is_stale, stale_s
from .context import JobContext

log = logging.getLogger(__name__)
FINISHED = ("done", "failed", "cancelled")
LIVE = (TrialState.RUNNING, TrialState.WAITING)


def slice_s() -> float:
    return float(os.environ.get("PORTER_SLICE_S", "60"))


def compile_ahead() -> int:
    return int(os.environ.get("PORTER_COMPILE_AHEAD", "4"))


def compile_wait_s() -> float:
    return float(os.environ.get("PORTER_COMPILE_WAIT_S", "30"))


@dataclass
class Claimed:
    number: int
    trial_id: int
    config: dict
    started: float
    attempt: int
    key: str = ""
    sent_at: float = 0.0


@dataclass
class SliceResult:
    """What the task does next: `finished` (the job is over), `more` (run another slice now),
    `wait` (others still hold trials of this job: look again in a few seconds)."""
    action: str
    trials: int = 0


class Slice:
    def __init__(self, ctx: JobContext, claims: Claims, worker: str, send_compile=None):
        self.ctx, self.claims, self.worker = ctx, claims, worker
        self.send_compile = send_compile
        self.store = ctx.store
        self.searcher = ctx.searcher(worker)
        self.study = self.searcher.study
        self.storage = ctx.storage
        self.backend = ctx.backend()
        self.toolchain = {"nvrtc": nvrtc_version(), "arch": ctx.arch.name}
        spec = ctx.spec
        self.budget = spec.trials if spec.trials else (None if spec.minutes else 100)
        self.infeasible_left = MAX_INFEASIBLE_FACTOR * (self.budget or 1000)
        self.final = ""           # why this worker stopped asking: budget, exhausted, deadline
        self.done = 0
        self._last_scan = 0.0

    # ---- the loop --------------------------------------------------------------------------
    def run(self) -> SliceResult:
        ctx = self.ctx
        info = self.store.get_job(ctx.job_id)
        if info.status in FINISHED:
            return SliceResult("finished")
        if info.status == "queued":
            self.store.set_job_status(ctx.job_id, "running")
            info = self.store.get_job(ctx.job_id)
        deadline = (info.started_at or time.time()) + ctx.spec.minutes * 60 \
            if ctx.spec.minutes else None
        t_end = time.monotonic() + slice_s()
        pending: deque[Claimed] = deque()
        depth = compile_ahead() if self.backend.needs_compile else 1
        try:
            while True:
                if self.store.heartbeat(ctx.job_id):
                    return self._cancel(pending)
                asking = not self.final and time.monotonic() < t_end
                while asking and len(pending) < depth:
                    if deadline is not None and time.time() >= deadline:
                        self.final = "deadline"
                        break
                    item = self._next()
                    if item is None:
                        break
                    pending.append(item)
                    self._send_compile(item)
                if not pending:
                    break
                self._finish(pending.popleft())
        except BaseException:
            for item in pending:      # a stale claim would be taken over anyway; be quick
                self.claims.release(item.trial_id)
            raise
        if not self.final:
            return SliceResult("more", self.done)
        return self._maybe_complete()

    # ---- proposals -------------------------------------------------------------------------
    def _next(self) -> Claimed | None:
        """A claimed, feasible, within-budget trial: a stale one taken over, else a new one."""
        while not self.final:
            item = self._take_over()
            if item is None:
                proposal = self.searcher.ask()
                if proposal is None:
                    self.final = "exhausted"
                    return None
                number, config = proposal
                tid = self.storage.get_trial_id_from_study_id_trial_number(
                    self.study._study_id, number)
                item = Claimed(number, tid, dict(config), time.time(), 1)
                self.claims.hold(self.storage, tid, 1)
            admitted = self._admit(item)
            if admitted:
                return item
        return None

    def _admit(self, item: Claimed) -> bool:
        ctx = self.ctx
        if item.attempt > MAX_ATTEMPTS:
            self._record(item, Outcome("crashed", f"its worker was lost {MAX_ATTEMPTS} times "
                                       "while evaluating it; not tried again"), None)
            return False
        from porter.check import static_check
        why = static_check(ctx.template, ctx.arch, item.config, ctx.sizes)
        ctx.feasible[item.number] = why is None
        if why:
            self._record(item, Outcome("infeasible", why), None)
            self.infeasible_left -= 1
            if self.infeasible_left <= 0:
                self.final = "infeasible"
            return False
        if item.attempt == 1 and not broker.lock(
                f"config:{ctx.job_id}:{ctx.template.config_key(item.config)}", 7 * 86400,
                default=True):
            # another worker proposed this configuration at the same moment (each searcher
            # syncs the shared history every few seconds): like a sampler repeating itself,
            # that costs no evaluation
            self._tell(item.number, None, TrialState.PRUNED)
            self.claims.release(item.trial_id)
            return False
        if self.budget is not None and self._rank(item.number) > self.budget:
            # not a proposal of this job: the budget was spent by earlier trial numbers
            self._tell(item.number, None, TrialState.PRUNED)
            self.claims.release(item.trial_id)
            self.final = "budget"
            return False
        return True

    def _rank(self, number: int) -> int:
        """1 + the feasible trials numbered below `number` (duplicates the sampler pruned and
        trials refused for the budget do not count)."""
        rank = 1
        for t in self.study.get_trials(deepcopy=False):
            if t.number >= number or t.state == TrialState.PRUNED:
                continue
            params = t.params or (t.system_attrs.get("fixed_params") or {})
            if set(params) != set(self.ctx.template.params):
                rank += 1   # not suggested yet: count it, a budget is never exceeded
                continue
            rank += self.ctx.is_feasible(t.number, params)
        return rank

    def _take_over(self) -> Claimed | None:
        now = time.time()
        if now - self._last_scan < 1.0:
            return None
        self._last_scan = now
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        stale = [t for t in running if not self.claims.holds(t._trial_id) and is_stale(t, now)]
        if not stale:
            return None
        recorded = self.store.trial_numbers(self.ctx.job_id) \
            if hasattr(self.store, "trial_numbers") else {t.number for t in
                                                         self.store.trials(self.ctx.job_id)}
        for t in stale:
            if t.number in recorded:
                # recorded, then its worker died before telling Optuna
                rec = next(r for r in self.store.trials(self.ctx.job_id) if r.number == t.number)
                self._tell(t.number, rec.objective)
                continue
            if not broker.lock(f"takeover:{self.ctx.job_id}:{t.number}", stale_s()):
                continue
            fresh = self.storage.get_trial(t._trial_id)
            if fresh.state != TrialState.RUNNING or not is_stale(fresh):
                continue
            attempt = claim_of(fresh)["attempt"] + 1
            log.warning("job %s trial %s: claim of %s is stale; taking it over (attempt %s)",
                        self.ctx.job_id, t.number, claim_of(fresh).get("worker"), attempt)
            self.claims.hold(self.storage, t._trial_id, attempt)
            return Claimed(t.number, t._trial_id, dict(fresh.params), time.time(), attempt)
        return None

    # ---- compile ahead ---------------------------------------------------------------------
    def _send_compile(self, item: Claimed) -> None:
        if not self.backend.needs_compile:
            return
        ctx = self.ctx
        item.key = variant_key(ctx.template, item.config, ctx.arch)
        item.sent_at = time.monotonic()
        if self.send_compile is not None and not (cache_dir() / f"{item.key}.json").is_file():
            try:
                self.send_compile(ctx.job_id, item.number)
            except Exception as e:  # noqa: BLE001 - broker away: compiled here instead
                log.warning("compile task not sent (%s); compiling here", e)
                item.sent_at = -1e9

    def _compiled(self, item: Claimed) -> CompileResult | None:
        if not self.backend.needs_compile:
            return None
        meta = cache_dir() / f"{item.key}.json"
        while self.send_compile is not None and not meta.is_file() and \
                time.monotonic() - item.sent_at < compile_wait_s():
            time.sleep(0.02)
        try:   # from the cache when a compile worker got there first
            return compile_variant(self.ctx.template, item.config, self.ctx.arch)
        except Exception as e:  # noqa: BLE001 - a dead compiler is this trial's
            return CompileResult(ok=False, key=item.key, log=f"compiler died: {e}")

    # ---- finishing -------------------------------------------------------------------------
    def _finish(self, item: Claimed) -> None:
        compiled = self._compiled(item)
        outcome = evaluate(self.ctx.template, self.ctx.arch, self.backend, item.config,
                           compiled, self.ctx.sizes)
        self._record(item, outcome, compiled)

    def _record(self, item: Claimed, outcome: Outcome, compiled: CompileResult | None) -> None:
        ctx = self.ctx
        rec = trial_record(ctx.template, ctx.arch, self.backend.name, ctx.sizes, item.number,
                           item.config, item.started, outcome, compiled, self.toolchain,
                           self.worker)
        if self.store.record_trial(ctx.job_id, rec):
            self.done += outcome.status != "infeasible"
        self._tell(item.number, rec.objective)
        self.claims.release(item.trial_id)

    def _tell(self, number: int, objective: float | None, state: TrialState | None = None):
        if state is None:
            self.searcher.tell(number, objective)
            return
        try:
            self.study.tell(number, state=state)
        except (ValueError, RuntimeError):
            pass

    def _cancel(self, pending) -> SliceResult:
        for item in pending:
            self._tell(item.number, None, TrialState.PRUNED)
            self.claims.release(item.trial_id)
        finish_job(self.ctx, "cancelled")
        return SliceResult("finished", self.done)

    def _maybe_complete(self) -> SliceResult:
        """This worker has nothing more to ask. The job is over when no trial is still held."""
        if any(t.state == TrialState.RUNNING for t in self.study.get_trials(
                deepcopy=False, states=(TrialState.RUNNING,))):
            return SliceResult("wait", self.done)
        finish_job(self.ctx, "done")
        return SliceResult("finished", self.done)


def finish_job(ctx: JobContext, status: str, message: str | None = None) -> None:
    """Sets the job's final status (idempotent; a cancel request wins over done)."""
    store = ctx.store
    info = store.get_job(ctx.job_id)
    if info.status in FINISHED:
        return
    if status == "done" and info.extra.get("cancel_requested"):
        status = "cancelled"
    if message is None:
        counts: dict[str, int] = {}
        for t in store.trials(ctx.job_id):
            counts[t.status] = counts.get(t.status, 0) + 1
        message = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    store.set_job_status(ctx.job_id, status, message)


optuna.logging.set_verbosity(optuna.logging.WARNING)
