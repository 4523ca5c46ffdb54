"""The torch format for gemm_fp8: torch.ops.porter.gemm_fp8(a, b, scale_a, scale_b,
use_fast_accum=None) == torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=torch.bfloat16).

CPU, no torch: a compile-only sm_90a job (promoted accumulation; a job tunes one) exports a
package whose __init__.py registers porter::gemm_fp8 and gemm_fp8_out with fake
implementations and their input checks, names the tuned accumulation, and compiles as Python.
CPU with torch (skipped where torch is absent, as on CI): the package imports; on the meta
device the fake implementations give _scaled_mm's shapes and refuse bad inputs in one line
(dtype, contiguity, K, scale shapes, out, an accumulation that was not tuned); SCALING comes
from the scales' shapes and ACCUM from use_fast_accum (None: promoted where tuned, else fast:
the package over a fast job's module). The stand-in kernel's results and the GPU test are in
test_export_torch_fp8_run.py, on this module's fixtures.
"""
from __future__ import annotations

import ast
import sys
import warnings

import pytest

from porter.export.export import export
from porter.export.fmt_torch import torch_package
from porter.measure.ops.gemm_fp8 import GemmFp8Op
from porter.spec.template import find_template
from porter.store.base import open_store
from test_export import _load_module

# a job tunes one accumulation (ACCUM is tied to PROMOTE): promoted, per tensor and per row
SIZES = ["2048x2048x2048x1x2", "1024x4096x4096x2x2"]
FAST_SIZES = ["2048x2048x2048x2x1"]
RTOL = GemmFp8Op.rtol


def _job(tmp_path_factory, sizes):
    from conftest import replay_job
    tmp = tmp_path_factory.mktemp("fp8torch")
    store = open_store(f"sqlite:///{tmp / 'f.db'}")
    job_id = replay_job(store, "gemm_fp8", None, arch="sm_90a", trials=1, sizes=sizes,
                        backend="compile-only", workers=1)
    return store, job_id


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return _job(tmp_path_factory, SIZES)


@pytest.fixture(scope="module")
def fast_module(tmp_path_factory):
    """The python module of a job tuned for fast accumulation (what a fast job's package holds
    as _kernel: the package's text is the same but for the docstring)."""
    store, job_id = _job(tmp_path_factory, FAST_SIZES)
    out = tmp_path_factory.mktemp("fastpy")
    return _load_module(next(p for p in export(store, job_id, "python", out)
                             if p.suffix == ".py"))


@pytest.fixture
def as_fast(pkg, fast_module, monkeypatch):
    """The package over the fast job's module."""
    torch, mod = pkg
    tuned = tuple(sorted({e["size"][mod._ACCUM_AXIS] for e in fast_module.TABLE}))
    assert tuned == (1,)
    monkeypatch.setattr(mod, "_kernel", fast_module)
    monkeypatch.setattr(mod, "ACCUMS", tuned)
    return torch, mod


@pytest.fixture(scope="module")
def exported(job, tmp_path_factory):
    store, job_id = job
    out = tmp_path_factory.mktemp("pkg")
    paths = export(store, job_id, "torch", out)
    return out, paths


@pytest.fixture(scope="module")
def pkg(exported):
    """The imported package (once per session: it registers porter::gemm_fp8)."""
    torch = pytest.importorskip("torch")
    out, _ = exported
    sys.path.insert(0, str(out))
    try:
        mod = __import__("gemm_fp8_torch")
    finally:
        sys.path.remove(str(out))
    return torch, mod


# ---- the package's text (no torch) ----------------------------------------------------------
def _flat(text):
    return " ".join(text.split())


def test_e5m2_variant_package_takes_e5m2_a(tmp_path):
    """gemm_fp8_e5m2's package checks for float8_e5m2 a and float8_e4m3fn b and says so."""
    init = torch_package(find_template("gemm_fp8_e5m2"), "sm_90a", [{"size": [64, 64, 64, 1, 1]}])
    assert "@" + "ADTYPE@" not in init and "@" + "BDTYPE@" not in init
    assert "a.dtype == torch.float8_e5m2 and b.dtype == torch.float8_e4m3fn" in init
    assert "takes float8_e5m2 a and float8_e4m3fn b" in init
    assert 'custom_op("porter::gemm_fp8_e5m2", mutates_args=())' in init
    assert "a (M x K) float8_e5m2 and b (N x K) float8_e4m3fn" in _flat(init)
    ast.parse(init)


