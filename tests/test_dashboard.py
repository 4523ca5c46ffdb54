"""Every dashboard page renders against a database of replayed H200 jobs (tests/conftest.py),
through Streamlit's AppTest: no exception, and the elements a user looks for are there."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")


def open_page(monkeypatch, url: str, page: str | None = None, **query) -> AppTest:
    monkeypatch.setenv("PORTER_DB_URL", url)
    at = AppTest.from_file(APP, default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = str(v)
    at.run()
    if page:
        at.switch_page(f"page_scripts/{page}.py")
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def markdown_text(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


def test_jobs_page_lists_every_job(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url)
    assert at.title[0].value == "Jobs"
    df = at.dataframe[0].value
    assert set(df["template"]) == {"gemm_mma", "rmsnorm"}
    assert set(df["status"]) == {"done"}
    assert df["best_ratio"].max() > 1.0          # rmsnorm beats torch on the H200 recording
    assert {m.label for m in at.metric} >= {"running", "done"}


def test_job_page_shows_convergence_parameters_statuses_top_and_exports(replayed_db,
                                                                        monkeypatch):
    job = replayed_db.jobs["gemm_mma/sm_90a"]
    at = open_page(monkeypatch, replayed_db.url, "job", job=job)
    assert at.title[0].value == "Job"
    assert at.selectbox(key="job_pick").value == job
    assert "gemm_mma" in markdown_text(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["trials"] == "30" and metrics["measured"] == "30"
    assert [t.label for t in at.tabs] == ["Convergence", "Parameters", "Statuses",
                                          "Top configurations", "Export"]
    charts = at.get("plotly_chart")
    assert len(charts) >= 5                       # 2 convergence, importance, parcoords, statuses
    top = at.dataframe[0].value
    assert len(top) and top["ratio"].notna().all()
    assert any("#define BM" in c.value for c in at.code)   # the best variant's source
    labels = {b.label for b in at.get("download_button")}
    assert labels == {"cu", "cubin", "ptx", "fatbin", "python", "header", "json", "kt-cache"}


def test_job_page_says_compile_only(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "job", job=replayed_db.jobs["gemm_mma/sm_80"])
    assert any("Compile-only" in w.value for w in at.warning)
    assert at.dataframe[0].value["status"].eq("compiled").all()


def test_best_configurations_grid(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "best")
    assert at.title[0].value == "Best configurations"
    grid = at.dataframe[0].value
    assert set(grid["template"]) == {"gemm_mma", "rmsnorm"}
    assert len(grid) == 5                         # 2 gemm sizes + 3 rmsnorm sizes
    assert grid["sm_90a"].str.contains("x · ").all()


def test_compare_page(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "compare")
    assert at.title[0].value == "Compare"
    at.selectbox(key="cmp_template").set_value("gemm_mma").run()
    assert not at.exception
    df = at.dataframe[0].value
    assert set(df["size"]) == {"4096x4096x4096", "8192x8192x8192"}


def test_submit_page_shows_errors_on_one_line(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "submit")
    at.text_input(key="sub_sizes").input("12x")
    at.button[0].click().run()
    assert not at.exception
    assert at.error and "malformed size '12x'" in at.error[0].value
    assert "\n" not in at.error[0].value


def test_root_address_takes_a_page_query(replayed_db, monkeypatch):
    monkeypatch.setenv("PORTER_DB_URL", replayed_db.url)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["page"] = "best"
    at.run()
    assert not at.exception and at.title[0].value == "Best configurations"


def test_submit_page_queues_through_the_service_plugin(replayed_db, monkeypatch):
    import porter.store.base
    submitted = []

    class FakeService:
        def submit(self, spec, db_url):
            submitted.append((spec, db_url))
            return 4242

    monkeypatch.setattr(porter.store.base, "plugin", lambda name: FakeService)
    at = open_page(monkeypatch, replayed_db.url, "submit")
    at.selectbox(key="sub_template").set_value("rmsnorm")
    at.text_input(key="sub_sizes").input("8192x4096")
    at.button[0].click().run()
    assert not at.exception and not at.error
    assert "queued job 4242" in at.success[0].value
    spec, url = submitted[0]
    assert spec.template == "rmsnorm" and spec.sizes == ((8192, 4096),) and url == replayed_db.url


def test_optuna_importance_button(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "job", job=replayed_db.jobs["rmsnorm/sm_90a"])
    at.button(key="fanova").click().run()
    assert not at.exception
    # Optuna's fANOVA over the job's study
    assert at.get("json") and not at.warning
