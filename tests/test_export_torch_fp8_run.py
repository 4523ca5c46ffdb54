"""The torch format for gemm_fp8, its results: the kernel's arguments, handed to a stand-in
kernel that computes what gemm_fp8 computes from them (its reference over the buffers' bytes),
give torch._scaled_mm's result on the CPU, through the registered ops too (the GPU test's
checks), and the op traces without a graph break (CPU with torch; skipped where torch is
absent, as on CI). GPU (marked `gpu`; sm_90 only): the torch op, its out variant and scaled_mm
on random e4m3 inputs, both scalings and both accumulations (the fast one: the package over a
fast job's module), tuned and untuned sizes, against the fp32 reference (the op's rtol) and
torch._scaled_mm. The jobs and packages are test_export_torch_fp8's fixtures.
"""
from __future__ import annotations

import pytest

from porter.measure.ops.gemm_fp8 import dequantize
from test_export_torch_fp8 import (RTOL, _meta, _scales, as_fast, exported,  # noqa: F401
                                   fast_module, job, pkg)


def _e4m3(torch, rows, K, rowwise, gen, device="cpu"):
    """Random rows of varied magnitude quantized to e4m3 with the op's scales (amax / 448),
    the scale in _scaled_mm's shape for a: (rows, 1) or ()."""
    x = torch.randn(rows, K, generator=gen, device=device)
    x = x * torch.exp(torch.rand(rows, 1, generator=gen, device=device) * 4 - 2)
    amax = x.abs().amax(dim=1, keepdim=True) if rowwise else x.abs().amax()
    scale = (amax.clamp_min(1e-12) / 448.0).float()
    return (x / scale).to(torch.float8_e4m3fn), scale


def _stand_in(torch, mod, calls):
    """A stand-in for TunedKernel.launch that does what the gemm_fp8 kernel does with its
    arguments (named by the exported module's SPEC): C = dequantized A @ dequantized B^T, the
    scales read as flat fp32 memory (sa [M] and sb [N] per row, else sa[0] and sb[0])."""
    names = [n for n, k in mod._kernel.SPEC["args"] if k != "workspace"]

    def launch(*args, size=None, stream=None):
        v = dict(zip(names, args))
        calls.append((v, size, stream))
        M, N, K, scaling = v["M"], v["N"], v["K"], v["scaling"]
        rowwise = scaling == 2
        sa, sb = v["scale_a"].reshape(-1).numpy(), v["scale_b"].reshape(-1).numpy()
        assert sa.size == (M if rowwise else 1) and sb.size == (N if rowwise else 1)
        A = dequantize(v["A"].view(torch.uint8).numpy(), sa, rowwise)
        B = dequantize(v["B"].view(torch.uint8).numpy(), sb, rowwise)
        assert A.shape == (M, K) and B.shape == (N, K)
        v["C"].copy_(torch.from_numpy(A @ B.T).to(torch.bfloat16))
        return {"size": list(size)}
    return launch


@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("use_fast_accum", [None, False, "fast None", "fast True"])
def test_kernel_arguments_give_scaled_mms_result(request, monkeypatch, rowwise, use_fast_accum):
    """What the package hands the kernel (order, scales, SCALING, the size with ACCUM) computes
    torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=torch.bfloat16) on the CPU."""
    fast = isinstance(use_fast_accum, str)
    torch, mod = request.getfixturevalue("as_fast" if fast else "pkg")
    if fast:
        use_fast_accum = {"fast None": None, "fast True": True}[use_fast_accum]
    calls = []
    monkeypatch.setattr(mod._kernel.KERNEL, "launch", _stand_in(torch, mod, calls))
    gen = torch.Generator().manual_seed(7)
    M, N, K = 130, 96, 272
    a, sa = _e4m3(torch, M, K, rowwise, gen)
    b, sb = _e4m3(torch, N, K, rowwise, gen)
    sb = sb.reshape(1, N) if rowwise else sb                 # _scaled_mm's (1, N)
    scaling = mod._check(a, b, sa, sb)
    accum = mod._accum(use_fast_accum)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    mod._launch(a, b, sa, sb, scaling, accum, out, 1234)
    (v, size, stream), = calls
    assert v["A"] is a and v["B"] is b and v["C"] is out and v["scale_a"] is sa
    assert v["scale_b"] is sb and stream == 1234
    assert size == (M, N, K, 2 if rowwise else 1, 1 if fast else 2)
    theirs = torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
    ref = ((a.double() * sa.double()) @ (b.double() * sb.double().reshape(-1, 1)).t())
    assert not out.isnan().any()
    assert _rel(torch, out, ref) <= RTOL and _rel(torch, out, theirs) <= RTOL


