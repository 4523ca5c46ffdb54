"""The GPU side of benchmarks/gemm_sweep.py: one porter job per shape (porter's Engine, the
auto sampler, warm-started from the nearest tuned shapes through porter.search.warm), stopped
early once the search has converged, then its fastest configurations re-timed interleaved with
cuBLAS (port_bench.side_by_side: cublasGemmEx and torch.matmul, an L2 flush before every
repeat)."""
from __future__ import annotations

import contextlib
import datetime
import math
import time
from pathlib import Path

from porter.build.check import static_check
from porter.build.compile import nvrtc_version
from porter.job.hooks import JobHooks, PoolCompiles
from porter.job.jobs import make_spec, template_record, template_snapshot
from porter.job.loop import Engine, finish_job
from porter.measure.backends.gpu import GpuBackend
from porter.search.vendor import vendor_seeds
from porter.search.warm import Tuned, seeds_for
from porter.spec.arch import get_arch
from porter.spec.template import find_template, load_template

TEMPLATE = "gemm_wgmma"
N_SEEDS = 16              # warm-start configurations per shape: the nearest tuned shapes'
N_VARY = 8                # best ones, then this many neighbours of the best along VARY
VARY = ("BN", "STREAMK", "TAILW", "BM", "CLUSTER", "SPLITK", "EPI", "STAGES")
N_WAVE = 4                # of those, this many tile shapes / splits / clusters of the best seed
WAVE_VARY = ("BM", "BN", "SPLITK", "CLUSTER")   # that fill the waves better ([launch] tile_cost)
FINALISTS = 2             # the search's fastest configurations re-timed side by side, then up
N_DISTINCT = 2            # to this many more of another structure (STRUCTURE) within NEAR of
NEAR = 0.03               # the fastest: at 15-60 us the search's figures are noisier than that
STRUCTURE = ("BM", "BN", "STAGES", "CONSUMERS", "PERSIST", "CLUSTER", "EPI", "SPLITK", "STREAMK",
             "TAILW", "SWAP", "PINGPONG")
COMPILE_WORKERS = 12      # one compile pool for the whole sweep, lent to every shape's job
AHEAD = 6                 # (a pool per job costs ~1 s of spawning); at most AHEAD in flight


class SharedPool(PoolCompiles):
    """The sweep's compile pool: lent to each job's engine (Engine's `compiles`), which leaves
    it open and with nothing of that job pending; it also compiles the warm seeds ahead."""

    def compile_all(self, tpl, configs, arch) -> None:
        for c in configs:
            self.submit(None, tpl, c, arch)
        while self.pending():
            self.finished()


@contextlib.contextmanager
def shared_compiles(workers: int = COMPILE_WORKERS, ahead: int = AHEAD):
    """One compile pool for a sweep's jobs (SweepPorter's `compiles`), shut down at the end."""
    pool = SharedPool(workers, ahead)
    try:
        yield pool
    finally:
        pool.close()


class Converged(JobHooks):
    """The embedded hooks, plus: stop once `min_trials` trials are in and the best objective
    has not improved by more than `tol` over the last `patience` of them. Trials in flight
    finish and are recorded (and counted)."""

    def __init__(self, min_trials: int, patience: int, tol: float = 0.005):
        self.min_trials, self.patience, self.tol = min_trials, patience, tol
        self.count = self.last_gain = 0
        self.best = math.inf
        self.stopped = False

    def on_trial(self, rec, best) -> None:
        if rec.status == "infeasible":
            return
        self.count += 1
        if rec.objective is not None and rec.objective < self.best * (1 - self.tol):
            self.last_gain = self.count
        if rec.objective is not None:
            self.best = min(self.best, rec.objective)

    def beat(self):
        signal = super().beat()
        if signal is None and self.count >= self.min_trials and \
                self.count - self.last_gain >= self.patience:
            self.stopped = True
            return "stop"
        return signal


