"""fp8 GEMM: C = (sa * A) (sb * B)^T in bf16, A [M, K] and B [N, K] row-major e4m3 (op
gemm_fp8), or A e5m2 and B e4m3 (op gemm_fp8_e5m2: gradients times weights, as fp8 training's
backward pass has them).

Sizes M, N, K, SCALING, ACCUM. SCALING 1: per-tensor scales (sa, sb one float each); 2: a scale
per row of A (sa [M]) and per column of C, i.e. per row of B (sb [N]). ACCUM names the
accumulation the problem asks for and so the baseline: 1 fast (torch._scaled_mm with
use_fast_accum=True), 2 promoted to fp32 (use_fast_accum=False). Kernel arguments: A, B, C,
scale_a, scale_b, int M, N, K, scaling, void* workspace, then the template's tensor maps (A and B
over bytes, C over bf16: `tensor_map` builds them).

Inputs are random normal rows of varied magnitude (e^u, u uniform in [-2, 2], per row), quantized
to e4m3 (e5m2) with the scales each mode would choose (amax / 448; e5m2: amax / 57344). The
reference is the fp32 GEMM of the dequantized inputs, so it holds no quantization error: what
is measured is the kernel's own (accumulation, bf16 output), as for the baseline on the same
inputs.
e4m3 and e5m2 conversions are exact table look-ups (round to nearest even, saturating at 448
and 57344) that work on NumPy and CuPy arrays alike.
"""
from __future__ import annotations

import ctypes

import numpy as np

from porter.errors import TemplateError
from porter.measure.ops._bf16 import _xp, from_bf16, rel_error
from porter.measure.ops.base import Op

E4M3_MAX = 448.0


def _e4m3_table() -> np.ndarray:
    """The value of every e4m3fn code 0..255 (0x7F and 0xFF: NaN), float32."""
    c = np.arange(256)
    s, e, m = c >> 7, (c >> 3) & 15, c & 7
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    v = np.where(s == 1, -mag, mag)
    v[(e == 15) & (m == 7)] = np.nan
    return v.astype(np.float32)


E4M3 = _e4m3_table()
E5M2_MAX = 57344.0


def _e5m2_table() -> np.ndarray:
    """The value of every e5m2 code 0..255 (exponent 31: infinities and NaN), float32: the top
    byte of an IEEE half."""
    return (np.arange(256, dtype=np.uint16) << 8).view(np.float16).astype(np.float32)


E5M2 = _e5m2_table()
# per format: its table, largest finite value, and the codes 0.. of its finite non-negative
# values in ascending order (e4m3fn: 0..126, 0x7F is NaN; e5m2: 0..123, 0x7C is infinity)
FORMATS = {"e4m3": (E4M3, E4M3_MAX, 127), "e5m2": (E5M2, E5M2_MAX, 124)}


def from_fp8(codes, fmt: str = "e4m3"):
    """uint8 codes of `fmt` -> float32 values."""
    xp = _xp(codes)
    return xp.asarray(FORMATS[fmt][0])[codes]


def to_fp8(x, fmt: str = "e4m3"):
    """float32 array -> uint8 codes of `fmt`: round to nearest, ties to the even code,
    magnitudes past the largest finite value saturated (no infinities are produced)."""
    table, top, n = FORMATS[fmt]
    xp = _xp(x)
    pos = xp.asarray(table[:n])                   # the finite non-negative values, ascending
    a = xp.minimum(xp.abs(x.astype(xp.float32)), top)
    hi = xp.clip(xp.searchsorted(pos, a), 1, n - 1)
    lo = hi - 1
    dlo, dhi = a - pos[lo], pos[hi] - a
    code = xp.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo).astype(xp.uint8)
    return code | (xp.signbit(x).astype(xp.uint8) << 7)


def from_e4m3(codes):
    """uint8 e4m3 codes -> float32 values."""
    return from_fp8(codes, "e4m3")


def to_e4m3(x):
    """float32 array -> uint8 e4m3 codes: round to nearest, ties to the even code, magnitudes
    past 448 saturated (e4m3fn has no infinity)."""
    return to_fp8(x, "e4m3")


def quantize(x, rowwise: bool, fmt: str = "e4m3"):
    """(codes, scales): x ~ codes * scale with scale = amax / (the format's largest value) per
    tensor (shape [1]) or per row (shape [rows])."""
    xp = _xp(x)
    amax = xp.abs(x).max(axis=1) if rowwise else xp.abs(x).max().reshape(1)
    scale = (xp.maximum(amax, 1e-12) / FORMATS[fmt][1]).astype(xp.float32)
    q = to_fp8(x / (scale[:, None] if rowwise else scale[0]), fmt)
    return q, scale


def dequantize(codes, scale, rowwise: bool, fmt: str = "e4m3"):
    """float32 values of quantized codes: codes * scale (per tensor or per row)."""
    return from_fp8(codes, fmt) * (scale[:, None] if rowwise else scale[0])


def torch_fp8(codes, fmt: str = "e4m3"):
    """A torch float8_e4m3fn (float8_e5m2) view of a uint8 CuPy array, or None where torch is
    absent."""
    try:
        import torch
    except ImportError:
        return None
    return torch.from_dlpack(codes).view(torch.float8_e4m3fn if fmt == "e4m3"
                                         else torch.float8_e5m2)


