"""The `porter` command as a user runs it: bad input gets one line and exit status 2, and
leaves nothing in the database."""
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLANTED = ROOT / "tests" / "data" / "templates" / "planted"


def porter(*args, db, cache, env_extra=None, timeout=600):
    env = dict(os.environ, COLUMNS="200", PORTER_DB_URL=f"sqlite:///{db}", PORTER_CACHE_DIR=str(cache))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "porter.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=ROOT)


def rows(db, table):
    if not Path(db).exists():
        return 0
    with sqlite3.connect(db) as c:
        try:
            return c.execute(f"select count(*) from {table}").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


@pytest.fixture
def env(tmp_path):
    return {"db": tmp_path / "p.db", "cache": tmp_path / "cache"}


def bad_template(tmp_path, space_edit=None, source_edit=None):
    d = tmp_path / "bad"
    shutil.copytree(PLANTED, d)
    if space_edit:
        (d / "space.toml").write_text(space_edit((d / "space.toml").read_text()))
    if source_edit:
        (d / "kernel.cu").write_text(source_edit((d / "kernel.cu").read_text()))
    return d


@pytest.mark.parametrize("args, needle", [
    (["port", "nope", "--arch", "sm_90a"], "unknown template 'nope'"),
    (["port", "rmsnorm", "--arch", "sm_42"], "unknown architecture 'sm_42'"),
    (["port", "rmsnorm", "--arch", "sm_90a", "--sizes", "12x"], "malformed size '12x'"),
    (["port", "rmsnorm", "--arch", "sm_90a", "--sampler", "magic"], "unknown sampler"),
    (["port", "rmsnorm", "--arch", "sm_90a", "--trials", "0"], "--trials must be"),
])
def test_bad_input_one_line_exit_2(env, args, needle):
    r = porter(*args, **env)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert rows(env["db"], "porter_trials") == 0 and rows(env["db"], "porter_jobs") == 0


def test_template_that_does_not_compile(env, tmp_path):
    d = bad_template(tmp_path, source_edit=lambda s: s.replace("float ss = 0.f;", "flot ss;"))
    r = porter("port", str(d), "--arch", "sm_90a", "--trials", "2", **env)
    assert r.returncode == 2
    assert "does not compile for sm_90a" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert rows(env["db"], "porter_jobs") == 0


def test_constraint_with_unknown_parameter(env, tmp_path):
    d = bad_template(tmp_path, lambda s: s + '\n[constraints]\nlist = ["TILE > 2"]\n')
    r = porter("port", str(d), "--arch", "sm_90a", **env)
    assert r.returncode == 2 and "unknown parameter(s) TILE" in r.stderr
    assert rows(env["db"], "porter_jobs") == 0


def test_include_outside_project(env, tmp_path):
    d = bad_template(tmp_path, source_edit=lambda s: '#include "../../secret.h"\n' + s)
    r = porter("port", str(d), "--arch", "sm_90a", **env)
    assert r.returncode == 2 and "outside the project's include folder" in r.stderr
    assert rows(env["db"], "porter_jobs") == 0


def test_missing_feature_is_one_sentence(env, tmp_path):
    d = bad_template(tmp_path, lambda s: s.replace('version = "1"',
                                                   'version = "1"\nrequires = ["wgmma"]'))
    r = porter("port", str(d), "--arch", "sm_80", **env)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: template 'planted' needs wgmma, which sm_80 does not have"


def test_compile_only_port_records_every_trial(env):
    r = porter("port", str(PLANTED), "--arch", "sm_90a", "--trials", "8", "--backend",
               "compile-only", **env)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "compile-only" in r.stdout
    with sqlite3.connect(env["db"]) as c:
        statuses = [s for (s,) in c.execute("select status from porter_trials")]
    assert len(statuses) == 8 and set(statuses) == {"compiled"}
    r = porter("jobs", **env)
    assert r.returncode == 0 and "planted" in r.stdout


def test_import_kt_then_port(env, tmp_path):
    kt = ROOT / "tests" / "data" / "kt"
    out = tmp_path / "vadd"
    r = porter("import-kt", str(kt / "vector_add.cu"), str(kt / "vector_add.T1.json"), "-o",
               str(out), **env)
    assert r.returncode == 0, r.stderr
    assert (out / "space.toml").is_file() and (out / "t1.json").is_file()
    r = porter("port", str(out), "--arch", "sm_90a", "--trials", "3", **env)
    assert r.returncode == 0, r.stderr
    assert rows(env["db"], "porter_trials") == 3
    r = porter("import-kt", str(kt / "missing.cu"), str(kt / "vector_add.T1.json"), **env)
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.parametrize("arch", ["sm_100a", "sm_120"])
def test_ports_ahead_of_hardware_report(env, arch):
    """A compile-only port of every built-in template to an architecture no worker has: the
    ones it can run give the feasible set, resources per variant and failures with reasons in
    `porter report`; gemm_wgmma is refused in one sentence naming the missing feature."""
    for job, tpl in enumerate(["rmsnorm", "gemm_mma"], start=1):
        r = porter("port", tpl, "--arch", arch, "--backend", "compile-only", "--trials", "4",
                   **env)
        assert r.returncode == 0, r.stderr + r.stdout
        r = porter("report", str(job), **env)
        assert r.returncode == 0, r.stderr
        out = r.stdout
        assert f"{tpl} -> {arch}" in out and "backend compile-only" in out
        assert "feasible set: " in out and " of the space's " in out
        assert "resources per variant (4 built)" in out
        assert "failures and refusals" not in out     # all four compiled
        with sqlite3.connect(env["db"]) as c:
            regs = [x for (x,) in c.execute(
                "select registers from porter_trials where job_id = ?", (job,))]
        assert len(regs) == 4 and all(x and x > 0 for x in regs)
    r = porter("port", "gemm_wgmma", "--arch", arch, "--backend", "compile-only", **env)
    assert r.returncode == 2
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith("error: template 'gemm_wgmma' needs wgmma")
    assert line.endswith(f"which {arch} does not have")


