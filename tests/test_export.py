"""Exports of a replayed gemm_mma job (the H200 recording): every format is written, the .cu
compiles standalone through NVRTC, and the kt-cache loads in Kernel Tuner's simulation mode."""
import json
from pathlib import Path

import numpy as np
import pytest

from porter.backends.replay import ReplayBackend
from porter.engine import Engine
from porter.errors import PorterError
from porter.export import FORMATS, export
from porter.jobs import make_spec, template_record
from porter.store import open_store

ROOT = Path(__file__).resolve().parents[1]
REC = ROOT / "tests" / "data" / "replay" / "gemm_mma_h200.json.gz"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    store = open_store(f"sqlite:///{tmp / 'p.db'}")
    spec, tpl, arch = make_spec("gemm_mma", "sm_90a", ["4096x4096x4096", "8192x8192x8192"],
                                trials=30, backend="replay", replay=str(REC))
    src, space = template_record(tpl)
    job_id = store.create_job(spec, tpl.name, tpl.source_hash, src, space)
    Engine(store, tpl, arch, ReplayBackend(REC)).run(job_id, spec)
    return store, job_id


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_writes_files_and_a_manifest(job, fmt, tmp_path):
    store, job_id = job
    paths = export(store, job_id, fmt, tmp_path)
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["template"] == "gemm_mma" and manifest["arch"] == "sm_90a"
    assert manifest["gpu"].startswith("NVIDIA H200")
    assert {tuple(m["size"]) for m in manifest["measurements"]} == {(4096,) * 3, (8192,) * 3}


def test_exported_cu_compiles_standalone(job, tmp_path):
    from porter.compile import _nvrtc_compile
    store, job_id = job
    for p in export(store, job_id, "cu", tmp_path):
        if p.suffix != ".cu":
            continue
        text = p.read_text()
        assert '#include "porter.cuh"' not in text and "launch_gemm_mma" in text
        ok, log, cubin = _nvrtc_compile(text, p.name, ["--gpu-architecture=sm_90a",
                                                       "-DPORTER_NO_HOST", "-std=c++17"])
        assert ok, log
        assert len(cubin) > 1000


def test_kt_cache_loads_in_kernel_tuner_simulation(job, tmp_path):
    kernel_tuner = pytest.importorskip("kernel_tuner")
    store, job_id = job
    path = next(p for p in export(store, job_id, "kt-cache", tmp_path) if "kt_cache" in p.name)
    data = json.loads(path.read_text())
    measured = {k: v["time"] for k, v in data["cache"].items() if isinstance(v["time"], float)}
    assert measured
    keys = data["tune_params_keys"]

    def recorded(p):
        return ",".join(str(p[k]) for k in keys) in data["cache"]

    results, _ = kernel_tuner.tune_kernel(
        data["kernel_name"], "extern \"C\" __global__ void gemm_mma() {}",
        tuple(data["problem_size"]), [np.int32(0)], data["tune_params"],
        simulation_mode=True, cache=str(path), strategy="brute_force", verbose=False,
        restrictions=recorded)
    got = {",".join(str(r[k]) for k in data["tune_params_keys"]): r["time"] for r in results
           if isinstance(r.get("time"), float)}
    assert got and all(got[k] == pytest.approx(measured[k]) for k in got)


def test_unknown_format_is_one_line(job, tmp_path):
    store, job_id = job
    with pytest.raises(PorterError, match="unknown export format 'zip'"):
        export(store, job_id, "zip", tmp_path)
