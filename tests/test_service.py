"""The service against the local Redis and PostgreSQL: real `porter worker` processes, real
`porter submit`, faults (a killed measuring worker, a Redis restart, a job whose every variant
crashes) and malformed submissions."""
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

pytestmark = pytest.mark.service

ROOT = Path(__file__).resolve().parents[1]
PORTER = str(ROOT / ".venv" / "bin" / "porter") if (ROOT / ".venv/bin/porter").exists() \
    else "porter"
REPLAY = ROOT / "tests/data/replay/gemm_mma_h200.json.gz"
# PORTER_TEST_BROKER: another database number lets two suites share one Redis
BROKER = os.environ.get("PORTER_TEST_BROKER", "redis://127.0.0.1:6379/9")
PG = "postgresql+psycopg://postgres@127.0.0.1:5432/"
REDIS_START = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port",
               "6379", "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis",
               "--logfile", "/var/log/redis/ci.log"]


def _services_up() -> bool:
    try:
        import psycopg
        import redis
        redis.Redis.from_url(BROKER, socket_connect_timeout=2).ping()
        psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres",
                        connect_timeout=3).close()
        return True
    except Exception:  # noqa: BLE001
        return False


if not _services_up():
    pytest.skip("needs Redis and PostgreSQL on localhost", allow_module_level=True)


def _wait_redis(up: bool, timeout=20):
    import redis
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            redis.Redis.from_url(BROKER, socket_connect_timeout=1).ping()
            if up:
                return
        except Exception:  # noqa: BLE001
            if not up:
                return
        time.sleep(0.2)
    raise AssertionError(f"redis did not come {'up' if up else 'down'}")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    import psycopg
    import redis
    name = f"porter_svc_{uuid.uuid4().hex[:8]}"
    admin = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    redis.Redis.from_url(BROKER).flushdb()
    e = dict(os.environ, PORTER_DB_URL=PG + name, PORTER_BROKER_URL=BROKER,
             PORTER_CACHE_DIR=str(tmp_path_factory.mktemp("cache")),
             PORTER_STALE_TRIAL_S="5", PYTHONUNBUFFERED="1",
             # the recordings the tests replay: the repository's and those tests write
             PORTER_REPLAY_DIR=os.pathsep.join([str(ROOT / "tests" / "data"),
                                                str(tmp_path_factory.getbasetemp())]))
    e.pop("CUDA_VISIBLE_DEVICES", None)
    yield e
    from db.store import get_engine  # noqa: F401 - engines of this process hold no connection
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Workers:
    def __init__(self, env, logdir: Path):
        self.env, self.logdir, self.procs = env, logdir, []

    def start(self, queue: str, n: int = 1, **extra):
        for _ in range(n):
            log = open(self.logdir / f"{queue}-{len(self.procs)}.log", "w")
            args = [PORTER, "worker", "--queues", queue]
            if queue == "compile":
                args += ["--concurrency", "1"]
            p = subprocess.Popen(args, env=dict(self.env, **extra), stdout=log,
                                 stderr=subprocess.STDOUT, cwd=ROOT)
            self.procs.append(p)
        return self.procs[-n:]

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def workers(env, tmp_path):
    w = Workers(env, tmp_path)
    yield w
    w.stop()


def submit(env, *extra, replay=REPLAY, trials=30, fresh=True) -> int:
    """`porter submit` of the replayed gemm_mma job; fresh: with --fresh (these tests are about
    workers measuring; the measurement cache has its own, test_service_cache.py)."""
    r = subprocess.run([PORTER, "submit", "gemm_mma", "--arch", "sm_90a", "--backend", "replay",
                        "--replay", str(replay), "--sizes", "4096x4096x4096", "--trials",
                        str(trials), *extra, *(["--fresh"] if fresh else [])], env=env,
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().splitlines()[-1])


def store(env):
    from porter.store.base import open_store
    return open_store(env["PORTER_DB_URL"])


def wait_done(env, job_id, timeout=90):
    s = store(env)
    t0 = time.time()
    while time.time() - t0 < timeout:
        j = s.get_job(job_id)
        if j.status in ("done", "failed", "cancelled"):
            return j
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {s.get_job(job_id).status} after {timeout} s")


def wait_trials(env, job_id, n, timeout=60):
    s = store(env)
    t0 = time.time()
    while len(s.trial_numbers(job_id)) < n:
        assert time.time() - t0 < timeout, "no progress"
        time.sleep(0.2)


def check_trials(env, job_id, n, status="measured"):
    trials = store(env).trials(job_id)
    counted = [t for t in trials if t.status != "infeasible"]
    assert len(counted) == n, [t.status for t in trials]
    assert len({t.number for t in trials}) == len(trials)
    assert len({t.config_key for t in trials}) == len(trials)
    assert all(t.status == status for t in counted), {t.status for t in counted}
    return trials


