"""The measurement cache across jobs (issue 20, Do 4 and Acceptance 5): the same job run twice
measures nothing the second time and reaches the same best; `--fresh` measures again; a changed
template snapshot, size, architecture, GPU model or recording is not reused; reused trials are
marked (report, API, dashboard) and feed the search. Embedded (SQLite, the real replay backend
with its measure calls counted) and the service (real workers over Redis and PostgreSQL);
migration 0004 over a database holding rows of 0003."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from porter.job.cache import measure_key
from porter.job.jobs import make_spec, template_record, template_snapshot
from porter.job.loop import Engine
from porter.measure.backends.base import CompileOnlyBackend
from porter.measure.backends.replay import ReplayBackend
from porter.store.base import open_store

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "tests" / "data" / "replay" / "gemm_mma_h200.json.gz"
SIZE = "4096x4096x4096"


class CountingReplay(ReplayBackend):
    """The replay backend, counting what it is asked to measure."""

    def __init__(self, source):
        super().__init__(source)
        self.measured = 0

    def measure(self, *args, **kw):
        self.measured += 1
        return super().measure(*args, **kw)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    return open_store(f"sqlite:///{tmp_path / 'p.db'}")


def run(store, template="gemm_mma", arch="sm_90a", sizes=(SIZE,), trials=20, replay=REPLAY,
        fresh=False):
    """A replayed job run to its end in this process: (job id, summary, measure calls)."""
    spec, tpl, a = make_spec(str(template), arch, list(sizes), trials=trials, backend="replay",
                             replay=str(replay), fresh=fresh)
    src, space = template_record(tpl)
    job = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                           snapshot=template_snapshot(tpl))
    be = CountingReplay(replay)
    summary = Engine(store, tpl, a, be, workers=1).run(job, spec)
    assert summary.status == "done", summary.message
    return job, summary, be.measured


def counted(trials):
    return [t for t in trials if t.status != "infeasible"]


def test_the_same_job_twice_measures_nothing_the_second_time(store):
    first, s1, n1 = run(store)
    second, s2, n2 = run(store)
    assert n1 >= 20 and n2 == 0, (n1, n2)
    a, b = {t.number: t for t in store.trials(first)}, counted(store.trials(second))
    assert len(b) == 20 and s2.reused == 20 and "20 reused" in s2.message
    for t in b:     # every trial links to the first job's trial, with its figures
        job, number = t.reused_from
        src = a[number]
        assert job == first and src.reused_from is None
        assert (t.config_key, t.status, t.objective, t.measurements) == \
            (src.config_key, src.status, src.objective, src.measurements)
    assert {t.config_key for t in b} == {t.config_key for t in counted(a.values())}
    best1, best2 = store.best_trials(first, 1)[0], store.best_trials(second, 1)[0]
    assert best2.config_key == best1.config_key and best2.objective == best1.objective
    assert store.get_job(second).n_reused == 20 and store.get_job(first).n_reused == 0
    from porter.export.export import tuning_table     # the export's manifest rows say so too
    (row,) = tuning_table(store, second)[2]
    assert row["reused_from"][0] == first and "reused_from" not in tuning_table(store, first)[2][0]


def test_reused_trials_are_told_to_the_search(store):
    """The second job's study holds every reused trial COMPLETE with the original objective,
    so its search goes on from them (the budget larger: 20 reused, 10 measured)."""
    import optuna
    first, _, _ = run(store)
    second, summary, n = run(store, trials=30)
    trials = counted(store.trials(second))
    assert len(trials) == 30 and summary.reused == 20 and n >= 10
    assert len({t.config_key for t in trials}) == 30, "nothing proposed twice"
    study = optuna.load_study(study_name=store.get_job(second).study_name,
                              storage=store.optuna_storage())
    values = {t.number: t.value for t in study.get_trials(deepcopy=False)}
    for t in trials:
        assert values[t.number] == pytest.approx(t.objective)
    # the reused ones came first, best first
    reused = sorted((t for t in trials if t.reused_from), key=lambda t: t.number)
    assert [t.objective for t in reused] == sorted(t.objective for t in reused)


def test_fresh_measures_again_and_becomes_the_newest_source(store):
    first, _, _ = run(store)
    fresh, summary, n = run(store, fresh=True)
    assert n >= 20 and summary.reused == 0
    assert not [t for t in store.trials(fresh) if t.reused_from]
    third, _, n3 = run(store)
    assert n3 == 0
    assert {t.reused_from[0] for t in counted(store.trials(third))} == {fresh}


@pytest.mark.parametrize("change", ["template", "size", "arch", "recording"])
def test_another_identity_is_not_reused(store, tmp_path, change):
    first, _, n1 = run(store)
    kw = {}
    if change == "template":          # the same template, one comment added: a new snapshot
        folder = tmp_path / "gemm_mma"
        shutil.copytree(ROOT / "search_spaces" / "gemm_mma", folder)
        with open(folder / "kernel.cu", "a") as f:
            f.write("\n// edited\n")
        kw["template"] = folder
    elif change == "size":
        kw["sizes"] = ("8192x8192x8192",)
    elif change == "arch":
        kw["arch"] = "sm_90"
    else:                              # a recording of another GPU
        data = json.load(gzip.open(REPLAY, "rt"))
        data["device"]["gpu"] = "NVIDIA H100 80GB HBM3"
        kw["replay"] = tmp_path / "h100.json"
        kw["replay"].write_text(json.dumps(data))
    second, summary, n2 = run(store, **kw)
    assert summary.reused == 0 and n2 >= 20
    assert not [t for t in store.trials(second) if t.reused_from]


def test_identity_covers_the_gpu_model_and_nothing_measured_has_none():
    spec, tpl, arch = make_spec("gemm_mma", "sm_90a", [SIZE], backend="replay",
                                replay=str(REPLAY))
    be = ReplayBackend(REPLAY)
    k = measure_key(tpl, arch, be, spec.sizes)
    assert k == measure_key(tpl, arch, ReplayBackend(REPLAY), spec.sizes)
    be.device["gpu"] = "NVIDIA H100 80GB HBM3"
    assert measure_key(tpl, arch, be, spec.sizes) != k
    assert measure_key(tpl, arch.with_sms(114), ReplayBackend(REPLAY), spec.sizes) != k
    two = ((4096,) * 3, (8192,) * 3)
    assert measure_key(tpl, arch, ReplayBackend(REPLAY), two) != \
        measure_key(tpl, arch, ReplayBackend(REPLAY), two[::-1])
    assert measure_key(tpl, arch, CompileOnlyBackend(), spec.sizes) is None


def test_failed_statuses_are_reused_with_their_reasons(store, tmp_path):
    data = json.load(gzip.open(REPLAY, "rt"))
    for i, e in enumerate(data["trials"].values()):
        if i % 3 == 0:
            e.update(status="crashed" if i % 2 else "wrong_result", measurements=[],
                     message=f"planted {i}")
    rec = tmp_path / "faults.json"
    rec.write_text(json.dumps(data))
    first, _, _ = run(store, replay=rec, trials=30)
    second, _, n = run(store, replay=rec, trials=30)
    assert n == 0
    a = {t.config_key: t for t in counted(store.trials(first))}
    b = counted(store.trials(second))
    assert {"crashed", "wrong_result", "measured"} <= {t.status for t in b}
    for t in b:
        assert (t.status, t.message) == (a[t.config_key].status, a[t.config_key].message)


def test_cli_port_twice_report_and_api_mark_reused_trials(tmp_path):
    import porter
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    env = {"PORTER_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "250", "PATH": "/usr/bin"}
    cmd = [sys.executable, "-m", "porter.cli"]
    port = [*cmd, "port", "gemm_mma", "--arch", "sm_90a", "--backend", "replay", "--replay",
            str(REPLAY), "--sizes", SIZE, "--trials", "12", "--db", db]
    outs = [subprocess.run(port + extra, capture_output=True, text=True, cwd=ROOT, env=env,
                           timeout=180) for extra in ([], [], ["--fresh"])]
    assert all(r.returncode == 0 for r in outs), [r.stderr for r in outs]
    assert "12 trials reused" in outs[1].stdout and "trials reused" not in outs[2].stdout
    assert "fresh measurements" in outs[2].stdout
    r = subprocess.run([*cmd, "report", "2", "--db", db], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "reused: 12 of 12 trials" in r.stdout and "from job 1" in r.stdout
    assert "(reused from job 1 #" in r.stdout
    assert "its configuration came from: measurement cache" in r.stdout
    assert "trials by origin: measurement cache 12 (best " in r.stdout
    r = subprocess.run([*cmd, "status", "2", "--db", db], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=60)
    assert "12 measured (12 reused from earlier jobs)" in r.stdout
    r = subprocess.run([*cmd, "best", "gemm_mma", "--arch", "sm_90a", "--top", "3", "--db", db],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    rows = [ln for ln in r.stdout.splitlines() if "measured" in ln]
    assert len(rows) == 3 and len({ln.split("│")[2] for ln in rows}) == 3, r.stdout
    df = porter.get_job(2, db).trials()
    assert set(df["reused_from"].str.startswith("job 1 trial ")) == {True}
    assert set(df["origin"]) == {"measurement cache"}
    assert "template default" in set(porter.get_job(1, db).trials()["origin"])
    assert porter.get_job(3, db).trials()["reused_from"].isna().all()
    assert porter.get_job(2, db).best()["reused_from"][0] == 1


def test_dashboard_trial_table_marks_reused_trials(store, monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest
    first, _, _ = run(store, trials=8)
    second, _, _ = run(store, trials=8)
    monkeypatch.setenv("PORTER_DB_URL", store.url)
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=90)
    at.switch_page("page_scripts/job.py")
    at.query_params["job"] = str(second)
    at.query_params["tab"] = "Trials"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    tables = [d.value for d in at.dataframe if "reused from" in d.value.columns]
    assert tables and set(tables[0]["reused from"].str.startswith(f"job {first} #")) == {True}
    assert set(tables[0]["origin"]) == {"measurement cache"}   # why they were tried first
    assert any("8 of these trials reuse" in c.value for c in at.caption)


@pytest.mark.gpu
def test_on_a_gpu_the_second_port_measures_nothing(tmp_path, monkeypatch):
    """The GPU backend's identity (its device's name): the same short gemm_mma port twice on a
    real GPU; the second measures nothing, --fresh measures again."""
    pytest.importorskip("cupy")
    from porter.measure.backends.gpu import GpuBackend, gpu_available
    if not gpu_available():
        pytest.skip("no CUDA GPU here")

    class CountingGpu(GpuBackend):
        measured = 0

        def measure(self, *args, **kw):
            self.measured += 1
            return super().measure(*args, **kw)

    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    store = open_store(f"sqlite:///{tmp_path / 'g.db'}")
    out = []
    for fresh in (False, False, True):
        spec, tpl, a = make_spec("gemm_mma", "sm_90a", ["1024x1024x1024"], trials=5,
                                 fresh=fresh)
        src, space = template_record(tpl)
        job = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                               snapshot=template_snapshot(tpl))
        be = CountingGpu(timeout_s=10)
        try:
            summary = Engine(store, tpl, a, be, workers=2).run(job, spec)
        finally:
            be.close()
        out.append((job, summary, be.measured))
    (j1, _, n1), (j2, s2, n2), (j3, s3, n3) = out
    assert n1 >= 1 and n2 == 0 and n3 >= 1, (n1, n2, n3)
    assert s2.reused == len(counted(store.trials(j2))) == 5 and s3.reused == 0
    assert {t.reused_from[0] for t in counted(store.trials(j2))} == {j1}
    assert store.trials(j2)[0].device.get("gpu") == store.trials(j1)[0].device.get("gpu")


# ---- migration 0004 over rows of 0003

def _rows_of_0003(url: str) -> None:
    from db import migrate
    from db.engine import get_engine
    migrate.upgrade(url, "0003")
    with get_engine(url).begin() as conn:
        conn.execute(sa.text(
            "insert into porter_templates (source_hash, name, version, source, space_text, "
            "created_at) values ('0003aa', 'old', '1', 'src', '[template]', 0)"))
        job = conn.execute(sa.text(
            "insert into porter_jobs (spec, template_name, template_hash, arch, status, message,"
            " created_at, study_name, cancel_requested, name, notes) values (:spec, 'old', "
            "'0003aa', 'sm_90a', 'done', '', 0, 'porter-job-1', false, '', '') returning id"),
            {"spec": '{"template": "old", "arch": "sm_90a", "sizes": [[64, 64]]}'}).scalar()
        trial = conn.execute(sa.text(
            "insert into porter_trials (job_id, number, params, config_key, status, message, "
            "backend, objective, compile_log, device, worker, note) values (:j, 0, '{\"A\": 1}',"
            " 'A1', 'measured', '', 'gpu', 0.5, '', '{}', 'w', '') returning id"),
            {"j": job}).scalar()
        conn.execute(sa.text(
            "insert into porter_measurements (trial_id, size, ours_ms, ours_spread, baseline, "
            "baseline_ms, ratio) values (:t, '64x64', 1.0, 0.0, 'torch', 2.0, 2.0)"),
            {"t": trial})


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql",
                                                            marks=pytest.mark.service)])
def test_upgrade_from_0003_keeps_rows_and_reuses_none_of_them(backend, tmp_path):
    from db import migrate
    if backend == "sqlite":
        ctx = _nullctx(f"sqlite:///{tmp_path / 'old.db'}")
    else:
        from test_db import _pg_unreachable, fresh_pg_database
        if _pg_unreachable():
            pytest.skip(_pg_unreachable())
        ctx = fresh_pg_database()
    with ctx as url:
        _rows_of_0003(url)
        s = open_store(url)
        assert migrate.current(s.url) == migrate.head() == "0005"
        (t,) = s.trials(1)
        assert t.objective == 0.5 and t.measurements[0].ratio == 2.0
        assert t.measure_key is None and t.reused_from is None
        assert t.origin == ""                   # recorded before 0005: no origin
        assert s.get_job(1).n_reused == 0
        # trials recorded before 0004 have no identity: never a cache source
        assert s.cached_trial("", "A1") is None and s.cached_configs("", 10) == []
        _downgrade(s.url, "0003")               # and back down, and up again
        assert migrate.current(s.url) == "0003"
        migrate.upgrade(s.url)
        assert s.trials(1)[0].objective == 0.5


def _downgrade(url: str, revision: str) -> None:
    from alembic import command
    from db import migrate
    from db.engine import get_engine
    cfg = migrate.alembic_config(url)
    with get_engine(url).begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


class _nullctx:
    def __init__(self, v):
        self.v = v

    def __enter__(self):
        return self.v

    def __exit__(self, *exc):
        return False



# ---- each trial's origin

def test_each_trial_records_where_its_configuration_came_from(store):
    """run_job's origins: a warm-start configuration's trial carries its source's label, the
    template's default and [[seeds]] theirs, the rest the search's; the second run of the same
    job takes the cached measurements first, so its trials say so (and link their source)."""
    spec, tpl, a = make_spec("gemm_mma", "sm_90a", [SIZE], trials=12, backend="replay",
                             replay=str(REPLAY))
    be = ReplayBackend(REPLAY)
    default = tpl.config_key(tpl.start_configs()[0])
    # a recorded configuration other than the default: the warm start's
    picked = next(dict(zip(be.params, map(int, k.split(",")))) for k in be.entries
                  if k != default)
    # and one someone enqueued in the job's Optuna study (optuna-dashboard, enqueue_trial)
    queued = next(dict(zip(be.params, map(int, k.split(",")))) for k in be.entries
                  if k not in (default, tpl.config_key(picked)))
    src, space = template_record(tpl)
    job = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                           snapshot=template_snapshot(tpl))
    import optuna
    optuna.create_study(storage=store.optuna_storage(), study_name=store.get_job(job).study_name,
                        direction="minimize").enqueue_trial(queued)
    Engine(store, tpl, a, be, workers=1).run(job, spec, [picked], (),
                                             {tpl.config_key(picked): "job 7's best"})
    by_key = {t.config_key: t for t in store.trials(job)}
    assert by_key[tpl.config_key(queued)].number == 0     # the study's queue goes first
    assert by_key[tpl.config_key(queued)].origin == "enqueued in the study"
    assert by_key[tpl.config_key(picked)].origin == "job 7's best"
    assert by_key[default].origin == "template default"
    seeds = {tpl.config_key(tpl.complete(c)) for c in tpl.start_configs()[1:]}
    assert {by_key[k].origin for k in seeds if k in by_key} <= {"template [[seeds]]"}
    rest = [t for k, t in by_key.items()
            if k not in seeds | {default, tpl.config_key(picked), tpl.config_key(queued)}]
    assert rest and {t.origin for t in rest} == {"search (auto)"}
    # the dashboard's convergence rows carry them (its chart marks the warm start's trials)
    conv = {r["number"]: r["origin"] for r in store.convergence(job, "objective")}
    assert conv[0] == "enqueued in the study" and set(conv.values()) <= {t.origin for t in by_key.values()}
    # the same job again: every trial reuses the first's measurement, and says why it was tried
    second, _, measured = run(store, trials=12)
    assert measured == 0
    assert {t.origin for t in counted(store.trials(second))} == {"measurement cache"}
    assert all(t.reused_from for t in counted(store.trials(second)))