def test_package_registers_the_op_with_its_checks(exported):
    out, paths = exported
    d = out / "gemm_fp8_torch"
    assert (d / "__init__.py").is_file() and (d / "_kernel.py").is_file()
    assert sum(p.suffix == ".cubin" and p.parent == d for p in paths) == 1
    init = (d / "__init__.py").read_text()
    assert 'custom_op("porter::gemm_fp8", mutates_args=())' in init
    assert 'custom_op("porter::gemm_fp8_out", mutates_args=("out",))' in init
    assert init.count("@gemm_fp8.register_fake") == 1
    assert init.count("@gemm_fp8_out.register_fake") == 1
    for check in ("a.dtype == torch.float8_e4m3fn and b.dtype == torch.float8_e4m3fn",
                  "takes float8_e4m3fn a and float8_e4m3fn b",
                  "their second dimensions (K) must match",
                  "must be a multiple of 16", "needs contiguous (row-major) a (M x K) and b",
                  "scale_a.dtype == torch.float32 and scale_b.dtype == torch.float32",
                  "needs contiguous scale_a and scale_b",
                  "tuple(scale_a.shape) == (M, 1) and tuple(scale_b.shape) == (1, N)",
                  "scale_a.numel() == 1 and scale_b.numel() == 1",
                  "which this export was not tuned for",
                  "_check_out(out, (a.shape[0], b.shape[0]))",
                  "scale_a, scale_b and out must be on one CUDA "):
        assert check in init, check
    # the usage names _scaled_mm, the tuned accumulations and the default
    flat = _flat(init)
    assert "# == torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)" in flat
    assert "Tuned here: promoted (ACCUM 2) (gemm_fp8_torch.ACCUMS)" in flat
    assert "None (the default) promoted where this export was tuned for it" in flat
    assert "@NAME@" not in init and "@ACCUMS@" not in init and "@USAGE@" not in init


def test_package_compiles_as_python_with_the_ops_signatures(exported):
    out, _ = exported
    d = out / "gemm_fp8_torch"
    init = (d / "__init__.py").read_text()
    compile(init, str(d / "__init__.py"), "exec")
    compile((d / "_kernel.py").read_text(), str(d / "_kernel.py"), "exec")
    funcs = {f.name: f for f in ast.parse(init).body if isinstance(f, ast.FunctionDef)}
    args = {n: [a.arg for a in f.args.args] for n, f in funcs.items()}
    assert args["gemm_fp8"] == ["a", "b", "scale_a", "scale_b", "use_fast_accum"]
    assert args["gemm_fp8_out"] == ["a", "b", "scale_a", "scale_b", "use_fast_accum", "out"]
    assert ast.unparse(funcs["gemm_fp8"].decorator_list[0]) == \
        "torch.library.custom_op('porter::gemm_fp8', mutates_args=())"
    assert ast.unparse(funcs["gemm_fp8_out"].decorator_list[0]) == \
        "torch.library.custom_op('porter::gemm_fp8_out', mutates_args=('out',))"
    assert ast.unparse(funcs["gemm_fp8"].args.defaults[0]) == "None"
    assert {"scaled_mm", "run", "_check", "_scaling", "_accum", "_launch"} <= set(funcs)


def test_usage_names_what_was_tuned():
    tpl = find_template("gemm_fp8")
    promoted = _flat(torch_package(tpl, "sm_90a", [{"size": [4096, 4096, 4096, 1, 2]}]))
    assert "Tuned here: promoted (ACCUM 2) (gemm_fp8_torch.ACCUMS)" in promoted
    fast = _flat(torch_package(tpl, "sm_90a", [{"size": [4096, 4096, 4096, 2, 1]}] * 2))
    assert "Tuned here: fast (ACCUM 1) (gemm_fp8_torch.ACCUMS)" in fast
    assert "Tuned here: not listed" in _flat(torch_package(tpl, "sm_90a"))
    both = _flat(torch_package(tpl, "sm_90a", [{"size": [8, 8, 16, 1, 2]},
                                               {"size": [8, 8, 16, 1, 1]}]))
    assert "Tuned here: fast (ACCUM 1), promoted (ACCUM 2)" in both


