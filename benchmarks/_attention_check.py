"""benchmarks/attention.py's checks and timing: the fp32 reference (chunked), the error
measure, inputs, verification of one run, torch SDPA's backends, interleaved timing, and
`Kernel`: one configuration compiled by porter and launched as porter's engine launches it."""
from __future__ import annotations

import ctypes
import statistics
from pathlib import Path

RAGGED = [  # (B, H, HKV, S, D, causal): sequence lengths that cut the tiles, GQA, both masks
    (2, 4, 4, 1000, 128, False), (2, 4, 4, 1000, 128, True), (1, 4, 2, 777, 128, True),
    (1, 2, 2, 130, 128, False), (1, 2, 1, 333, 64, True), (2, 3, 3, 1537, 64, False),
    (1, 2, 2, 64, 128, True), (1, 1, 1, 17, 128, False),
]


class Kernel:
    """One configuration of flash_attention_fwd bound to one problem's torch tensors: the cubin
    from porter's compile cache (the one the engine measured), the template's own launch
    geometry and rank-3 tensor maps ({D, S, B * heads}, as the attention op builds them).
    Calling it launches the kernel on torch's current stream."""

    def __init__(self, params, q, k, v, o, lse, causal, scale, sms):
        import torch
        from porter.build.compile import compile_variant
        from porter.measure import tma
        from porter.spec.arch import ARCHS
        from porter.spec.template import find_template
        tpl = find_template("flash_attention_fwd")
        arch = ARCHS["sm_90a"].with_sms(sms)
        B, H, S, D = q.shape
        size = (B, H, k.shape[1], S, D, 2 if causal else 1)
        res = compile_variant(tpl, params, arch)
        if not res.ok:
            raise RuntimeError(f"{params} does not compile: {res.log[:2000]}")
        self.params, self.resources, self.launch = dict(params), res.resources, tma.launch
        self.mod, self.fn = tma.load_function(Path(res.cubin_path).read_bytes(), tpl.kernel)
        env = tpl.env(params, arch, size)
        geo = tpl.launch(params, arch, size, env=env)
        self.grid, self.block, self.smem = tuple(geo.grid), tuple(geo.block), geo.smem
        maps = []
        for buf, box, swizzle in tpl.map_boxes(env):
            t = {"Q": q, "K": k, "V": v, "O": o}[buf]
            maps.append(bytes(128) if not all(box) else tma.encode_tiled(
                t.data_ptr(), [t.shape[3], t.shape[2], t.shape[0] * t.shape[1]],
                [t.shape[3] * 2, t.shape[2] * t.shape[3] * 2], [int(b) for b in box], swizzle))
        self.keep = (q, k, v, o, lse)
        self.args = [ctypes.c_void_p(t.data_ptr()) for t in (q, k, v, o, lse)] + \
            [ctypes.c_int(B), ctypes.c_int(H), ctypes.c_int(k.shape[1]), ctypes.c_int(S),
             ctypes.c_int(int(causal)), ctypes.c_float(scale), ctypes.c_void_p(0)] + maps
        self.stream = torch.cuda.current_stream().cuda_stream

    def __call__(self):
        self.launch(self.fn, self.grid, self.block, self.smem, args=self.args,
                    stream=self.stream)


def ragged_checks(configs, sms) -> list[dict]:
    """Each configuration on every RAGGED shape its constraints allow: O and LSE of every row of
    three heads against fp32, outputs NaN-poisoned first."""
    import math
    from porter.build.check import static_check
    from porter.spec.arch import ARCHS
    from porter.spec.template import find_template
    tpl = find_template("flash_attention_fwd")
    arch = ARCHS["sm_90a"].with_sms(sms)
    out = []
    for params in configs:
        for (B, H, HKV, S, D, causal) in RAGGED:
            if static_check(tpl, arch, params, [(B, H, HKV, S, D, 2 if causal else 1)]):
                continue
            q, k, v, o, lse = make_problem(B, H, HKV, S, D, seed=S * 7 + D + causal)
            scale = 1 / math.sqrt(D)
            try:
                eo, el = verify(Kernel(params, q, k, v, o, lse, causal, scale, sms),
                                q, k, v, o, lse, causal, scale, full_rows=True)
            except Exception as e:   # noqa: BLE001 - recorded as a failed check
                print(f"  {params} S{S} D{D}: {e}", flush=True)
                eo = el = float("inf")
            ok = eo < 1e-2 and el < 1e-3
            out.append(dict(params=params, shape=dict(B=B, H=H, HKV=HKV, S=S, D=D,
                                                      causal=causal), err_o=eo, err_lse=el,
                            ok=ok))
            print(f"check B{B} H{H}/{HKV} S{S} D{D} causal={int(causal)} "
                  f"{_short(params)}: O {eo:.2e} LSE {el:.2e} {'ok' if ok else 'WRONG'}",
                  flush=True)
    return out


def _short(params) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items() if k != "HD")


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
