"""benchmarks/service_scaling.py's overhead phase: one service driver runs a replayed job in this
process (porter's job loop with the service's hooks, real Redis and the given database, the
replay backend without its hold, so the kernel costs nothing) and every call the loop makes into
porter's store, the search and Optuna, the lock and Redis is timed by what it is.

overhead_ms_per_trial is the loop's wall time from its first proposal to its end over the trials
it recorded: what a trial costs beyond the kernel (porter + Optuna + database). The driver's
start (opening the study, enumerating the feasible set) is reported apart, as start_s."""
from __future__ import annotations

import collections
import functools
import os
import threading
import time
from contextlib import contextmanager


class Timer:
    def __init__(self):
        self.s: dict[str, float] = collections.defaultdict(float)
        self.n: dict[str, int] = collections.defaultdict(int)
        self.local = threading.local()   # nesting depth, per thread
        self.wrapped: list[tuple] = []

    def restore(self) -> None:
        for owner, name, fn in reversed(self.wrapped):
            if fn is None:          # inherited: drop the wrapper, the base's shows again
                delattr(owner, name)
            else:
                setattr(owner, name, fn)
        self.wrapped.clear()

    def wrap(self, owner, name: str, label: str):
        """Times owner.name (a class or an instance attribute) under label; nested timed calls
        are counted once, by the outermost."""
        fn = getattr(owner, name)
        self.wrapped.append((owner, name, vars(owner).get(name)))
        timer = self

        @functools.wraps(fn)
        def timed(*a, **k):
            if getattr(timer.local, "depth", 0):
                return fn(*a, **k)
            timer.local.depth = 1
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timer.s[label] += time.perf_counter() - t
                timer.n[label] += 1
                timer.local.depth = 0
        setattr(owner, name, timed)

    def wrap_cm(self, owner, name: str, label: str):
        """Times the entry of a context manager (owner.name()) under label."""
        fn = getattr(owner, name)
        self.wrapped.append((owner, name, vars(owner).get(name)))
        timer = self

        @functools.wraps(fn)
        @contextmanager
        def timed(*a, **k):
            cm = fn(*a, **k)
            t = time.perf_counter()
            cm.__enter__()
            timer.s[label] += time.perf_counter() - t
            timer.n[label] += 1
            t2 = time.perf_counter()
            try:
                yield
            except BaseException as e:
                timer.s[label + " (held)"] += time.perf_counter() - t2
                if not cm.__exit__(type(e), e, e.__traceback__):
                    raise
            else:
                timer.s[label + " (held)"] += time.perf_counter() - t2
                cm.__exit__(None, None, None)
        setattr(owner, name, timed)


def measure_overhead(db_url: str, broker: str, replay: str, trials: int) -> dict:
    """Runs one driver over a fresh replayed job of `trials` trials on db_url; returns the
    per-trial overhead and its parts (ms a trial)."""
    os.environ["PORTER_BROKER_URL"] = broker
    os.environ.pop("PORTER_REPLAY_HOLD", None)
    from porter.job import loop
    from porter.job.jobs import make_spec, template_record, template_snapshot
    from porter.measure.backends.replay import ReplayBackend
    from porter.search import searcher
    from porter.store.base import open_store
    from workers import driver, tasks

    spec, tpl, _ = make_spec("gemm_mma", "sm_90a", ["4096x4096x4096"], trials,
                             backend="replay", replay=replay, service=True,
                             fresh=True)   # each round measures (no reuse of the last round)
    store = open_store(db_url)
    src, space = template_record(tpl)
    store.optuna_storage()
    job_id = store.create_job(spec, tpl.name, tpl.source_hash, src, space, status="queued",
                              snapshot=template_snapshot(tpl))
    info, tpl, arch, backend = tasks.job_parts(store, store.get_job(job_id))
    tm = Timer()
    S = type(store)
    for name, label in (("record_trial", "porter: record trial"),
                        ("trial_statuses", "porter: read statuses"),
                        ("get_job", "porter: read job"), ("trials", "porter: read trials"),
                        ("beat", "porter: heartbeat (thread)"),
                        ("start_run", "porter: start run")):
        tm.wrap(S, name, label)
    tm.wrap(searcher.Searcher, "sync", "optuna: read study")
    tm.wrap(searcher.Searcher, "ask", "search + optuna: ask")
    tm.wrap(searcher.Searcher, "tell", "search + optuna: tell")
    tm.wrap(ReplayBackend, "measure", "kernel (replay, no hold)")
    tm.wrap(driver.ServiceHooks, "asked", "redis: trial alive")
    tm.wrap_cm(driver.ServiceHooks, "lock", "lock: wait")
    first: list[float] = []
    orig_next = loop._Run.next_proposal

    def next_proposal(self):
        if not first:
            first.append(time.perf_counter())
        return orig_next(self)
    loop._Run.next_proposal = next_proposal
    t0 = time.perf_counter()
    try:
        summary = loop.run_job(store, job_id, spec, tpl, arch, backend,
                               hooks=driver.ServiceHooks("bench", tasks.redis_try),
                               worker="service:bench")
    finally:
        loop._Run.next_proposal = orig_next
        tm.restore()
        backend.close()
    t1 = time.perf_counter()
    n = sum(1 for t in store.trials(job_id))
    if summary.status != "done" or not n:
        raise RuntimeError(f"the overhead job ended {summary.status} after {n} trials: "
                           f"{summary.message}")
    start = first[0] - t0 if first else 0.0
    kernel = tm.s.get("kernel (replay, no hold)", 0.0)
    loop_s = t1 - (first[0] if first else t0) - kernel
    parts = {k: round(v / n * 1e3, 2) for k, v in sorted(tm.s.items(), key=lambda kv: -kv[1])
             if not k.startswith("kernel") and k != "porter: start run"}
    in_loop = sum(v for k, v in tm.s.items()
                  if not k.startswith("kernel") and "(thread)" not in k and "(held)" not in k
                  and k != "porter: start run")
    parts["other (porter's own Python)"] = round((loop_s - in_loop + tm.s.get(
        "porter: start run", 0)) / n * 1e3, 2) if n else None
    store.close()
    return {"trials": n, "status": summary.status,
            "overhead_ms_per_trial": round(loop_s / n * 1e3, 2) if n else None,
            "start_s": round(start, 3),
            "ms_per_trial": parts,
            "calls": dict(tm.n)}
