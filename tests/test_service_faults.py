"""The service under faults (issue 20's table), against the local Redis and PostgreSQL with the
replay backend: each ends with the job `done` or `failed` with a message, within a bounded time,
every trial recorded once, and no worker killed by what happened."""
from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
import time

import pytest

from test_service import (BROKER, PORTER, REDIS_START, ROOT, Workers, _wait_redis,  # noqa: F401
                          check_trials, env, store, submit, wait_done, wait_trials, workers)

pytestmark = pytest.mark.service
FAST_REAP = {"PORTER_DRIVER_STALE_S": "4", "PORTER_REAP_S": "1"}


def _study_running(env, job_id) -> list[int]:
    import optuna
    s = store(env)
    study = optuna.load_study(study_name=s.get_job(job_id).study_name,
                              storage=s.optuna_storage())
    return [t.number for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]


def test_postgres_restart_mid_job(env, workers):
    """The job's database refuses connections for a few seconds and every session to it is
    terminated (what a restart does to the drivers: AdminShutdown): the drivers retry and the
    job finishes."""
    import psycopg
    workers.start("gpu.sm_90a", 2, PORTER_REPLAY_HOLD="1")
    job = submit(env, trials=30)
    wait_trials(env, job, 5)
    name = env["PORTER_DB_URL"].rsplit("/", 1)[1]
    admin = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        time.sleep(3)
        c.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    info = wait_done(env, job, timeout=120)
    assert info.status == "done", info.message
    check_trials(env, job, 30)
    assert not _study_running(env, job)
    assert all(p.poll() is None for p in workers.procs)


def test_only_driver_killed(env, workers):
    """The job's only driver is SIGKILLed: a worker notices the silent heartbeat (seconds here,
    under a minute by default) and queues a new driver; the broker's visibility timeout
    (an hour) is not waited for."""
    e = dict(env, PORTER_DRIVERS="1")
    (a,) = workers.start("gpu.sm_90a", 1, PORTER_REPLAY_HOLD="1", **FAST_REAP)
    job = submit(e, trials=20)
    wait_trials(env, job, 4)
    a.send_signal(signal.SIGKILL)
    a.wait()
    workers.start("gpu.sm_90a", 1, PORTER_REPLAY_HOLD="1", **FAST_REAP)
    info = wait_done(env, job, timeout=90)
    assert info.status == "done", info.message
    check_trials(env, job, 20)
    assert not _study_running(env, job)


def _raw_message(task: str, args) -> dict:
    """A real Celery message for `task`, as the Redis transport stores it."""
    import redis

    from workers.app import app
    with app.connection_for_write(BROKER) as conn:
        app.send_task(task, args=args, queue="porter-test-scratch", connection=conn)
    r = redis.Redis.from_url(BROKER)
    return json.loads(r.rpop("porter-test-scratch"))


def test_poison_messages_go_to_dead_letter(env, workers):
    import redis
    r = redis.Redis.from_url(BROKER)
    r.delete("porter.dead-letter")
    workers.start("gpu.sm_90a", 1)
    bad_body = _raw_message("workers.tasks.drive_job", [1])
    bad_body["body"] = base64.b64encode(b"{{{ not json").decode()
    poison = ["not json at all", json.dumps({"body": "x"}), json.dumps([1, 2]),
              json.dumps(bad_body), json.dumps(_raw_message("workers.tasks.drive_job", ["abc"])),
              json.dumps(_raw_message("workers.tasks.no_such_task", [1]))]
    for p in poison:
        r.lpush("gpu.sm_90a", p)
    job = submit(env, trials=8)               # queued behind the poison
    info = wait_done(env, job, timeout=60)
    assert info.status == "done", info.message
    check_trials(env, job, 8)
    assert all(p.poll() is None for p in workers.procs), "no worker died"
    letters = [json.loads(x) for x in r.lrange("porter.dead-letter", 0, -1)]
    assert len(letters) == len(poison), letters
    assert any("not json at all" in x["payload"] for x in letters)
    assert all(x["reason"] for x in letters)


def test_worker_with_bad_database_url(env):
    for url in ("postgresql+psycopg://postgres@127.0.0.1:5999/nope", "sqlite:////etc/hostname/x.db",
                "nosuchdb://x"):
        r = subprocess.run([PORTER, "worker", "--queues", "gpu.sm_90a"],
                           env=dict(env, PORTER_DB_URL=url), capture_output=True, text=True,
                           cwd=ROOT, timeout=60)
        assert r.returncode == 2, (url, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "worker not started" in r.stderr and "Traceback" not in r.stderr


def test_worker_with_unreachable_broker(env):
    r = subprocess.run([PORTER, "worker", "--queues", "compile"],
                       env=dict(env, PORTER_BROKER_URL="redis://127.0.0.1:6399/0"),
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "broker" in r.stderr


def test_template_folder_gone_after_submit(env, workers, tmp_path):
    """The job owns its template: deleting the folder it was submitted from changes nothing."""
    folder = tmp_path / "tpl" / "gemm_mma"
    shutil.copytree(ROOT / "search_spaces" / "gemm_mma", folder)
    r = subprocess.run([PORTER, "submit", str(folder), "--arch", "sm_90a", "--backend", "replay",
                        "--replay", str(ROOT / "tests/data/replay/gemm_mma_h200.json.gz"),
                        "--sizes", "4096x4096x4096", "--trials", "10"], env=env,
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.strip().splitlines()[-1])
    shutil.rmtree(tmp_path / "tpl")
    workers.start("gpu.sm_90a", 1)
    info = wait_done(env, job, timeout=60)
    assert info.status == "done" or (info.status == "failed" and info.message), info
    if info.status == "done":
        check_trials(env, job, 10)


def test_queued_work_survives_redis_restart(env, workers):
    """Redis with its append-only file on: a job queued while no worker runs is still queued
    after Redis restarts, and a worker started afterwards runs it."""
    import redis
    r = redis.Redis.from_url(BROKER)
    r.config_set("appendonly", "yes")
    t0 = time.time()
    while r.info("persistence").get("aof_rewrite_in_progress") or \
            not r.info("persistence").get("aof_enabled"):
        assert time.time() - t0 < 30
        time.sleep(0.2)
    job = submit(env, trials=8)
    subprocess.run(["redis-cli", "-p", "6379", "shutdown"], timeout=20)
    _wait_redis(False)
    subprocess.run([*REDIS_START[:REDIS_START.index("--appendonly")], "--appendonly", "yes",
                    *REDIS_START[REDIS_START.index("--appendonly") + 2:]], check=True, timeout=10)
    _wait_redis(True)
    workers.start("gpu.sm_90a", 1)
    info = wait_done(env, job, timeout=60)
    assert info.status == "done", info.message
    check_trials(env, job, 8)


def test_replay_source_outside_data_folder(env, tmp_path_factory):
    """A submitter cannot make workers read a host file: a replay source outside
    PORTER_REPLAY_DIR is refused in one line and no job is recorded."""
    outside = "/etc/hostname"
    before = len(store(env).list_jobs(None))
    for e in (env, {k: v for k, v in env.items() if k != "PORTER_REPLAY_DIR"}):
        r = subprocess.run([PORTER, "submit", "gemm_mma", "--arch", "sm_90a", "--backend",
                            "replay", "--replay", outside, "--sizes", "4096x4096x4096"],
                           env=e, capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "PORTER_REPLAY_DIR" in r.stderr
    assert len(store(env).list_jobs(None)) == before
