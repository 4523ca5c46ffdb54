"""The torch format's body for the gemm_fp8 ops (porter/export/fmt_torch.py has the others):
torch.ops.porter.NAME(a, b, scale_a, scale_b, use_fast_accum) as torch._scaled_mm(a, b.t(),
scale_a, scale_b, out_dtype=torch.bfloat16, use_fast_accum=...). @ADTYPE@ and @BDTYPE@ are a's
and b's torch dtypes (FP8_DTYPES: gemm_fp8 e4m3 both, gemm_fp8_e5m2 a in e5m2)."""

FP8_DTYPES = {"gemm_fp8": ("float8_e4m3fn", "float8_e4m3fn"),
              "gemm_fp8_e5m2": ("float8_e5m2", "float8_e4m3fn")}

GEMM_FP8 = '''
from typing import Optional

# the accumulations this export was tuned for (the size's ACCUM: 1 fast, 2 promoted to fp32).
# A job tunes one: the space ties ACCUM to PROMOTE, so no configuration serves both.
_ACCUM_AXIS = _kernel.DIMS.index("ACCUM")
ACCUMS = tuple(sorted({int(e["size"][_ACCUM_AXIS]) for e in _kernel.TABLE}))
_ACCUM_NAMES = {1: "fast (use_fast_accum=True)", 2: "promoted (use_fast_accum=False)"}


def _accum(use_fast_accum):
    """The size's ACCUM: True 1 (fast), False 2 (promoted to fp32), as torch._scaled_mm's flag;
    None 2 where this export was tuned for it, else 1."""
    if use_fast_accum is None:
        return 2 if 2 in ACCUMS else 1
    accum = 1 if use_fast_accum else 2
    torch._check(accum in ACCUMS, lambda: (
        f"porter::@NAME@: use_fast_accum={bool(use_fast_accum)} asks for "
        f"{_ACCUM_NAMES[accum].split()[0]} accumulation, which this export was not tuned for "
        f"(tuned: {', '.join(_ACCUM_NAMES[x] for x in ACCUMS)}); pass use_fast_accum=None"))
    return accum


def _scaling(a, b, scale_a, scale_b):
    """SCALING from the scales' shapes, as torch._scaled_mm reads them: one element each -> 1
    (per tensor); scale_a (M, 1) and scale_b (1, N) -> 2 (a scale per row of a and of b)."""
    M, N = a.shape[0], b.shape[0]
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return 1
    torch._check(tuple(scale_a.shape) == (M, 1) and tuple(scale_b.shape) == (1, N), lambda: (
        f"porter::@NAME@: scale_a and scale_b must hold one element each (per tensor) or be "
        f"({M}, 1) and (1, {N}) (per row of a and of b, as torch._scaled_mm takes them), got "
        f"{tuple(scale_a.shape)} and {tuple(scale_b.shape)}"))
    return 2


def _check(a, b, scale_a, scale_b):
    """The checks of every variant; returns SCALING."""
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: (
        f"porter::@NAME@: a (M x K) and b (N x K) must be 2-D, got {tuple(a.shape)} and "
        f"{tuple(b.shape)}"))
    torch._check(a.shape[1] == b.shape[1], lambda: (
        f"porter::@NAME@ computes (scale_a * a) @ (scale_b * b).T: a is {tuple(a.shape)}, b is "
        f"{tuple(b.shape)}; their second dimensions (K) must match"))
    torch._check(a.dtype == torch.@ADTYPE@ and b.dtype == torch.@BDTYPE@, lambda: (
        f"porter::@NAME@ takes @ADTYPE@ a and @BDTYPE@ b, got {a.dtype} and {b.dtype}"))
    torch._check(a.is_contiguous() and b.is_contiguous(), lambda: (
        "porter::@NAME@ needs contiguous (row-major) a (M x K) and b (N x K), b being "
        "torch._scaled_mm's second operand transposed; call .contiguous() first"))
    torch._check(a.shape[1] % 16 == 0, lambda: (
        f"porter::@NAME@: K = {a.shape[1]} must be a multiple of 16 (as torch._scaled_mm asks)"))
    torch._check(scale_a.dtype == torch.float32 and scale_b.dtype == torch.float32, lambda: (
        f"porter::@NAME@ takes float32 scales, got {scale_a.dtype} and {scale_b.dtype}"))
    torch._check(scale_a.is_contiguous() and scale_b.is_contiguous(), lambda: (
        "porter::@NAME@ needs contiguous scale_a and scale_b; call .contiguous() first"))
    return _scaling(a, b, scale_a, scale_b)


def _size(a, b, scaling, accum):
    """The kernel's problem size (the module's DIMS order: M, N, K, SCALING, ACCUM)."""
    dims = {"M": a.shape[0], "N": b.shape[0], "K": a.shape[1], "SCALING": scaling,
            "ACCUM": accum}
    return tuple(int(dims[d]) for d in _kernel.DIMS)


def _run(a, b, scale_a, scale_b, scaling, accum, out):
    torch._check(a.is_cuda and all(t.device == a.device for t in (b, scale_a, scale_b, out)),
                 lambda: (f"porter::@NAME@: a, b, scale_a, scale_b and out must be on one CUDA "
                          f"device, got {a.device}, {b.device}, {scale_a.device}, "
                          f"{scale_b.device}, {out.device}"))
    M, K = a.shape
    N = b.shape[0]
    if M == 0 or N == 0:
        return
    if K == 0:
        out.zero_()
        return
    with torch.cuda.device(a.device):
        _launch(a, b, scale_a, scale_b, scaling, accum, out,
                torch.cuda.current_stream().cuda_stream)


def _launch(a, b, scale_a, scale_b, scaling, accum, out, stream):
    """The kernel on the op's arguments in its order (A, B, C, scale_a, scale_b, M, N, K,
    scaling), the size given (the module cannot tell ACCUM from them): scale_a (M, 1) and
    scale_b (1, N), contiguous, are the kernel's per-row sa [M] and sb [N]."""
    M, K = a.shape
    N = b.shape[0]
    return _kernel.KERNEL.launch(a, b, out, scale_a, scale_b, M, N, K, scaling,
                                 size=_size(a, b, scaling, accum), stream=stream)


@torch.library.custom_op("porter::@NAME@", mutates_args=())
def @NAME@(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
           use_fast_accum: Optional[bool] = None) -> torch.Tensor:
    """(scale_a * a) @ (scale_b * b).T in bfloat16 with the tuned kernel, i.e.
    torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=torch.bfloat16): a M x K and b N x K
    @ADTYPE@ and @BDTYPE@, contiguous; float32 scales, one element each or (M, 1) and (1, N);
    use_fast_accum as _scaled_mm's, None: promoted where tuned, else fast."""
    scaling = _check(a, b, scale_a, scale_b)
    accum = _accum(use_fast_accum)
    out = torch.empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16, device=a.device)
    _run(a, b, scale_a, scale_b, scaling, accum, out)
    return out


@@NAME@.register_fake
def _(a, b, scale_a, scale_b, use_fast_accum=None):
    _check(a, b, scale_a, scale_b)
    _accum(use_fast_accum)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16)


@torch.library.custom_op("porter::@NAME@_out", mutates_args=("out",))
def @NAME@_out(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               use_fast_accum: Optional[bool], out: torch.Tensor) -> None:
    """The same, written into out (M x N, bfloat16, contiguous)."""
    scaling = _check(a, b, scale_a, scale_b)
    accum = _accum(use_fast_accum)
    _check_out(out, (a.shape[0], b.shape[0]))
    _run(a, b, scale_a, scale_b, scaling, accum, out)


@@NAME@_out.register_fake
def _(a, b, scale_a, scale_b, use_fast_accum, out):
    _check(a, b, scale_a, scale_b)
    _accum(use_fast_accum)
    _check_out(out, (a.shape[0], b.shape[0]))


def scaled_mm(a, b, scale_a, scale_b, *, out_dtype=torch.bfloat16, use_fast_accum=None,
              out=None):
    """torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16) with its own operands:
    b is K x N column-major (weight.t()); no bias, no scale_result, bfloat16 out only."""
    torch._check(out_dtype == torch.bfloat16, lambda: (
        f"porter::@NAME@ writes bfloat16, not {out_dtype}"))
    return run(a, b.t(), scale_a, scale_b, use_fast_accum, out=out)


def run(a, b, scale_a, scale_b, use_fast_accum=None, *, out=None):
    if out is None:
        return torch.ops.porter.@NAME@(a, b, scale_a, scale_b, use_fast_accum)
    torch.ops.porter.@NAME@_out(a, b, scale_a, scale_b, use_fast_accum, out)
    return out
'''