# ---- with torch, on the CPU -----------------------------------------------------------------
def _meta(torch, *shape, dtype=None):
    return torch.empty(*shape, dtype=dtype or torch.float8_e4m3fn, device="meta")


def _scales(torch, M, N, rowwise, device="meta"):
    if rowwise:
        return (torch.ones(M, 1, device=device), torch.ones(1, N, device=device))
    return torch.ones((), device=device), torch.ones((), device=device)


@pytest.mark.parametrize("kind", ["0-dim", "1-element", "rowwise"])
def test_fake_gives_scaled_mms_shape(pkg, kind):
    torch, mod = pkg
    M, N, K = 256, 128, 64
    a, b = _meta(torch, M, K), _meta(torch, N, K)
    if kind == "rowwise":
        sa, sb = torch.empty(M, 1, device="meta"), torch.empty(1, N, device="meta")
    elif kind == "0-dim":
        sa, sb = torch.empty((), device="meta"), torch.empty((), device="meta")
    else:
        sa, sb = torch.empty(1, device="meta"), torch.empty(1, device="meta")
    assert mod._scaling(a, b, sa, sb) == (2 if kind == "rowwise" else 1)
    y = torch.ops.porter.gemm_fp8(a, b, sa, sb)
    theirs = torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
    assert y.shape == theirs.shape == (M, N) and y.dtype == theirs.dtype == torch.bfloat16
    assert y.device.type == "meta"
    out = torch.empty(M, N, dtype=torch.bfloat16, device="meta")
    assert torch.ops.porter.gemm_fp8_out(a, b, sa, sb, None, out) is None
    assert mod.run(a, b, sa, sb, False, out=out) is out
    assert mod.scaled_mm(a, b.t(), sa, sb).shape == (M, N)


def _bad_inputs(torch):
    M, N, K = 256, 128, 64
    a, b = _meta(torch, M, K), _meta(torch, N, K)
    one = torch.empty((), device="meta")
    ra, rb = torch.empty(M, 1, device="meta"), torch.empty(1, N, device="meta")
    return [
        ((a.to(torch.bfloat16), b, one, one), r"takes float8_e4m3fn a and float8_e4m3fn b, got "
                                              r"torch.bfloat16 and torch.float8_e4m3fn"),
        ((a, _meta(torch, N, K, dtype=torch.float8_e5m2), one, one), "takes float8_e4m3fn"),
        ((a, _meta(torch, N, 2 * K), one, one), r"a is \(256, 64\), b is \(128, 128\); their "
                                                r"second dimensions \(K\) must match"),
        ((_meta(torch, 2, M, K), b, one, one), "must be 2-D"),
        ((_meta(torch, M, 40), _meta(torch, N, 40), one, one), "K = 40 must be a multiple of 16"),
        ((_meta(torch, M, M), _meta(torch, M, M).t(), one, one),       # _scaled_mm's b, not b.t()
         r"needs contiguous \(row-major\) a \(M x K\) and b \(N x K\)"),
        ((a, b, torch.empty(M, device="meta"), torch.empty(N, device="meta")),  # the kernel's own
         r"must hold one element each \(per tensor\) or be \(256, 1\) and \(1, 128\) .*got "
         r"\(256,\) and \(128,\)"),
        ((a, b, one, rb), r"must hold one element each .*got \(\) and \(1, 128\)"),
        ((a, b, rb, ra), r"must hold one element each"),
        ((a, b, ra.double(), rb.double()), "takes float32 scales, got torch.float64"),
        ((a, b, one.to(torch.bfloat16), one), "takes float32 scales"),
        ((a, b, torch.empty(M, 2, device="meta")[:, :1], rb),
         "needs contiguous scale_a and scale_b"),
    ]


