"""Exports of flash_attention_fwd (issue 22): the python module and the torch package.

CPU: a compile-only sm_90a job exports; the python module (no porter in it) reads the size from
the arguments (D from Q's shape, MASK from causal), plans the launch with rank-3 tensor maps
encoded exactly as porter's own attention op encodes them, refuses a head dim it was not tuned
for; the cu format refuses in one line (its maps are matrices); the torch package registers
porter::flash_attention_fwd, traces under torch.compile without a graph break (where torch is
installed) and refuses bad shapes in one line.
GPU (marked `gpu`; sm_90 only): the exported module and the torch op against torch SDPA and an
fp32 reference, causal and not, GQA, a sequence length that is no multiple of the tiles and
one that was not tuned.
"""
from __future__ import annotations

import json
import sys
import types

import pytest

from porter.errors import PorterError
from porter.export.export import export
from porter.store.base import open_store
from test_export import _load_module
from test_gpu_attention import _FakeDriver, needs_gpu

TUNED = "2x4x2x1000x128x2"          # causal, GQA 2:1, S cuts every tile


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from conftest import replay_job
    tmp = tmp_path_factory.mktemp("attn")
    store = open_store(f"sqlite:///{tmp / 'a.db'}")
    job_id = replay_job(store, "flash_attention_fwd", None, arch="sm_90a", trials=1,
                        sizes=[TUNED], backend="compile-only", workers=1)
    return store, job_id


@pytest.fixture(scope="module")
def module(job, tmp_path_factory):
    store, job_id = job
    out = tmp_path_factory.mktemp("py")
    paths = export(store, job_id, "python", out)
    mod = _load_module(next(p for p in paths if p.suffix == ".py"))
    return mod, out


def _shaped(*shape):
    return types.SimpleNamespace(shape=shape)


