"""Kernel Tuner interoperability: caches, T1 specifications, import as a template, replayed
ports, warm starts."""
import gzip
import json
from pathlib import Path

import pytest

from porter.spec.arch import ARCHS
from porter.measure.backends.replay import ReplayBackend
from porter.job.loop import Engine
from porter.job.jobs import make_spec, template_record, template_snapshot
from porter.interop.kt import add_extern_c, import_kt, kt_space, load_cache, load_t1, translate
from porter.search.searcher import Searcher, SearchSpace
from porter.store.base import open_store
from porter.spec.template import load_template

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared" / "replay"
DATA = ROOT / "tests" / "data" / "kt"
CACHES = sorted(SHARED.glob("*.json.gz")) if SHARED.is_dir() else []
T1S = sorted(SHARED.glob("*.T1.json")) if SHARED.is_dir() else []


@pytest.mark.skipif(not CACHES, reason="no Kernel Tuner caches in shared/replay")
@pytest.mark.parametrize("path", CACHES, ids=lambda p: p.name)
def test_load_cache(path):
    c = load_cache(path)
    assert c.device and c.names == tuple(c.params)
    assert all(isinstance(t, float) or t in ("InvalidConfig", "CompilationFailedConfig",
                                              "RuntimeFailedConfig", "ErrorConfig")
               for t in c.entries.values())
    params, feasible = kt_space(c)
    assert list(params) == list(c.names)
    invalid = sum(1 for t in c.entries.values() if t == "InvalidConfig")
    assert len(feasible) == len(c.entries) - invalid
    key, best = c.optimum()
    assert c.config(key) in feasible and best == min(c.valid_times().values())
    top = c.top(10)
    assert len(top) == 10 and c.time(top[0]) == best
    # the cache agrees with the T1 conditions of its kernel
    t1 = SHARED / (path.name.rsplit("_", 1)[0] + ".T1.json")
    if t1.exists():
        spec = load_t1(t1)
        assert all(spec.is_valid(dict(zip(c.names, cfg))) for cfg in list(feasible)[:500])


@pytest.mark.skipif(not T1S, reason="no T1 files in shared/replay")
@pytest.mark.parametrize("path", T1S, ids=lambda p: p.name)
def test_load_t1(path):
    t1 = load_t1(path)
    assert t1.params and all(isinstance(v, tuple) and v for v in t1.params.values())
    assert t1.conditions and t1.problem_size
    for c in t1.conditions:
        assert c.names <= set(t1.params)


def test_conditions_translate_and_evaluate():
    t1 = load_t1(DATA / "vector_add.T1.json")
    assert t1.params == {"block_size_x": (32, 64, 128, 256, 512, 1024),
                         "tile_size_x": (1, 2, 4, 8)}
    assert t1.is_valid({"block_size_x": 128, "tile_size_x": 4})
    assert not t1.is_valid({"block_size_x": 1024, "tile_size_x": 4})
    assert not t1.is_valid({"block_size_x": 32, "tile_size_x": 8})
    assert translate("a || !b && c != 1") == "a  or   not b  and  c != 1"
    assert translate("ProblemSize[1] > 2") == "ProblemSize_1 > 2"


def test_extern_c():
    src = "__global__ void k(float* x) {}\n"
    assert add_extern_c(src, "k").startswith('extern "C" __global__ void k(')
    once = 'extern "C" __global__ void k(float* x) {}\n'
    assert add_extern_c(once, "k") == once
    bounded = "__global__ void __launch_bounds__(256, 2) k(float* x) {}\n"
    assert add_extern_c(bounded, "k") == 'extern "C" ' + bounded


def _import(tmp_path):
    return import_kt(DATA / "vector_add.cu", DATA / "vector_add.T1.json", tmp_path / "va")


