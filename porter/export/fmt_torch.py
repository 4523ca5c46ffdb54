"""The `torch` format: a package that registers the tuned kernel as a PyTorch custom op
(torch.library), with a fake implementation so torch.compile traces through it without a graph
break. It launches through the `python` format's module (copied in as _kernel.py) on the
current CUDA stream. Ops: gemm (torch.ops.porter.NAME(a, b) == a @ b.T), rmsnorm
(torch.ops.porter.NAME(x, weight, eps) == F.rms_norm(x, (cols,), weight, eps)), attention
(torch.ops.porter.NAME(q, k, v, is_causal, scale) == (F.scaled_dot_product_attention(q, k, v,
is_causal=is_causal, scale=scale, enable_gqa=True), its log-sum-exp)) and gemm_fp8
(torch.ops.porter.NAME(a, b, scale_a, scale_b, use_fast_accum=None) ==
torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=torch.bfloat16, use_fast_accum=...):
SCALING from the scales' shapes, ACCUM from use_fast_accum, None meaning promoted where the
export was tuned for it), each with an out variant (NAME_out)."""
from __future__ import annotations

from porter.errors import PorterError
from porter.export.fmt_torch_fp8 import FP8_DTYPES, GEMM_FP8
from porter.spec.template import Template

_GEMM = '''
def _check(a, b):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: (
        f"porter::@NAME@: a (M x K) and b (N x K) must be 2-D, got {tuple(a.shape)} and "
        f"{tuple(b.shape)}"))
    torch._check(a.shape[1] == b.shape[1], lambda: (
        f"porter::@NAME@ computes a @ b.T: a is {tuple(a.shape)}, b is {tuple(b.shape)}; "
        "their second dimensions (K) must match"))
    torch._check(a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16, lambda: (
        f"porter::@NAME@ takes bfloat16 tensors, got {a.dtype} and {b.dtype}"))
    torch._check(a.is_contiguous() and b.is_contiguous(), lambda: (
        "porter::@NAME@ needs contiguous (row-major) a and b; call .contiguous() first"))


def _run(a, b, out):
    torch._check(a.is_cuda and b.device == a.device and out.device == a.device, lambda: (
        f"porter::@NAME@: a, b and out must be on one CUDA device, got {a.device}, "
        f"{b.device}, {out.device}"))
    M, K = a.shape
    N = b.shape[0]
    if M == 0 or N == 0:
        return
    if K == 0:
        out.zero_()
        return
    with torch.cuda.device(a.device):
        _kernel.launch(a, b, out, M, N, K, stream=torch.cuda.current_stream().cuda_stream)


@torch.library.custom_op("porter::@NAME@", mutates_args=())
def @NAME@(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T with the tuned kernel: a is M x K, b is N x K (bfloat16, contiguous)."""
    _check(a, b)
    out = torch.empty((a.shape[0], b.shape[0]), dtype=a.dtype, device=a.device)
    _run(a, b, out)
    return out


@@NAME@.register_fake
def _(a, b):
    _check(a, b)
    return a.new_empty((a.shape[0], b.shape[0]))


@torch.library.custom_op("porter::@NAME@_out", mutates_args=("out",))
def @NAME@_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out = a @ b.T, written into out (M x N, bfloat16, contiguous)."""
    _check(a, b)
    _check_out(out, (a.shape[0], b.shape[0]))
    _run(a, b, out)


@@NAME@_out.register_fake
def _(a, b, out):
    _check(a, b)
    _check_out(out, (a.shape[0], b.shape[0]))


def linear(x, weight):
    """torch.nn.functional.linear(x, weight) without bias (x @ weight.T) for x of any rank."""
    y = torch.ops.porter.@NAME@(x.reshape(-1, x.shape[-1]), weight)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def run(a, b, *, out=None):
    if out is None:
        return torch.ops.porter.@NAME@(a, b)
    torch.ops.porter.@NAME@_out(a, b, out)
    return out
'''

_RMSNORM = '''
def _check(x, weight):
    torch._check(x.dim() >= 1 and weight.dim() == 1 and x.shape[-1] == weight.shape[0],
                 lambda: (f"porter::@NAME@ normalises the last dimension of x {tuple(x.shape)} "
                          f"with a weight of that length, got {tuple(weight.shape)}"))
    torch._check(x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16, lambda: (
        f"porter::@NAME@ takes bfloat16 tensors, got {x.dtype} and {weight.dtype}"))
    torch._check(x.is_contiguous() and weight.is_contiguous(), lambda: (
        "porter::@NAME@ needs contiguous x and weight; call .contiguous() first"))


def _run(x, weight, eps, out):
    torch._check(x.is_cuda and weight.device == x.device and out.device == x.device,
                 lambda: f"porter::@NAME@: x, weight and out must be on one CUDA device")
    cols = x.shape[-1]
    rows = x.numel() // cols if cols else 0
    if rows == 0:
        return
    with torch.cuda.device(x.device):
        _kernel.launch(x, weight, out, rows, cols, float(eps),
                       stream=torch.cuda.current_stream().cuda_stream)


@torch.library.custom_op("porter::@NAME@", mutates_args=())
def @NAME@(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension with the tuned kernel (bfloat16, contiguous)."""
    _check(x, weight)
    out = torch.empty_like(x)
    _run(x, weight, eps, out)
    return out


@@NAME@.register_fake
def _(x, weight, eps=1e-6):
    _check(x, weight)
    return torch.empty_like(x)


@torch.library.custom_op("porter::@NAME@_out", mutates_args=("out",))
def @NAME@_out(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """RMSNorm of x written into out (x's shape, bfloat16, contiguous)."""
    _check(x, weight)
    _check_out(out, tuple(x.shape))
    _run(x, weight, eps, out)


@@NAME@_out.register_fake
def _(x, weight, eps, out):
    _check(x, weight)
    _check_out(out, tuple(x.shape))


def run(x, weight, eps=1e-6, *, out=None):
    if out is None:
        return torch.ops.porter.@NAME@(x, weight, eps)
    torch.ops.porter.@NAME@_out(x, weight, eps, out)
    return out
'''

