"""Shared fixtures.

`replayed_db`: a SQLite database holding real jobs replayed from the H200 recordings in
tests/data/replay (gemm_mma and rmsnorm on sm_90a, 30 trials each) and one small compile-only
job (gemm_mma on sm_80: compiled, not measured). Built once per session; treat it as read-only.
`replay_job` is the helper behind it, for tests that need their own database.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPLAY_DIR = ROOT / "tests" / "data" / "replay"
RECORDINGS = {"gemm_mma": REPLAY_DIR / "gemm_mma_h200.json.gz",
              "rmsnorm": REPLAY_DIR / "rmsnorm_h200.json.gz"}


@dataclass
class ReplayedDb:
    url: str
    store: object
    jobs: dict[str, int] = field(default_factory=dict)   # "gemm_mma/sm_90a" -> job id


def replay_job(store, template: str, recording: str | Path | None, arch: str = "sm_90a",
               trials: int = 30, sizes: list[str] | None = None, backend: str = "replay",
               workers: int | None = None) -> int:
    """Records a job and runs the engine on it in-process; returns the job id. With
    backend="compile-only" (and recording None) the variants are compiled, not measured."""
    from porter.job.loop import Engine
    from porter.job.jobs import make_backend, make_spec, template_record, template_snapshot

    spec, tpl, a = make_spec(template, arch, sizes, trials=trials, backend=backend,
                             replay=str(recording) if recording else None)
    src, space = template_record(tpl)
    job_id = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                              snapshot=template_snapshot(tpl))
    be, _ = make_backend(spec, a)
    try:
        Engine(store, tpl, a, be, workers=workers).run(job_id, spec)
    finally:
        be.close()
    return job_id


@pytest.fixture(scope="session")
def replayed_db(tmp_path_factory) -> ReplayedDb:
    from porter.store.base import open_store
    url = f"sqlite:///{tmp_path_factory.mktemp('replayed') / 'porter.db'}"
    store = open_store(url)
    db = ReplayedDb(url, store)
    for name, rec in RECORDINGS.items():
        db.jobs[f"{name}/sm_90a"] = replay_job(store, name, rec, trials=30)
    db.jobs["gemm_mma/sm_80"] = replay_job(store, "gemm_mma", None, arch="sm_80", trials=6,
                                           backend="compile-only", workers=4)
    return db
