"""benchmarks/attention.py's checks and timing: the fp32 reference (chunked), the error
measure, inputs, verification of one run, torch SDPA's backends, interleaved timing."""
from __future__ import annotations

import statistics


def reference(q, k, v, causal, scale, heads, rows):
    """fp32 O and LSE for the (b, h) pairs in `heads`, query rows `rows` (chunked)."""
    import torch
    B, H, S, D = q.shape
    grp = H // k.shape[1]
    outs, lses = [], []
    for b, h in heads:
        qq = q[b, h, rows].float()
        kk = k[b, h // grp].float()
        vv = v[b, h // grp].float()
        o_parts, l_parts = [], []
        for i in range(0, len(rows), 1024):
            s = (qq[i:i + 1024] @ kk.T) * scale
            if causal:
                r = rows[i:i + 1024].view(-1, 1)
                s = s.masked_fill(torch.arange(S, device=q.device).view(1, -1) > r, float("-inf"))
            lse = torch.logsumexp(s, dim=-1)
            o_parts.append(torch.exp(s - lse[:, None]) @ vv)
            l_parts.append(lse)
        outs.append(torch.cat(o_parts))
        lses.append(torch.cat(l_parts))
    return torch.stack(outs), torch.stack(lses)


def rel_err(a, b) -> float:
    import torch
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item()


def make_problem(B, H, HKV, S, D, seed):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    o = torch.full((B, H, S, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((B, H, S), float("nan"), device="cuda", dtype=torch.float32)
    return q, k, v, o, lse


def verify(run, q, k, v, o, lse, causal, scale, full_rows=False):
    """(O error, LSE error) of one launch against fp32 on sampled heads and rows."""
    import torch
    B, H, S, D = q.shape
    o.fill_(float("nan"))
    lse.fill_(float("nan"))
    run()
    torch.cuda.synchronize()
    if not (torch.isfinite(o).all() and torch.isfinite(lse).all()):
        return float("inf"), float("inf")
    heads = sorted({(0, 0), (B - 1, H - 1), (B // 2, H // 3)})
    if full_rows or S <= 2048:
        rows = torch.arange(S, device="cuda")
    else:
        g = torch.Generator(device="cuda").manual_seed(S)
        rows = torch.cat([torch.arange(512, device="cuda"), torch.arange(S - 512, S, device="cuda"),
                          torch.randint(512, S - 512, (512,), device="cuda", generator=g)])
    ro, rl = reference(q, k, v, causal, scale, heads, rows)
    so = torch.stack([o[b, h, rows] for b, h in heads])
    sl = torch.stack([lse[b, h, rows] for b, h in heads])
    return rel_err(so, ro), rel_err(sl, rl)


def sdpa(backend, q, k, v, causal, scale):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    gqa = q.shape[1] != k.shape[1]
    if gqa:   # not every backend takes enable_gqa: expand K / V once, outside the timing
        try:
            with sdpa_kernel([be]):
                torch.nn.functional.scaled_dot_product_attention(
                    q[:, :, :64], k[:, :, :64], v[:, :, :64], is_causal=causal, scale=scale,
                    enable_gqa=True)
            note = "enable_gqa"
        except Exception:   # noqa: BLE001
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            gqa, note = False, "K/V expanded beforehand"
    else:
        note = ""

    def fn():
        with sdpa_kernel([be]):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
    return fn, note


def time_interleaved(fns: dict, reps: int) -> dict:
    """Median ms of each function, run in turn repeat by repeat, L2 flushed before each call."""
    import torch
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for f in fns.values():   # warm-up
        f()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps * len(fns))]
    i = 0
    for _ in range(reps):
        for name, f in fns.items():
            flush.zero_()
            ev[i][0].record()
            f()
            ev[i][1].record()
            times[name].append(i)
            i += 1
    torch.cuda.synchronize()
    return {name: statistics.median(ev[j][0].elapsed_time(ev[j][1]) for j in idx)
            for name, idx in times.items()}
