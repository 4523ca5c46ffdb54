"""A port of a size nobody tuned starts from the nearest sizes earlier jobs of the template
tuned (porter.job.run.near_size_configs), on the CPU: the database, the template's feasibility
and wave cost are real; the earlier jobs' trials are written as a GPU job records them."""
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from porter.build.check import static_check
from porter.job.jobs import make_spec, template_record, template_snapshot
from porter.job.run import NEAR_SEEDS, job_warm_start, near_size_configs
from porter.records import Measurement, TrialRecord
from porter.store.base import open_store

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "tests" / "data" / "replay"

# gemm_wgmma's H200 winners at 4096^3 and 8192^3 (benchmarks/results/gemm_sweep_h200.json)
BEST_4096 = {"BM": 128, "BN": 256, "BK": 64, "STAGES": 4, "CONSUMERS": 2, "GROUP_M": 16,
             "PERSIST": 1, "CLUSTER": 1, "EPI": 3, "SPLITK": 1, "STREAMK": 0, "SWAP": 0,
             "TAILW": 224, "PINGPONG": 0}
BEST_8192 = dict(BEST_4096, STREAMK=2, TAILW=0)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    return open_store(f"sqlite:///{tmp_path / 'p.db'}")


def tuned_job(store, size, configs, template="gemm_wgmma"):
    """A finished job of one size whose trials measured `configs`, best first."""
    spec, tpl, _ = make_spec(template, "sm_90a", ["x".join(map(str, size))], trials=10,
                             backend="compile-only")
    src, space = template_record(tpl)
    job = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                           snapshot=template_snapshot(tpl))
    for i, cfg in enumerate(configs):
        ms = 0.5 * (1 + 0.1 * i)
        store.record_trial(job, TrialRecord(
            number=i, params=cfg, config_key=",".join(str(v) for v in cfg.values()),
            status="measured", objective=ms,
            measurements=(Measurement(size=tuple(size), ours_ms=ms),)))
    store.set_job_status(job, "done", "")
    return job


def new_job(store, size, trials=60, **kw):
    spec, tpl, arch = make_spec("gemm_wgmma", "sm_90a", [size], trials=trials,
                                backend="compile-only", **kw)
    src, space = template_record(tpl)
    job = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                           snapshot=template_snapshot(tpl))
    return spec, tpl, arch, job


def test_a_new_size_starts_from_the_nearest_tuned_size_and_a_tile_that_fills_its_waves(store):
    tuned_job(store, (4096, 4096, 4096), [BEST_4096, dict(BEST_4096, TAILW=0)])
    tuned_job(store, (8192, 8192, 8192), [BEST_8192])
    spec, tpl, arch, job = new_job(store, "1536x1536x1536")
    seeds, nearest = near_size_configs(store, tpl, arch, spec, exclude_job=job)
    assert nearest == [(4096, 4096, 4096), (8192, 8192, 8192)]
    assert 1 < len(seeds) <= NEAR_SEEDS
    assert len({tpl.config_key(c) for c in seeds}) == len(seeds)
    for c in seeds:
        assert static_check(tpl, arch, c, spec.sizes) is None, c
    # the nearest size's best leads, as far as 1536^3 allows it (the re-cut last wave of
    # TAILW needs more tiles than SMs: at 1536^3 128 x 256 makes 72)
    first = seeds[0]
    assert (first["BM"], first["BN"], first["STAGES"]) == (128, 256, 4)
    # 128 x 256 leaves 60 of 132 SMs idle at 1536^3; 128 x 144 makes 12 x 11 = 132 tiles:
    # the wave fit comes among the seeds and costs less than the first
    cost = {tpl.config_key(c): tpl.wave_cost(c, arch, (1536, 1536, 1536)) for c in seeds}
    fits = [c for c in seeds if cost[tpl.config_key(c)] < cost[tpl.config_key(first)]]
    assert any((c["BM"], c["BN"]) == (128, 144) for c in fits), fits


