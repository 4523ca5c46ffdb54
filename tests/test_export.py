"""Exports of a replayed gemm_mma job (the H200 recording): every format is written, the .cu
compiles standalone through NVRTC, the kt-cache loads in Kernel Tuner's simulation mode, the
python module dispatches to the nearest tuned size, the header's lookup works in C, the fatbin
holds every architecture, and user errors are one line."""
import json
from pathlib import Path

import numpy as np
import pytest

from porter.measure.backends.replay import ReplayBackend
from porter.job.loop import Engine
from porter.errors import PorterError
from porter.export.export import FORMATS, export
from porter.job.jobs import make_spec, template_record, template_snapshot
from porter.store.base import open_store

ROOT = Path(__file__).resolve().parents[1]
REC = ROOT / "tests" / "data" / "replay" / "gemm_mma_h200.json.gz"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    store = open_store(f"sqlite:///{tmp / 'p.db'}")
    spec, tpl, arch = make_spec("gemm_mma", "sm_90a", ["4096x4096x4096", "8192x8192x8192"],
                                trials=30, backend="replay", replay=str(REC))
    src, space = template_record(tpl)
    job_id = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                              snapshot=template_snapshot(tpl))
    Engine(store, tpl, arch, ReplayBackend(REC)).run(job_id, spec)
    from conftest import replay_job
    replay_job(store, "gemm_mma", None, arch="sm_80", trials=4, backend="compile-only",
               workers=2)
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
    big = next(m for m in manifest["measurements"] if m["size"] == [8192] * 3)
    assert big["launch"]["grid"][0] * big["launch"]["grid"][1] > 1 and big["launch"]["smem_bytes"] > 0
    assert "tensor_maps" not in big["launch"]                  # gemm_mma takes plain pointers


def test_exported_cu_compiles_standalone(job, tmp_path):
    from porter.build.compile import _nvrtc_compile
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


def test_unknown_job_and_empty_job_are_one_line(job, tmp_path):
    from porter.job.jobs import make_spec, template_record
    store, _ = job
    with pytest.raises(PorterError, match="no job 999"):
        export(store, 999, "json", tmp_path)
    spec, tpl, _ = make_spec("gemm_mma", "sm_90a", trials=1, backend="compile-only")
    src, space = template_record(tpl)
    empty = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                             snapshot=template_snapshot(tpl))
    with pytest.raises(PorterError, match=f"job {empty} has no measured or compiled trial"):
        export(store, empty, "cu", tmp_path)


def test_json_table_is_the_best_per_size(job, tmp_path):
    store, job_id = job
    export(store, job_id, "json", tmp_path)
    table = json.loads((tmp_path / "gemm_mma_sm_90a.json").read_text())["table"]
    for row in table:
        times = [m.ours_ms for t in store.trials(job_id, "measured") for m in t.measurements
                 if list(m.size) == row["size"]]
        assert row["ours_ms"] == min(times) and row["ratio"] > 0