_ATTENTION = '''
import math
from typing import Optional


def _check(q, k, v):
    torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4, lambda: (
        f"porter::@NAME@: q (B, H, S, D), k and v (B, HKV, S, D) must be 4-D, got "
        f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"))
    torch._check(k.shape == v.shape and q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2]
                 and q.shape[3] == k.shape[3], lambda: (
        f"porter::@NAME@: k and v must be (B, HKV, S, D) with q's B, S and D: q "
        f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"))
    torch._check(k.shape[1] >= 1 and q.shape[1] % k.shape[1] == 0, lambda: (
        f"porter::@NAME@: q's {q.shape[1]} heads must be a multiple of k's {k.shape[1]}"))
    torch._check(all(t.dtype == torch.bfloat16 for t in (q, k, v)), lambda: (
        f"porter::@NAME@ takes bfloat16 tensors, got {q.dtype}, {k.dtype}, {v.dtype}"))
    torch._check(q.is_contiguous() and k.is_contiguous() and v.is_contiguous(), lambda: (
        "porter::@NAME@ needs contiguous q, k and v; call .contiguous() first"))


def _run(q, k, v, is_causal, scale, out, lse):
    torch._check(q.is_cuda and all(t.device == q.device for t in (k, v, out, lse)), lambda: (
        "porter::@NAME@: q, k, v, out and lse must be on one CUDA device"))
    B, H, S, D = q.shape
    if B == 0 or H == 0 or S == 0:
        return
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    causal = int(bool(is_causal))
    with torch.cuda.device(q.device):
        _kernel.launch(q, k, v, out, lse, B, H, k.shape[1], S, causal, scale,
                       size=(B, H, k.shape[1], S, D, causal + 1),
                       stream=torch.cuda.current_stream().cuda_stream)


@torch.library.custom_op("porter::@NAME@", mutates_args=())
def @NAME@(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
           scale: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward with the tuned kernel: (out (B, H, S, D) bfloat16, lse (B, H, S)
    float32, the natural log-sum-exp of each row's scaled scores); q (B, H, S, D), k and v
    (B, HKV, S, D), H a multiple of HKV (grouped-query attention); scale 1 / sqrt(D) if None."""
    _check(q, k, v)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    _run(q, k, v, is_causal, scale, out, lse)
    return out, lse


@@NAME@.register_fake
def _(q, k, v, is_causal=False, scale=None):
    _check(q, k, v)
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("porter::@NAME@_out", mutates_args=("out", "lse"))
def @NAME@_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
               scale: Optional[float], out: torch.Tensor, lse: torch.Tensor) -> None:
    """The same, written into out (q's shape, bfloat16) and lse ((B, H, S), float32)."""
    _check(q, k, v)
    _check_out(out, tuple(q.shape))
    torch._check(tuple(lse.shape) == tuple(q.shape[:3]) and lse.dtype == torch.float32
                 and lse.is_contiguous(), lambda: (
        f"porter::@NAME@: lse must be a contiguous float32 tensor of shape "
        f"{tuple(q.shape[:3])}"))
    _run(q, k, v, is_causal, scale, out, lse)


@@NAME@_out.register_fake
def _(q, k, v, is_causal, scale, out, lse):
    _check(q, k, v)
    _check_out(out, tuple(q.shape))


def sdpa(q, k, v, is_causal=False, scale=None):
    """F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale,
    enable_gqa=True) without mask or dropout: the output only."""
    return torch.ops.porter.@NAME@(q, k, v, is_causal, scale)[0]


def run(q, k, v, is_causal=False, scale=None, *, out=None, lse=None):
    if out is None and lse is None:
        return torch.ops.porter.@NAME@(q, k, v, is_causal, scale)
    out = torch.empty_like(q) if out is None else out
    lse = q.new_empty(q.shape[:3], dtype=torch.float32) if lse is None else lse
    torch.ops.porter.@NAME@_out(q, k, v, is_causal, scale, out, lse)
    return out, lse
'''


