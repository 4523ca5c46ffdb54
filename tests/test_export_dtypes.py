"""Tensor maps in the exports carry their buffer's element type (CPU only).

gemm_fp8 takes A and B as e4m3 bytes and C as bf16: its cu export encodes A and B as UINT8 with
1-byte strides and C as BFLOAT16 with 2-byte strides; the python module's spec names each map's
type and hands the driver the same arguments as porter's measuring op (gemm_fp8's own
tensor_map); the manifest says each map's type. The dtype -> CUtensorMapDataType table, a spec
written before maps carried a type (bf16), and an unknown type refused in one line at export.
A declared [op]'s maps carry its declared dtype, and the measuring child encodes them with that
element size too.
"""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest

from porter.errors import PorterError, TemplateError
from porter.export.export import export
from porter.export.runtime_py import TMA_DTYPES, tiled_args, tma_dtype
from porter.store.base import open_store
from test_export import _load_module
from test_gemm_fp8 import _Arr, _FakeDriver

ROOT = Path(__file__).resolve().parents[1]
SIZE = "4096x4096x4096x1x2"          # per-tensor scales, promoted accumulation


# ---- the table ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, want", [
    ("bf16", ("bf16", "BFLOAT16", 9, 2)), ("float16", ("float16", "FLOAT16", 6, 2)),
    ("float32", ("float32", "FLOAT32", 7, 4)), ("float64", ("float64", "FLOAT64", 8, 8)),
    ("e4m3", ("e4m3", "UINT8", 0, 1)), ("e5m2", ("e5m2", "UINT8", 0, 1)),
    ("uint8", ("uint8", "UINT8", 0, 1)), ("int8", ("int8", "UINT8", 0, 1)),
    ("int32", ("int32", "INT32", 3, 4)), ("uint16", ("uint16", "UINT16", 1, 2)),
    # aliases as torch / NumPy / C spell them
    ("bfloat16", ("bf16", "BFLOAT16", 9, 2)), ("fp16", ("float16", "FLOAT16", 6, 2)),
    ("fp32", ("float32", "FLOAT32", 7, 4)), ("float8_e4m3fn", ("e4m3", "UINT8", 0, 1)),
    ("fp8_e5m2", ("e5m2", "UINT8", 0, 1)), ("BF16", ("bf16", "BFLOAT16", 9, 2))])
def test_dtype_maps_to_tensor_map_type_and_size(dtype, want):
    assert tma_dtype(dtype) == want


def test_unknown_dtype_is_one_line():
    with pytest.raises(ValueError, match=r"^no TMA data type for element type 'complex64'; "
                       r"known: bf16, float16, float32") as e:
        tma_dtype("complex64")
    assert "\n" not in str(e.value)


