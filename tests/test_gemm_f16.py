"""gemm_wgmma's fp16 variant (gemm_wgmma_f16: the same kernel with DTYPE=1, measured by the
gemm_f16 op): the variant loads from the base's folder and snapshot, every tested configuration
compiles for sm_90a without spills, the op's inputs, reference and error work (NumPy standing in
for CuPy), its tensor maps are FLOAT16, and the exports know its element type. No GPU needed
(test_gpu.py runs it on a Hopper GPU)."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from porter.build.compile import compile_variant
from porter.errors import TemplateError
from porter.measure import tma
from porter.measure.ops import get_op, validate_template
from porter.measure.ops.gemm import GemmOp, reference_f16
from porter.spec.arch import ARCHS
from porter.spec.template import discover, find_template, load_template

from test_wgmma_compile import CONFIGS, SMALL, _feasible

SM90A = ARCHS["sm_90a"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_variant_is_the_base_with_another_op_and_dtype():
    base, f16 = find_template("gemm_wgmma"), find_template("gemm_wgmma_f16")
    assert (base.name, base.op, base.options) == ("gemm_wgmma", "gemm", ())
    assert (f16.name, f16.op, f16.options) == ("gemm_wgmma_f16", "gemm_f16", ("-DDTYPE=1",))
    assert f16.folder == base.folder and f16.source == base.source
    assert f16.source_hash == base.source_hash
    assert f16.params == base.params and f16.seeds == base.seeds
    assert [c.text for c in f16.constraints] == [c.text for c in base.constraints]
    assert [(m.buffer, [b.text for b in m.box]) for m in f16.tensor_maps] == \
        [(m.buffer, [b.text for b in m.box]) for m in base.tensor_maps]
    assert "fp16" in f16.description
    assert discover()["gemm_wgmma_f16"] == base.folder
    validate_template(f16)
    # the folder's own name, or any name that is no variant, is the base
    assert load_template(base.folder, variant="gemm_wgmma").op == "gemm"
    assert load_template(base.folder, variant="other").op == "gemm"


def test_a_job_of_the_variant_loads_it_back(tmp_path):
    from porter.job.jobs import make_spec, template_record, template_snapshot
    from porter.spec.snapshot import job_template
    from porter.store.base import open_store
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    ids = {}
    for name in ("gemm_wgmma_f16", "gemm_wgmma"):
        spec, tpl, _ = make_spec(name, "sm_90a", ["4096x4096x4096"], 2, backend="compile-only")
        src, space = template_record(tpl)
        ids[name] = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                                     snapshot=template_snapshot(tpl))
    got = job_template(store, ids["gemm_wgmma_f16"])
    assert (got.name, got.op, got.options) == ("gemm_wgmma_f16", "gemm_f16", ("-DDTYPE=1",))
    got = job_template(store, ids["gemm_wgmma"])
    assert (got.name, got.op, got.options) == ("gemm_wgmma", "gemm", ())


@pytest.mark.parametrize("table,match", [
    ('[variants.v]\nop = "gemm"\ncolour = 1\n', "unknown key"),
    ('[variants.v]\noptions = ["-DX=1"]\n', "needs op"),
    ('[variants.t]\nop = "gemm"\n', "name of its own"),
    ('[variants.v]\nop = "gemm"\noptions = "-DX=1"\n', "list of strings"),
])
def test_malformed_variants_are_refused_in_one_line(tmp_path, table, match):
    (tmp_path / "kernel.cu").write_text('extern "C" __global__ void k() {}\n')
    (tmp_path / "space.toml").write_text(
        '[template]\nname = "t"\nop = "gemm"\nkernel = "k"\n[sizes]\nnames = ["M", "N", "K"]\n'
        'default = ["64x64x64"]\n[params]\nX = [1]\n[launch]\ngrid = [1]\nblock = [32]\n'
        + table)
    with pytest.raises(TemplateError, match=match):
        load_template(tmp_path)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(map(str, c.values())))
def test_compiles_for_sm90a_in_fp16_without_spills(cache, config):
    tpl = find_template("gemm_wgmma_f16")
    small = config["SPLITK"] > 1 or config["SWAP"]
    assert _feasible(tpl, config, size=SMALL if small else (4096, 4096, 4096))
    res = compile_variant(tpl, config, SM90A, use_cache=False)
    assert res.ok, res.log
    r = res.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, res.log
    consumer = 232 if config["CONSUMERS"] == 2 else 240
    assert r.registers <= consumer
    assert "serialized" not in res.log and "C7508" not in res.log, res.log


def test_fp16_and_bf16_builds_differ(cache):
    cfg = find_template("gemm_wgmma").start_configs()[0]
    bins = [open(compile_variant(find_template(n), cfg, SM90A).cubin_path, "rb").read()
            for n in ("gemm_wgmma", "gemm_wgmma_f16")]
    assert bins[0] != bins[1]


def test_op_inputs_reference_and_error_on_the_cpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", np)      # NumPy stands in for CuPy
    op = get_op("gemm_f16")
    assert isinstance(op, GemmOp) and op.dims == ("M", "N", "K")
    assert op.signature == get_op("gemm").signature and "fp16" in op.note
    state = op.setup((48, 40, 64), seed=3)
    A, B, C = state["A"], state["B"], state["C"]
    assert A.dtype == B.dtype == C.dtype == np.float16
    assert A.shape == (48, 64) and B.shape == (40, 64) and C.shape == (48, 40)
    assert np.abs(A).min() >= 0 and np.count_nonzero(A) > 0.99 * A.size
    exact = A.astype(np.float64) @ B.astype(np.float64).T
    assert state["ref"].dtype == np.float32
    assert np.allclose(state["ref"], exact, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(reference_f16(A, B), state["ref"])
    op.poison(state)
    assert np.isnan(C).all() and op.error(state) == float("inf")
    C[...] = state["ref"].astype(np.float16)            # fp16 output rounding only
    assert 0 < op.error(state) < 1e-3 <= op.rtol
    C[0, 0] += 1000
    assert op.error(state) > op.rtol


class _FakeDriver:
    """Just enough of cuda.bindings.driver for tma.encode_tiled; records each call."""

    def __init__(self):
        ns = types.SimpleNamespace
        self.calls = []
        self.cuuint64_t = self.cuuint32_t = int
        self.CUresult = ns(CUDA_SUCCESS=0)
        self.CUtensorMapDataType = ns(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16="bf16",
                                      CU_TENSOR_MAP_DATA_TYPE_FLOAT16="f16")
        self.CUtensorMapInterleave = ns(CU_TENSOR_MAP_INTERLEAVE_NONE="none")
        self.CUtensorMapSwizzle = ns(CU_TENSOR_MAP_SWIZZLE_128B="128B")
        self.CUtensorMapL2promotion = ns(CU_TENSOR_MAP_L2_PROMOTION_L2_256B="l2",
                                         CU_TENSOR_MAP_L2_PROMOTION_NONE="l2_none")
        self.CUtensorMapFloatOOBfill = ns(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE="zero")

    def cuTensorMapEncodeTiled(self, *args):
        self.calls.append(args)
        return 0, types.SimpleNamespace(opaque=list(range(16)))


class _Arr:
    def __init__(self, shape, ptr):
        self.shape, self.dtype = shape, np.dtype(np.float16)
        self.strides = (shape[1] * 2, 2)
        self.data = types.SimpleNamespace(ptr=ptr)


def test_tensor_maps_are_float16(monkeypatch):
    assert tma.data_type(2) == ("BFLOAT16", 2)                  # by size: bf16, as before
    assert tma.data_type(2, "float16") == ("FLOAT16", 2)
    assert tma.data_type(1, "fp16") == ("FLOAT16", 2)           # the dtype sets the size
    with pytest.raises(ValueError, match="no TMA data type"):
        tma.data_type(2, "complex32")
    drv = _FakeDriver()
    monkeypatch.setattr(tma, "_driver", lambda: drv)
    op = get_op("gemm_f16")
    M, N, K = 1000, 776, 2064
    state = {"A": _Arr((M, K), 0x7f0000000000), "B": _Arr((N, K), 0x7f0000100000),
             "C": _Arr((M, N), 0x7f0000200000)}
    assert len(op.tensor_map(state, "A", (64, 128), 128)) == 128
    op.tensor_map(state, "C", (64, 64), 128)
    assert op.tensor_map(state, "C", (0, 0), 128) == bytes(128)     # unused: no driver call
    a, c = drv.calls
    assert a[:6] == ("f16", 2, 0x7f0000000000, [K, M], [K * 2], [64, 128])
    assert c[0] == "f16" and c[3:6] == ([N, M], [N * 2], [64, 64])
    # A's pitch (4128 bytes) is on 32-byte sectors, C's (1552) 16 bytes off them: no promotion
    assert (a[9], c[9]) == ("l2", "l2_none")
    with pytest.raises(TemplateError, match="over B"):
        op.tensor_map(state, "B", (128, 128), 128)                 # 256 bytes > the swizzle


def test_exports_know_the_fp16_buffers():
    from porter.export.fmt_cu import standalone_source
    from porter.export.opargs import map_dtypes, op_args
    tpl = find_template("gemm_wgmma_f16")
    assert {d[1] for d in map_dtypes(tpl)} == {"FLOAT16"}
    assert {d[1] for d in map_dtypes(find_template("gemm_wgmma"))} == {"BFLOAT16"}
    assert [a.name for a in op_args(tpl).args] == ["A", "B", "C", "M", "N", "K", "workspace"]
    src = standalone_source(tpl, "sm_90a", tpl.start_configs()[0], (4096, 4096, 4096))
    assert "#define DTYPE 1" in src
    assert "#define DTYPE 1" not in standalone_source(find_template("gemm_wgmma"), "sm_90a",
                                                      tpl.start_configs()[0])
