"""Trials per second of one replayed job with 1, 2 and 4 measuring workers (service mode).

Each replayed measurement sleeps its recorded GPU time (PORTER_REPLAY_HOLD=1), so a worker is as
busy as the H200 was; scaling then measures the service's coordination overhead (claims, shared
study, budget ranks, recording). Needs the local Redis and PostgreSQL.
Writes benchmarks/results/service_scaling.json.

    python benchmarks/service_scaling.py [--trials 96] [--workers 1 2 4]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "tests" / "data" / "replay" / "gemm_mma_h200.json.gz"
PORTER = [sys.executable, "-m", "porter.cli"]


def run(n_workers: int, trials: int, redis_db: int, log_dir: Path) -> dict:
    import psycopg
    import redis
    from porter.store import open_store
    dbname = f"porter_bench_{uuid.uuid4().hex[:8]}"
    admin = "host=127.0.0.1 user=postgres dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {dbname}")
    redis.Redis(db=redis_db).flushdb()
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{dbname}"
    env = dict(os.environ, PORTER_DB_URL=url, PORTER_BROKER_URL=f"redis://127.0.0.1:6379/{redis_db}",
               PORTER_REPLAY_HOLD="1", PORTER_JOB_SLOTS=str(max(4, n_workers)),
               PORTER_LOG_LEVEL="INFO", PYTHONPATH=str(ROOT))
    procs = []
    try:
        for i in range(n_workers):
            log = open(log_dir / f"w{n_workers}_{i}.log", "wb")
            procs.append(subprocess.Popen([*PORTER, "worker", "--queues", "gpu.sm_90a"],
                                          env=dict(env, PORTER_WORKER_NAME=f"bench{i}"),
                                          stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.time() + 120     # every worker connected and idle
        while time.time() < deadline and not all(
                b"ready." in (log_dir / f"w{n_workers}_{i}.log").read_bytes()
                for i in range(n_workers)):
            time.sleep(0.5)
        store = open_store(url)
        r = subprocess.run([*PORTER, "submit", "gemm_mma", "--arch", "sm_90a", "--backend",
                            "replay", "--replay", str(RECORDING), "--trials", str(trials),
                            "--sizes", "4096x4096x4096", "--sizes", "8192x8192x8192"],
                           env=env, capture_output=True, text=True, check=True)
        job = int(r.stdout.split()[-1])
        while store.get_job(job).status not in ("done", "failed", "cancelled"):
            time.sleep(0.1)
        info = store.get_job(job)
        rows = store.trials(job)
        wall = max(t.finished_at for t in rows) - min(t.started_at for t in rows)
        held = sum(t.measurements and 0.05 * sum(m.ours_ms for m in t.measurements) or 0
                   for t in rows)
        return {"workers": n_workers, "status": info.status, "trials": len(rows),
                "distinct_configs": len({t.config_key for t in rows}),
                "wall_s": round(wall, 3), "trials_per_s": round(len(rows) / wall, 3),
                "replayed_gpu_s": round(held, 3),
                "per_worker": {w: sum(t.worker == w for t in rows)
                               for w in sorted({t.worker for t in rows})}}
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=96)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--redis-db", type=int, default=12)
    ap.add_argument("-o", "--out", type=Path,
                    default=ROOT / "benchmarks" / "results" / "service_scaling.json")
    args = ap.parse_args()
    log_dir = Path("/tmp") / "porter_service_scaling"
    log_dir.mkdir(exist_ok=True)
    runs = []
    for n in args.workers:
        res = run(n, args.trials, args.redis_db, log_dir)
        print(json.dumps(res))
        runs.append(res)
    base = runs[0]["trials_per_s"] / runs[0]["workers"]
    for r in runs:
        r["speedup"] = round(r["trials_per_s"] / base, 3)
    out = {"benchmark": "service_scaling", "template": "gemm_mma", "arch": "sm_90a",
           "backend": "replay (hold: each measurement sleeps its recorded H200 GPU time)",
           "recording": RECORDING.name, "date": dt.datetime.now().isoformat(timespec="seconds"),
           "host": platform.node(), "cpus": os.cpu_count(), "trials": args.trials,
           "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{args.out}: " + ", ".join(f"{r['workers']} workers {r['trials_per_s']}/s "
                                      f"(x{r['speedup']})" for r in runs))


if __name__ == "__main__":
    main()