class GemmFp8Op(Op):
    """C[M, N] bf16 = (sa A)(sb B)^T, A and B e4m3 (K-major both), fp32 accumulation."""

    name = "gemm_fp8"
    formats = {"A": "e4m3", "B": "e4m3"}
    dims = ("M", "N", "K", "SCALING", "ACCUM")
    rtol = 1e-2
    signature = ("p", "p", "p", "p", "p", "s", "s", "s", "s", "p")
    note = "reference: fp32 GEMM of the dequantized fp8 inputs"

    def setup(self, size, seed):
        import cupy as cp
        M, N, K, scaling, accum = check_size(size)
        rng = cp.random.default_rng(seed)
        state = {"size": size, "rowwise": scaling == 2, "fast": accum == 1}
        for name, rows in (("A", M), ("B", N)):
            x = rng.standard_normal((rows, K), dtype=cp.float32)
            x *= cp.exp(rng.uniform(-2.0, 2.0, (rows, 1))).astype(cp.float32)
            state[name], state["s" + name] = quantize(x, scaling == 2, self.formats[name])
            del x
        state["formats"] = self.formats
        a = dequantize(state["A"], state["sA"], scaling == 2, self.formats["A"])
        b = dequantize(state["B"], state["sB"], scaling == 2, self.formats["B"])
        state["ref"] = a @ b.T
        del a, b
        state["C"] = cp.empty((M, N), dtype=cp.uint16)
        return state

    def args(self, state, workspace_ptr):
        M, N, K, scaling, _ = state["size"]
        return [ctypes.c_void_p(state[k].data.ptr) for k in ("A", "B", "C", "sA", "sB")] + \
            [ctypes.c_int(M), ctypes.c_int(N), ctypes.c_int(K), ctypes.c_int(scaling),
             ctypes.c_void_p(workspace_ptr)]

    def poison(self, state):
        state["C"].fill(0xFFFF)

    def error(self, state):
        return rel_error(from_bf16(state["C"]), state["ref"])

    def baselines(self, state):
        run = scaled_mm(state, state["fast"])
        if run is None:
            return {}
        return {f"torch._scaled_mm(use_fast_accum={state['fast']})": run}

    def tensor_map(self, state, name: str, box, swizzle: int = 128) -> bytes:
        """The 2-D CUtensorMap over A or B (bytes: fp8) or C (bf16), box {box[0], box[1]}
        innermost first (a box with a zero extent: 128 zero bytes, the map is unused)."""
        if not all(box):
            return bytes(128)
        from porter.measure import tma
        t = state[name]
        rows, cols = t.shape
        eb = t.dtype.itemsize
        try:
            return tma.encode_tiled(t.data.ptr, [cols, rows], [cols * eb],
                                    [int(b) for b in box], swizzle, elem_bytes=eb)
        except (ValueError, tma.TmaError) as e:
            raise TemplateError(f"tensor map over {name} (box {tuple(box)}): {e}") from e


class GemmFp8E5m2Op(GemmFp8Op):
    """gemm_fp8 with A in e5m2 (range over precision: gradients) and B in e4m3; the baseline is
    torch._scaled_mm over the same two formats. gemm_fp8's variant gemm_fp8_e5m2 computes it
    (FP8_A=1)."""

    name = "gemm_fp8_e5m2"
    formats = {"A": "e5m2", "B": "e4m3"}
    note = "reference: fp32 GEMM of the dequantized fp8 inputs (A e5m2, B e4m3)"


def check_size(size):
    """(M, N, K, SCALING, ACCUM) checked; a one-line TemplateError otherwise."""
    if len(size) != 5:
        raise TemplateError(f"gemm_fp8 size {size}: needs M, N, K, SCALING, ACCUM")
    M, N, K, scaling, accum = (int(v) for v in size)
    if scaling not in (1, 2) or accum not in (1, 2):
        raise TemplateError(f"gemm_fp8 size {size}: SCALING must be 1 (per tensor) or 2 (per "
                            "row / column) and ACCUM 1 (fast) or 2 (promoted)")
    if K % 16:
        raise TemplateError(f"gemm_fp8 size {size}: K must be a multiple of 16 (TMA row pitch "
                            "of fp8 rows)")
    return M, N, K, scaling, accum


def scaled_mm(state, fast: bool):
    """torch._scaled_mm over the state's inputs and scales (B [N, K] row-major is the column-
    major K x N operand it wants), bf16 out, as a function of no arguments; None without
    torch."""
    fmts = state["formats"]   # (setup's: the op's operand formats)
    ta, tb = torch_fp8(state["A"], fmts["A"]), torch_fp8(state["B"], fmts["B"])
    if ta is None:
        return None
    import torch
    sa, sb = torch.from_dlpack(state["sA"]), torch.from_dlpack(state["sB"])
    if state["rowwise"]:
        sa, sb = sa.reshape(-1, 1), sb.reshape(1, -1)
    else:
        sa, sb = sa.reshape(()), sb.reshape(())
    return lambda: torch._scaled_mm(ta, tb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                    use_fast_accum=fast)


def baseline_error(state, fast: bool) -> float:
    """torch._scaled_mm's relative error against the reference on the same inputs."""
    import cupy as cp
    out = scaled_mm(state, fast)()
    return rel_error(cp.from_dlpack(out.float()), state["ref"])
