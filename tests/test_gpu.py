"""On a GPU only (skipped elsewhere): the planted faults end in their own statuses and a short
real port verifies every measured trial. benchmarks/port_bench.py runs the same jobs at full
size on the H200."""
from pathlib import Path

import pytest

from porter.job.loop import Engine
from porter.job.jobs import make_spec, template_record, template_snapshot
from porter.store.base import open_store

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


def _has_gpu():
    try:
        from porter.measure.backends.gpu import gpu_available
        import cupy  # noqa: F401
    except ImportError:
        return False
    return gpu_available()


if not _has_gpu():
    pytest.skip("no CUDA GPU with CuPy here", allow_module_level=True)


def _run(tmp_path, name, sizes, trials, **kw):
    from porter.measure.backends.gpu import GpuBackend
    store = open_store(f"sqlite:///{tmp_path / 'g.db'}")
    spec, tpl, arch = make_spec(name, "sm_90a", sizes, trials, **kw)
    src, space = template_record(tpl)
    job = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                           snapshot=template_snapshot(tpl))
    be = GpuBackend(timeout_s=10)
    try:
        Engine(store, tpl, arch, be).run(job, spec)
    finally:
        be.close()
    return store.trials(job)


def test_planted_faults(tmp_path):
    trials = _run(tmp_path, "planted", ["1024x1024"], 8,
                  templates_dir=[ROOT / "tests" / "data" / "templates"])
    by_mode = {}
    for t in trials:
        by_mode.setdefault(t.params["MODE"], set()).add(t.status)
    assert by_mode == {0: {"measured"}, 1: {"wrong_result"}, 2: {"crashed"}, 3: {"timeout"}}


def test_short_gemm_port_verifies_every_measured_trial(tmp_path):
    trials = _run(tmp_path, "gemm_mma", ["1024x1024x1024"], 6)
    measured = [t for t in trials if t.status == "measured"]
    assert measured
    assert all(m.error is not None and m.error < 1e-2 for t in measured for m in t.measurements)


