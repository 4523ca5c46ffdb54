"""Every dashboard page and tab renders against a database of replayed H200 jobs
(tests/conftest.py) through Streamlit's AppTest: no exception, and what a user looks for is
there. Routing and ids (unknown or malformed ids, search reaching any job, ?page= at the root),
job control (notes, rename, cancel, delete with confirmation) and Submit without Celery (a real
background `porter port`, and no job row left behind when a submission fails)."""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
from streamlit.testing.v1 import AppTest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "dashboard" / "app.py")
RMS_RECORDING = ROOT / "tests" / "data" / "replay" / "rmsnorm_h200.json.gz"
TABS = ["Convergence", "Trials", "Analysis", "Kernel", "Failures", "Top configurations",
        "Export"]


def open_page(monkeypatch, url: str, page: str | None = None, **query) -> AppTest:
    monkeypatch.setenv("PORTER_DB_URL", url)
    at = AppTest.from_file(APP, default_timeout=90)
    if page:
        at.switch_page(f"page_scripts/{page}.py")
    for k, v in query.items():
        at.query_params[k] = str(v)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture
def own_db(replayed_db, tmp_path):
    """A copy of the replayed database that a test may change."""
    from porter.store.base import open_store
    url = copy_sqlite(replayed_db.url, tmp_path / "porter.db")
    return url, open_store(url)