def test_cold_small_budget_and_old_configurations(store):
    # an older template's configuration: one without PINGPONG takes its default; one with a
    # parameter the template no longer has is left out; a value no longer offered is repaired
    old = {k: v for k, v in BEST_4096.items() if k != "PINGPONG"}
    gone = dict(BEST_4096, UNROLL=4)
    odd = dict(BEST_4096, BN=136)
    tuned_job(store, (4096, 4096, 4096), [gone, odd, old])
    spec, tpl, arch, job = new_job(store, "4096x4096x4096", trials=8)
    seeds, nearest = near_size_configs(store, tpl, arch, spec, exclude_job=job)
    assert nearest == [(4096, 4096, 4096)]
    assert len(seeds) == 2                      # a quarter of the 8 trials
    assert seeds[0] != odd and seeds[0]["BN"] in tpl.params["BN"]
    assert all("UNROLL" not in c for c in seeds)
    assert tpl.complete(old) in seeds
    spec_c, tpl, arch, job_c = new_job(store, "4096x4096x4096", cold=True)
    assert spec_c.cold and near_size_configs(store, tpl, arch, spec_c, job_c) == ([], [])
    # the job's own trials (a resume) are not a source
    assert near_size_configs(store, tpl, arch, spec, exclude_job=1)[0] == []


def test_no_tuned_size_no_warm_start(store):
    spec, tpl, arch, job = new_job(store, "1536x1536x1536")
    assert near_size_configs(store, tpl, arch, spec, job) == ([], [])
    assert job_warm_start(store, tpl, arch, spec, job) == ([], [], "", {})


def test_bad_align_is_one_line(tmp_path):
    import shutil
    from porter.errors import TemplateError
    from porter.spec.template import load_template
    folder = tmp_path / "t"
    shutil.copytree(ROOT / "search_spaces" / "gemm_wgmma", folder)
    text = (folder / "space.toml").read_text().replace("align = [0, 0, 1]", "align = [0, 1]")
    (folder / "space.toml").write_text(text)
    with pytest.raises(TemplateError, match=r"align must list 3 non-negative numbers"):
        load_template(folder)


@pytest.mark.skipif(not (REPLAY / "gemm_mma_h200.json.gz").exists(),
                    reason="the H200 recording of gemm_mma is not in the tree")
def test_porter_port_of_a_new_size_proposes_the_tuned_best_first(tmp_path):
    """Two `porter port` runs: a replayed port at 4096^3, then a compile-only port at 2048^3,
    whose first trial is the first job's best; with --cold the template's default."""
    db = f"sqlite:///{tmp_path / 'p.db'}"
    env = {"PORTER_CACHE_DIR": str(tmp_path / "cache")}
    import os
    env = dict(os.environ, **env)
    porter = [sys.executable, "-m", "porter.cli"]
    r = subprocess.run([*porter, "port", "gemm_mma", "--arch", "sm_90a", "--backend", "replay",
                        "--replay", str(REPLAY / "gemm_mma_h200.json.gz"), "--sizes",
                        "4096x4096x4096", "--trials", "12", "--db", db],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    s = open_store(db)
    best = s.best_trials(1, 1)[0]
    runs = {}
    for flag in ((), ("--cold",)):
        r = subprocess.run([*porter, "port", "gemm_mma", "--arch", "sm_90a", "--backend",
                            "compile-only", "--sizes", "2048x2048x2048", "--trials", "1",
                            "--db", db, *flag],
                           capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        job = int(re.search(r"job (\d+):", r.stdout).group(1))
        runs[flag] = (r.stdout, min(s.trials(job), key=lambda t: t.number))
    out, first = runs[()]
    assert "warm-start configs from the nearest tuned sizes (4096x4096x4096)" in \
        " ".join(out.split())
    assert first.params == best.params
    out, first = runs[("--cold",)]
    assert "warm-start" not in out
    from porter.spec.template import find_template
    tpl = find_template("gemm_mma")
    assert first.params == tpl.start_configs()[0]