def test_bad_inputs_are_refused_in_one_line(pkg):
    torch, mod = pkg
    for args, match in _bad_inputs(torch):
        with pytest.raises(RuntimeError, match=match) as e:
            torch.ops.porter.gemm_fp8(*args)
        assert "porter::gemm_fp8" in str(e.value) and "\n" not in str(e.value).strip(), match
        out = torch.empty(256, 128, dtype=torch.bfloat16, device="meta")
        with pytest.raises(RuntimeError, match=match):
            torch.ops.porter.gemm_fp8_out(*args, None, out)


def test_out_is_checked(pkg):
    torch, mod = pkg
    a, b = _meta(torch, 256, 64), _meta(torch, 128, 64)
    sa, sb = _scales(torch, 256, 128, True)
    with pytest.raises(RuntimeError, match=r"out must have shape \(256, 128\), got \(128, 256\)"):
        torch.ops.porter.gemm_fp8_out(a, b, sa, sb, None,
                                      torch.empty(128, 256, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(RuntimeError, match="out must be a contiguous bfloat16 tensor"):
        torch.ops.porter.gemm_fp8_out(a, b, sa, sb, None, torch.empty(256, 128, device="meta"))
    with pytest.raises(RuntimeError, match="writes bfloat16, not torch.float16"):
        mod.scaled_mm(a, b.t(), sa, sb, out_dtype=torch.float16)


def test_cpu_tensors_are_refused_by_the_real_op(pkg):
    torch, _ = pkg
    a = torch.zeros(32, 64).to(torch.float8_e4m3fn)
    b = torch.zeros(48, 64).to(torch.float8_e4m3fn)
    sa, sb = _scales(torch, 32, 48, False, device="cpu")
    with pytest.raises(RuntimeError, match="must be on one CUDA device, got cpu"):
        torch.ops.porter.gemm_fp8(a, b, sa, sb)


def test_accumulation_default_and_refusal(pkg, monkeypatch):
    torch, mod = pkg
    assert mod.ACCUMS == (2,)
    assert mod._accum(None) == 2 and mod._accum(False) == 2
    a, b = _meta(torch, 256, 64), _meta(torch, 128, 64)
    sa, sb = _scales(torch, 256, 128, False)
    with pytest.raises(RuntimeError, match=r"use_fast_accum=True asks for fast accumulation, "
                       r"which this export was not tuned for \(tuned: promoted "
                       r"\(use_fast_accum=False\)\); pass use_fast_accum=None"):
        torch.ops.porter.gemm_fp8(a, b, sa, sb, True)
    with pytest.raises(RuntimeError, match="use_fast_accum=True asks for fast accumulation"):
        torch.ops.porter.gemm_fp8_out(a, b, sa, sb, True,
                                      torch.empty(256, 128, dtype=torch.bfloat16, device="meta"))
    monkeypatch.setattr(mod, "ACCUMS", (1,))                 # an export tuned for fast only
    assert mod._accum(None) == 1 and mod._accum(True) == 1
    with pytest.raises(RuntimeError, match=r"use_fast_accum=False asks for promoted "
                       r"accumulation, which this export was not tuned for \(tuned: fast "
                       r"\(use_fast_accum=True\)\)"):
        torch.ops.porter.gemm_fp8(a, b, sa, sb, False)
    assert torch.ops.porter.gemm_fp8(a, b, sa, sb).shape == (256, 128)
    monkeypatch.setattr(mod, "ACCUMS", (1, 2))               # both (not from one job)
    assert (mod._accum(None), mod._accum(True), mod._accum(False)) == (2, 1, 2)


def test_the_size_selects_an_entry_of_its_accumulation(pkg, fast_module):
    """The package's size (M, N, K, SCALING, ACCUM) selects a legal entry, tuned or not, for
    either scaling; PROMOTE matches the accumulation."""
    _, mod = pkg
    assert {tuple(e["size"]) for e in mod._kernel.TABLE} == {
        (2048, 2048, 2048, 1, 2), (1024, 4096, 4096, 2, 2)}
    for kernel, accum in ((mod._kernel.KERNEL, 2), (fast_module.KERNEL, 1)):
        for M, N, K in ((2048, 2048, 2048), (1000, 784, 2064), (130, 528, 272),
                        (8192, 8192, 8192)):
            for scaling in (1, 2):
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    entry = kernel.select((M, N, K, scaling, accum))
                assert (entry["params"]["PROMOTE"] > 0) == (accum == 2), entry["params"]
