from __future__ import annotations

import ctypes
import math

from porter.errors import TemplateError
from porter.measure.ops._bf16 import from_bf16, rel_error, to_bf16, torch_view
from porter.measure.ops.base import Op

_SAMPLE_ROWS = 512       # rows of each part (head, tail, random middle) checked when S > 2048


class AttentionOp(Op):
    """O = softmax(scale * Q K^T [causal]) V and LSE (natural log, fp32), the forward pass.

    Sizes B, H, HKV, S, D, MASK (1: none, 2: causal; sizes are positive integers). Q and O are
    [B, H, S, D], K and V [B, HKV, S, D] (H % HKV == 0: query head h reads KV head
    h // (H // HKV)), all bf16; LSE is [B, H, S] fp32; scale 1 / sqrt(D).
    Kernel arguments: Q, K, V, O, LSE, int B, H, HKV, S, causal (0 / 1), float scale,
    void* workspace, then the template's tensor maps. The maps are rank 3 over
    {D, S, B * heads} (innermost first), so rows past S read as zero and stores clip per head:
    `tensor_map` builds them (`buffer`'s 2-D description cannot say that).
    The reference is fp32 on a sample: three (batch, head) pairs, every row up to S = 2048,
    else the first, the last and 512 random rows; the whole output must be written (poisoned).
    """

    name = "attention"
    dims = ("B", "H", "HKV", "S", "D", "MASK")
    rtol = 1e-2
    signature = ("p", "p", "p", "p", "p", "s", "s", "s", "s", "s", "s", "p")
    note = "reference: fp32 on 3 heads, all rows up to S = 2048, else 1536 sampled rows"

    def setup(self, size, seed):
        import cupy as cp
        B, H, HKV, S, D, mask = size
        if H % HKV or mask not in (1, 2):
            raise TemplateError(f"attention size {size}: needs H % HKV == 0 and MASK 1 or 2")
        rng = cp.random.default_rng(seed)
        q = to_bf16(rng.standard_normal((B, H, S, D), dtype=cp.float32))
        k = to_bf16(rng.standard_normal((B, HKV, S, D), dtype=cp.float32))
        v = to_bf16(rng.standard_normal((B, HKV, S, D), dtype=cp.float32))
        state = {"Q": q, "K": k, "V": v, "O": cp.empty((B, H, S, D), dtype=cp.uint16),
                 "LSE": cp.empty((B, H, S), dtype=cp.float32), "size": size,
                 "scale": 1.0 / math.sqrt(D), "causal": mask == 2}
        state["heads"] = sorted({(0, 0), (B - 1, H - 1), (B // 2, H // 3)})
        if S <= 4 * _SAMPLE_ROWS:
            rows = cp.arange(S)
        else:
            mid = rng.integers(_SAMPLE_ROWS, S - _SAMPLE_ROWS, _SAMPLE_ROWS)
            rows = cp.concatenate([cp.arange(_SAMPLE_ROWS), cp.arange(S - _SAMPLE_ROWS, S), mid])
        state["rows"] = rows
        state["ref_o"], state["ref_lse"] = _reference(state)
        return state

    def args(self, state, workspace_ptr):
        B, H, HKV, S, D, _ = state["size"]
        return [ctypes.c_void_p(state[n].data.ptr) for n in ("Q", "K", "V", "O", "LSE")] + \
            [ctypes.c_int(B), ctypes.c_int(H), ctypes.c_int(HKV), ctypes.c_int(S),
             ctypes.c_int(int(state["causal"])), ctypes.c_float(state["scale"]),
             ctypes.c_void_p(workspace_ptr)]

    def poison(self, state):
        state["O"].fill(0xFFFF)
        state["LSE"].fill(float("nan"))

    def error(self, state):
        import cupy as cp
        o, lse = state["O"], state["LSE"]
        if not (bool(cp.isfinite(from_bf16(o)).all()) and bool(cp.isfinite(lse).all())):
            return float("inf")
        rows = state["rows"]
        so = cp.stack([from_bf16(o[b, h][rows]) for b, h in state["heads"]])
        sl = cp.stack([lse[b, h][rows] for b, h in state["heads"]])
        return max(rel_error(so, state["ref_o"]), rel_error(sl, state["ref_lse"]))

    def baselines(self, state):
        tq, tk, tv = (torch_view(state[n]) for n in "QKV")
        if tq is None:
            return {}
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        gqa = state["size"][1] != state["size"][2]
        out = {}
        for name, be in (("cudnn(torch sdpa)", SDPBackend.CUDNN_ATTENTION),
                         ("flash(torch sdpa)", SDPBackend.FLASH_ATTENTION)):
            def run(be=be):
                with sdpa_kernel([be]):
                    return torch.nn.functional.scaled_dot_product_attention(
                        tq, tk, tv, is_causal=state["causal"], scale=state["scale"],
                        enable_gqa=gqa)
            try:
                run()
            except RuntimeError:   # this backend does not take the shape (or GQA) here
                continue
            out[name] = run
        return out

    def buffer(self, state, name):
        raise TemplateError("attention's tensor maps are rank 3 ({D, S, B * heads}); build them "
                            "with AttentionOp.tensor_map")

    def tensor_map(self, state, name: str, box, swizzle: int = 128) -> bytes:
        """The 128-byte CUtensorMap over buffer Q, K, V or O: rank 3 {D, S, B * heads},
        box {box[0], box[1], 1} (a box with a zero extent: 128 zero bytes, the map is unused).
        The GPU child calls this for every [[tensor_maps]] entry (ops without it: `buffer`)."""
        if not all(box):
            return bytes(128)
        from porter.measure import tma
        t = state[name]
        heads, S, D = t.shape[0] * t.shape[1], t.shape[2], t.shape[3]
        try:
            return tma.encode_tiled(t.data.ptr, [D, S, heads], [D * 2, S * D * 2],
                                    [int(b) for b in box], swizzle)
        except (ValueError, tma.TmaError) as e:
            raise TemplateError(f"tensor map over {name} (box {tuple(box)}): {e}") from e


def _reference(state):
    """fp32 O and LSE of the sampled (batch, head) pairs and rows, 1024 rows at a time."""
    import cupy as cp
    B, H, HKV, S, D, _ = state["size"]
    grp = H // HKV
    rows = state["rows"]
    outs, lses = [], []
    for b, h in state["heads"]:
        q = from_bf16(state["Q"][b, h][rows]) * state["scale"]
        k = from_bf16(state["K"][b, h // grp])
        v = from_bf16(state["V"][b, h // grp])
        o_parts, l_parts = [], []
        for i in range(0, len(rows), 1024):
            s = q[i:i + 1024] @ k.T
            if state["causal"]:
                s = cp.where(cp.arange(S)[None, :] > rows[i:i + 1024, None], -cp.inf, s)
            m = s.max(axis=1, keepdims=True)
            p = cp.exp(s - m)
            den = p.sum(axis=1, keepdims=True)
            o_parts.append((p / den) @ v)
            l_parts.append((m + cp.log(den))[:, 0])
        outs.append(cp.concatenate(o_parts))
        lses.append(cp.concatenate(l_parts))
    return cp.stack(outs), cp.stack(lses)