_HEAD = '''"""@NAME@ tuned by Kernel Porter for @ARCH@, as a PyTorch custom op.

    import @NAME@_torch            # registers torch.ops.porter.@NAME@ and @NAME@_out
@USAGE@
The op runs on the current CUDA stream; a fake implementation lets torch.compile trace it
without a graph break. No autograd formula is registered (inference). Sizes that were not
tuned run the nearest tuned configuration that is legal there (see _kernel.select).
"""
import torch

from . import _kernel


def _check_out(out, shape):
    torch._check(tuple(out.shape) == tuple(shape), lambda: (
        f"porter::@NAME@: out must have shape {tuple(shape)}, got {tuple(out.shape)}"))
    torch._check(out.dtype == torch.bfloat16 and out.is_contiguous(), lambda: (
        "porter::@NAME@: out must be a contiguous bfloat16 tensor"))
'''

_USAGE = {
    "gemm": """    y = torch.ops.porter.@NAME@(a, b)       # a @ b.T: a M x K, b N x K, bfloat16
    torch.ops.porter.@NAME@_out(a, b, y)    # into an existing y
    y = @NAME@_torch.linear(x, W)           # F.linear(x, W) (no bias) for x of any rank
""",
    "rmsnorm": """    y = torch.ops.porter.@NAME@(x, w, 1e-6)      # F.rms_norm(x, (x.shape[-1],), w, 1e-6)
    torch.ops.porter.@NAME@_out(x, w, 1e-6, y)   # into an existing y
""",
    "attention": """    o, lse = torch.ops.porter.@NAME@(q, k, v, True, None)   # causal; None: 1/sqrt(D)
    o = @NAME@_torch.sdpa(q, k, v, is_causal=True)        # output only, as F.sdpa
    torch.ops.porter.@NAME@_out(q, k, v, True, None, o, lse)   # into existing o, lse
q is (B, H, S, D), k and v (B, HKV, S, D) with H a multiple of HKV (as SDPA's enable_gqa),
bfloat16 and contiguous; lse is (B, H, S) float32, the natural log-sum-exp of each row.
""",
    "gemm_fp8": """\
    y = torch.ops.porter.@NAME@(a, b, sa, sb)
        # == torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
    y = torch.ops.porter.@NAME@(a, b, sa, sb, False)     # use_fast_accum=False: promoted
    torch.ops.porter.@NAME@_out(a, b, sa, sb, None, y)   # into an existing y
    y = @NAME@_torch.scaled_mm(a, b.t(), sa, sb)         # with _scaled_mm's own operands
a (M x K) @ADTYPE@ and b (N x K) @BDTYPE@, contiguous, K a multiple of 16; y (M x N) bfloat16,
y[i, j] = sa[i] * sb[j] * sum_k a[i, k] * b[j, k]. Scales float32, as torch._scaled_mm takes
them: one element each (per tensor; 0-dim will do) or sa (M, 1) and sb (1, N) (a scale per row
of a and per row of b). use_fast_accum as _scaled_mm's: True fast accumulation, False promoted
to fp32; None (the default) promoted where this export was tuned for it, else fast.
Tuned here: @ACCUMS@ (@NAME@_torch.ACCUMS).
An accumulation that was not tuned is refused (a job tunes one: sizes ending x1 fast, x2
promoted).
""",
}
_BODY = {"gemm": _GEMM, "rmsnorm": _RMSNORM, "attention": _ATTENTION}
for _op in FP8_DTYPES:   # the fp8 ops share one body and usage, their operand dtypes filled in
    _BODY[_op], _USAGE[_op] = GEMM_FP8, _USAGE["gemm_fp8"]
_ACCUM_TEXT = {1: "fast (ACCUM 1)", 2: "promoted (ACCUM 2)"}


def torch_package(tpl: Template, arch: str, rows: list[dict] | None = None) -> str:
    """The package's __init__.py (the module and cubins go beside it). `rows`, the tuned table
    (each with its "size"), names gemm_fp8's tuned accumulations in the docstring."""
    if tpl.op not in _BODY:
        raise PorterError(f"the torch format covers the gemm, gemm_fp8, gemm_fp8_e5m2, rmsnorm "
                          f"and attention ops; template {tpl.name!r} is a {tpl.op!r} op: export "
                          "it as python or cu")
    text = (_HEAD.replace("@USAGE@", _USAGE[tpl.op]) + _BODY[tpl.op])
    if tpl.op in FP8_DTYPES:
        adtype, bdtype = FP8_DTYPES[tpl.op]
        text = text.replace("@ADTYPE@", adtype).replace("@BDTYPE@", bdtype)
        axis = list(tpl.size_names).index("ACCUM")
        tuned = sorted({int(r["size"][axis]) for r in rows or []})
        text = text.replace("@ACCUMS@", ", ".join(_ACCUM_TEXT.get(x, f"ACCUM {x}")
                                                  for x in tuned) or "not listed")
    return text.replace("@NAME@", tpl.name).replace("@ARCH@", arch)