def _load_module(path: Path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_python_module_dispatches_to_the_nearest_size(job, tmp_path):
    from porter.spec.arch import get_arch
    from porter.spec.template import find_template
    store, job_id = job
    paths = export(store, job_id, "python", tmp_path)
    mod = _load_module(next(p for p in paths if p.suffix == ".py"))   # needs neither porter
    assert "from porter" not in mod.__loader__.get_source(mod.__name__)  # nor CuPy to import
    assert all((tmp_path / e["file"]).is_file() for e in mod.TABLE)
    assert mod.nearest((4000, 4100, 3900))["size"] == [4096] * 3
    assert mod.nearest((10000, 9000, 7000))["size"] == [8192] * 3
    entry = mod.nearest((6144, 6144, 6144))
    tpl = find_template("gemm_mma")
    want = tpl.launch(entry["params"], get_arch("sm_90a"), (6144, 6144, 6144))
    grid, block, smem, _ = mod.geometry(entry, (6144, 6144, 6144))
    assert (grid, block, smem) == (want.grid, want.block, want.smem)


def test_header_lookup_in_c(job, tmp_path):
    import shutil
    import subprocess
    store, job_id = job
    h = next(p for p in export(store, job_id, "header", tmp_path) if p.suffix == ".h")
    text = h.read_text()
    assert "gemm_mma_lookup" in text and "{90, 4096, 4096, 4096," in text
    assert "{80, 4096, 4096, 4096," in text      # the compile-only sm_80 job's row
    if not shutil.which("cc"):
        pytest.skip("no C compiler to check the header's lookup")
    (tmp_path / "main.c").write_text(
        f'#include "{h.name}"\n#include <stdio.h>\nint main(void) {{\n'
        "  const struct gemm_mma_config* c = gemm_mma_lookup(90, 8000, 8000, 8000);\n"
        "  const struct gemm_mma_config* d = gemm_mma_lookup(89, 4096, 4096, 4096);\n"
        '  printf("%d %lld %d\\n", c->arch, c->M, d->arch);\n  return 0;\n}\n')
    subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", "-o", str(tmp_path / "main"),
                    str(tmp_path / "main.c")], check=True, cwd=tmp_path)
    out = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["90", "8192", "80"]


def test_fatbin_holds_every_architecture(job, tmp_path):
    from porter.export.formats import nvfatbin
    store, job_id = job
    paths = export(store, job_id, "fatbin", tmp_path)
    index = json.loads((tmp_path / "gemm_mma.fatbin.json").read_text())
    assert {tuple(f["size"]) for f in index["fatbins"]} == {(4096,) * 3, (8192,) * 3}
    for f in index["fatbins"]:
        assert {i["arch"] for i in f["images"]} == {"sm_80", "sm_90a"}
    if nvfatbin() is None:
        assert "nvFatbin not installed" in index["container"]
        return
    for f in index["fatbins"]:
        data = (tmp_path / f["file"]).read_bytes()
        assert data[:4] == bytes.fromhex("50ed55ba")     # the fatbin magic, little-endian
        assert f["ptx"] == "sm_80"
    assert json.loads((tmp_path / "manifest.json").read_text())["archs"] == ["sm_80", "sm_90a"]
    assert len([p for p in paths if p.suffix == ".fatbin"]) == 2


def test_compile_only_job_exports_the_first_compiled_config(tmp_path):
    from conftest import replay_job
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    job_id = replay_job(store, "rmsnorm", None, arch="sm_80", trials=3, backend="compile-only",
                        workers=2)
    paths = export(store, job_id, "cu", tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["gpu"] == "not measured"
    assert manifest["selection"].startswith("compile-only job")
    assert len([p for p in paths if p.suffix == ".cu"]) == 3


def test_manifest_says_how_to_launch_a_tma_kernel(tmp_path):
    """gemm_wgmma takes TMA tensor maps after its plain arguments: the manifest lists each
    map's buffer, box and swizzle per tuned size (a zero box: unused, 128 zero bytes), with the
    grid, cluster and workspace."""
    from conftest import replay_job
    store = open_store(f"sqlite:///{tmp_path / 'w.db'}")
    job_id = replay_job(store, "gemm_wgmma", None, arch="sm_90a", trials=1,
                        sizes=["4096x4096x4096"], backend="compile-only", workers=1)
    export(store, job_id, "cubin", tmp_path / "out")
    launch = json.loads((tmp_path / "out" / "manifest.json").read_text())["measurements"][0]["launch"]
    # the default configuration: 128x256 tiles, persistent on 132 SMs, C stored by TMA, no pieces
    assert launch["grid"] == [132, 1, 1] and launch["block"] == [384, 1, 1]
    assert launch["cluster"] == [1, 1, 1] and launch["workspace_bytes"] == 0
    assert launch["tensor_maps"] == [
        {"buffer": "A", "box": [64, 128], "swizzle": 128},
        {"buffer": "B", "box": [64, 256], "swizzle": 128},
        {"buffer": "C", "box": [64, 64], "swizzle": 128},
        {"buffer": "B", "box": [0, 0], "swizzle": 128}]