def test_traces_without_a_graph_break(pkg):
    torch, mod = pkg
    a, b = _meta(torch, 256, 64), _meta(torch, 128, 64)
    sa, sb = _scales(torch, 256, 128, True)

    def f(a, b, sa, sb):
        return (mod.run(a, b, sa, sb).float() * 2).sum() + mod.scaled_mm(
            a, b.t(), sa, sb, use_fast_accum=False)[0, 0]
    assert torch._dynamo.explain(f)(a, b, sa, sb).graph_break_count == 0


# ---- GPU ------------------------------------------------------------------------------------
def _rel(torch, a, b):
    return (torch.linalg.norm(a.double() - b.double()) / torch.linalg.norm(b.double())).item()


# the tuned size, then untuned ones: ragged M, N and K (no multiple of the tiles; N and K
# multiples of 16 as torch._scaled_mm asks), a long K
GPU_SHAPES = [(2048, 2048, 2048), (1000, 784, 2064), (130, 528, 272), (512, 1024, 8192)]


def _against_scaled_mm(torch, mod, fast, shapes, device):
    """The op, its out variant, scaled_mm and the default on random e4m3 inputs, per tensor and
    per row, against the fp32 (float64) reference of the dequantized inputs and _scaled_mm."""
    gen = torch.Generator(device=device).manual_seed(11)
    for M, N, K in shapes:
        for rowwise in (False, True):
            case = (M, N, K, "per row" if rowwise else "per tensor", "fast" if fast else
                    "promoted")
            a, sa = _e4m3(torch, M, K, rowwise, gen, device)
            b, sb = _e4m3(torch, N, K, rowwise, gen, device)
            sb = sb.reshape(1, N) if rowwise else sb
            ref = (a.double() * sa.double()) @ (b.double() * sb.double().reshape(-1, 1)).t()
            y = torch.ops.porter.gemm_fp8(a, b, sa, sb, fast)
            try:
                theirs = torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16,
                                          use_fast_accum=fast)
            except RuntimeError:
                if M % 16 == 0:
                    raise
                theirs = None       # a ragged M cuBLASLt / CUTLASS may refuse: reference only
            if device == "cuda":
                torch.cuda.synchronize()
            assert y.shape == (M, N) and y.dtype == torch.bfloat16 and y.device == a.device
            err = _rel(torch, y, ref)
            base = None if theirs is None else _rel(torch, theirs, ref)
            assert err <= RTOL, (case, err, base)
            if theirs is not None:
                assert _rel(torch, y, theirs) <= RTOL, (case, err, base)
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=device)
            torch.ops.porter.gemm_fp8_out(a, b, sa, sb, fast, out)
            assert torch.equal(out, y), case
            assert torch.equal(mod.scaled_mm(a, b.t(), sa, sb, use_fast_accum=fast), y), case
            assert torch.equal(torch.ops.porter.gemm_fp8(a, b, sa, sb), y), case   # the default


@pytest.mark.parametrize("fast", [False, True], ids=["promoted", "fast"])
def test_the_gpu_checks_pass_over_the_stand_in_kernel(request, monkeypatch, fast):
    """The GPU test's checks on the CPU, the kernel replaced by the stand-in (and the CUDA
    device check by nothing): what the op hands the kernel gives _scaled_mm's result through
    the registered ops too."""
    torch, mod = request.getfixturevalue("as_fast" if fast else "pkg")
    monkeypatch.setattr(mod._kernel.KERNEL, "launch", _stand_in(torch, mod, []))
    monkeypatch.setattr(mod, "_run", lambda a, b, sa, sb, scaling, accum, out:
                        mod._launch(a, b, sa, sb, scaling, accum, out, 0))
    _against_scaled_mm(torch, mod, fast, [(256, 384, 512), (130, 528, 272)], "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("fast", [False, True], ids=["promoted", "fast"])
def test_torch_op_matches_scaled_mm_on_the_gpu(request, fast):
    """The promoted job's package, and the same package over the fast job's module."""
    torch, mod = request.getfixturevalue("as_fast" if fast else "pkg")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("gemm_fp8 needs an sm_90 GPU")
    pytest.importorskip("cuda.bindings.driver")
    _against_scaled_mm(torch, mod, fast, GPU_SHAPES, "cuda")
