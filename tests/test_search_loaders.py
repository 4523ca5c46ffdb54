"""Kernel Tuner caches as they come: a bare-integer problem size, an empty device name, GPU
names with underscores beside the kernel's T1 file (porter.interop.kt_cache, and the search
benchmark that reads them)."""
import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest

from porter.errors import SpecError
from porter.interop.kt_cache import kt_space, load_cache, t1_beside

ROOT = Path(__file__).resolve().parents[1]
T1 = ROOT / "tests" / "data" / "kt" / "vector_add.T1.json"


def write_cache(path: Path, **top) -> Path:
    """A small cache of vector_add's two parameters: times, one failure, one InvalidConfig."""
    cache = {}
    for bx in (32, 64, 128):
        for tx in (1, 2):
            t = 0.01 * bx / 32 + 0.005 * tx
            if (bx, tx) == (128, 2):
                t = "InvalidConfig"
            if (bx, tx) == (64, 2):
                t = "CompilationFailedConfig"
            cache[f"{bx},{tx}"] = {"block_size_x": bx, "tile_size_x": tx, "time": t}
    data = {"device_name": "test GPU", "kernel_name": "vector_add", "problem_size": [1000],
            "tune_params_keys": ["block_size_x", "tile_size_x"],
            "tune_params": {"block_size_x": [32, 64, 128], "tile_size_x": [1, 2]},
            "objective": "time", "cache": cache}
    data.update(top)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        json.dump(data, f)
    return path


def test_integer_problem_size(tmp_path):
    c = load_cache(write_cache(tmp_path / "vector_add_A100.json", problem_size=4096))
    assert c.problem_size == (4096,)
    params, feasible = kt_space(c)
    assert len(feasible) == 5 and c.optimum() == ("32,1", pytest.approx(0.015))
    assert load_cache(write_cache(tmp_path / "b.json", problem_size=[25000, 2048, 1])) \
        .problem_size == (25000, 2048, 1)
    with pytest.raises(SpecError, match="problem_size"):
        load_cache(write_cache(tmp_path / "c.json", problem_size={"x": 1}))


def test_gpu_name_with_underscores_finds_the_kernels_t1(tmp_path):
    shutil.copy(T1, tmp_path / "vector_add.T1.json")
    shutil.copy(T1, tmp_path / "vector.T1.json")       # a shorter name that also prefixes it
    path = write_cache(tmp_path / "vector_add_GTX_1080_Ti.json.gz", device_name="")
    assert t1_beside(path) == tmp_path / "vector_add.T1.json"
    assert load_cache(path).device == "GTX_1080_Ti"    # empty device_name: from the file name
    assert t1_beside(write_cache(tmp_path / "other_kernel_A100.json")) is None
    assert t1_beside(write_cache(tmp_path / "vector_addition_A100.json")) == \
        tmp_path / "vector.T1.json"


def test_device_name_from_an_environment_block_or_the_file(tmp_path):
    env = {"device_name": "AMD Instinct MI250X"}
    assert load_cache(write_cache(tmp_path / "k_MI250X.json", device_name="",
                                  environment=env)).device == "AMD Instinct MI250X"
    assert load_cache(write_cache(tmp_path / "k_MI250X.json", device_name="")).device == "MI250X"
    assert load_cache(write_cache(tmp_path / "k_W7800.json", device_name=" W7800 ",
                                  environment="none")).device == "W7800"


def test_search_benchmark_reads_such_a_space(tmp_path):
    """The benchmark's Space on a cache with an integer size and an underscored GPU name: it
    finds the T1 file and Kernel Tuner's restrictions come from it."""
    pytest.importorskip("kernel_tuner")      # the test extras have it; the GPU machine does not
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _search_runs as R
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    shutil.copy(T1, tmp_path / "vector_add.T1.json")
    path = write_cache(tmp_path / "vector_add_GTX_1080_Ti.json.gz", problem_size=1000)
    sp = R.Space(path)
    assert sp.t1 == tmp_path / "vector_add.T1.json"
    assert sp.n == 5 and sp.opt == pytest.approx(0.015)
    ours = R.run_porter(sp, "auto", seed=0)
    try:
        theirs, _ = R.run_kt(sp, "random_sample", seed=0)
    finally:
        R.cleanup()
    for values in (ours, theirs):
        assert len(values) == sp.budget and set(values) <= set(sp.value.values())
        assert sp.score(R.trajectory(values)) <= 1.0
