"""The service's compile prefetch (workers.tasks.prefetch_compiles) and the measurement cache:
a second GPU job of the same template and size prefetches none of the configurations the first
measured (its drivers take them from the cache without compiling) and still prefetches every
other one; a fresh job, or one whose drivers have recorded nothing yet (its identity, which
names their GPU, is not known), prefetches them all. On SQLite and PostgreSQL, with the
store's batch lookup (cached_config_keys) checked against cached_trial."""
from __future__ import annotations

from pathlib import Path

import pytest

from porter.job.hooks import JobHooks
from porter.job.jobs import make_spec, template_record, template_snapshot
from porter.job.loop import Engine
from porter.measure.backends.replay import ReplayBackend
from porter.store.base import open_store

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "tests" / "data" / "replay" / "gemm_mma_h200.json.gz"
SIZE = "4096x4096x4096"
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.service)]


class ReplayedGpu(ReplayBackend):
    """A GPU backend as a driver holds one (named `gpu`, its device the recording's H200), with
    the recording's figures: the identity a driver records, without a GPU."""
    name = "gpu"


class StopAfter(JobHooks):
    """The embedded hooks, stopping the run (the job stays running) after `n` trials."""

    def __init__(self, n: int):
        self.left = n

    def on_trial(self, rec, best) -> None:
        self.left -= rec.status != "infeasible"

    def beat(self):
        return "stop" if self.left <= 0 else super().beat()


@pytest.fixture(params=BACKENDS)
def url(request, tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'p.db'}"
        return
    from test_db import _pg_unreachable, fresh_pg_database
    if _pg_unreachable():
        pytest.skip(_pg_unreachable())
    with fresh_pg_database() as u:
        yield u


def gpu_job(store, trials: int, fresh: bool = False, drive: int | None = None) -> int:
    """A GPU job of gemm_mma at SIZE; its driver (the loop with ReplayedGpu) runs it to the
    end, or for `drive` trials (the job stays running, as while its drivers work), or not at
    all (drive=0: submitted, no driver yet)."""
    spec, tpl, a = make_spec("gemm_mma", "sm_90a", [SIZE], trials=trials, fresh=fresh)
    assert spec.backend == "gpu"
    src, space = template_record(tpl)
    job = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                           snapshot=template_snapshot(tpl))
    if drive == 0:
        return job
    hooks = StopAfter(drive if drive is not None else trials + 1)
    summary = Engine(store, tpl, a, ReplayedGpu(REPLAY), workers=1, hooks=hooks,
                     on_trial=hooks.on_trial).run(job, spec)
    assert summary.status == ("done" if drive is None else "stopped"), summary.message
    return job


def prefetch(job: int, url: str, monkeypatch) -> list[str]:
    """The configuration keys prefetch_compiles(job) compiles (the compiler stubbed out)."""
    from porter.build.compile import CompileResult
    from porter.spec.template import find_template
    from workers.tasks import prefetch_compiles
    tpl, compiled = find_template("gemm_mma"), []

    def compile_variant(t, config, arch):
        compiled.append(tpl.config_key(config))
        return CompileResult(ok=True, key=compiled[-1])
    monkeypatch.setenv("PORTER_DB_URL", url)
    monkeypatch.setattr("porter.build.compile.compile_variant", compile_variant)
    assert prefetch_compiles(job) == len(compiled)
    return compiled


def feasible_keys() -> set[str]:
    from workers.tasks import prefetch_order
    spec, tpl, a = make_spec("gemm_mma", "sm_90a", [SIZE])
    return {tpl.config_key(c) for c in prefetch_order(tpl, a, spec, 1)}


def counted_keys(store, job: int) -> set[str]:
    return {t.config_key for t in store.trials(job) if t.status != "infeasible"}


def test_a_second_job_prefetches_only_what_the_cache_does_not_serve(url, monkeypatch):
    store = open_store(url)
    first = gpu_job(store, trials=12)
    measured = counted_keys(store, first)
    everything = feasible_keys()
    assert len(measured) == 12 and measured < everything
    # the second job's drivers have started: they reused the 12 (recorded first) and measured
    # one more, so its trials carry its identity
    second = gpu_job(store, trials=30, drive=13)
    assert {t.reused_from[0] for t in store.trials(second) if t.reused_from} == {first}
    compiled = prefetch(second, url, monkeypatch)
    assert not set(compiled) & measured
    assert sorted(compiled) == sorted(everything - measured)
    # a fresh job reuses nothing, and a job with no trial yet has no known identity
    assert sorted(prefetch(gpu_job(store, trials=30, fresh=True, drive=1), url, monkeypatch)) \
        == sorted(everything)
    assert sorted(prefetch(gpu_job(store, trials=30, drive=0), url, monkeypatch)) == \
        sorted(everything)


def test_cached_config_keys_is_cached_trial_in_one_batch(url):
    store = open_store(url)
    first = gpu_job(store, trials=12)
    second = gpu_job(store, trials=14, drive=14)          # 12 reused, 2 measured
    (key,) = store.measure_keys(first)
    assert store.measure_keys(second) == {key} and store.measure_keys(gpu_job(
        store, trials=5, drive=0)) == set()
    keys = sorted(feasible_keys())                        # more than one IN list's worth
    assert len(keys) > 500
    for exclude in (None, first, second):
        assert store.cached_config_keys(key, keys, exclude_job=exclude) == {
            k for k in keys if store.cached_trial(key, k, exclude_job=exclude) is not None}
    # reused trials are never sources: the second job's own measurements are all it adds
    assert store.cached_config_keys(key, keys, exclude_job=first) == \
        counted_keys(store, second) - counted_keys(store, first)
    assert store.cached_config_keys("another identity", keys) == set()