def test_python_module_reads_the_size_and_plans_rank3_maps(module):
    mod, out = module
    assert "from porter" not in mod.__loader__.get_source(mod.__name__)
    assert all((out / e["file"]).is_file() for e in mod.TABLE)
    assert [a for a, _ in mod.SPEC["args"]] == ["Q", "K", "V", "O", "LSE", "B", "H", "HKV", "S",
                                                "causal", "scale", "workspace"]
    values = dict(Q=_shaped(2, 4, 1000, 128), K=0, V=0, O=0, LSE=0, B=2, H=4, HKV=2, S=1000,
                  causal=1, scale=0.088)
    assert mod.KERNEL.size_of(values) == (2, 4, 2, 1000, 128, 2)
    assert mod.KERNEL.size_of(dict(values, causal=0))[-1] == 1
    with pytest.raises(TypeError, match="cannot tell D .* pass size="):
        mod.KERNEL.size_of(dict(values, Q=0x1000))
    entry = mod.select((2, 4, 2, 1000, 128, 2))
    assert entry["params"]["HD"] == 128 and entry["params"]["PERSIST"] == 1
    plan = mod.KERNEL.plan(entry, (2, 4, 2, 1000, 128, 2))
    rows = 64 * entry["params"]["CONSUMERS"]
    assert plan["block"] == [128 * (entry["params"]["CONSUMERS"] + 1), 1, 1]
    assert plan["grid"][0] == min(2 * 4 * ((-(-1000 // rows) + 1) // 2), mod.KERNEL.spec[
        "limits"]["arch_sms"])
    assert [m[0] for m in plan["maps"]] == ["Q", "K", "V", "O"]
    assert [m[3] for m in mod.SPEC["space"]["maps"]] == ["bf16"] * 4
    assert plan["maps"][0][1] == [64, rows, 1] and plan["maps"][1][1][:2] == [
        64, entry["params"]["BN"]]
    # the same untuned D is refused in one line: HD is compiled in
    with pytest.raises(ValueError, match="no tuned configuration is legal at 2x4x2x1000x64x2"):
        mod.select((2, 4, 2, 1000, 64, 2))


def test_python_module_encodes_maps_as_porter_does(module, monkeypatch):
    """The module's encoding of Q (rank 3) and of a matrix (rank 2) hands the driver the same
    arguments as porter's attention op and porter's matrix maps."""
    from porter.measure import tma
    from porter.measure.ops import get_op
    mod, _ = module
    ours, theirs = _FakeDriver(), _FakeDriver()
    monkeypatch.setattr(mod, "_drv", lambda: ours)
    monkeypatch.setattr(tma, "_driver", lambda: theirs)
    B, H, S, D = 2, 4, 1000, 128
    mod.KERNEL._encode(0x7f0000000000, [B * H, S, D], [64, 128, 1], 128)
    mod.KERNEL._encode(0x7f0000100000, [B * 2, S, D], [64, 176], 128)     # box padded
    mod.KERNEL._encode(0x7f0000200000, [4096, 1024], [64, 128], 128)
    state = {"Q": types.SimpleNamespace(shape=(B, H, S, D),
                                        data=types.SimpleNamespace(ptr=0x7f0000000000)),
             "K": types.SimpleNamespace(shape=(B, 2, S, D),
                                        data=types.SimpleNamespace(ptr=0x7f0000100000))}
    op = get_op("attention")
    op.tensor_map(state, "Q", (64, 128, 1), 128)
    op.tensor_map(state, "K", (64, 176), 128)
    tma.encode_tiled_2d(0x7f0000200000, rows=4096, cols=1024, row_stride_bytes=2048,
                        box_cols=64, box_rows=128, swizzle=128)
    assert len(ours.calls) == len(theirs.calls) == 3
    for a, b in zip(ours.calls, theirs.calls):
        assert [list(x) if isinstance(x, (list, tuple)) else x for x in a] == \
            [list(x) if isinstance(x, (list, tuple)) else x for x in b]
    assert ours.calls[0][3] == [D, S, B * H] and ours.calls[0][4] == [D * 2, S * D * 2]


def test_cu_refused_cubin_and_manifest_written(job, tmp_path):
    store, job_id = job
    with pytest.raises(PorterError, match="cu format's tensor maps are matrices.*python or "
                       "torch"):
        export(store, job_id, "cu", tmp_path / "cu")
    assert not list((tmp_path / "cu").glob("*.cu"))
    paths = export(store, job_id, "cubin", tmp_path / "bin")
    assert any(p.suffix == ".cubin" for p in paths)
    launch = json.loads((tmp_path / "bin" / "manifest.json").read_text())[
        "measurements"][0]["launch"]
    assert [m["buffer"] for m in launch["tensor_maps"]] == ["Q", "K", "V", "O"]
    assert launch["tensor_maps"][0]["box"][2] == 1


def _torch_package(job, path):
    store, job_id = job
    export(store, job_id, "torch", path)
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(path))
    try:
        pkg = __import__("flash_attention_fwd_torch")
    finally:
        sys.path.remove(str(path))
    return torch, pkg


def test_torch_package_traces_and_refuses_bad_shapes(job, tmp_path):
    store, job_id = job
    export(store, job_id, "torch", tmp_path)
    init = (tmp_path / "flash_attention_fwd_torch" / "__init__.py").read_text()
    assert 'custom_op("porter::flash_attention_fwd"' in init and "register_fake" in init
    torch, pkg = _torch_package(job, tmp_path)
    q = torch.empty(2, 8, 1000, 128, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(2, 2, 1000, 128, dtype=torch.bfloat16, device="meta")
    o, lse = torch.ops.porter.flash_attention_fwd(q, kv, kv, True, None)
    assert o.shape == q.shape and lse.shape == (2, 8, 1000) and lse.dtype == torch.float32

    def f(q, k, v):
        return (pkg.sdpa(q, k, v, is_causal=True).float() * 2).sum()
    assert torch._dynamo.explain(f)(q, kv, kv).graph_break_count == 0
    with pytest.raises(RuntimeError, match="heads must be a multiple"):
        torch.ops.porter.flash_attention_fwd(q, kv[:, :1].expand(2, 3, 1000, 128)
                                             .contiguous(), kv[:, :1].expand(2, 3, 1000, 128)
                                             .contiguous())
    with pytest.raises(RuntimeError, match="with q's B, S and D"):
        torch.ops.porter.flash_attention_fwd(q, kv[:, :, :999], kv[:, :, :999])
    with pytest.raises(RuntimeError, match="takes bfloat16"):
        torch.ops.porter.flash_attention_fwd(q.float(), kv, kv)


# ---- GPU -----------------------------------------------------------------------------------
def _reference(torch, q, k, v, causal, scale):
    """fp32 O and LSE (GQA: K / V heads repeated)."""
    rep = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(rep, 1) for t in (k, v))
    s = (q.float() @ k.transpose(-1, -2)) * scale
    if causal:
        S = q.shape[2]
        s = s.masked_fill(torch.ones(S, S, device=q.device, dtype=torch.bool).triu(1),
                          float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ v, lse


def _rel(torch, a, b):
    return (torch.linalg.norm(a.float() - b.float()) / torch.linalg.norm(b.float())).item()


SHAPES = [(2, 4, 2, 1000, True), (2, 4, 2, 1000, False), (1, 4, 1, 777, False),
          (1, 2, 2, 64, True), (3, 6, 3, 2050, True)]   # the tuned size, then untuned ones


@pytest.mark.gpu
@needs_gpu
def test_exported_module_and_torch_op_match_sdpa_on_the_gpu(job, module, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("flash_attention_fwd needs sm_90a")
    import torch.nn.functional as F
    mod, _ = module
    _, pkg = _torch_package(job, tmp_path)
    g = torch.Generator(device="cuda").manual_seed(3)
    for B, H, HKV, S, causal in SHAPES:
        q = torch.randn(B, H, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, HKV, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        scale = 128 ** -0.5
        ro, rl = _reference(torch, q, k, v, causal, scale)
        o = torch.full_like(q, float("nan"))
        lse = torch.full((B, H, S), float("nan"), device="cuda")
        mod.launch(q, k, v, o, lse, B, H, HKV, S, int(causal), scale)       # the python module
        torch.cuda.synchronize()
        assert _rel(torch, o, ro) < 1e-2 and _rel(torch, lse, rl) < 1e-3, (B, H, HKV, S, causal)
        o2, lse2 = torch.ops.porter.flash_attention_fwd(q, k, v, causal, None)   # torch op
        sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        assert _rel(torch, o2, ro) < 1e-2 and _rel(torch, lse2, rl) < 1e-3
        assert _rel(torch, o2, sdpa) < 1e-2, (B, H, HKV, S, causal)
        assert torch.equal(pkg.sdpa(q, k, v, is_causal=causal), o2)
