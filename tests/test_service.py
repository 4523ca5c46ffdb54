"""Service mode against the local Redis (127.0.0.1:6379) and PostgreSQL (127.0.0.1:5432, user
postgres): compile and measuring workers as separate `porter worker` processes, jobs through the
`porter submit` CLI, and the faults the service must survive. The replay backend stands in for
the GPU (tests/data/replay/gemm_mma_h200.json.gz, a real H200 recording); the workers still
compile every variant (PORTER_REPLAY_COMPILE=1) so the compile queue is exercised, and each
replayed measurement sleeps its recorded GPU time (PORTER_REPLAY_HOLD=1).
"""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "tests" / "data" / "replay" / "gemm_mma_h200.json.gz"
PORTER = [sys.executable, "-m", "porter.cli"]
REDIS_DB = 11
REDIS_RESTART = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port",
                 "6379", "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis",
                 "--logfile", "/var/log/redis/ci.log"]
SIZES = ["--sizes", "4096x4096x4096", "--sizes", "8192x8192x8192"]


def _redis_up() -> bool:
    try:
        import redis
        return redis.Redis(socket_connect_timeout=1).ping()
    except Exception:
        return False


def _pg_up() -> bool:
    try:
        import psycopg
        psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", connect_timeout=2).close()
        return True
    except Exception:
        return False


class Cluster:
    """Worker processes of one test module, each in its own session so a kill takes all of it."""

    def __init__(self, env: dict, logs: Path):
        self.env, self.logs = env, logs
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, queues: str, *extra: str) -> None:
        env = dict(self.env, PORTER_WORKER_NAME=name)
        log = open(self.logs / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen([*PORTER, "worker", "--queues", queues, *extra],
                                            env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, cwd=ROOT)

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        p = self.procs.pop(name)
        os.killpg(p.pid, sig)
        p.wait(30)

    def stop(self) -> None:
        for name in list(self.procs):
            p = self.procs[name]
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
            self.procs.pop(name)

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def porter(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*PORTER, *args], env=self.env, capture_output=True, text=True,
                              cwd=ROOT, timeout=120)

    def submit(self, *args: str, recording: Path = RECORDING) -> int:
        r = self.porter("submit", "gemm_mma", "--arch", "sm_90a", "--backend", "replay",
                        "--replay", str(recording), *SIZES, *args)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not (_redis_up() and _pg_up()):
        pytest.skip("needs Redis on 127.0.0.1:6379 and PostgreSQL on 127.0.0.1:5432")
    import psycopg
    import redis
    dbname = f"porter_service_{uuid.uuid4().hex[:8]}"
    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres",
                         autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {dbname}")
    redis.Redis(db=REDIS_DB).flushdb()
    tmp = tmp_path_factory.mktemp("service")
    env = dict(os.environ,
               PORTER_DB_URL=f"postgresql+psycopg://postgres@127.0.0.1:5432/{dbname}",
               PORTER_BROKER_URL=f"redis://127.0.0.1:6379/{REDIS_DB}",
               PORTER_CACHE_DIR=str(tmp / "cache"), PORTER_REPLAY_COMPILE="1",
               PORTER_REPLAY_HOLD="1", PORTER_STALE_S="5", PORTER_SLICE_S="8",
               PORTER_SUPERVISE_S="2", PORTER_ORPHAN_S="6", PORTER_JOB_SLOTS="4",
               PORTER_COMPILE_WAIT_S="10", PORTER_LOG_LEVEL="INFO", PYTHONPATH=str(ROOT))
    c = Cluster(env, tmp)
    for i in (1, 2):
        c.start(f"compile{i}", "compile", "--concurrency", "1")
        c.start(f"gpu{i}", "gpu.sm_90a")
    yield c
    c.stop()
    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres",
                         autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")


def _store(c: Cluster):
    from porter.store import open_store
    return open_store(c.env["PORTER_DB_URL"])


def wait_for(c: Cluster, job_id: int, statuses=("done", "failed", "cancelled"),
             timeout: float = 90, trials: int | None = None):
    store = _store(c)
    end = time.time() + timeout
    while time.time() < end:
        info = store.get_job(job_id)
        if trials is not None and info.n_trials >= trials:
            return info
        if trials is None and info.status in statuses:
            return info
        time.sleep(0.3)
    logs = {p.name: p.read_text()[-3000:] for p in c.logs.glob("*.log")}
    raise AssertionError(f"job {job_id} still {store.get_job(job_id).status}; logs: {logs}")


def check_exactly_once(c: Cluster, job_id: int, budget: int | None):
    """Every trial number once in porter's store, every Optuna trial finished, and the budget
    spent exactly (infeasible proposals do not count)."""
    import optuna
    store = _store(c)
    trials = store.trials(job_id)
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers))
    if budget is not None:
        assert sum(t.status != "infeasible" for t in trials) == budget
    info = store.get_job(job_id)
    study = optuna.load_study(study_name=info.study_name, storage=store.optuna_storage())
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert not [n for n, s in states.items() if s == optuna.trial.TrialState.RUNNING]
    evaluated = {n for n, s in states.items() if s in (optuna.trial.TrialState.COMPLETE,
                                                       optuna.trial.TrialState.FAIL)}
    assert evaluated == set(numbers)     # nothing evaluated and lost, nothing extra
    return trials


