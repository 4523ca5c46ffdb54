"""The Python API (porter/api.py) on real jobs: a replayed port (the H200 recording), its
trials as a DataFrame, its best, its exports; bad input is one PorterError line and records
nothing; the notebook-style example in examples/ runs end to end."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import porter
from porter.errors import PorterError

ROOT = Path(__file__).resolve().parents[1]
REC = ROOT / "tests" / "data" / "replay" / "gemm_mma_h200.json.gz"


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    db = f"sqlite:///{tmp_path_factory.mktemp('api') / 'api.db'}"
    job = porter.port("gemm_mma", arch="sm_90a", sizes=[(4096, 4096, 4096), "8192x8192x8192"],
                      trials=25, backend="replay", replay=REC, db=db, progress=False)
    return job, db


def test_port_returns_a_finished_job(replayed):
    job, db = replayed
    assert isinstance(job, porter.Job) and job.status == "done"
    info = porter.get_job(job.id, db).info
    assert info.template_name == "gemm_mma" and info.spec.arch == "sm_90a"
    assert info.spec.sizes == ((4096, 4096, 4096), (8192, 8192, 8192))
    assert [j.id for j in porter.jobs(db)] == [job.id]


def test_trials_dataframe_and_best(replayed):
    job, _ = replayed
    df = job.trials()
    assert set(df["trial"]) == set(range(25))
    assert {"BM", "BN", "STAGES", "ours_ms", "baseline_ms", "ratio", "size"} <= set(df.columns)
    measured = df[df["status"] == "measured"]
    assert set(measured["size"]) == {"4096x4096x4096", "8192x8192x8192"}
    assert (measured["ratio"] - measured["baseline_ms"] / measured["ours_ms"]).abs().max() < 1e-9
    best = job.best()
    assert best["params"] == job.best(3)[0]["params"] and len(job.best(3)) == 3
    # the best trial's objective is the lowest of the job's measured trials
    per_trial = {t.number: t.objective for t in job.store.trials(job.id, "measured")}
    assert best["objective"] == min(per_trial.values())
    assert {m["size"][0] for m in best["measurements"]} == {4096, 8192}


def test_export_through_the_job(replayed, tmp_path):
    job, _ = replayed
    paths = job.export("json", tmp_path)
    table = json.loads((tmp_path / "gemm_mma_sm_90a.json").read_text())["table"]
    assert {tuple(r["size"]) for r in table} == {(4096,) * 3, (8192,) * 3}
    assert tmp_path / "manifest.json" in paths
    with pytest.raises(PorterError, match="unknown export format 'zip'"):
        job.export("zip", tmp_path)


def test_bad_input_is_one_line_and_records_nothing(tmp_path):
    db = f"sqlite:///{tmp_path / 'bad.db'}"
    for kwargs, needle in (({"template": "nope"}, "unknown template 'nope'"),
                           ({"template": "gemm_mma", "arch": "sm_42"}, "unknown architecture"),
                           ({"template": "gemm_mma", "sizes": "12x"}, "malformed size '12x'"),
                           ({"template": "gemm_mma", "trials": 0}, "--trials must be")):
        kwargs = {"arch": "sm_90a", **kwargs}
        with pytest.raises(PorterError, match=needle) as e:
            porter.port(db=db, progress=False, backend="compile-only", **kwargs)
        assert "\n" not in str(e.value)
    assert porter.jobs(db) == []
    with pytest.raises(PorterError, match="no job 7"):
        porter.get_job(7, db)


def test_import_porter_stays_light():
    code = ("import sys, porter; heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('sqlalchemy', 'optuna', 'pandas', 'cupy', 'torch', 'rich', 'db')]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_notebook_example_runs(tmp_path):
    """examples/port_and_export.py: a replayed port through the API, then exports (CI runs it)."""
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "port_and_export.py"), "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "best: trial" in r.stdout and "x cublas" in r.stdout
    assert (tmp_path / "python" / "gemm_mma_tuned.py").is_file()
    assert len(list((tmp_path / "cu").glob("*.cu"))) == 1
    manifest = json.loads((tmp_path / "cu" / "manifest.json").read_text())
    assert manifest["gpu"].startswith("NVIDIA H200") and manifest["job"] == 1