def test_import_kt_loads_and_compiles(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    folder = _import(tmp_path)
    assert {p.name for p in folder.iterdir()} == {"kernel.cu", "t1.json", "space.toml"}
    tpl = load_template(folder)
    assert tpl.op == "kt" and tpl.kernel == "vector_add" and tpl.size_names == ("P0",)
    assert tpl.default_sizes == ((1000000,),)
    assert 'extern "C" __global__ void vector_add(' in tpl.source
    arch = ARCHS["sm_90a"]
    launch = tpl.launch({"block_size_x": 128, "tile_size_x": 2}, arch, (1000000,))
    assert launch.grid == (3907, 1, 1) and launch.block == (128, 1, 1)   # ceil(1e6 / 256)
    from porter.build.check import static_check
    assert static_check(tpl, arch, {"block_size_x": 32, "tile_size_x": 8}, [(1000000,)])
    from porter.build.compile import compile_variant
    res = compile_variant(tpl, {"block_size_x": 128, "tile_size_x": 2}, arch, use_cache=False)
    assert res.ok, res.log


def _vector_add_cache(path: Path, tpl) -> Path:
    """A Kernel Tuner cache for the imported vector add: times for the valid configurations,
    one compile failure, one runtime failure, InvalidConfig for the rest."""
    cache = {}
    names = list(tpl.params)
    for i, cfg in enumerate(tpl.iter_configs()):
        key = ",".join(str(cfg[n]) for n in names)
        ok = cfg["block_size_x"] * cfg["tile_size_x"] <= 2048 and \
            not (cfg["block_size_x"] == 32 and cfg["tile_size_x"] == 8)
        t = (0.05 + 0.001 * abs(cfg["block_size_x"] - 256) + 0.002 * cfg["tile_size_x"]) \
            if ok else "InvalidConfig"
        if cfg == {"block_size_x": 64, "tile_size_x": 2}:
            t = "CompilationFailedConfig"
        if cfg == {"block_size_x": 512, "tile_size_x": 1}:
            t = "RuntimeFailedConfig"
        cache[key] = dict(cfg, time=t)
    data = {"device_name": "test GPU", "kernel_name": "vector_add", "problem_size": [1000000],
            "tune_params_keys": names, "tune_params": {n: list(v) for n, v in tpl.params.items()},
            "objective": "time", "cache": cache}
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    return path


def test_replayed_port_runs_to_completion(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    folder = _import(tmp_path)
    tpl = load_template(folder)
    rec = _vector_add_cache(tmp_path / "va_cache.json.gz", tpl)
    c = load_cache(rec)
    params, feasible = kt_space(c)
    assert len(feasible) == 20     # 24 less 1024x4, 1024x8, 512x8 (> 2048) and 32x8
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}")
    spec, tpl, arch = make_spec(str(folder), "sm_90a", trials=100, backend="replay",
                                replay=str(rec))
    src, space = template_record(tpl)
    job = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                           snapshot=template_snapshot(tpl))
    summary = Engine(store, tpl, arch, ReplayBackend(rec), workers=1).run(job, spec)
    trials = store.trials(job)
    counted = [t for t in trials if t.status != "infeasible"]
    assert summary.status == "done"
    assert len(counted) == len(feasible)                     # the space is exhausted
    assert len({t.config_key for t in trials}) == len(trials)
    statuses = {t.config_key: t.status for t in trials}
    assert statuses["64,2"] == "compile_failed" and statuses["512,1"] == "launch_failed"
    best = store.best_trials(job, 1)[0]
    assert best.config_key == c.optimum()[0]


def test_warm_start_keeps_only_feasible_configs():
    params = {"a": (1, 2, 3, 4), "b": (1, 2)}
    feasible = lambda cfg: cfg["a"] * cfg["b"] <= 4                       # noqa: E731
    warm = [{"a": 4, "b": 2}, {"a": 2, "b": 2}, {"a": 9, "b": 1}, {"a": 1}, {"a": 3, "b": 1}]
    s = Searcher(SearchSpace(params, feasible), "auto", seed=1, warm_start=warm)
    first = []
    for _ in range(2):
        n, cfg = s.ask()
        first.append(cfg)
        s.tell(n, 1.0)
    assert first == [{"a": 2, "b": 2}, {"a": 3, "b": 1}]