def sweep_seeds(tpl, arch, shape, tuned: list[Tuned], vendor_kernels=()) -> list[dict]:
    """The warm start of one shape: N_SEEDS configurations (porter.search.warm.seeds_for with
    the sweep's policy), each feasible at that shape on `arch`; with `vendor_kernels` (the
    kernel names cuBLAS ran for this shape) the vendor's tile, stages and cluster on the best
    seed, and where it runs clusters the same tile without one (porter.search.vendor), come
    second and third, repaired, in place of the last seeds."""
    shape = tuple(shape)

    def feasible(cfg, size=None):
        return static_check(tpl, arch, cfg, [tuple(size or shape)]) is None

    def cost(cfg):
        return tpl.wave_cost(cfg, arch, shape)
    seeds = seeds_for(shape, tuned, tpl.params, feasible, N_SEEDS, vary=VARY, n_vary=N_VARY,
                      align=tpl.size_align, cost=cost, wave_vary=WAVE_VARY,
                      n_wave=N_WAVE, feasible_at=feasible)
    vs = vendor_seeds(vendor_kernels, seeds[0], tpl.params, feasible,
                      tpl.vendor.params if tpl.vendor else None) \
        if seeds and vendor_kernels else []
    have = {tpl.config_key(c) for c in seeds}
    vs = [v for v in vs if tpl.config_key(v) not in have]
    return [*seeds[:1], *vs, *seeds[1:]][:N_SEEDS]


def pick_finalists(measured, top: int = FINALISTS, distinct: int = N_DISTINCT,
                   near: float = NEAR) -> list:
    """The configurations to re-time side by side, from the measured trials fastest first: the
    `top` fastest, then up to `distinct` more, each the fastest of a structure (the STRUCTURE
    parameters; GROUP_M and RELEASE alone do not make one) not yet picked, within `near` of the
    fastest objective. Near-ties of another kind get the careful timing the search cannot give
    them (the search's 5-40 repeats of a 15-60 us kernel move by 1-3 % from run to run)."""
    def kind(t):
        return tuple(t.params.get(k) for k in STRUCTURE)
    picked = list(measured[:top])
    if not picked:
        return picked
    seen, limit = {kind(t) for t in picked}, measured[0].objective * (1 + near)
    for t in measured[top:]:
        if len(picked) >= top + distinct or t.objective > limit:
            break
        if kind(t) not in seen:
            seen.add(kind(t))
            picked.append(t)
    return picked


def size_text(shape) -> str:
    return "x".join(map(str, shape))


