from __future__ import annotations

import ctypes

from porter.measure.ops._bf16 import from_bf16, rel_error, to_bf16, torch_view
from porter.measure.ops.base import Op

EPS = 1e-6


class RmsNormOp(Op):
    """y = x * rsqrt(mean(x^2) + eps) * w over each row; bf16 in and out, fp32 inside."""

    name = "rmsnorm"
    dims = ("rows", "cols")
    rtol = 1e-2
    signature = ("p", "p", "p", "s", "s", "s")
    memory_bound = True

    def setup(self, size, seed):
        import cupy as cp
        rows, cols = size
        rng = cp.random.default_rng(seed)
        x = to_bf16(rng.standard_normal((rows, cols), dtype=cp.float32))
        w = to_bf16(1.0 + 0.1 * rng.standard_normal((1, cols), dtype=cp.float32))
        xf = from_bf16(x)
        ref = xf * cp.reciprocal(cp.sqrt((xf * xf).mean(axis=1, keepdims=True) + EPS))
        ref *= from_bf16(w)
        y = cp.empty((rows, cols), dtype=cp.uint16)
        return {"x": x, "w": w, "y": y, "ref": ref, "size": size}

    def args(self, state, workspace_ptr):
        rows, cols = state["size"]
        return [ctypes.c_void_p(state["x"].data.ptr), ctypes.c_void_p(state["w"].data.ptr),
                ctypes.c_void_p(state["y"].data.ptr), ctypes.c_int(rows), ctypes.c_int(cols),
                ctypes.c_float(EPS)]

    def poison(self, state):
        state["y"].fill(0xFFFF)

    def error(self, state):
        return rel_error(from_bf16(state["y"]), state["ref"])

    def baselines(self, state):
        tx, tw = torch_view(state["x"]), torch_view(state["w"])
        if tx is None:
            return {"cupy composite": lambda: _composite(state)}
        import torch
        cols = state["size"][1]
        wv = tw.view(cols)
        return {"torch.rms_norm": lambda: torch.nn.functional.rms_norm(tx, (cols,), wv, EPS)}


def _composite(state):
    import cupy as cp
    xf = from_bf16(state["x"])
    y = xf * cp.reciprocal(cp.sqrt((xf * xf).mean(axis=1, keepdims=True) + EPS))
    state["y"][...] = to_bf16(y * from_bf16(state["w"]))