def copy_sqlite(url: str, dest: Path) -> str:
    """A copy of a SQLite database, what its write-ahead log holds included (a plain file copy
    would miss the newest commits)."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as src, sqlite3.connect(dest) as dst:
        src.backup(dst)
    return f"sqlite:///{dest}"


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_jobs_page_lists_every_job(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "jobs")
    assert at.title[0].value == "Jobs"
    df = at.dataframe[0].value
    assert set(df["template"]) == {"gemm_mma", "rmsnorm"}
    assert len(df) == len(replayed_db.jobs)
    assert df["best_ratio"].max() > 1.0          # rmsnorm beats torch on the H200 recording
    counts = replayed_db.store.job_status_counts()
    assert sum(counts.values()) == len(replayed_db.jobs)
    assert all(metrics(at)[s] == str(n) for s, n in counts.items())
    at.text_input(key="jobs_search").input("rmsnorm").run()
    assert set(at.dataframe[0].value["template"]) == {"rmsnorm"}


@pytest.mark.parametrize("tab", TABS)
def test_every_job_tab_renders(replayed_db, monkeypatch, tab):
    job = replayed_db.jobs["gemm_mma/sm_90a"]
    at = open_page(monkeypatch, replayed_db.url, "job", job=job, tab=tab)
    assert [t.label for t in at.tabs if t.label in TABS] == TABS
    assert metrics(at)["trials"] == "30" and metrics(at)["measured"] == "30"
    charts = at.get("plotly_chart")
    if tab == "Convergence":
        assert len(charts) == 1
    if tab == "Trials":
        table = at.dataframe[0].value
        assert len(table) == 30 and table["ratio"].notna().all()
    if tab == "Analysis":          # its first view: importance by ANOVA, named
        assert len(charts) == 1 and any("One-way ANOVA" in c.value for c in at.caption)
    if tab == "Kernel":            # its first view: the roofline under the H200's roofs
        assert len(charts) == 1 and any("H200" in c.value for c in at.caption)
    if tab == "Top configurations":
        assert any("#define BM" in c.value for c in at.code)
    if tab == "Export":
        assert {b.label for b in at.get("download_button")} == {
            "cu", "cubin", "ptx", "fatbin", "python", "header", "json", "kt-cache"}
    if tab == "Export":           # tabs are lazy: only the open one ran
        assert not charts

@pytest.mark.parametrize("view,charts", [("Slice", 1), ("Contour", 1), ("EDF", 1),
                                         ("Parallel coordinates", 1)])
def test_every_analysis_view_renders(replayed_db, monkeypatch, view, charts):
    job = replayed_db.jobs["gemm_mma/sm_90a"]
    at = open_page(monkeypatch, replayed_db.url, "job", job=job, tab="Analysis", an_view=view)
    assert len(at.get("plotly_chart")) == charts


def test_trials_tab_filters_and_sorts(replayed_db, monkeypatch):
    job = replayed_db.jobs["gemm_mma/sm_90a"]
    at = open_page(monkeypatch, replayed_db.url, "job", job=job, tab="Trials")
    at.selectbox(key="tr_sort").set_value("ratio")
    at.toggle(key="tr_desc").set_value(True).run()
    r = at.dataframe[0].value["ratio"]
    assert list(r) == sorted(r, reverse=True)
    at.select_slider(key="tr_rng_BM").set_range(128, 256).run()
    df = at.dataframe[0].value
    assert len(df) < 30 and df["params"].str.contains("BM=64 ").sum() == 0


def test_compile_only_job_and_its_resources(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "job", job=replayed_db.jobs["gemm_mma/sm_80"],
                   tab="Kernel", kv="Resources")
    assert any("Compile-only" in w.value for w in at.warning)
    assert any("Occupancy from the sm_80 table" in c.value for c in at.caption)


def test_fanova_is_a_chart_next_to_anova(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "job", job=replayed_db.jobs["rmsnorm/sm_90a"],
                   tab="Analysis")
    n = len(at.get("plotly_chart"))
    at.button(key="fanova").click().run()
    assert not at.exception and not at.warning
    assert len(at.get("plotly_chart")) == n + 1


# ---- routing and ids

def test_unknown_and_malformed_job_ids_say_so(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "job", job=999)
    assert "No job 999" in at.error[0].value
    assert "trials" not in metrics(at)            # no other job shown in its place
    at = open_page(monkeypatch, replayed_db.url, "job", job="abc")
    assert "not a job id" in at.error[0].value and "trials" not in metrics(at)


def test_any_job_is_reachable_by_search(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "job")     # the newest job by default
    newest = max(replayed_db.jobs.values())
    assert at.query_params["job"] == str(newest)
    at.text_input(key="job_search").input("rmsnorm").run()
    pick = at.selectbox(key="job_pick")
    found = [o for o in pick.options if "rmsnorm" in o]
    assert len(found) == 1 and len(pick.options) == 2     # the match and the job on show
    rms = replayed_db.jobs["rmsnorm/sm_90a"]
    pick.set_value(rms).run()
    assert at.query_params["job"] == str(rms)
    assert "rmsnorm" in at.markdown[0].value and metrics(at)["trials"] == "30"

@pytest.mark.parametrize("page,title", [("best", "Best configurations"), ("compare", "Compare"),
                                        ("submit", "Submit a porting job"), ("jobs", "Jobs")])
def test_root_address_takes_a_page_query(replayed_db, monkeypatch, page, title):
    at = open_page(monkeypatch, replayed_db.url, page=page)
    assert at.title[0].value == title
    monkeypatch.setenv("PORTER_DB_URL", replayed_db.url)
    root = AppTest.from_file(APP, default_timeout=60)
    root.query_params["page"] = page
    root.run()
    assert not root.exception and root.title[0].value == title

def test_best_page_shows_what_moved_across_sizes(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "best")
    grid = at.dataframe[0].value
    assert set(grid["template"]) == {"gemm_mma", "rmsnorm"} and len(grid) == 5
    at.selectbox(key="best_across").set_value("rmsnorm").run()
    assert any("Moved:" in c.value for c in at.caption)


def test_compare_pages(replayed_db, monkeypatch):
    at = open_page(monkeypatch, replayed_db.url, "compare")
    at.selectbox(key="cmp_template").set_value("gemm_mma").run()
    assert set(at.dataframe[0].value["size"]) == {"4096x4096x4096", "8192x8192x8192"}
    jobs = [replayed_db.jobs["gemm_mma/sm_90a"], replayed_db.jobs["rmsnorm/sm_90a"]]
    at = open_page(monkeypatch, replayed_db.url, "compare", cmp_tab="Overlay jobs")
    at.multiselect(key="ov_jobs").set_value(jobs).run()
    assert not at.exception and len(at.get("plotly_chart")) == 2


# ---- job control

def test_rename_notes_cancel_and_delete(own_db, monkeypatch):
    from porter.records import JobSpec
    url, store = own_db
    job = store.job_rows(1, search="rmsnorm")[0][0]["job"]
    at = open_page(monkeypatch, url, "job", job=job)
    at.text_input(key="job_name").input("first H200 run")
    at.text_area(key="job_notes_text").input("clocks not locked")
    at.button(key="FormSubmitter:job_notes-Save").click().run()
    d = store.job_detail(job)
    assert (d["name"], d["notes"]) == ("first H200 run", "clocks not locked")
    assert store.job_rows(search="first H200")[0][0]["job"] == job

    assert at.button(key="job_delete").disabled      # not before the confirmation
    at.checkbox(key="job_delete_sure").check().run()
    at.button(key="job_delete").click().run()
    assert store.job_detail(job) is None

    running = store.create_job(JobSpec(template="rmsnorm", arch="sm_90a",
                                       sizes=((16384, 4096),)), "rmsnorm", d["template_hash"],
                               "src", "[template]\n", status="running")
    at = open_page(monkeypatch, url, "job", job=running)
    assert not at.button(key="job_cancel").disabled
    at.button(key="job_cancel").click().run()
    assert store.cancel_requested(running)


# ---- Submit without Celery

def test_submit_shows_errors_on_one_line_and_writes_nothing(own_db, monkeypatch):
    url, store = own_db
    before = store.job_rows()[1]
    at = open_page(monkeypatch, url, "submit")
    at.text_input(key="sub_sizes").input("12x")
    at.button[0].click().run()
    assert not at.exception and "malformed size '12x'" in at.error[0].value
    assert "\n" not in at.error[0].value
    assert store.job_rows()[1] == before


def test_submit_without_a_broker_runs_the_job_here(tmp_path, monkeypatch):
    from porter.store.base import open_store
    url = f"sqlite:///{tmp_path / 'porter.db'}"
    store = open_store(url)
    monkeypatch.delenv("PORTER_BROKER_URL", raising=False)
    at = open_page(monkeypatch, url, "submit")
    assert any("No broker (PORTER_BROKER_URL is not set)" in c.value for c in at.caption)
    at.selectbox(key="sub_template").set_value("rmsnorm")
    at.selectbox(key="sub_backend").set_value("replay")
    at.text_input(key="sub_replay").input(str(RMS_RECORDING))
    at.number_input(key="sub_trials").set_value(6)
    at.checkbox(key="sub_cold").check()
    at.button[0].click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "running here in a background process" in at.success[0].value
    job = int(at.success[0].value.split()[1])
    deadline = time.monotonic() + 120
    while store.job_detail(job)["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, "the background port did not finish"
        time.sleep(0.5)
    d = store.job_detail(job)
    assert d["status"] == "done" and d["n_measured"] == 6
    # the form's boxes reach the background `porter port`
    spec = store.get_job(job).spec
    assert spec.cold and not spec.fresh and spec.trials == 6

    # a replay source that cannot be read: the background port fails before recording a job
    bad = tmp_path / "bad.json"
    bad.write_text("not a recording")
    at.text_input(key="sub_replay").input(str(bad))
    at.button[0].click().run()
    assert "cannot read replay source" in at.error[0].value
    assert store.job_rows()[1] == 1


def test_submit_to_a_dead_broker_leaves_no_job_row(tmp_path, monkeypatch):
    pytest.importorskip("celery")
    from dashboard.submit_view import broker_problem, submit_service
    from porter.errors import PorterError
    from porter.job.jobs import make_spec
    from porter.store.base import open_store
    url = f"sqlite:///{tmp_path / 'porter.db'}"
    monkeypatch.setenv("PORTER_BROKER_URL", "redis://127.0.0.1:1/0")
    assert "unreachable" in broker_problem()
    at = open_page(monkeypatch, url, "submit")    # the page offers only the embedded run
    assert at.radio(key="sub_mode").options == ["here (a background `porter port` process)"]
    spec, _, _ = make_spec("rmsnorm", "sm_90a", None, 5)
    with pytest.raises(PorterError, match="not queued"):
        submit_service(spec, url)
    assert open_store(url).job_rows()[1] == 0


def test_trial_downloads_hold_every_matching_trial(replayed_db):
    import io

    import pandas as pd

    from dashboard.job_tabs import _all
    job = replayed_db.jobs["gemm_mma/sm_90a"]
    csv = pd.read_csv(io.BytesIO(_all(replayed_db.url, job, ("measured",), (("BM", (128, 256)),),
                                      "ratio", True, "csv")))
    want = [t for t in replayed_db.store.trials(job) if t.params["BM"] >= 128]
    assert len(csv) == len(want) and set(csv["param_BM"]) <= {128, 256}
    assert list(csv["ratio"]) == sorted(csv["ratio"], reverse=True)
    pq = pd.read_parquet(io.BytesIO(_all(replayed_db.url, job, (), (), "number", False,
                                         "parquet")))
    assert len(pq) == 30 and {"number", "status", "objective", "param_BN"} <= set(pq.columns)