@pytest.mark.parametrize("config,size", [
    # TMA-stored epilogue, ragged M and N (the store clips the edge tiles)
    (dict(EPI=3), (1000, 1000, 1024)),
    # split-K: per-tile counters must be zero again afterwards, the slots are scratch
    (dict(BM=64, BN=128, CONSUMERS=1, STAGES=8, SPLITK=2), (128, 4096, 4096)),
    # BN = 200: the 8 columns past the last whole 64-wide box from the registers;
    # stream-K runs reordered (the head of the last tile first), ragged M, N and K
    (dict(BN=200), (1000, 1000, 1024)),
    (dict(BN=200, EPI=1, STAGES=5), (3000, 4040, 4104)),
    (dict(STREAMK=2), (3000, 4040, 4104)),
    (dict(BN=224, STREAMK=1), (3000, 4040, 4104)),
    # the last rows re-cut into pieces (4096^3: 8 rows of 18 pieces 224-232 wide; ragged: 4 rows
    # of 21 pieces 192-200 wide, the partial last row of tiles among them)
    (dict(TAILW=224), (4096, 4096, 4096)),
    (dict(BN=224, TAILW=192), (3000, 4040, 4104)),
    # 256 x 152 tiles (152 accumulators a thread; the last 24 columns in an overlapping box) and 192-row tiles on three consumer warpgroups, ragged M, N and K
    (dict(BM=256, BN=152, STAGES=4), (3000, 4040, 4104)),
    (dict(BM=256, BN=192, EPI=0, GROUP_M=8), (1000, 1000, 1000)),
    (dict(BM=192, BN=192, CONSUMERS=3, CLUSTER=2), (3000, 4040, 4104)),
    # B multicast in shares rounded up to whole 8-row atoms (80 + 72 rows; 56 x 3 + 32)
    (dict(BM=256, BN=152, CLUSTER=2), (3000, 5000, 1000)),
    (dict(BN=200, CLUSTER=4, PERSIST=0), (1000, 3000, 1000)),
    (dict(BM=192, BN=128, CONSUMERS=3, EPI=1, STREAMK=1), (3000, 4040, 4104)),
    # overlapping last boxes: the whole tile staged (EPI=2, 4 boxes for 232 columns), pieces of
    # 192-200 re-cut from 232-wide tiles, and 3 consumers at 192 x 184
    (dict(BN=232, EPI=2, STAGES=3, CLUSTER=2), (3000, 5000, 1000)),
    (dict(BN=232, TAILW=192), (3000, 4040, 4104)),
    (dict(BM=192, BN=184, CONSUMERS=3, CLUSTER=2), (1000, 3000, 1000)),
    # consumers in turn, each a whole tile (odd and even item counts per CTA, ragged edges)
    (dict(BN=128, CLUSTER=2, PINGPONG=1), (3000, 5000, 1000)),
    (dict(BM=64, BN=232, STAGES=5, CLUSTER=2, PINGPONG=1), (1000, 3000, 1000)),
    (dict(BN=192, EPI=1, PINGPONG=1), (3000, 4040, 4104)),
    # each warp storing its own 16 rows: one-slice ring (BN % 128 != 0) with an overlapping last
    # box and register-stored columns, two-slice ring, clusters, re-cut pieces, ping-pong
    (dict(BM=256, BN=152, CLUSTER=2, EPI=4), (3000, 5000, 1000)),
    (dict(BN=200, CLUSTER=4, PERSIST=0, EPI=4), (1000, 3000, 1000)),
    (dict(EPI=4, CLUSTER=2), (1000, 1000, 1024)),
    (dict(BN=224, TAILW=192, EPI=4), (3000, 4040, 4104)),
    (dict(BN=128, CLUSTER=2, PINGPONG=1, EPI=4), (3000, 5000, 1000)),
    # a k-tile's MMAs in two halves, the previous stage freed between: halves of the m64 tiles
    # (256 rows), of the k16 steps (BK 64 and 128), with clusters, re-cut pieces and ping-pong
    (dict(BM=256, BN=152, CLUSTER=2, RELEASE=1), (3000, 5000, 1000)),
    (dict(CLUSTER=2, RELEASE=1), (1000, 1000, 1024)),
    (dict(BK=128, STAGES=2, RELEASE=1), (1000, 3000, 1000)),
    (dict(BN=224, TAILW=192, RELEASE=1), (3000, 4040, 4104)),
    (dict(BN=128, CLUSTER=2, PINGPONG=1, RELEASE=1), (3000, 5000, 1000)),
    # the epilogue staged in the ring's A rows: 5 stages of 128x200 in clusters of 4 (3 boxes and
    # 8 columns from the registers), two slabs a consumer (256 rows), two sub-tiles a stage
    (dict(BN=200, CLUSTER=4, PERSIST=0, EPI=5, STAGES=5), (1000, 3000, 1000)),
    (dict(BM=256, BN=152, CLUSTER=2, PERSIST=0, EPI=5), (3000, 5000, 1000)),
    (dict(BK=128, STAGES=2, PERSIST=0, EPI=5), (1000, 1000, 1024)),
    (dict(BN=224, PERSIST=0, EPI=5, STAGES=5), (3000, 4040, 4104)),
])
def test_wgmma_side_by_side_interleaved(config, size):
    """Hopper only: a gemm_wgmma variant measured the way benchmarks end (ours and cuBLAS
    interleaved repeat by repeat), verified, with the vendor's time beside it."""
    from porter.spec.arch import get_arch
    from porter.measure.backends.gpu import GpuBackend
    from porter.build.compile import compile_variant
    from porter.spec.template import find_template
    import cupy
    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("needs sm_90a")
    tpl, arch = find_template("gemm_wgmma"), get_arch("sm_90a")
    cfg = {**tpl.start_configs()[0], **config}
    assert tpl.workspace_clean_bytes(cfg, arch, size) <= tpl.workspace_bytes(cfg, arch, size)
    compiled = compile_variant(tpl, cfg, arch)
    assert compiled.ok, compiled.log
    be = GpuBackend(timeout_s=10)
    be.fresh_baseline = True
    try:
        for _ in range(2):   # twice: the first launch must have left the workspace as found
            out = be.measure(tpl, arch, cfg, compiled, [size])
            assert out.status == "measured", out.message
            m = out.measurements[0]
            assert m.error < 1e-2 and m.baseline and m.baseline_ms > 0 and m.ratio > 0
    finally:
        be.close()


