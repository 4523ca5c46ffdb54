"""The dashboard on a larger database (the synthetic data of benchmarks/dashboard_scale.py, at a
size CI fills in seconds: one job of 5,000 trials among 20): every page renders without an
error, shows what the data holds, and charts get downsampled series, not every trial. No timing
here: the benchmark measures it (in headless Chromium, with 100,000 trials)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("dashboard_scale",
                                               ROOT / "benchmarks" / "dashboard_scale.py")
scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale)
BIG, JOBS, SMALL = 5000, 20, 50


@pytest.fixture(scope="module")
def big_db(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('scale') / 'scale.db'}"
    counts = scale.fill(url, BIG, JOBS, SMALL)
    assert counts["jobs"] == JOBS and counts["trials"] == BIG + (JOBS - 1) * SMALL
    return url


def open_page(monkeypatch, url, page, **query) -> AppTest:
    monkeypatch.setenv("PORTER_DB_URL", url)
    at, _ = scale.render(page, query)
    assert not at.exception, (page, [e.value for e in at.exception])
    return at


@pytest.mark.parametrize("page", list(scale.PAGES))
def test_every_page_renders_the_large_database(big_db, monkeypatch, page):
    at = open_page(monkeypatch, big_db, page, **scale.PAGES[page])
    assert at.title[0].value
    if page == "jobs":   # three synthetic jobs are running
        assert {m.label: m.value for m in at.metric}["running"] == "3"
        assert len(at.dataframe[0].value) == JOBS
    if page == "job":
        from porter.store.base import open_store
        store = open_store(big_db)
        metrics = {m.label: m.value for m in at.metric}
        assert metrics["trials"] == str(BIG)
        assert metrics["measured"] == str(store.trial_page(1, ["measured"], limit=1)[1])


def _points(at: AppTest) -> int:
    """The longest trace of the first chart."""
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    return max(len(t.get("x") or []) for t in spec["data"])


def test_charts_get_downsampled_series(big_db, monkeypatch):
    at = open_page(monkeypatch, big_db, "job", job=1)
    # 5,000 trials: each series holds about CONVERGENCE_POINTS rows (plus improvements)
    from dashboard.data import CONVERGENCE_POINTS, SAMPLE_ROWS
    assert 0 < _points(at) <= CONVERGENCE_POINTS + 200
    at = open_page(monkeypatch, big_db, "job", job=1, tab="Analysis", an_view="Slice")
    assert 0 < _points(at) <= SAMPLE_ROWS + 60
    at = open_page(monkeypatch, big_db, "job", job=1, tab="Top configurations")
    best = at.dataframe[0].value
    assert set(best["status"]) == {"measured"} and best["objective"].is_monotonic_increasing