def test_report_of_a_warm_started_port(env):
    """A replayed sm_90a job (H200 recording) seeds a compile-only port to sm_100a; the report
    names the source's best there and what became of it here."""
    rec = ROOT / "tests" / "data" / "replay" / "gemm_mma_h200.json.gz"
    r = porter("port", "gemm_mma", "--arch", "sm_90a", "--backend", "replay", "--replay",
               str(rec), "--trials", "20", "--sizes", "4096x4096x4096", **env)
    assert r.returncode == 0, r.stderr
    r = porter("port", "gemm_mma", "--arch", "sm_100a", "--backend", "compile-only",
               "--trials", "3", "--sizes", "4096x4096x4096", "--from-arch", "sm_90a", **env)
    assert r.returncode == 0, r.stderr
    r = porter("report", "2", **env)
    assert r.returncode == 0, r.stderr
    assert "warm start from sm_90a: best there " in r.stdout
    assert "as-is on sm_100a: compiled (trial 0)" in r.stdout    # tried first, as it fits


def test_export_from_the_cli_goes_through_the_api(env, tmp_path):
    """`porter export` writes what porter.get_job(...).export writes; a bad format or job is
    one line and exit 2."""
    rec = ROOT / "tests" / "data" / "replay" / "rmsnorm_h200.json.gz"
    r = porter("port", "rmsnorm", "--arch", "sm_90a", "--backend", "replay", "--replay",
               str(rec), "--trials", "6", **env)
    assert r.returncode == 0, r.stderr
    r = porter("export", "1", "--format", "torch", "-o", str(tmp_path / "t"), **env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "t" / "rmsnorm_torch" / "__init__.py").is_file()
    assert "torch.ops.porter.rmsnorm" in (tmp_path / "t" / "rmsnorm_torch" / "__init__.py").read_text()
    for args, needle in ((["export", "1", "--format", "zip"], "unknown export format 'zip'"),
                         (["export", "9", "--format", "cu"], "no job 9")):
        r = porter(*args, "-o", str(tmp_path / "x"), **env)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr


def test_record_says_where_a_reused_trial_came_from(env, tmp_path):
    """`porter record` of a job that reused an earlier job's measurements: each reused entry
    carries reused_from [job, trial] of the trial that measured it; a trial measured by the job
    itself has none; the recording still replays."""
    import gzip
    import json
    from porter.measure.backends.replay import ReplayBackend
    from porter.store.base import open_store
    replay = ROOT / "tests" / "data" / "replay" / "gemm_mma_h200.json.gz"
    port = ["port", "gemm_mma", "--arch", "sm_90a", "--backend", "replay", "--replay",
            str(replay), "--sizes", "4096x4096x4096"]
    for trials in ("12", "20"):          # job 2: the 12 of job 1 reused, 8 measured
        r = porter(*port, "--trials", trials, **env)
        assert r.returncode == 0, r.stderr
    out = {}
    for job in (1, 2):
        out[job] = tmp_path / f"job{job}.json.gz"
        r = porter("record", str(job), "-o", str(out[job]), **env)
        assert r.returncode == 0, r.stderr
    assert "12 reused from earlier jobs' measurements" in r.stdout
    store = open_store(f"sqlite:///{env['db']}")
    first = {t.config_key: t.number for t in store.trials(1) if t.status != "infeasible"}
    first_rec = json.load(gzip.open(out[1], "rt"))["trials"]
    assert len(first_rec) == 12 and not [e for e in first_rec.values() if "reused_from" in e]
    entries = json.load(gzip.open(out[2], "rt"))["trials"]
    assert len(entries) == 20
    reused = {k: e["reused_from"] for k, e in entries.items() if "reused_from" in e}
    assert reused == {k: [1, n] for k, n in first.items()}
    fresh = set(entries) - set(reused)             # measured by job 2 itself
    assert len(fresh) == 8 and not fresh & set(first)
    for k in reused:                               # the original's figures
        assert entries[k]["measurements"] == first_rec[k]["measurements"]
    assert ReplayBackend(out[2]).entries.keys() == entries.keys()