def test_job_runs_on_two_measuring_workers(env, workers):
    workers.start("compile", 2)
    workers.start("gpu.sm_90a", 2)
    job = submit(env)
    info = wait_done(env, job)
    assert info.status == "done", info.message
    trials = check_trials(env, job, 30)
    assert len({t.worker for t in trials}) == 2, "both measuring workers took part"
    assert all(p.poll() is None for p in workers.procs)


def test_two_measuring_workers_on_sqlite(env, tmp_path):
    """One host without PostgreSQL: the service on a SQLite file. The two drivers take turns
    asking (a file lock beside the database), so no configuration is tried twice."""
    import redis
    redis.Redis.from_url(BROKER).flushdb()      # job numbers restart in the new database
    e = dict(env, PORTER_DB_URL=f"sqlite:///{tmp_path / 'svc.db'}")
    w = Workers(e, tmp_path)
    try:
        # each trial holds its worker for its recorded GPU time: a faster driver no longer
        # finishes the whole job before the second one joins
        w.start("gpu.sm_90a", 2, PORTER_REPLAY_HOLD="1")
        job = submit(e, trials=24)
        info = wait_done(e, job)
        assert info.status == "done", info.message
        trials = check_trials(e, job, 24)
        assert len({t.worker for t in trials}) == 2, "both measuring workers took part"
    finally:
        w.stop()
        redis.Redis.from_url(BROKER).flushdb()


def test_killed_measuring_worker(env, workers):
    a, b = workers.start("gpu.sm_90a", 2, PORTER_REPLAY_HOLD="1")
    job = submit(env, trials=40)
    wait_trials(env, job, 6)
    a.send_signal(signal.SIGKILL)
    a.wait()
    info = wait_done(env, job)
    assert info.status == "done", info.message
    check_trials(env, job, 40)
    assert b.poll() is None


def test_redis_restart(env, workers):
    workers.start("gpu.sm_90a", 2, PORTER_REPLAY_HOLD="1")
    job = submit(env, trials=40)
    wait_trials(env, job, 6)
    subprocess.run(["redis-cli", "-p", "6379", "shutdown", "nosave"], timeout=10)
    _wait_redis(False)
    time.sleep(2)
    subprocess.run(REDIS_START, check=True, timeout=10)
    _wait_redis(True)
    info = wait_done(env, job)
    assert info.status == "done", info.message
    check_trials(env, job, 40)
    # the workers reconnected to the (emptied) broker: a new job is taken up
    job2 = submit(env, trials=10)
    info = wait_done(env, job2, timeout=60)
    assert info.status == "done", info.message
    check_trials(env, job2, 10)
    assert all(p.poll() is None for p in workers.procs)


def test_every_variant_crashes(env, workers, tmp_path):
    data = json.load(gzip.open(REPLAY, "rt"))
    for e in data["trials"].values():
        e.update(status="crashed", message="illegal memory access", measurements=[],
                 gpu_s=0.0)
    crashing = tmp_path / "crashing.json"
    crashing.write_text(json.dumps(data))
    workers.start("gpu.sm_90a", 2)
    job = submit(env, replay=crashing)
    info = wait_done(env, job)
    assert info.status == "done", info.message
    check_trials(env, job, 30, status="crashed")
    assert all(p.poll() is None for p in workers.procs)


@pytest.mark.parametrize("args", [
    ["nosuch_template", "--arch", "sm_90a"],
    ["gemm_mma", "--arch", "sm_90a", "--sizes", "4096xabc"],
    ["gemm_mma"],
])
def test_malformed_submit(env, args):
    before = len(store(env).list_jobs(None))
    r = subprocess.run([PORTER, "submit", *args], env=env, capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout.strip() == ""
    assert len(store(env).list_jobs(None)) == before


def test_compose_file_is_valid():
    """docker-compose.yml parsed by a strict compose-spec parser (YAML anchors, merge keys and
    ${...} variables resolved first, as docker compose does)."""
    compose_spec = pytest.importorskip("compose_spec")
    import yaml
    from test_service_compose import SECRETS, interpolate
    # docker compose interpolates ${...} before it validates; so does this test
    data = interpolate(yaml.safe_load((ROOT / "docker-compose.yml").read_text()), SECRETS)
    c = compose_spec.PyCompose.from_json(json.dumps(data))
    for name in ("redis", "postgres", "compile-worker", "gpu-worker-0", "dashboard"):
        assert name in c, name
    gpus = [n for n in data["services"] if n.startswith("gpu-worker-")]
    ids = set()
    for n in gpus:
        svc = data["services"][n]
        dev = svc["deploy"]["resources"]["reservations"]["devices"][0]
        assert dev["driver"] == "nvidia" and len(dev["device_ids"]) == 1
        ids |= set(dev["device_ids"])
        assert svc["environment"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert svc["command"][:3] == ["worker", "--queues", "gpu.sm_90a"]
        assert "healthcheck" in svc
    assert len(ids) == len(gpus), "each GPU worker has its own GPU"
    assert "pgdata" in data["volumes"]
    assert data["services"]["dashboard"]["command"][:3] == ["dashboard", "--address", "0.0.0.0"]
