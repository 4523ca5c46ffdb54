"""bf16 on CuPy, which has no bf16 dtype: bf16 values live in uint16 arrays."""
from __future__ import annotations


def to_bf16(x):
    """float32 CuPy array -> uint16 array of bf16 bits, round to nearest even."""
    import cupy as cp
    u = x.astype(cp.float32).view(cp.uint32)
    rounded = (u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16
    return rounded.astype(cp.uint16)


def from_bf16(b):
    import cupy as cp
    return (b.astype(cp.uint32) << 16).view(cp.float32)


def rel_error(out_f32, ref_f32) -> float:
    import cupy as cp
    if not bool(cp.isfinite(out_f32).all()):
        return float("inf")
    num = float(cp.linalg.norm((out_f32 - ref_f32).ravel()))
    den = float(cp.linalg.norm(ref_f32.ravel())) or 1.0
    return num / den


def torch_view(u16):
    """A torch bf16 view of a uint16 CuPy array, or None where torch is absent."""
    try:
        import torch
    except ImportError:
        return None
    return torch.from_dlpack(u16).view(torch.bfloat16)
