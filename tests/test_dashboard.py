"""Each dashboard page renders (Streamlit's AppTest) against a database filled by real replayed
jobs from the H200 recordings."""
from pathlib import Path

import pytest

from porter.backends.replay import ReplayBackend
from porter.engine import Engine
from porter.jobs import make_spec, template_record
from porter.store import open_store

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "dashboard" / "app.py")
REPLAY = ROOT / "tests" / "data" / "replay"


@pytest.fixture(scope="module")
def db_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('dash') / 'd.db'}"
    store = open_store(url)
    for name in ("gemm_mma", "rmsnorm"):
        rec = REPLAY / f"{name}_h200.json.gz"
        spec, tpl, arch = make_spec(name, "sm_90a", trials=20, backend="replay",
                                    replay=str(rec))
        src, space = template_record(tpl)
        job = store.create_job(spec, tpl.name, tpl.source_hash, src, space)
        Engine(store, tpl, arch, ReplayBackend(rec)).run(job, spec)
    return url


def run(db_url, monkeypatch, **query):
    from streamlit.testing.v1 import AppTest
    monkeypatch.setenv("PORTER_DB_URL", db_url)
    at = AppTest.from_file(APP, default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, at.exception
    return at


def test_jobs_page_lists_both_jobs(db_url, monkeypatch):
    at = run(db_url, monkeypatch, page="jobs")
    df = at.dataframe[0].value
    assert set(df["template"]) == {"gemm_mma", "rmsnorm"}
    assert (df["status"] == "done").all()


def test_job_page_has_charts_failures_and_downloads(db_url, monkeypatch):
    at = run(db_url, monkeypatch, page="job", job="1")
    assert any("gemm_mma" in m.value for m in at.markdown)
    assert len(at.get("plotly_chart")) >= 2
    assert len(at.get("download_button")) == 8
    assert "extern \"C\"" in at.code[-1].value


def test_best_configurations_page(db_url, monkeypatch):
    at = run(db_url, monkeypatch, page="best")
    assert at.header[0].value == "Best configurations"
    df = at.dataframe[0].value
    assert "ratio" in df.columns, list(df.columns)
    assert {"gemm_mma", "rmsnorm"} <= set(df["template"])
    assert df["ratio"].notna().all()


def test_compare_page(db_url, monkeypatch):
    at = run(db_url, monkeypatch, page="compare")
    assert at.dataframe[0].value.shape[0] >= 1