class SweepPorter:
    """Holds the two measuring processes (search: few repeats; re-time: interleaved with the
    baselines), the database and the template for a whole sweep."""

    def __init__(self, store, trials: int, min_trials: int, patience: int,
                 include_dir: str | None = None, backends=None,
                 compiles: SharedPool | None = None, vendor: dict | None = None):
        """compiles: the pool every shape's job compiles in (shared_compiles); None: each job
        makes its own of COMPILE_WORKERS processes. vendor: the kernel names cuBLAS ran, by
        shape (vendor_kernels), for the vendor's seed."""
        self.store, self.trials, self.compiles = store, trials, compiles
        self.vendor = vendor or {}
        self.min_trials, self.patience = min_trials, patience
        self.include_dir = include_dir
        self.tpl = template(include_dir)
        if backends is None:
            # search: 5-40 repeats of ~12 ms a trial (the finalists are re-timed carefully)
            backends = (GpuBackend(seed=1, min_repeats=5, max_repeats=40, target_ms=12.0),
                        GpuBackend(seed=123, min_repeats=10, target_ms=40.0))
        self.search_be, self.retime_be = backends
        self.retime_be.fresh_baseline = True
        self.device = self.search_be.device_info()
        self.search_be.sms = self.retime_be.sms = int(self.device.get("sms") or 0)
        self.arch = get_arch("sm_90a").with_sms(self.search_be.sms)
        self.src, self.space = template_record(self.tpl)
        self.snapshot = template_snapshot(self.tpl)

    def close(self):
        self.search_be.close()
        self.retime_be.close()

    def seeds(self, shape, tuned: list[Tuned]) -> list[dict]:
        return sweep_seeds(self.tpl, self.arch, shape, tuned, self.vendor.get(tuple(shape), ()))

    def precompile(self, configs: list[dict], pool: SharedPool) -> float:
        """Compiles configurations ahead in the sweep's pool (the compile cache serves every
        shape: M, N, K are kernel arguments); returns the wall seconds."""
        t0 = time.monotonic()
        uniq = {self.tpl.config_key(c): c for c in configs}
        pool.compile_all(self.tpl, list(uniq.values()), self.arch)
        return time.monotonic() - t0

    def port(self, shape, seeds: list[dict], min_trials: int | None = None) -> dict:
        """One job for one shape; the record's search half."""
        spec, _, _ = make_spec(TEMPLATE, "sm_90a", [size_text(shape)], self.trials)
        job = self.store.create_job(spec, self.tpl.name, self.tpl.source_hash, self.src,
                                    self.space, status="running", snapshot=self.snapshot)
        hooks = Converged(min_trials or self.min_trials, self.patience)
        t0 = time.monotonic()
        summary = Engine(self.store, self.tpl, self.arch, self.search_be,
                         workers=COMPILE_WORKERS, on_trial=hooks.on_trial, hooks=hooks,
                         compiles=self.compiles).run(job, spec, seeds)
        seconds = time.monotonic() - t0
        if hooks.stopped:
            finish_job(self.store, job, "done", f"converged: no gain over {hooks.patience} "
                       f"trials after {hooks.count}")
        trials = self.store.trials(job)
        counts: dict[str, int] = {}
        for t in trials:
            counts[t.status] = counts.get(t.status, 0) + 1
        measured = sorted((t for t in trials if t.objective is not None),
                          key=lambda t: t.objective)
        warm_keys = {self.tpl.config_key(s) for s in seeds}
        best_warm = min((t.objective for t in measured if t.config_key in warm_keys),
                        default=None)
        return {"job": job, "trials": sum(n for s, n in counts.items() if s != "infeasible"),
                "seconds": round(seconds, 2), "counts": counts,
                "stopped": "converged" if hooks.stopped else summary.status,
                "compiled_here": summary.compiled, "warm_seeds": len(seeds),
                "search_ratio": 1 / measured[0].objective if measured else None,
                "best_warm_seed_ratio": 1 / best_warm if best_warm else None,
                "min_trials": hooks.min_trials,
                # every trial in order: configuration key, status, ratio in the search
                "tried": [[t.config_key, t.status, round(1 / t.objective, 4)
                           if t.objective else None] for t in trials],
                "measured": measured}

    def retime(self, shape, measured) -> dict | None:
        """The finalists (`pick_finalists`) timed interleaved with the baselines (2 rounds
        each); the best of them timed once more (4 rounds): that is the figure."""
        from port_bench import side_by_side
        fin = []
        for t in pick_finalists(measured):
            r, _ = side_by_side(self.retime_be, self.tpl, self.arch, t.params, tuple(shape),
                                repeats=2)
            if r is not None:
                fin.append((r, t))
        if not fin:
            return None
        sel, best = max(fin, key=lambda f: f[0]["ratio"])
        t0 = time.monotonic()
        res, _ = side_by_side(self.retime_be, self.tpl, self.arch, best.params, tuple(shape),
                              repeats=4)
        res = res or sel
        return {**res, "params": best.params, "selection_ratio": sel["ratio"],
                "confirm_seconds": round(time.monotonic() - t0, 2),
                "finalists": [{"params": t.params, "ratio": r["ratio"], "ours_ms": r["ours_ms"],
                               "search_ratio": 1 / t.objective} for r, t in fin]}

    def record(self, shape, category, seeds, min_trials: int | None = None) -> dict:
        found = self.port(shape, seeds, min_trials)
        t0 = time.monotonic()
        res = self.retime(shape, found.pop("measured"))
        rec = {"template": TEMPLATE, "arch": self.arch.name, "gpu": self.device.get("gpu", ""),
               "driver": self.device.get("driver", ""), "nvrtc": nvrtc_version(),
               "date": datetime.date.today().isoformat(), "shape": list(shape),
               "category": category, "seed_policy": f"{N_SEEDS - N_VARY - N_WAVE} nearest (align "
               f"{self.tpl.size_align}) + {N_WAVE} wave fits along "
               f"{','.join(WAVE_VARY)} + {N_VARY} neighbours along {','.join(VARY)}",
               "finalist_policy": f"{FINALISTS} fastest + up to {N_DISTINCT} of another "
               f"structure within {NEAR:.0%}",
               "vendor_kernels": list(self.vendor.get(tuple(shape), ())), **found,
               "retime_seconds": round(time.monotonic() - t0, 2)}
        if res is None:
            rec.update(params=None, ratio=None, note="no configuration measured")
        else:
            rec.update(res)
        return rec


def template(include_dir: str | None = None):
    """gemm_wgmma, compiled against `include_dir` (a copy of porter/include taken from a
    commit, so headers being edited beside the sweep cannot change its kernels) or porter's."""
    if include_dir is None:
        return find_template(TEMPLATE)
    from porter.spec.snapshot import bundle
    folder, inc = find_template(TEMPLATE).folder, Path(include_dir)
    return load_template(folder, include_dir=inc, source_hash=bundle(folder, inc).hash)