@pytest.mark.parametrize("config,size", [
    (dict(), (4096, 4096, 4096)),                                    # TMA-stored epilogue
    (dict(EPI=0, STREAMK=1), (1000, 1000, 1024)),                   # direct stores, stream-K
    (dict(BM=64, BN=16, STAGES=8, CONSUMERS=1, SWAP=1, EPI=0), (16, 4096, 4096)),
])
def test_wgmma_f16_against_torch_matmul(config, size):
    """Hopper only: gemm_wgmma_f16 (DTYPE=1) measured as a port measures it, verified against
    the fp32 reference of its fp16 inputs, and no less accurate than torch.matmul in fp16 on
    inputs of the same kind."""
    from porter.spec.arch import get_arch
    from porter.measure.backends.gpu import GpuBackend
    from porter.build.compile import compile_variant
    from porter.measure.ops import get_op
    from porter.spec.template import find_template
    import cupy
    import torch
    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("needs sm_90a")
    tpl, arch = find_template("gemm_wgmma_f16"), get_arch("sm_90a")
    cfg = {**tpl.start_configs()[0], **config}
    compiled = compile_variant(tpl, cfg, arch)
    assert compiled.ok, compiled.log
    be = GpuBackend(timeout_s=10)
    be.fresh_baseline = True
    try:
        out = be.measure(tpl, arch, cfg, compiled, [size])
    finally:
        be.close()
    assert out.status == "measured", out.message
    m = out.measurements[0]
    assert m.baseline and m.baseline_ms > 0 and m.ratio > 0
    op = get_op("gemm_f16")
    state = op.setup(size, seed=0)
    a, b, c = (torch.from_dlpack(state[k]) for k in "ABC")
    torch.matmul(a, b.T, out=c)
    torch_err = op.error(state)
    assert m.error < 1e-2 and m.error <= 2 * torch_err + 1e-4, (m.error, torch_err)


def test_vendor_seed_from_the_profiled_baseline(tmp_path):
    """Hopper only: the GPU backend reads cuBLAS's kernel at a size through torch's profiler in
    a process of its own, and `porter port`'s warm start puts its tile into gemm_wgmma's
    terms: a feasible seed with the vendor's tile, named in the job's note."""
    pytest.importorskip("torch")
    import cupy
    from porter.build.check import static_check
    from porter.job.run import job_warm_start
    from porter.measure.backends.gpu import GpuBackend
    from porter.search.vendor import nvjet_tile
    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("needs sm_90a")
    store = open_store(f"sqlite:///{tmp_path / 'v.db'}")
    spec, tpl, arch = make_spec("gemm_wgmma", "sm_90a", ["1000x3000x1000"], 10)
    be = GpuBackend(timeout_s=10)
    try:
        kernels, = be.vendor_kernels(tpl, [(1000, 3000, 1000)])
        warm, _, note, _ = job_warm_start(store, tpl, arch, spec, 1, be)
    finally:
        be.close()
    tile = next(t for k in kernels if (t := nvjet_tile(k)) is not None)
    assert warm and "vendor" in note, (kernels, note)
    seed = warm[0]
    assert static_check(tpl, arch, seed, [(1000, 3000, 1000)]) is None
    assert (seed["BM"], seed["BN"]) == (tile["BM"], tile["BN"]) or tile["BN"] not in \
        tpl.params["BN"], (seed, tile)