@pytest.mark.service
def test_job_runs_to_completion_on_two_workers(cluster):
    job = cluster.submit("--trials", "16")
    info = wait_for(cluster, job)
    assert info.status == "done", info.message
    trials = check_exactly_once(cluster, job, 16)
    assert all(t.status == "measured" and t.backend == "replay" for t in trials)
    assert all(t.registers for t in trials)            # compiled: ptxas resources recorded
    r = cluster.porter("status", str(job))
    assert r.returncode == 0 and "done" in r.stdout


@pytest.mark.service
def test_sigkilled_measuring_worker_loses_no_trial(cluster):
    job = cluster.submit("--trials", "24")
    wait_for(cluster, job, trials=4)
    cluster.kill("gpu1")                                # mid-job, with trials claimed
    info = wait_for(cluster, job, timeout=120)
    assert info.status == "done", info.message
    check_exactly_once(cluster, job, 24)
    cluster.start("gpu1", "gpu.sm_90a")                 # as a restart policy would
    job2 = cluster.submit("--trials", "6", "--seed", "1")
    assert wait_for(cluster, job2).status == "done"
    check_exactly_once(cluster, job2, 6)
    assert sorted(cluster.alive()) == ["compile1", "compile2", "gpu1", "gpu2"]


@pytest.mark.service
def test_redis_restart_mid_job(cluster):
    job = cluster.submit("--trials", "24", "--seed", "2")
    wait_for(cluster, job, trials=4)
    subprocess.run(["redis-cli", "shutdown", "nosave"], capture_output=True, timeout=30)
    time.sleep(2)
    subprocess.run(REDIS_RESTART, check=True, timeout=30)
    for _ in range(50):
        if _redis_up():
            break
        time.sleep(0.2)
    info = wait_for(cluster, job, timeout=150)
    assert info.status == "done", info.message
    check_exactly_once(cluster, job, 24)
    job2 = cluster.submit("--trials", "4", "--seed", "3")   # workers took up the broker again
    assert wait_for(cluster, job2).status == "done"
    assert sorted(cluster.alive()) == ["compile1", "compile2", "gpu1", "gpu2"]


@pytest.mark.service
def test_every_variant_crashing_ends_the_job(cluster, tmp_path):
    # SYNTHETIC recording: the real H200 recording with every entry turned into `crashed`
    # (what the GPU backend records when a kernel takes its measuring process down)
    data = json.loads(gzip.open(RECORDING, "rt").read())
    for entry in data["trials"].values():
        entry.update(status="crashed", message="SYNTHETIC: the kernel took its process down "
                     "(exit code -11)", measurements=[], gpu_s=0.01)
    crashed = tmp_path / "synthetic_all_crashed.json.gz"
    with gzip.open(crashed, "wt") as f:
        json.dump(data, f)
    job = cluster.submit("--trials", "8", recording=crashed)
    info = wait_for(cluster, job)
    assert info.status == "done" and info.n_measured == 0
    trials = check_exactly_once(cluster, job, 8)
    assert {t.status for t in trials} == {"crashed"}


@pytest.mark.service
def test_cancel_stops_within_a_trial(cluster):
    job = cluster.submit("--trials", "90", "--seed", "4")
    wait_for(cluster, job, trials=3)
    r = cluster.porter("cancel", str(job))
    assert r.returncode == 0
    t0 = time.time()
    info = wait_for(cluster, job, timeout=30)
    assert info.status == "cancelled"
    assert time.time() - t0 < 10
    n = _store(cluster).get_job(job).n_trials
    time.sleep(2)
    assert _store(cluster).get_job(job).n_trials == n
    check_exactly_once(cluster, job, None)


@pytest.mark.service
@pytest.mark.parametrize("args, says", [
    (["submit", "no_such_template", "--arch", "sm_90a"], "unknown template"),
    (["submit", "gemm_mma", "--arch", "sm_90a", "--sizes", "4096xbanana"], "size"),
    (["submit", "gemm_mma", "--arch", "sm_999"], "sm_999"),
    (["submit", "gemm_mma", "--arch", "sm_90a", "--backend", "replay"], "--replay"),
    (["submit", "gemm_mma", "--arch", "sm_90a", "--trials", "0"], "--trials"),
])
def test_malformed_submits_are_refused_in_one_line(cluster, args, says):
    before = len(_store(cluster).list_jobs(1000))
    r = cluster.porter(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], r.stderr
    assert len(_store(cluster).list_jobs(1000)) == before     # nothing half-written


@pytest.mark.service
def test_missing_field_is_a_usage_error(cluster):
    r = cluster.porter("submit", "gemm_mma")
    assert r.returncode == 2 and "--arch" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_compose_file_parses_with_a_compose_parser():
    """docker-compose.yml through compose-spec (Rust compose_spec bindings; no Docker engine
    here). Compose interpolates ${VAR:-default} before validating; the defaults stand in."""
    import re
    compose_spec = pytest.importorskip("compose_spec")
    text = (ROOT / "docker-compose.yml").read_text()
    text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: m.group(2), text)
    c = compose_spec.PyCompose.from_yaml(text)
    c.validate()
    assert set(c.service_names()) >= {"redis", "postgres", "compile", "gpu0", "dashboard"}
    gpu = c.get_service("gpu0")
    (dev,) = gpu.deploy.resources.reservations.devices
    assert dev.driver == "nvidia" and dev.device_ids == {"0"}
    assert "CUDA_VISIBLE_DEVICES" in str(gpu.environment)
    for name in ("redis", "postgres", "compile", "gpu0", "dashboard"):
        assert c.get_service(name).healthcheck is not None, name
    assert "pgdata" in c.volumes
