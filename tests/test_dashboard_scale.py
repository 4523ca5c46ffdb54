"""The dashboard with 100 jobs and 50,000 trials (the synthetic data of
benchmarks/dashboard_scale.py, which times the same renders and writes
benchmarks/results/dashboard_scale.json): every page renders without an error and shows what
the data holds. No timing here: the benchmark measures it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("dashboard_scale",
                                               ROOT / "benchmarks" / "dashboard_scale.py")
scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale)


def test_every_page_renders_the_large_database(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'scale.db'}"
    counts = scale.fill(url)
    assert counts["jobs"] == scale.N_JOBS and counts["trials"] == scale.N_TRIALS
    monkeypatch.setenv("PORTER_DB_URL", url)
    AppTest.from_file(scale.APP, default_timeout=60).run()   # imports (plotly, pandas) once
    for page, query in scale.PAGES.items():
        at, _ = scale.render(page, query)
        assert not at.exception, (page, [e.value for e in at.exception])
        assert at.title[0].value
        if page == "jobs":   # three synthetic jobs are running: the table refreshes itself
            assert any("refreshing every" in c.value for c in at.caption)
            assert len(at.dataframe[0].value) == scale.N_JOBS
        if page == "job":    # job 1's counts, and its best trials fastest first
            from porter.store.base import open_store
            trials = open_store(url).trials(1)
            metrics = {m.label: m.value for m in at.metric}
            assert metrics["trials"] == str(len(trials)) == str(scale.N_TRIALS // scale.N_JOBS)
            assert metrics["measured"] == str(sum(t.status == "measured" for t in trials))
            best = at.dataframe[0].value
            assert set(best["status"]) == {"measured"}
            assert best["objective"].is_monotonic_increasing