def test_table_values_are_the_drivers():
    """The numbers the cu export writes are cuda.bindings' CUtensorMapDataType values."""
    drv = pytest.importorskip("cuda.bindings.driver")
    for dtype, (name, value, _) in TMA_DTYPES.items():
        assert int(getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{name}")) == value, \
            dtype


def test_tiled_args_strides_are_in_the_elements_bytes():
    M, K = 4096, 1024
    fp8 = tiled_args(0x7f0000000000, [M, K], [128, 128], 128, "e4m3")
    assert (fp8["data_type"], fp8["elem_bytes"]) == ("UINT8", 1)
    assert fp8["dims"] == [K, M] and fp8["strides"] == [K] and fp8["box"] == [128, 128]
    assert fp8["swizzle"] == "128B" and fp8["rank"] == 2 and fp8["elem_strides"] == [1, 1]
    bf16 = tiled_args(0x7f0000000000, [M, K], [64, 128], 128)            # the default: bf16
    assert (bf16["data_type"], bf16["strides"]) == ("BFLOAT16", [2 * K])
    f32 = tiled_args(0x7f0000000000, [8, 1000, 128], [32, 64], 128, "float32")   # rank 3
    assert f32["dims"] == [128, 1000, 8] and f32["strides"] == [512, 512 * 1000]
    assert f32["box"] == [32, 64, 1] and f32["data_type_value"] == 7
    # L2 promotion by the row pitch, as porter measured it: 256 bytes on 32-byte sectors, none off
    assert [a["l2_promotion"] for a in (fp8, bf16, f32)] == ["L2_256B"] * 3
    assert tiled_args(0x7f0000000000, [M, 1000], [64, 128], 128)["l2_promotion"] == "NONE"
    assert tiled_args(0x7f0000000000, [M, 1008], [64, 128], 128)["l2_promotion"] == "L2_256B"
    with pytest.raises(ValueError, match="no TMA data type for element type 'e3m4'"):
        tiled_args(0, [M, K], [128, 128], 128, "e3m4")


# ---- gemm_fp8's exports ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def fp8_job(tmp_path_factory):
    from conftest import replay_job
    tmp = tmp_path_factory.mktemp("fp8")
    store = open_store(f"sqlite:///{tmp / 'f.db'}")
    job_id = replay_job(store, "gemm_fp8", None, arch="sm_90a", trials=1, sizes=[SIZE],
                        backend="compile-only", workers=1)
    return store, job_id


@pytest.fixture(scope="module")
def fp8_cu(fp8_job, tmp_path_factory):
    store, job_id = fp8_job
    out = tmp_path_factory.mktemp("cu")
    return next(p for p in export(store, job_id, "cu", out) if p.suffix == ".cu")


@pytest.fixture(scope="module")
def fp8_module(fp8_job, tmp_path_factory):
    store, job_id = fp8_job
    out = tmp_path_factory.mktemp("py")
    return _load_module(next(p for p in export(store, job_id, "python", out)
                             if p.suffix == ".py"))


def _map_blocks(text: str) -> dict[str, str]:
    """Each buffer's encoding block of porter_make_maps, by buffer."""
    body = text[text.index("static cudaError_t porter_make_maps"):]
    body = body[:body.index("return cudaSuccess;")]
    return {m.group(1): m.group(0) for m in
            re.finditer(r"// (\w+): \w+, \d+ bytes? an element\n.*?\);", body, re.S)}


def test_cu_encodes_a_and_b_as_bytes_and_c_as_bf16(fp8_cu):
    text = fp8_cu.read_text()
    blocks = _map_blocks(text)
    assert list(blocks) == ["A", "B", "C"]
    for buf, rows in (("A", "M"), ("B", "N")):
        b = blocks[buf]
        assert f"// {buf}: e4m3, 1 byte an element" in b
        assert f"dims[2] = {{(unsigned long long)(long long)K, (unsigned long long)(long long)" \
               f"{rows}}}" in b
        assert "strides[1] = {(unsigned long long)(long long)K * 1ULL}" in b
        assert re.search(rf"encode\(&maps\[\d\], 0 /\* UINT8 \*/, 2, \(void\*\){buf},", b)
    # L2 promotion by the row pitch at run time, as the python format and porter's measurements
    for b in blocks.values():
        assert "/* L2 promotion: none where the pitch is off 32-byte sectors, else 256 B */\n" \
               "                     strides[0] % 32ULL ? 0 : 3, 0 /* out-of-bounds: zeros */" in b
    c = blocks["C"]
    assert "// C: bf16, 2 bytes an element" in c
    assert "strides[1] = {(unsigned long long)(long long)N * 2ULL}" in c
    assert re.search(r"encode\(&maps\[2\], 9 /\* BFLOAT16 \*/, 2, \(void\*\)C,", c)
    assert "BFLOAT16" not in blocks["A"] + blocks["B"]
    assert "extern \"C\" cudaError_t launch_gemm_fp8(const uint8_t* A, const uint8_t* B, " \
           "bf16_t* C, const float* scale_a, const float* scale_b, int M, int N, int K, " \
           "int scaling, void* workspace, cudaStream_t stream)" in text


def test_cu_of_a_bf16_gemm_still_encodes_bf16(tmp_path):
    from conftest import replay_job
    store = open_store(f"sqlite:///{tmp_path / 'w.db'}")
    job_id = replay_job(store, "gemm_wgmma", None, arch="sm_90a", trials=1,
                        sizes=["4096x4096x4096"], backend="compile-only", workers=1)
    cu = next(p for p in export(store, job_id, "cu", tmp_path / "cu") if p.suffix == ".cu")
    blocks = _map_blocks(cu.read_text())
    assert set(blocks) == {"A", "B", "C"} and len(re.findall(r"9 /\* BFLOAT16 \*/",
                                                             cu.read_text())) == 4
    assert "K * 2ULL" in blocks["A"] and "UINT8" not in cu.read_text()


def test_exported_fp8_cu_compiles(fp8_cu, tmp_path):
    """NVRTC (the device code; the host launcher is skipped there) and, where nvcc exists, the
    whole translation unit with its host launcher (its PORTER_MAIN program: test_export_cu_main)."""
    from porter.build.compile import BASE_OPTIONS, _nvrtc_compile
    text = fp8_cu.read_text()
    ok, log, cubin = _nvrtc_compile(text, fp8_cu.name,
                                    [*BASE_OPTIONS, "--gpu-architecture=sm_90a"])
    assert ok, log
    assert len(cubin) > 1000
    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("no nvcc on this machine: the host launcher of the exported .cu is not built")
    r = subprocess.run([nvcc, "-arch=sm_90a", "-std=c++17", str(fp8_cu), "-c", "-o",
                        str(tmp_path / "k.o")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "porter_" not in r.stderr, r.stderr[-3000:]


def test_python_spec_carries_each_maps_element_type(fp8_module):
    mod = fp8_module
    assert [m[0] for m in mod.SPEC["space"]["maps"]] == ["A", "B", "C"]
    assert [m[3] for m in mod.SPEC["space"]["maps"]] == ["e4m3", "e4m3", "bf16"]
    assert mod.KERNEL.map_dtypes == ["e4m3", "e4m3", "bf16"]
    assert "from porter" not in mod.__loader__.get_source(mod.__name__)
    # ACCUM is no argument: the module says to pass the size
    with pytest.raises(TypeError, match="cannot tell ACCUM .* pass size=\\(M, N, K, SCALING, "
                       "ACCUM\\)"):
        mod.KERNEL.size_of(dict(A=0, B=0, C=0, scale_a=0, scale_b=0, M=256, N=256, K=256,
                                scaling=1))


def test_python_module_encodes_fp8_maps_as_the_measuring_op_does(fp8_module, monkeypatch):
    """The module's encodings of A, B (bytes) and C (bf16) hand the driver exactly what porter's
    gemm_fp8 op hands it when it measures."""
    from porter.measure import tma
    from porter.measure.ops import get_op
    mod = fp8_module
    ours, theirs = _FakeDriver(), _FakeDriver()
    monkeypatch.setattr(mod, "_drv", lambda: ours)
    monkeypatch.setattr(tma, "_driver", lambda: theirs)
    M, N, K = 1000, 776, 2064
    ptrs = {"A": 0x7f0000000000, "B": 0x7f0000100000, "C": 0x7f0000200000}
    state = {"A": _Arr((M, K), np.uint8, ptrs["A"]), "B": _Arr((N, K), np.uint8, ptrs["B"]),
             "C": _Arr((M, N), np.uint16, ptrs["C"])}
    op = get_op("gemm_fp8")
    dims = {"A": [M, K], "B": [N, K], "C": [M, N]}
    boxes = {"A": (128, 128), "B": (128, 192), "C": (64, 64)}
    for buf, dtype in zip("ABC", mod.KERNEL.map_dtypes):
        mod.KERNEL._encode(ptrs[buf], dims[buf], boxes[buf], 128, dtype)
        op.tensor_map(state, buf, boxes[buf], 128)
    assert len(ours.calls) == len(theirs.calls) == 3
    for a, b in zip(ours.calls, theirs.calls):
        assert [list(x) if isinstance(x, (list, tuple)) else x for x in a] == \
            [list(x) if isinstance(x, (list, tuple)) else x for x in b]
    assert [c[0] for c in ours.calls] == ["u8", "u8", "bf16"]
    assert ours.calls[0][4] == [K] and ours.calls[2][4] == [2 * N]


class _LaunchDriver(_FakeDriver):
    """_FakeDriver plus the calls TunedKernel._prepare makes (no GPU)."""

    def __init__(self):
        super().__init__()
        ns = types.SimpleNamespace
        self.CUfunction_attribute = ns(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="smem")
        self.CUlaunchAttributeID = ns(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION="cluster")
        self.CUlaunchConfig = ns
        self.CUstream = int

    def cuFuncSetAttribute(self, *args):
        return (0,)

    def cuMemAlloc(self, size):
        return 0, 0x7f0000400000

    def cuMemsetD8(self, *args):
        return (0,)


def test_python_module_launch_encodes_each_map_with_its_type(fp8_module, monkeypatch):
    """The launch path (TunedKernel._prepare) pairs each map with its buffer's type."""
    mod = fp8_module
    drv = _LaunchDriver()
    monkeypatch.setattr(mod, "_drv", lambda: drv)
    monkeypatch.setattr(mod.KERNEL, "function", lambda ctx, entry: 7)
    M, N, K = 1024, 1536, 2048
    size = (M, N, K, 1, 2)
    entry = mod.select(size)
    values = dict(A=0x7f0000000000, B=0x7f0000100000, C=0x7f0000200000, scale_a=0x7f0000300000,
                  scale_b=0x7f0000300100, M=M, N=N, K=K, scaling=1)
    mod.KERNEL._prepare(1, 0, entry, size, values)
    epi = entry["params"]["EPI"]
    assert [c[0] for c in drv.calls] == ["u8", "u8"] + (["bf16"] if epi == 3 else [])
    assert drv.calls[0][3:5] == ([K, M], [K]) and drv.calls[1][3:5] == ([K, N], [K])
    if epi == 3:
        assert drv.calls[2][3:5] == ([N, M], [2 * N])


def test_a_spec_without_map_types_means_bf16(fp8_module, tmp_path):
    """A module exported before maps carried their type (three entries a map) still loads and
    encodes bf16; a spec naming a type TMA has none for is refused in one line."""
    mod = fp8_module
    old = copy.deepcopy(mod.SPEC)
    old["space"]["maps"] = [m[:3] for m in old["space"]["maps"]]
    assert mod.TunedKernel(old, str(tmp_path)).map_dtypes == ["bf16"] * 3
    bad = copy.deepcopy(mod.SPEC)
    bad["space"]["maps"][0][3] = "complex64"
    with pytest.raises(ValueError, match="no TMA data type for element type 'complex64'"):
        mod.TunedKernel(bad, str(tmp_path))


def test_manifest_names_each_maps_type(fp8_job, tmp_path):
    store, job_id = fp8_job
    export(store, job_id, "cubin", tmp_path)
    launch = json.loads((tmp_path / "manifest.json").read_text())["measurements"][0]["launch"]
    maps = launch["tensor_maps"]
    assert [(m["buffer"], m["dtype"], m["tma_data_type"], m["elem_bytes"]) for m in maps] == [
        ("A", "e4m3", "UINT8", 1), ("B", "e4m3", "UINT8", 1), ("C", "bf16", "BFLOAT16", 2)]


def test_unknown_buffer_type_is_refused_at_export_in_one_line(fp8_job, tmp_path, monkeypatch):
    import porter.export.opargs as opargs
    store, job_id = fp8_job
    broken = opargs._BUILTIN["gemm_fp8"]
    monkeypatch.setitem(opargs._BUILTIN, "gemm_fp8", opargs.OpArgs(
        broken.args, broken.buffers, broken.output, broken.size_exprs, broken.size_axes,
        {**broken.dtypes, "B": "e3m4"}))
    for fmt in ("cu", "python", "cubin"):
        with pytest.raises(PorterError, match=r"^template 'gemm_fp8': tensor map over 'B': no "
                           r"TMA data type for element type 'e3m4'; known: ") as e:
            export(store, job_id, fmt, tmp_path / fmt)
        assert "\n" not in str(e.value)
        assert not (tmp_path / fmt).exists()          # refused before anything is written


# ---- a declared op: measured and exported with the declared dtype ---------------------------
class _Strided(_Arr):
    def __init__(self, shape, dtype, ptr):
        super().__init__(shape, dtype, ptr)
        self.strides = tuple(int(np.prod(shape[i + 1:])) * self.dtype.itemsize
                             for i in range(len(shape)))


def _declared_with_maps(tmp_path):
    """examples/softmax (float32 x, y) with a tensor map over x and one over y."""
    from porter.spec.template import load_template
    d = tmp_path / "softmax_tma"
    shutil.copytree(ROOT / "examples" / "softmax", d)
    (d / "space.toml").write_text((d / "space.toml").read_text() + '''
[[tensor_maps]]
buffer = "x"
box = ["32 * VEC", 8]
swizzle = 128

[[tensor_maps]]
buffer = "y"
box = [32, 8]
swizzle = 0
''')
    return load_template(d)


def test_declared_op_maps_carry_the_declared_dtype(tmp_path):
    from porter.export.opargs import map_dtypes
    tpl = _declared_with_maps(tmp_path)
    assert map_dtypes(tpl) == [("float32", "FLOAT32", 7, 4)] * 2


def test_declared_op_measures_with_the_buffers_element_size(monkeypatch):
    """The measuring child asks the declared op for each map: a float32 buffer is encoded with
    4-byte elements (it was encoded as a bf16 matrix), a bf16 one exactly as before."""
    from porter.measure import tma
    from porter.measure.ops.declared import DeclaredOp
    drv = _FakeDriver()
    drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = "f32"
    drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE = "NONE"
    monkeypatch.setattr(tma, "_driver", lambda: drv)
    op = object.__new__(DeclaredOp)              # tensor_map reads nothing but the state
    rows, cols = 1000, 4096
    state = {"arrays": {"x": _Strided((rows, cols), np.float32, 0x7f0000000000),
                        "h": _Strided((rows, cols), np.uint16, 0x7f0000100000)}}
    assert len(op.tensor_map(state, "x", (32, 8), 128)) == 128
    assert op.tensor_map(state, "x", (0, 8), 128) == bytes(128)          # unused map
    op.tensor_map(state, "h", (64, 8), 128)
    tma.encode_tiled_2d(0x7f0000100000, rows, cols, cols * 2, 64, 8, 128)   # the old path
    x, h, old = drv.calls
    assert x[:6] == ("f32", 2, 0x7f0000000000, [cols, rows], [cols * 4], [32, 8])
    assert h == old and h[0] == "bf16" and h[4] == [cols * 2]
    with pytest.raises(TemplateError, match="over x .*swizzle span"):
        op.tensor_map(state, "x", (64, 8), 128)          # 256 bytes: past the swizzle
