"""Search quality on brute-forced Kernel Tuner caches: porter's samplers against Kernel Tuner's
strategies, scored with the methodology of Willemsen et al. ("A methodology for comparing
optimization algorithms for auto-tuning", FGCS 2024; the FAIR auto-tuning benchmark hub), in
its function-evaluation form, and auto's constants chosen by leave-one-space-out.

Exact definitions used here, per space (one cache file):

- Countable configurations: every cached configuration except InvalidConfig (none of the shared
  caches has any: they hold exactly the configurations that satisfy the T1 conditions). A
  compilation or runtime failure costs an evaluation like a timed one; for scoring its value is
  the worst valid time of the space (it never improves the best found).
- Evaluation: a distinct countable configuration, counted in the order a strategy first
  evaluates it. Repeats and statically infeasible proposals cost nothing (porter's Searcher
  never hands them out for "auto"; an Optuna sampler's are answered inside the Searcher; Kernel
  Tuner's repeats are cache hits and are dropped from its result list here).
- Random-search baseline: E_k, the expected best value of k draws without replacement from the
  N countable values, computed exactly (no sampling).
- Budget B: the methodology's cutoff point. With median m and optimum o of the values, the
  target is o + (1 - 0.95) * (m - o); with g configurations at or below the target, B is the
  expected number of draws random search without replacement needs to hit one,
  ceil((N + 1) / (g + 1)). Not capped by default (--cap N caps it, for quick runs).
- Score of one run: mean over k = 1..B of (E_k - best_k) / (E_k - o), where best_k is the best
  value among the run's first k evaluations (a run that stops early keeps its last best): 0 is
  random search without replacement, 1 is the optimum from the first evaluation. Per space:
  mean, standard deviation, median and 10th percentile over seeds 0..S-1 (the same seeds for
  every strategy).
- Evaluations to within 5%: the first evaluation whose value is at most 1.05 x the optimum,
  within the budget B; per space the median over seeds (null when half the seeds or more do not
  get there within B) and the share of seeds that do.

Kernel Tuner's strategies run through kernel_tuner.tune_kernel in simulation mode on the cache
(a dummy kernel string; tune_params from the cache; restrictions from the kernel's T1
Conditions), numpy/random seeded with the seed: with default options (max_fevals = B only);
with options scaled to spend the whole budget (benchmarks/_search_runs.py FULL: generations or
iterations for 2 B evaluations, and fresh-seeded restarts while budget is left); and, for the
strategies in MIDDLE, full-budget again from the middle of the space (x0 = auto's first
proposal). Each strategy is compared by the best of its option sets. Their runs are kept in a
file (--kt-runs) and only missing ones are run; --report-only reports what the files hold.

auto's constants: each variant of benchmarks/_search_variants.py runs on every space; for each
space the variant with the best mean score over the other nine is scored on it (`loo`), and the
variant best over all ten is what porter.search.auto.Auto's defaults are (in-sample `auto`).

    python benchmarks/search_quality.py [--seeds 20] [--jobs 2] [--ours auto,random]
                                        [--kt genetic_algorithm,...] [--spaces A100,...]
                                        [--variants all|none|name,...] [--report-only]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")   # one core per worker on a shared machine
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import _search_runs as R                      # noqa: E402
import _search_report as report               # noqa: E402
import _search_variants as V                  # noqa: E402

REPLAY = ROOT.parent / "shared" / "replay"
OUT = ROOT / "benchmarks" / "results" / "search_quality.json"
KT_RUNS = ROOT / "benchmarks" / "results" / "search_quality_kt_runs.jsonl.gz"
OURS_RUNS = Path(tempfile.gettempdir()) / "porter-search-quality" / "ours_runs.jsonl.gz"
OURS = ("auto",)
OURS_SLOW = {"tpe": "about 10 ms per Optuna trial (and 3-4 trials per evaluation on these "
                    "spaces): ~40 min for 20 seeds on five spaces on one core; not run here",
             "gp": "needs PyTorch, not installed", "cmaes": "as slow as tpe"}

Space, evaluations = R.Space, R.evaluations    # what benchmarks/transfer.py imports from here
_SPACES: dict[str, R.Space] = {}


def _space(path: str, cap: int) -> R.Space:
    if path not in _SPACES:
        _SPACES[path] = R.Space(Path(path), cap)
    return _SPACES[path]


def _task(args):
    """One run: (path, cap, strategy, options, seed) -> its trajectory, evaluations, seconds."""
    path, cap, name, options, seed = args
    sp = _space(path, cap)
    t0 = time.time()
    restarts = 0
    try:
        if name.startswith("kt:"):
            vals, restarts = R.run_kt(sp, name[3:], seed, full=options in ("full", "mid"),
                                      middle=options == "mid")
        elif "@" in name:       # auto@N: to N evaluations, for the evaluations to within 5%
            vals = R.run_porter(sp, name.split("@")[0], seed, budget=int(name.split("@")[1]))
        else:
            vals = R.run_porter(sp, name, seed)
    except Exception as e:  # a strategy that cannot run here is reported, not fatal
        return args, None, f"{type(e).__name__}: {e}"[:300], 0, time.time() - t0
    return args, R.trajectory(vals), len(vals), restarts, time.time() - t0


def _run_all(tasks: list, jobs: int, sink) -> None:
    if not tasks:
        return
    ctx = mp.get_context("fork")
    done, t0 = 0, time.time()
    with ctx.Pool(jobs) as pool:
        for out in pool.imap_unordered(_task, tasks, chunksize=1):
            sink(*out)
            done += 1
            if done % 50 == 0 or done == len(tasks):
                print(f"  {done}/{len(tasks)} runs, {time.time() - t0:.0f} s", flush=True)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--ours", default=",".join(OURS))
    ap.add_argument("--kt", default=",".join(R.KT_STRATEGIES))
    ap.add_argument("--spaces", default="", help="substrings of cache names to keep")
    ap.add_argument("--cap", type=int, default=0)
    ap.add_argument("--variants", default="all", help="auto variants for leave-one-space-out "
                    "('all', 'none' or names from benchmarks/_search_variants.py)")
    ap.add_argument("--long", type=int, default=1000, help="auto also runs to this many "
                    "evaluations (or the whole space), for evaluations to within 5%% beyond B")
    ap.add_argument("--kt-runs", default=str(KT_RUNS))
    ap.add_argument("--kt-options", default="default,full,mid", help="option sets to run: "
                    "default, full (budget-scaled), mid (full, from the middle)")
    ap.add_argument("--ours-runs", default=str(OURS_RUNS), help="porter's runs, kept by the "
                    "hash of porter/search/*.py (so re-running after a change starts afresh)")
    ap.add_argument("--runs-only", action="store_true", help="only fill the files of runs")
    ap.add_argument("--report-only", action="store_true", help="run nothing: report the runs "
                    "the files hold (cells with fewer seeds say so in their n)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    t0 = time.time()
    paths = sorted(REPLAY.glob("*.json.gz"))
    if args.spaces:
        paths = [p for p in paths if any(s in p.name for s in args.spaces.split(","))]
    spaces = {str(p): _space(str(p), args.cap) for p in paths}
    seeds = range(args.seeds)

    # Kernel Tuner: run what the file does not have yet, in the order the seeds go
    kt_names = [s for s in args.kt.split(",") if s]
    kt_file = Path(args.kt_runs)
    kept = R.read_runs(kt_file)
    kt_tasks = [(p, args.cap, f"kt:{s}", opt, seed) for seed in seeds for p in spaces
                for s in kt_names for opt in (("default", "full") if s in R.FULL else
                                              ("default",)) + (("mid",) if s in R.MIDDLE else ())
                if opt in args.kt_options.split(",") and
                R.run_key(spaces[p].name, s, opt, seed, spaces[p].budget) not in kept]
    # bayes_opt's cost grows faster than linearly with B (~220 s a run at B = 2783): last
    kt_tasks.sort(key=lambda t: t[2] == "kt:bayes_opt" and spaces[t[0]].budget > 1500)
    failed: dict[str, str] = {}

    def keep_kt(task, traj, n, restarts, secs):
        path, _, name, opt, seed = task
        sp = spaces[path]
        if traj is None:
            failed.setdefault(name, n)
            return
        run = {"space": sp.name, "strategy": name[3:], "options": opt, "seed": seed,
               "budget": sp.budget, "n": n, "restarts": restarts, "traj": traj,
               "seconds": round(secs, 2)}
        R.append_run(kt_file, run)
        kept[R.run_key(sp.name, name[3:], opt, seed, sp.budget)] = run

    print(f"Kernel Tuner: {len(kt_tasks)} runs to do, {len(kept)} kept in {kt_file}", flush=True)
    if not args.report_only:
        _run_all(kt_tasks, args.jobs, keep_kt)

    # porter: the samplers asked for, and auto's variants (auto itself is the variant its
    # defaults are, when the grid has it: the same runs)
    variants = V.select(args.variants)
    V.register(variants)
    same = V.defaults_variant(variants)
    ours = [s for s in args.ours.split(",") if s and not (s == "auto" and same)] + \
        [V.sampler_name(v) for v in variants] + ([f"auto@{args.long}"] if args.long else [])
    code = V.code_hash()
    ours_file = Path(args.ours_runs)
    ours_kept = R.read_runs(ours_file)
    runs: dict[tuple, dict] = {}

    def keep_ours(task, traj, n, restarts, secs):
        path, _, name, _, seed = task
        sp = spaces[path]
        if traj is None:
            failed.setdefault(name, n)
            return
        run = {"space": sp.name, "strategy": name, "options": code, "seed": seed,
               "budget": sp.budget, "n": n, "traj": traj, "seconds": round(secs, 2)}
        R.append_run(ours_file, run)
        ours_kept[R.run_key(sp.name, name, code, seed, sp.budget)] = run
    our_tasks = [(p, args.cap, name, "default", seed) for seed in seeds for p in spaces
                 for name in ours
                 if R.run_key(spaces[p].name, name, code, seed, spaces[p].budget)
                 not in ours_kept]
    print(f"porter: {len(our_tasks)} runs to do (code {code})", flush=True)
    if not args.report_only:
        _run_all(our_tasks, args.jobs, keep_ours)
    if args.runs_only:
        R.cleanup()
        return {}
    for p, sp in spaces.items():
        for name in ours:
            for seed in seeds:
                r = ours_kept.get(R.run_key(sp.name, name, code, seed, sp.budget))
                if r is not None:
                    runs[(sp.name, name, "default", seed)] = r
    if same:
        check = R.trajectory(R.run_porter(next(iter(spaces.values())), "auto", 0))
        first = next(iter(spaces.values())).name
        kept_traj = runs.get((first, V.sampler_name(same), "default", 0), {}).get("traj", [])
        if [list(x) for x in kept_traj] != [list(x) for x in check]:
            raise SystemExit(f"auto does not reproduce variant {same}: defaults changed?")
        for (sname, name, opt, seed), r in list(runs.items()):
            if name == V.sampler_name(same):
                runs[(sname, "auto", opt, seed)] = r
    for r in kept.values():
        if r["seed"] < args.seeds and r["strategy"] in kt_names and \
                any(sp.name == r["space"] and sp.budget == r["budget"]
                    for sp in spaces.values()):
            runs[(r["space"], "kt:" + r["strategy"], r["options"], r["seed"])] = r

    result = report.build(list(spaces.values()), runs, args, variants, failed,
                          __doc__.split("    python")[0].strip())
    result["skipped"] = {k: v for k, v in OURS_SLOW.items() if k not in ours}
    result["seconds"] = round(time.time() - t0, 1)
    R.cleanup()
    print(report.table(result))
    print(f"goal: {json.dumps(result['goal'], indent=1)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['seconds']} s")
    return result


if __name__ == "__main__":
    main()
