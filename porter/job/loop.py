"""The job loop, the one both `porter port` (Engine) and the service's drivers
(workers.tasks.drive_job) run: propose -> static check -> compile -> measure and verify ->
record -> tell, until the budget is recorded, the deadline passes, the space is exhausted, or the
job is cancelled. What differs between the two is passed in (porter.job.hooks).

One definition of each rule, here:
- budget: recorded trials that are not `infeasible`, plus trials in flight (this run's and those
  other drivers are working on), never more than `spec.trials` (100 when neither trials nor
  minutes are given; none with minutes only);
- deadline: `spec.minutes` after the job's current run started (Store.start_run: when it went
  to running; drivers that join a running job share that clock); trials in flight finish;
- final status: `done`, `cancelled`, `failed` (an error no retry fixed, with its reason; the job
  can be resumed) or `interrupted` (Ctrl-C); written only while the job is still running, so the
  first final status wins and a driver that finds the job finished by another writes nothing;
- errors: transient database errors are retried with backoff (hooks.retrying); any other error
  fails the job with a one-line reason, and the run's open Optuna trials are failed, never left
  RUNNING;
- reuse (porter.job.cache): unless the spec asks for fresh measurements, configurations other
  jobs measured under this job's measurement identity are proposed first (best first, up to the
  budget), and any proposal with such a measurement is recorded as reused (linked to the trial
  that measured it) and told to the search without compiling or measuring. Reused trials are
  trials of the job like any other: they count toward its budget.
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from porter.build.check import search_space, static_check
from porter.build.compile import CompileResult, nvrtc_version
from porter.job.cache import measure_key, reuse_limit, reused_record
from porter.job.hooks import Compiles, JobHooks, compiles_for, fail_trials, retrying
from porter.job.trial import (evaluate, first_error, objective, run_trial,  # noqa: F401
                              trial_record)
from porter.measure.backends.base import Backend, Outcome
from porter.records import JobSpec, TrialRecord
from porter.search.searcher import Searcher
from porter.spec.arch import Arch
from porter.spec.template import Template
from porter.store.base import Store, default_study_name

log = logging.getLogger("porter.job")
MAX_INFEASIBLE_FACTOR = 20
FINISHED = ("done", "failed", "cancelled", "interrupted")
_WAIT, _END = "wait", "end"


study_name = default_study_name      # the study of a job that names none


def trial_budget(spec: JobSpec) -> int | None:
    return spec.trials if spec.trials else (None if spec.minutes else 100)


@dataclass
class JobSummary:
    job_id: int
    status: str
    counts: dict[str, int] = field(default_factory=dict)
    best: TrialRecord | None = None
    wall_s: float = 0.0
    busy_ms: float = 0.0            # GPU time in kernels and baselines
    compile_s: float = 0.0          # summed compile time of fresh (uncached) variants
    compiled: int = 0
    reused: int = 0                 # trials recorded from earlier jobs' measurements
    message: str = ""

    @property
    def gpu_share(self) -> float:
        return self.busy_ms / 1e3 / self.wall_s if self.wall_s else 0.0


def run_job(store: Store, job_id: int, spec: JobSpec, tpl: Template, arch: Arch,
            backend: Backend, *, hooks: JobHooks | None = None, compile_workers: int | None = None,
            compiles: Compiles | None = None, warm_start=(), prior=(), origins=None,
            worker: str = "embedded",
            on_trial: Callable[[TrialRecord, TrialRecord | None], None] | None = None
            ) -> JobSummary:
    """Runs (or joins, or resumes) job `job_id` to its end and returns what happened.

    compile_workers: compile processes running ahead of the measurement (None or 0: compile in
    this process, through the compile cache), in a pool made for this run and closed at its
    end. compiles: a pool the caller lends instead (e.g. one PoolCompiles for many jobs), used
    where the backend compiles and left open, with nothing of this run pending in it.
    warm_start: configurations proposed first; prior: (configuration, objective) pairs measured
    elsewhere that the search learns from; origins: config key -> where a warm-start
    configuration came from (job_warm_start), recorded with its trial (the template's default
    and [[seeds]] are labelled here, anything else the search proposed "search (sampler)").
    Ctrl-C marks the job `interrupted` and goes up as KeyboardInterrupt."""
    run = _Run(store, job_id, spec, tpl, arch, backend, hooks or JobHooks(), worker, on_trial)
    starts = tpl.start_configs()
    run.origins = dict(origins or {})
    run.label(starts[:1], "template default")
    run.label(starts[1:], "template [[seeds]]")
    lent = compiles is not None and backend.needs_compile
    if not lent:
        compiles = compiles_for(backend.needs_compile, compile_workers)
    status, message = "failed", ""
    interrupted = False
    try:
        status = run.loop(compiles, [*warm_start, *starts], prior)
    except KeyboardInterrupt:
        interrupted = True
    except Exception as e:  # noqa: BLE001 - whatever stops the job is its recorded reason
        log.warning("job %s failed: %s", job_id, e, exc_info=True)
        run.abandon()
        message = f"{run.stage}: {_one_line(e)}; resume with --resume {job_id}"
    finally:
        release_compiles(compiles, lent)
        run.hooks.stop()
    if interrupted:
        # Ctrl-C can land between a write and its commit (inside a transaction's exit, say):
        # the interrupted frames then keep that connection, its transaction open, for as long
        # as the traceback lives, and on SQLite its write lock stops every write below. Out of
        # the handler the traceback is gone; collected, the connection rolls back.
        gc.collect()
        run.abandon()
        finish_job(store, job_id, "interrupted", f"interrupted; resume with --resume {job_id}",
                   run.hooks.db_retry_s)
        raise KeyboardInterrupt
    s = run.summary
    s.best = run.best
    s.wall_s = time.monotonic() - run.t0
    s.status = status or "stopped"
    s.message = message or _counts_line(s.counts, s.reused)
    if status:
        finish_job(store, job_id, status, s.message, run.hooks.db_retry_s)
    return s


def release_compiles(compiles: Compiles, lent: bool) -> None:
    """The end of a run's use of its compiles: a lent pool drops what this run left pending
    (only an abandoned run leaves any: a run that ends normally collects every trial in
    flight) and stays open for its owner; one made for the run is closed."""
    if lent:
        compiles.drop_pending()
    else:
        compiles.close()


def finish_job(store: Store, job_id: int, status: str, message: str,
               retry_s: float = 60.0) -> bool:
    """Writes a final status while the job is still queued or running (the first final status
    wins); returns whether it was written."""
    def write():
        if store.get_job(job_id).status in FINISHED:
            return False
        store.set_job_status(job_id, status, message)
        return True
    return retrying(write, f"finishing job {job_id}", retry_s)


class Engine:
    """`porter port`'s way of running a job: compiles in a process pool ahead of the GPU, one
    made per run (`workers` processes) or the caller's (`compiles`, e.g. one PoolCompiles kept
    over many jobs; the engine never closes it)."""

    def __init__(self, store: Store, template: Template, arch: Arch, backend: Backend,
                 workers: int | None = None,
                 on_trial: Callable[[TrialRecord, TrialRecord | None], None] | None = None,
                 worker_name: str = "embedded", hooks: JobHooks | None = None,
                 compiles: Compiles | None = None):
        import os
        self.store, self.template, self.arch, self.backend = store, template, arch, backend
        # leave two cores to the measuring child and this process: a starved launch loop
        # shows up as idle GPU time
        self.workers = workers or max(1, (os.cpu_count() or 2) - 2)
        self.on_trial, self.worker_name, self.hooks = on_trial, worker_name, hooks
        self.compiles = compiles

    def run(self, job_id: int, spec: JobSpec, warm_start=(), prior=(), origins=None
            ) -> JobSummary:
        return run_job(self.store, job_id, spec, self.template, self.arch, self.backend,
                       hooks=self.hooks, compile_workers=self.workers, compiles=self.compiles,
                       warm_start=warm_start, prior=prior, origins=origins,
                       worker=self.worker_name,
                       on_trial=self.on_trial)


class _Run:
    """One party's run of a job: its searcher, its trials in flight, its counts."""

    def __init__(self, store, job_id, spec, tpl, arch, backend, hooks, worker, on_trial):
        self.store, self.job_id, self.spec = store, job_id, spec
        # arch_sms: the measuring device's own multiprocessor count where there is one
        self.tpl, self.arch, self.backend, self.hooks = tpl, arch.with_sms(backend.sms), \
            backend, hooks
        self.worker, self.on_trial = worker, on_trial
        self.sizes = list(spec.sizes)
        self.t0 = time.monotonic()
        self.summary = JobSummary(job_id, "running")
        self.best: TrialRecord | None = None
        self.in_flight: set[int] = set()
        self.untold: dict[int, float | None] = {}    # recorded, not yet told to the study
        self.searcher: Searcher | None = None
        self.budget = trial_budget(spec)
        self.infeasible_left = MAX_INFEASIBLE_FACTOR * (self.budget or 1000)
        self.stage = "starting"
        self.measure_key: str | None = None
        self.reuse = False
        self.origins: dict[str, str] = {}    # config key -> origin (run_job's labels)

    def label(self, configs, origin: str, replace: bool = False) -> None:
        """Records `origin` for each of `configs` (over an earlier label only with replace)."""
        for cfg in configs:
            key = self.tpl.config_key(self.tpl.complete(cfg))
            if replace or key not in self.origins:
                self.origins[key] = origin

    def origin(self, number: int, config: dict) -> str:
        """Where a trial's configuration came from: someone's enqueue_trial on the job's study,
        its warm-start source, else the search."""
        if self.searcher is not None and number in self.searcher.enqueued:
            return "enqueued in the study"
        return self.origins.get(self.tpl.config_key(config), f"search ({self.spec.sampler})")

    def db(self, fn, what: str):
        self.stage = what
        return retrying(fn, f"job {self.job_id}: {what}", self.hooks.db_retry_s)

    def loop(self, compiles, warm, prior) -> str | None:
        store, job_id, hooks = self.store, self.job_id, self.hooks
        started = self.db(lambda: store.start_run(job_id), "starting the run")
        self.db(lambda: hooks.start(store, job_id), "heartbeat")
        self.deadline = started + self.spec.minutes * 60 if self.spec.minutes else None
        for t in self.db(lambda: store.trials(job_id), "reading the job's trials"):
            self.summary.counts[t.status] = self.summary.counts.get(t.status, 0) + 1
            if t.objective is not None and (self.best is None
                                            or t.objective < self.best.objective):
                self.best = t
        name = self.db(lambda: store.get_job(job_id).study_name, "reading the job") \
            or study_name(job_id)
        space = search_space(self.tpl, self.arch, self.sizes, self.backend.allows)
        self.stage = "identifying the measurements"
        self.measure_key = measure_key(self.tpl, self.arch, self.backend, self.sizes)
        self.reuse = self.measure_key is not None and not self.spec.fresh
        if self.reuse:
            cached = self.db(lambda: store.cached_configs(
                self.measure_key, reuse_limit(self.budget), exclude_job=job_id),
                "reading the measurement cache")
            warm = [*cached, *warm]
            # proposed first: that is why they are tried
            self.label(cached, "measurement cache", replace=True)
        self.searcher = self.db(lambda: Searcher(
            space, self.spec.sampler, self.spec.seed, storage=store.optuna_storage(),
            study_name=name, warm_start=warm, prior=prior), "opening the study")
        self.toolchain = {"nvrtc": nvrtc_version(), "arch": self.arch.name}
        while True:
            signal = self.db(hooks.beat, "heartbeat")
            decision = None
            while signal is None and compiles.pending() < compiles.ahead:
                decision = self.next_proposal()
                if not isinstance(decision, tuple):
                    break
                number, config = decision
                t_start = time.time()
                why = static_check(self.tpl, self.arch, config, self.sizes)
                if why:
                    self.finish_trial(number, config, t_start, Outcome("infeasible", why), None)
                    self.infeasible_left -= 1
                    continue
                if self.reuse and self.reuse_cached(number, config, t_start):
                    continue
                compiles.submit((number, config, t_start), self.tpl, config, self.arch)
            if compiles.pending():
                for (number, config, t_start), compiled in compiles.finished():
                    self.stage = f"trial {number}"
                    outcome = evaluate(self.tpl, self.arch, self.backend, config, compiled,
                                       self.sizes)
                    self.finish_trial(number, config, t_start, outcome, compiled)
                continue
            if signal == "cancel":
                return "cancelled"
            if signal == "stop":
                return None
            if decision == _WAIT:
                time.sleep(hooks.wait_s)
                continue
            return "done"

    def next_proposal(self) -> tuple[int, dict] | str:
        """The next (number, configuration) for this run, _WAIT while only other parties'
        trials stand between it and the end, or _END. Retried whole (the lock taken again)
        when the database drops."""
        return self.db(self._next_locked, "asking for the next trial")

    def _next_locked(self) -> tuple[int, dict] | str:
        store, searcher, hooks = self.store, self.searcher, self.hooks
        with hooks.lock():
            # the study's running trials first, the records second: a trial is recorded
            # before it is told, so one that finishes in between is seen in the records; one
            # seen in neither cannot exist (asking needs the lock)
            running = searcher.sync()
            statuses = store.trial_statuses(self.job_id)
            foreign = [t for t in running
                       if t.number not in statuses and t.number not in self.in_flight]
            if foreign:
                gone = hooks.reclaim(searcher.study, foreign)
                foreign = [t for t in foreign if t.number not in gone]
            counted = sum(1 for st in statuses.values() if st != "infeasible")
            reserved = counted + len(self.in_flight) + len(foreign)
            if (self.budget is not None and counted >= self.budget) or self.infeasible_left <= 0:
                return _END
            out_of_time = self.deadline is not None and time.time() >= self.deadline
            if out_of_time or (self.budget is not None and reserved >= self.budget):
                return _WAIT if foreign else _END
            proposal = searcher.ask(sync=False)
            if proposal is None:                        # the space is exhausted
                return _WAIT if foreign else _END
            self.in_flight.add(proposal[0])
            hooks.asked(proposal[0])
            return proposal

    def reuse_cached(self, number: int, config: dict, t_start: float) -> bool:
        """Records trial `number` from another job's measurement of `config` under this job's
        identity, if there is one; whether it did."""
        self.stage = f"trial {number}"
        key = self.tpl.config_key(config)
        cached = self.db(lambda: self.store.cached_trial(self.measure_key, key,
                                                         exclude_job=self.job_id),
                         f"looking up trial {number} in the measurement cache")
        if cached is None:
            return False
        self.record(dataclasses.replace(reused_record(cached, number, t_start, self.worker),
                                        origin=self.origin(number, config)))
        return True

    def finish_trial(self, number: int, config: dict, t_start: float, outcome: Outcome,
                     compiled: CompileResult | None) -> None:
        self.stage = f"trial {number}"
        rec = trial_record(self.tpl, self.arch, self.backend.name, self.sizes, number, config,
                           t_start, outcome, compiled, self.toolchain, self.worker)
        self.record(dataclasses.replace(rec, measure_key=self.measure_key,
                                        origin=self.origin(number, config)), outcome.busy_ms,
                    compiled)

    def record(self, rec: TrialRecord, busy_ms: float = 0.0,
               compiled: CompileResult | None = None) -> None:
        """Records a finished trial, tells the search, and keeps the run's counts and best."""
        number = rec.number
        s = self.summary
        if self.db(lambda: self.store.record_trial(self.job_id, rec), f"recording trial {number}"):
            s.counts[rec.status] = s.counts.get(rec.status, 0) + 1
            s.reused += rec.reused_from is not None
        self.untold[number] = rec.objective
        self.db(lambda: self.searcher.tell(number, rec.objective), f"telling trial {number}")
        self.untold.pop(number, None)
        self.in_flight.discard(number)
        self.hooks.told(number)
        s.busy_ms += busy_ms
        if compiled and not compiled.cached:
            s.compile_s += compiled.seconds
            s.compiled += 1
        if rec.objective is not None and (self.best is None
                                          or rec.objective < self.best.objective):
            self.best = rec
        s.best = self.best
        if self.on_trial:
            self.on_trial(rec, self.best)

    def abandon(self) -> None:
        """Leaves no trial of this run RUNNING in the study (best effort: the database may be
        what failed): a recorded one is told its result, any other is failed, so a resume
        proposes it again or not at all. A run that is the job's only party (hooks.sole)
        settles every RUNNING trial, including one opened the instant Ctrl-C came."""
        if self.searcher is None:
            return
        try:
            study = self.searcher.study
            open_ = set(self.in_flight)
            if self.hooks.sole:
                import optuna
                open_ |= {t.number for t in study.get_trials(
                    deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
            if not open_:
                return
            told = dict(self.untold)
            if open_ - set(told):
                told.update({t.number: t.objective for t in self.store.trials(self.job_id)
                             if t.number in open_})
            for number in open_ & set(told):
                self.searcher.tell(number, told[number])
            fail_trials(study, open_ - set(told))
        except Exception as e:  # noqa: BLE001 - a driver that reclaims will fail them later
            log.warning("job %s: could not settle open trials (%s)", self.job_id, e)
        self.in_flight.clear()


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


def _counts_line(counts: dict[str, int], reused: int = 0) -> str:
    line = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return line + (f"; {reused} reused from earlier jobs' measurements" if reused else "")
