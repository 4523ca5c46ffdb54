"""Service throughput: what a trial costs a driver beyond the kernel, and trials/s of one job as
measuring workers join (issue 20). One command, on a bare machine too:

1. a throwaway PostgreSQL and Redis of its own (benchmarks/_service_pg.py: the archive that
   scripts/carry_postgres.sh packs, else this machine's binaries; Redis from that archive, else
   .redis from scripts/carry_redis.sh, else this machine's redis-server);
2. overhead: one driver in this process runs a replayed job (gemm_mma, H200 recording, no hold)
   with every call timed by what it is (benchmarks/_service_overhead.py), --overhead-rounds
   times; `overhead_ms_per_trial` is the median: porter + Optuna + PostgreSQL time a trial;
3. scaling: max(--workers) `porter worker --queues gpu.sm_90a` processes with
   PORTER_REPLAY_HOLD=1 (a trial holds its worker for its recorded GPU time, 0.17 s on average),
   then for each round and each N in --workers a job of --trials trials submitted with N
   drivers (PORTER_DRIVERS=N; the other workers stay idle). trials/s is the job's counted trials
   over the span from its first trial's start to its last one's end; each N's row is its median
   round, `speedup` the ratio of medians to N = 1. Each run is checked: every trial recorded
   once, no configuration twice, nothing left RUNNING in the study.

Writes --out (default: $OUT/service_scaling.json where OUT is set, else
benchmarks/results/service_scaling.json), rewritten after every step.

    .venv/bin/python benchmarks/service_scaling.py --out /tmp/scaling.json      # here

On the lent H200 (carry [".whl", ".pgsql"]; see docs/SERVICE.md for the whole command):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/service_scaling.py
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _service_pg import PgServer, redis_from, unpack, use_zoneinfo  # noqa: E402
from _service_procs import REPLAY, ROOT, Procs, free_port, redis_command, wait_for  # noqa: E402

ARCH = "sm_90a"


class Bench:
    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.work = Path(tempfile.mkdtemp(prefix="porter-scaling-"))
        os.chmod(self.work, 0o755)
        (self.work / "logs").mkdir()
        self.procs = Procs(self.work / "logs")
        self.out = Path(args.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.res = {
            "what": "service throughput: per-trial overhead of a driver and trials/s of one job "
                    "with 1..N measuring workers (replay, simulated GPU time)",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cores": os.cpu_count(),
            "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                        "platform": platform.platform(), "python": platform.python_version()},
            "job": {"template": "gemm_mma", "arch": ARCH, "backend": "replay (hold)",
                    "recording": REPLAY.name, "sizes": "4096x4096x4096",
                    "trials": args.trials, "sampler": "auto"},
            "status": "running", "notes": list(args.note)}

    def say(self, msg: str) -> None:
        print(f"[{time.time() - self.t0:6.1f}s] {msg}", flush=True)

    def save(self) -> None:
        self.res["elapsed_s"] = round(time.time() - self.t0, 1)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.res, indent=2, default=str) + "\n")
        os.replace(tmp, self.out)

    # ---- services
    def start_services(self) -> None:
        carried = Path(self.args.pg_dir).resolve()
        root = unpack(carried, self.work)
        use_zoneinfo(root)
        self.pg = PgServer(root, self.work, self.work / "logs/postgres.log",
                           dict(kv.split("=", 1) for kv in self.args.pg_set))
        admin = self.pg.start()
        self.res["postgres"] = self.pg.info
        self.say(f"postgres: {self.pg.info['version']} on port {self.pg.info['port']} "
                 f"({self.pg.info['how']}, as {self.pg.info['user']})")
        self.admin = admin
        packed = redis_from(root)
        if packed:
            argv, env = packed
            how = "packed with PostgreSQL (scripts/carry_postgres.sh)"
        elif (Path(self.args.redis_dir) / "redis-server").is_file():
            argv, env, how = redis_command(Path(self.args.redis_dir).resolve())
        elif shutil.which("redis-server"):
            argv, env, how = [shutil.which("redis-server")], dict(os.environ), "this machine's"
        else:
            raise SystemExit("error: no redis-server: carry .pgsql (scripts/carry_postgres.sh) "
                             "or .redis (scripts/carry_redis.sh)")
        port = free_port()
        rp = self.procs.start("redis", argv + [
            "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--dir", str(self.work)], env)
        self.broker = f"redis://127.0.0.1:{port}/0"
        import redis
        client = redis.Redis.from_url(self.broker, socket_connect_timeout=1)

        def ping():
            try:
                return client.ping()
            except redis.RedisError:
                return False
        wait_for("redis", ping, time.time() + 30, [rp])
        self.res["redis"] = {"how": how, "version": client.info("server")["redis_version"]}
        self.say(f"redis {self.res['redis']['version']} on port {port} ({how})")
        os.environ.update(PORTER_BROKER_URL=self.broker,
                          PORTER_REPLAY_DIR=str(REPLAY.parent),
                          PORTER_CACHE_DIR=str(self.work / "cache"))
        self.save()

    def database(self, name: str) -> str:
        import psycopg
        with psycopg.connect(host="127.0.0.1", port=self.pg.info["port"], user="postgres",
                             dbname="postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.pg.info['port']}/{name}"

    # ---- 2: overhead
    def overhead(self) -> None:
        from _service_overhead import measure_overhead
        rounds = []
        for i in range(self.args.overhead_rounds):
            url = self.database(f"porter_overhead_{i}")
            r = measure_overhead(url, self.broker, str(REPLAY), self.args.trials)
            rounds.append(r)
            self.say(f"overhead round {i + 1}: {r['overhead_ms_per_trial']} ms a trial "
                     f"({r['trials']} trials, {r['status']})")
        mid = sorted(rounds, key=lambda r: r["overhead_ms_per_trial"])[len(rounds) // 2]
        self.res["overhead_ms_per_trial"] = mid["overhead_ms_per_trial"]
        self.res["overhead"] = {
            "what": "one driver, replay without hold: wall time from its first ask to its end "
                    "over its trials (porter + Optuna + PostgreSQL + Redis), median round",
            "database": "postgresql", "all_rounds_ms": [r["overhead_ms_per_trial"]
                                                        for r in rounds], **mid}
        self.save()

    # ---- 3: scaling
    def start_workers(self, n: int) -> None:
        env = dict(os.environ, PORTER_DB_URL=self.db_url, PORTER_REPLAY_HOLD="1",
                   PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        names = []
        for i in range(n):
            name = f"gpu{i}"
            env_i = dict(env, PORTER_WORKER_NAME=f"{name}@%h")
            self.procs.start(name, [sys.executable, "-m", "porter.cli", "worker", "--queues",
                                    f"gpu.{ARCH}"], env_i)
            names.append(name)

        def ready():
            return all(" ready." in (self.work / "logs" / f"{m}.log").read_text(errors="replace")
                       for m in names)
        t = time.time()
        wait_for("workers", ready, t + 120, [p for _, p in self.procs.running])
        self.say(f"{n} workers ready in {time.time() - t:.1f} s")

    def one_run(self, n: int) -> dict:
        from porter.job.jobs import make_spec
        from workers.service import Service
        spec, _, _ = make_spec("gemm_mma", ARCH, ["4096x4096x4096"], self.args.trials,
                               backend="replay", replay=str(REPLAY), service=True,
                               fresh=True)   # every run measures: no reuse of the last run
        os.environ["PORTER_DRIVERS"] = str(n)
        job = Service().submit(spec, self.db_url)
        t = time.time()
        while self.store.get_job(job).status not in ("done", "failed", "cancelled"):
            if time.time() - t > self.args.job_timeout:
                self.store.request_cancel(job)
                raise RuntimeError(f"job {job} with {n} drivers did not end within "
                                   f"{self.args.job_timeout} s")
            time.sleep(0.1)
        return self.check(job, n)

    def check(self, job: int, n: int) -> dict:
        import optuna
        info = self.store.get_job(job)
        ts = self.store.trials(job)
        counted = [t for t in ts if t.status != "infeasible"]
        span = max(t.finished_at for t in ts) - min(t.started_at for t in ts)
        study = optuna.load_study(study_name=info.study_name, storage=self.store.optuna_storage())
        states = collections.Counter(t.state.name for t in study.get_trials(deepcopy=False))
        configs = collections.Counter(t.config_key for t in ts)
        gpu = json.load(__import__("gzip").open(REPLAY, "rt"))["trials"]
        return {"workers": n, "job": job, "status": info.status, "trials": len(counted),
                "wall_s": round(span, 3), "trials_per_s": round(len(counted) / span, 3),
                "replayed_gpu_s": round(sum(gpu[t.config_key].get("gpu_s", 0.0)
                                            for t in counted), 3),
                "workers_seen": len({t.worker for t in ts}),
                "recorded_once": len({t.number for t in ts}) == len(ts)
                and states.get("RUNNING", 0) == 0
                and sum(states[s] for s in ("COMPLETE", "FAIL")) == len(ts),
                "duplicate_configs": sum(1 for c in configs.values() if c > 1)}

    def scaling(self) -> None:
        from porter.store.base import open_store
        counts = [int(x) for x in self.args.workers.split(",")]
        self.db_url = self.database("porter_scaling")
        self.store = open_store(self.db_url)
        self.start_workers(max(counts))
        rounds: dict[int, list[dict]] = {n: [] for n in counts}
        for r in range(self.args.repeat):
            for n in counts:
                row = self.one_run(n)
                rounds[n].append(row)
                self.say(f"round {r + 1}, {n} worker(s): {row['trials_per_s']} trials/s "
                         f"({row['trials']} trials in {row['wall_s']} s, {row['status']}, "
                         f"recorded once {row['recorded_once']}, "
                         f"{row['duplicate_configs']} configurations twice)")
                self.res["runs"] = self.summary(counts, rounds)
                self.save()

    @staticmethod
    def summary(counts, rounds) -> list[dict]:
        runs = []
        for n in counts:
            rows = rounds[n]
            if not rows:
                continue
            mid = sorted(rows, key=lambda x: x["trials_per_s"])[len(rows) // 2]
            runs.append({**mid, "trials_per_s_all": [x["trials_per_s"] for x in rows]})
        base = next((r["trials_per_s"] for r in runs if r["workers"] == 1), None)
        for r in runs:
            r["speedup"] = round(r["trials_per_s"] / base, 2) if base else None
            r["speedup_per_worker"] = round(r["speedup"] / r["workers"], 3) if base else None
        return runs

    def run(self) -> None:
        try:
            self.start_services()
            self.overhead()
            self.scaling()
            runs = self.res.get("runs", [])
            self.res["checks"] = {
                "speedup_at_least_0.9N": {str(r["workers"]): r["speedup"] is not None
                                          and r["speedup"] >= 0.9 * r["workers"]
                                          for r in runs if r["workers"] > 1},
                "overhead_at_most_15ms": self.res["overhead_ms_per_trial"] <= 15,
                "every_trial_recorded_once": all(r["recorded_once"] for r in runs),
                "no_configuration_twice": all(r["duplicate_configs"] == 0 for r in runs)}
            self.res["status"] = "done"
        except BaseException as e:
            self.res["status"] = f"failed: {type(e).__name__}: {e}"[:800]
            raise
        finally:
            self.procs.stop(grace_s=5)
            if getattr(self, "store", None) is not None:
                self.store.close()
            if getattr(self, "pg", None) is not None:
                self.pg.stop()
            self.save()
            if self.args.logs:
                import tarfile
                with tarfile.open(Path(self.args.logs) / "service_scaling_logs.tar.gz",
                                  "w:gz") as tar:
                    tar.add(self.work / "logs", arcname="logs")
            if not self.args.keep:
                shutil.rmtree(self.work, ignore_errors=True)
        print(json.dumps({k: self.res.get(k) for k in ("overhead_ms_per_trial", "checks")}))
        for r in self.res.get("runs", []):
            print(f"  {r['workers']} worker(s): {r['trials_per_s']} trials/s, speedup "
                  f"{r['speedup']} ({r['trials_per_s_all']})")
        print(f"wrote {self.out}")


def main():
    default_out = Path(os.environ["OUT"]) / "service_scaling.json" if os.environ.get("OUT") \
        else ROOT / "benchmarks/results/service_scaling.json"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100,
                    help="trials a job (the recording holds 100 configurations)")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--repeat", type=int, default=3, help="rounds over the worker counts")
    ap.add_argument("--overhead-rounds", type=int, default=3)
    ap.add_argument("--job-timeout", type=float, default=120)
    ap.add_argument("--pg-dir", default=str(ROOT / ".pgsql"),
                    help="where scripts/carry_postgres.sh put its archive")
    ap.add_argument("--pg-set", action="append", default=[], metavar="NAME=VALUE",
                    help="a server setting (default: PostgreSQL's, durable commits)")
    ap.add_argument("--redis-dir", default=str(ROOT / ".redis"))
    ap.add_argument("--out", default=str(default_out))
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    ap.add_argument("--logs", default=os.environ.get("OUT"),
                    help="a folder for the logs as one .tar.gz (default: $OUT where set)")
    ap.add_argument("--note", action="append", default=[], help="a note for the results file")
    Bench(ap.parse_args()).run()


if __name__ == "__main__":
    main()
