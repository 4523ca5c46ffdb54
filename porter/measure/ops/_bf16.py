"""bf16 on CuPy, which has no bf16 dtype: bf16 values live in uint16 arrays. The helpers take
CuPy or NumPy arrays alike (NumPy dtypes apply to both)."""
from __future__ import annotations

import numpy as np


def _xp(a):
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


def to_bf16(x):
    """float32 array -> uint16 array of bf16 bits, round to nearest even."""
    u = x.astype(np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype(np.uint16)


def from_bf16(b):
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def rel_error(out_f32, ref_f32) -> float:
    xp = _xp(out_f32)
    if not bool(xp.isfinite(out_f32).all()):
        return float("inf")
    num = float(xp.linalg.norm((out_f32 - ref_f32).ravel()))
    den = float(xp.linalg.norm(ref_f32.ravel())) or 1.0
    return num / den


def torch_view(u16):
    """A torch bf16 view of a uint16 CuPy array, or None where torch is absent."""
    try:
        import torch
    except ImportError:
        return None
    return torch.from_dlpack(u16).view(torch.bfloat16)
