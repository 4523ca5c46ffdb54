"""Trials per second of one replayed job (gemm_mma, H200 recording, PORTER_REPLAY_HOLD=1 so each
trial holds its worker for the recorded GPU time) with 1, 2 and 4 measuring workers.

Needs the local Redis (db 10 is used and flushed) and PostgreSQL (a scratch database is created
and dropped). Writes benchmarks/results/service_scaling.json.

    .venv/bin/python benchmarks/service_scaling.py [--trials 60] [--repeat 3]

Each worker count's row is the run with the median trials/s over --repeat rounds (all of them
are kept in trials_per_s_all); speedups are ratios of those medians.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORTER = str(ROOT / ".venv/bin/porter")
REPLAY = ROOT / "tests/data/replay/gemm_mma_h200.json.gz"
BROKER = "redis://127.0.0.1:6379/10"
ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


def one_run(n_workers: int, trials: int) -> dict:
    import psycopg
    import redis
    name = f"porter_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    redis.Redis.from_url(BROKER).flushdb()
    env = dict(os.environ, PORTER_DB_URL=f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}",
               PORTER_BROKER_URL=BROKER, PORTER_REPLAY_HOLD="1",
               PORTER_DRIVERS=str(n_workers), PORTER_CACHE_DIR="/tmp/porter-bench-cache",
               PORTER_REPLAY_DIR=str(REPLAY.parent))
    procs = [subprocess.Popen([PORTER, "worker", "--queues", "gpu.sm_90a"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
             for _ in range(n_workers)]
    try:
        time.sleep(6)   # workers up
        out = subprocess.run([PORTER, "submit", "gemm_mma", "--arch", "sm_90a", "--backend",
                              "replay", "--replay", str(REPLAY), "--sizes", "4096x4096x4096",
                              "--trials", str(trials)], env=env, capture_output=True,
                             text=True, check=True, cwd=ROOT)
        job = int(out.stdout.split()[-1])
        from porter.store.base import open_store
        store = open_store(env["PORTER_DB_URL"])
        t0 = time.time()
        while store.get_job(job).status not in ("done", "failed", "cancelled"):
            assert time.time() - t0 < 300, "job did not finish"
            time.sleep(0.2)
        ts = store.trials(job)
        counted = [t for t in ts if t.status != "infeasible"]
        span = max(t.finished_at for t in ts) - min(t.started_at for t in ts)
        held = sum(json.load(__import__("gzip").open(REPLAY, "rt"))["trials"][t.config_key]
                   .get("gpu_s", 0.0) for t in counted)
        store.close()
        return {"workers": n_workers, "trials": len(counted), "wall_s": round(span, 3),
                "trials_per_s": round(len(counted) / span, 3),
                "replayed_gpu_s": round(held, 3),
                "workers_seen": len({t.worker for t in ts}),
                "status": store.get_job(job).status}
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        with psycopg.connect(ADMIN, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds over the worker counts; the figures are per-count medians "
                         "(a 2-CPU host that also runs PostgreSQL and Redis is noisy)")
    args = ap.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    rounds = [[one_run(n, args.trials) for n in counts] for _ in range(max(1, args.repeat))]
    runs = []
    for i, n in enumerate(counts):
        rows = [r[i] for r in rounds]
        runs.append({**sorted(rows, key=lambda r: r["trials_per_s"])[len(rows) // 2],
                     "trials_per_s_all": [r["trials_per_s"] for r in rows]})
    base = runs[0]["trials_per_s"]
    for r in runs:
        r["speedup"] = round(r["trials_per_s"] / base, 2)
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                       "platform": platform.platform(), "python": platform.python_version()},
           "job": {"template": "gemm_mma", "arch": "sm_90a", "backend": "replay (hold)",
                   "recording": REPLAY.name, "sizes": "4096x4096x4096",
                   "trials": args.trials, "sampler": "auto"},
           "runs": runs}
    path = ROOT / "benchmarks/results/service_scaling.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
