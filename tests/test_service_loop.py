"""One job loop: the same job run embedded (`porter port`) and by a service worker (real Redis
and PostgreSQL, replay backend) ends the same way: same trials, statuses and final status, for a
trial budget, a deadline, and an error in the middle of the job."""
from __future__ import annotations

import gzip
import json
import subprocess
import zlib
from collections import Counter

import pytest

from test_service import (PORTER, REPLAY, ROOT, env, store, submit, wait_done,  # noqa: F401
                          workers)

pytestmark = pytest.mark.service


def port_embedded(env, tmp_path, *extra, replay=REPLAY, trials=None):
    db = f"sqlite:///{tmp_path / 'embedded.db'}"
    args = [PORTER, "port", "gemm_mma", "--arch", "sm_90a", "--backend", "replay",
            "--replay", str(replay), "--sizes", "4096x4096x4096", "--db", db, *extra]
    if trials:
        args += ["--trials", str(trials)]
    r = subprocess.run(args, env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)
    from porter.store.base import open_store
    s = open_store(db)
    return r, s, s.list_jobs(1)[0]


def outcome(s, job):
    """What a run leaves: final status, trials (number -> config and status), and the
    study's trial states."""
    import optuna
    trials = s.trials(job.id)
    study = optuna.load_study(study_name=job.study_name, storage=s.optuna_storage())
    states = Counter(t.state.name for t in study.get_trials(deepcopy=False))
    return job.status, {t.config_key: t.status for t in trials}, len(trials), states


def run_both(env, workers, tmp_path, *extra, replay=REPLAY, trials=None):
    r, es, ejob = port_embedded(env, tmp_path, *extra, replay=replay, trials=trials)
    workers.start("gpu.sm_90a", 1)
    sid = submit(env, *extra, replay=replay, trials=trials)
    sjob = wait_done(env, sid, timeout=120)
    return r, outcome(es, es.get_job(ejob.id)), ejob, outcome(store(env), sjob), sjob


def test_budget_same_embedded_and_service(env, workers, tmp_path):
    r, emb, _, svc, _ = run_both(env, workers, tmp_path, trials=12)
    assert r.returncode == 0, r.stderr
    assert emb[0] == svc[0] == "done"
    assert emb[2] == svc[2] == 12
    assert emb[1] == svc[1], "the same configurations, with the same statuses"
    assert "RUNNING" not in emb[3] and "RUNNING" not in svc[3]


def test_deadline_same_embedded_and_service(env, workers, tmp_path):
    """--minutes only: both stop at the deadline (trials in flight finish) and end done; the
    replayed trials take their recorded GPU time, so the deadline comes before the space's
    100 configurations are through."""
    env = dict(env, PORTER_REPLAY_HOLD="1")
    data = json.load(gzip.open(REPLAY, "rt"))
    for e in data["trials"].values():
        e["gpu_s"] = 0.25
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(data))
    r, es, ejob = port_embedded(env, tmp_path, "--minutes", "0.05", replay=slow)
    assert r.returncode == 0, r.stderr
    workers.start("gpu.sm_90a", 1, PORTER_REPLAY_HOLD="1")
    sjob = wait_done(env, _submit_minutes(env, slow, "0.05"), timeout=60)
    e_status, e_trials, e_n, e_states = outcome(es, es.get_job(ejob.id))
    s_status, s_trials, s_n, s_states = outcome(store(env), sjob)
    assert e_status == s_status == "done"
    assert 0 < e_n < 100 and 0 < s_n < 100, (e_n, s_n)
    assert set(e_trials.values()) == set(s_trials.values()) == {"measured"}
    assert "RUNNING" not in e_states and "RUNNING" not in s_states


def _submit_minutes(env, replay, minutes):
    r = subprocess.run([PORTER, "submit", "gemm_mma", "--arch", "sm_90a", "--backend", "replay",
                        "--replay", str(replay), "--sizes", "4096x4096x4096", "--minutes",
                        minutes], env=env, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().splitlines()[-1])


def test_mid_job_error_same_embedded_and_service(env, workers, tmp_path):
    """A recording whose entries are half unusable (a status no trial may have): the job fails
    at the first such trial in both paths, with that reason, after the same trials, and no
    Optuna trial stays RUNNING."""
    data = json.load(gzip.open(REPLAY, "rt"))
    for key, e in data["trials"].items():
        if zlib.crc32(key.encode()) % 2:
            e["status"] = "exploded"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    r, emb, ejob, svc, sjob = run_both(env, workers, tmp_path, replay=bad, trials=30)
    assert r.returncode == 1 and "failed" in r.stdout, (r.stdout, r.stderr)
    assert emb[0] == svc[0] == "failed"
    assert emb[1] == svc[1] and emb[2] == svc[2]
    assert "RUNNING" not in emb[3] and "RUNNING" not in svc[3]
    assert "unknown trial status 'exploded'" in store(env).get_job(sjob.id).message