# ---- kernels whose constant-memory arguments are (or are not) also kernel parameters --------
_SCALE_3 = """// Kernel Tuner passes every argument, and copies cmem_args into their symbols as well
__constant__ float coeff[4];
__global__ void __launch_bounds__(1024) scale(float *out, const float *in,
                                              const float *coeff_unused /* = coeff */) {
    int i = blockIdx.x * block_size_x + threadIdx.x;
    if (i < 4096) out[i] = in[i] * coeff[i % 4];
}
"""
_SCALE_2 = _SCALE_3.replace(",\n                                              const float "
                            "*coeff_unused /* = coeff */)", ")")
_SCALE_4 = _SCALE_3.replace("const float *coeff_unused", "int n, const float *coeff_unused")


def _scale_t1(path: Path) -> Path:
    t1 = json.loads((DATA / "vector_add.T1.json").read_text())
    ks = t1["KernelSpecification"]
    ks.update(KernelName="scale", KernelFile="scale.cu", ProblemSize=[4096],
              GridDivX=["block_size_x"])
    t1["ConfigurationSpace"] = {"TuningParameters": [
        {"Name": "block_size_x", "Type": "int", "Values": "[64, 128]", "Default": 64}],
        "Conditions": []}
    ks["Arguments"] = [
        {"Name": "out", "Type": "float", "MemoryType": "Vector", "FillType": "Constant",
         "Size": "ProblemSize[0]", "FillValue": 0.0, "Output": 1},
        {"Name": "in", "Type": "float", "MemoryType": "Vector", "FillType": "Random",
         "Size": "ProblemSize[0]", "FillValue": 1.0},
        {"Name": "coeff", "Type": "float", "MemoryType": "Vector", "MemType": "Constant",
         "FillType": "Random", "Size": "4", "FillValue": 1.0}]
    path.write_text(json.dumps(t1))
    return path


def test_kernel_parameters():
    from porter.interop.kt import kernel_parameters
    assert kernel_parameters(_SCALE_3, "scale") == [
        "float *out", "const float *in", "const float *coeff_unused"]
    assert kernel_parameters(_SCALE_2, "scale") == ["float *out", "const float *in"]
    src = ('extern "C" __global__ void k(void) {}\n'
           "__global__ void t(Pair<int, float> p, float (*f)[4], int n) {}\n")
    assert kernel_parameters(src, "k") == []
    assert kernel_parameters(src, "t") == ["Pair<int, float> p", "float (*f)[4]", "int n"]
    with pytest.raises(Exception, match="no `__global__ void missing"):
        kernel_parameters(src, "missing")


class _Buf:
    def __init__(self, ptr):
        self.data = type("Mem", (), {"ptr": ptr})()


@pytest.mark.parametrize("source,passed", [(_SCALE_3, True), (_SCALE_2, False)],
                         ids=["declared", "symbol-only"])
def test_constant_argument_passed_when_the_kernel_declares_it(tmp_path, monkeypatch, source,
                                                              passed):
    from porter.measure.ops.kt import KTOp
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "scale.cu").write_text(source)
    folder = import_kt(tmp_path / "scale.cu", _scale_t1(tmp_path / "scale.T1.json"),
                       tmp_path / "scale")
    op = KTOp()
    op.configure(str(folder))
    assert op.pass_constants is passed
    bufs = [("vector", a, _Buf(1000 + i)) for i, a in enumerate(op.arguments)]
    ptrs = [a.value for a in op.args({"bufs": bufs}, 0)]
    assert ptrs == ([1000, 1001, 1002] if passed else [1000, 1001])
    state = {"bufs": bufs}
    assert list(op.constants(state)) == ["coeff"]     # the symbol is filled either way
    from porter.build.compile import compile_variant
    res = compile_variant(load_template(folder), {"block_size_x": 64}, ARCHS["sm_90a"],
                          use_cache=False)
    assert res.ok, res.log


def test_import_refuses_arguments_that_fit_no_signature(tmp_path):
    (tmp_path / "scale.cu").write_text(_SCALE_4)
    with pytest.raises(Exception, match="has 4 parameters but the T1 file lists 3 arguments"):
        import_kt(tmp_path / "scale.cu", _scale_t1(tmp_path / "scale.T1.json"),
                  tmp_path / "scale")
    assert not (tmp_path / "scale").exists()
