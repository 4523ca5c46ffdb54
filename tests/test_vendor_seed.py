"""The vendor's seed (porter.search.vendor): cuBLAS's nvjet kernel names read as gemm_wgmma's
tile, stages and cluster, put on a warm seed and fitted to the shape, and the sweep's warm start
taking it second. Real names from benchmarks/results/baseline_kernels_h100.json; no GPU."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from porter.build.check import static_check  # noqa: E402
from porter.job.jobs import make_spec  # noqa: E402
from porter.search.vendor import nvjet_tile, vendor_seed, vendor_seeds  # noqa: E402
from porter.spec.arch import get_arch  # noqa: E402
from porter.spec.template import find_template  # noqa: E402

NAMES = ROOT / "benchmarks" / "results" / "baseline_kernels_h100.json"
BASE = dict(BM=128, BN=192, BK=64, STAGES=4, CONSUMERS=2, GROUP_M=8, PERSIST=1, CLUSTER=2,
            EPI=3, SPLITK=1, STREAMK=0, SWAP=0, TAILW=0, PINGPONG=0, RELEASE=0)


def kernels(shape):
    return next(r["kernels"] for r in json.loads(NAMES.read_text())["records"]
                if r["op"] == "gemm_bf16" and r["shape"] == list(shape))


def test_nvjet_names_give_the_tile_in_row_major_terms():
    # cuBLAS's column-major view: 200 x 128 is 128 rows of C by 200 columns
    assert nvjet_tile(kernels((1000, 3000, 1000))[0]) == \
        dict(BM=128, BN=200, BK=64, STAGES=5, CLUSTER=4)
    assert nvjet_tile("nvjet_sm90_tst_152x256_64x4_1x2_h_bz_coopA_TNN") == \
        dict(BM=256, BN=152, BK=64, STAGES=4, CLUSTER=2)
    assert nvjet_tile("nvjet_sm90_qqtst_128x256_128x4_2x1_v_bz_coopA_TNN")["CLUSTER"] == 2
    assert nvjet_tile("Memset (Device)") is None
    assert nvjet_tile("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") is None
    every = [k for r in json.loads(NAMES.read_text())["records"] for k in r["kernels"]
             if k.startswith("nvjet")]
    assert every and all(nvjet_tile(k) for k in every)


def test_the_seed_takes_the_most_stages_that_fit_and_keeps_the_tile():
    """1000x3000x1000: cuBLAS's 128 x 200 in clusters of 4 with 5 stages. Persistent clusters
    of 4 are ruled out and 5 stages do not fit beside the TMA-stored epilogue, so the seed is
    128 x 200, clusters of 4, not persistent, 4 stages, the base's epilogue kept."""
    tpl, arch = find_template("gemm_wgmma"), get_arch("sm_90a")
    shape = (1000, 3000, 1000)

    def feasible(c):
        return static_check(tpl, arch, c, [shape]) is None
    raw = vendor_seed(kernels(shape), BASE, tpl.params)
    assert {k: raw[k] for k in ("BM", "BN", "STAGES", "CLUSTER")} == \
        dict(BM=128, BN=200, STAGES=5, CLUSTER=4) and not feasible(raw)
    seed = vendor_seed(kernels(shape), BASE, tpl.params, feasible)
    assert feasible(seed)
    assert seed == {**BASE, "BN": 200, "CLUSTER": 4, "PERSIST": 0, "STAGES": 4}
    # a tile the template does not have goes to the nearest it has (160 rows: 128)
    odd = vendor_seed(["nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_TNT"], BASE, tpl.params)
    assert (odd["BM"], odd["BN"], odd["CLUSTER"]) == (128, 256, 2)
    assert vendor_seed(["Memset (Device)"], BASE, tpl.params, feasible) is None


def test_a_clustered_vendor_tile_comes_with_and_without_its_cluster():
    """1536^3: cuBLAS's 128 x 144 in clusters of 2 (6 stages), then the same tile without a
    cluster; a vendor tile without a cluster, or one whose unclustered fit is the same
    configuration, gives one seed."""
    tpl, arch = find_template("gemm_wgmma"), get_arch("sm_90a")
    shape = (1536, 1536, 1536)

    def feasible(c):
        return static_check(tpl, arch, c, [shape]) is None
    base = {**BASE, "PERSIST": 0}
    first, alone = vendor_seeds(kernels(shape), base, tpl.params, feasible)
    assert (first["BM"], first["BN"], first["CLUSTER"]) == (128, 144, 2)
    assert (alone["BM"], alone["BN"], alone["CLUSTER"]) == (128, 144, 1)
    assert feasible(first) and feasible(alone)
    assert first == vendor_seed(kernels(shape), base, tpl.params, feasible)
    assert len(vendor_seeds(["nvjet_sm90_tst_144x128_64x6_1x1_h_bz_TNN"], base, tpl.params,
                            feasible)) == 1
    assert vendor_seeds(["Memset (Device)"], base, tpl.params, feasible) == []


def test_a_ping_pong_vendor_kernel_seeds_the_ping_pong_schedule_too():
    """A kernel without `coop` in its name is cuBLAS's ping-pong schedule: the seed comes as
    the base's schedule, then with PINGPONG 1 (tile, cluster and stages kept), then without the
    cluster. A cooperative kernel gives no ping-pong seed; nor does one where ping-pong cannot
    be fitted (1536^3: 66 tile pairs for 66 clusters, and ping-pong needs more tiles than CTAs);
    a template whose [vendor] leaves PINGPONG unmapped gets none either. cuBLASLt's fp8 kernel
    for row and column scales is such a kernel, and gemm_fp8 takes both schedules from it."""
    from porter.search.vendor import nvjet_pingpong
    tpl, arch = find_template("gemm_wgmma"), get_arch("sm_90a")
    assert nvjet_pingpong("nvjet_sm90_tst_144x128_64x6_1x2_h_bz_TNN") is True
    assert nvjet_pingpong("nvjet_sm90_tst_152x256_64x4_1x2_h_bz_coopA_TNN") is False
    assert nvjet_pingpong("nvjet_sm90_qqtst_320x128_128x3_1x2_h_bz_coopB_TNT") is False
    assert nvjet_pingpong("Memset (Device)") is None
    shape = (3000, 5000, 1024)

    def feasible(c, shape=shape, tpl=tpl):
        return static_check(tpl, arch, c, [shape]) is None
    pp = ["nvjet_sm90_tst_192x128_64x4_1x2_h_bz_TNN"]
    seeds = vendor_seeds(pp, BASE, tpl.params, feasible, tpl.vendor.params)
    assert [(c["BN"], c["CLUSTER"], c["PINGPONG"]) for c in seeds] == \
        [(192, 2, 0), (192, 2, 1), (192, 1, 0)]
    assert seeds[1] == {**seeds[0], "PINGPONG": 1} and all(map(feasible, seeds))
    coop = ["nvjet_sm90_tst_192x128_64x4_1x2_h_bz_coopA_TNN"]
    assert [c["PINGPONG"] for c in vendor_seeds(coop, BASE, tpl.params, feasible)] == [0, 0]
    unmapped = {f: f for f in ("BM", "BN", "BK", "STAGES", "CLUSTER")}
    assert [c["PINGPONG"] for c in vendor_seeds(pp, BASE, tpl.params, feasible,
                                                unmapped)] == [0, 0]
    # 1536^3 (the real name): ping-pong does not fit, the two seeds as before
    small = vendor_seeds(kernels((1536, 1536, 1536)), {**BASE, "PERSIST": 0}, tpl.params,
                         lambda c: static_check(tpl, arch, c, [(1536, 1536, 1536)]) is None)
    assert [c["PINGPONG"] for c in small] == [0, 0]
    fp8 = find_template("gemm_fp8")
    size = (8192, 8192, 8192, 2, 1)
    row = vendor_seeds(["nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_TNT"],
                       fp8.complete({}), fp8.params,
                       lambda c: static_check(fp8, arch, c, [size]) is None, fp8.vendor.params)
    assert [(c["BM"], c["BN"], c["STAGES"], c["CLUSTER"], c["PINGPONG"]) for c in row] == \
        [(128, 128, 6, 2, 0), (128, 128, 6, 2, 1), (128, 128, 6, 1, 0)]


def test_the_sweep_puts_the_vendors_seeds_second():
    import gemm_sweep as gs
    from _sweep_port import N_SEEDS, sweep_seeds
    tpl, arch = find_template("gemm_wgmma"), get_arch("sm_90a")
    shape = (1000, 3000, 1000)
    tuned = gs.tuned_sources() + gs.other_gpu_sources(
        ROOT / "benchmarks" / "results" / "gemm_sweep_h200.json")
    plain = sweep_seeds(tpl, arch, shape, tuned)
    with_vendor = sweep_seeds(tpl, arch, shape, tuned, kernels(shape))
    assert len(plain) == len(with_vendor) == N_SEEDS
    assert with_vendor[0] == plain[0] and with_vendor[3:] == plain[1:-2]
    v, alone = with_vendor[1:3]
    assert (v["BM"], v["BN"], v["CLUSTER"]) == (128, 200, 4) and v not in plain
    assert (alone["BM"], alone["BN"], alone["CLUSTER"]) == (128, 200, 1) and alone not in plain
    assert gs.vendor_kernels(NAMES)[shape] == kernels(shape)


def test_a_template_may_map_the_names_fields_to_its_own_parameters():
    params = {"TM": (64, 128), "TN": (128, 256), "S": (2, 4, 6), "CL": (1, 2)}
    base = {"TM": 64, "TN": 128, "S": 2, "CL": 1}
    name = ["nvjet_sm90_tst_256x128_64x6_1x2_h_bz_coopA_TNN"]
    names = {"BM": "TM", "BN": "TN", "STAGES": "S"}
    # CLUSTER maps to nothing: not set, and no unclustered twin
    assert vendor_seeds(name, base, params, names=names) == [{"TM": 128, "TN": 256, "S": 6,
                                                              "CL": 1}]
    both = vendor_seeds(name, base, params, names={**names, "CLUSTER": "CL"})
    assert [c["CL"] for c in both] == [2, 1]


def _replay_with_names(tmp_path, names_by_size):
    from porter.measure.backends.replay import RECORDING_FORMAT, ReplayBackend
    path = tmp_path / "names.json"
    path.write_text(json.dumps({
        "format": RECORDING_FORMAT, "template": "gemm_wgmma", "arch": "sm_90a",
        "param_names": [], "device": {"gpu": "NVIDIA H100 80GB HBM3"}, "trials": {},
        "vendor_kernels": names_by_size}))
    return ReplayBackend(path)


def test_a_port_starts_from_the_vendors_kernel(tmp_path, monkeypatch):
    """`porter port`'s warm start (porter.job.run.job_warm_start): the nearest tuned size's
    best, then cuBLAS's own tile at the job's size and its unclustered twin, then the other
    near configurations; the note names the kernel. The names are the H100's, recorded by its
    profiler (baseline_kernels_h100.json), served by the replay backend."""
    from porter.job.run import job_warm_start, vendor_configs
    from porter.store.base import open_store
    from test_near_seeds import BEST_4096, new_job, tuned_job
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}")
    shape = (1000, 3000, 1000)
    be = _replay_with_names(tmp_path, {"1000x3000x1000": kernels(shape)})
    assert be.vendor_kernels(None, [shape, (1, 2, 3)]) == [kernels(shape), []]
    tuned_job(store, (4096, 4096, 4096), [BEST_4096])
    spec, tpl, arch, job = new_job(store, "1000x3000x1000")
    plain, _, plain_note, plain_origins = job_warm_start(store, tpl, arch, spec, job)
    warm, _, note, origins = job_warm_start(store, tpl, arch, spec, job, be)
    assert "vendor" not in plain_note and "nvjet_sm90_tst_200x128_64x5_1x4" in note, note
    assert warm[0] == plain[0] and warm[3:] == plain[1:]
    v, alone = warm[1:3]
    # each configuration's origin, which its trial records: the kernel for the vendor's two
    near = "nearest tuned sizes (4096x4096x4096)"
    assert [origins[tpl.config_key(tpl.complete(c))] for c in warm[:3]] == \
        [near, *2 * ["vendor kernel " + kernels(shape)[0]]], origins
    assert set(plain_origins.values()) == {near} and len(plain_origins) == len(plain)
    assert (v["BM"], v["BN"], v["CLUSTER"]) == (128, 200, 4)
    assert (alone["BM"], alone["BN"], alone["CLUSTER"]) == (128, 200, 1)
    assert all(static_check(tpl, arch, c, [shape]) is None for c in (v, alone))
    # without a tuned size the seed sits on the template's own first configuration
    spec_b, tpl, arch, job_b = new_job(store, "1000x3000x1000")
    alone_seeds, _ = vendor_configs(tpl, arch, spec_b, be)
    assert [(c["BN"], c["CLUSTER"]) for c in alone_seeds] == [(200, 4), (200, 1)]
    # a cold job, a size the backend has no names for, a template without [vendor]: none
    spec_c, tpl, arch, _ = new_job(store, "1000x3000x1000", cold=True)
    assert vendor_configs(tpl, arch, spec_c, be) == ([], "")
    spec_d, tpl, arch, _ = new_job(store, "1024x3072x1024")
    assert vendor_configs(tpl, arch, spec_d, be) == ([], "")
    mma_spec, mma, mma_arch = make_spec("gemm_mma", "sm_90a", ["1000x3000x1000"], 10,
                                        backend="compile-only")
    assert mma.vendor is None and vendor_configs(mma, mma_arch, mma_spec, be) == ([], "")


def test_a_recording_with_bad_names_is_refused_in_one_line(tmp_path):
    from porter.errors import SpecError
    with pytest.raises(SpecError, match="vendor_kernels must map sizes"):
        _replay_with_names(tmp_path, {"1000x3000x1000": "nvjet_sm90_tst_200x128_64x5_1x4"})


def test_a_backend_that_fails_to_name_them_costs_a_seed_not_the_job(tmp_path):
    from porter.job.run import vendor_configs

    class Broken:
        vendor_note = ""

        def vendor_kernels(self, template, sizes):
            raise RuntimeError("profiler unavailable")

    class Quiet:
        vendor_note = "torch is not installed beside the GPU"

        def vendor_kernels(self, template, sizes):
            return [[] for _ in sizes]
    spec, tpl, arch = make_spec("gemm_wgmma", "sm_90a", ["1000x3000x1000"], 10,
                                backend="compile-only")
    assert vendor_configs(tpl, arch, spec, Broken()) == \
        ([], "the vendor's kernels unknown (profiler unavailable)")
    assert vendor_configs(tpl, arch, spec, Quiet()) == \
        ([], "no vendor seed: torch is not installed beside the GPU")


@pytest.mark.parametrize("section, message", [
    ('kernels = "cutlass"', "kernels must be one of nvjet"),
    ('kernels = "nvjet"\nparams = { TILE = "BM" }', "params names 'TILE'"),
    ('kernels = "nvjet"\nparams = { BM = "ROWS" }', "maps BM to 'ROWS', which is not a "
     "parameter"),
    ('kernels = "nvjet"\nextra = 1', "takes kernels and params only"),
])
def test_a_bad_vendor_section_is_one_line(tmp_path, section, message):
    import shutil
    from porter.errors import TemplateError
    from porter.spec.template import load_template
    folder = tmp_path / "t"
    shutil.copytree(ROOT / "search_spaces" / "gemm_wgmma", folder)
    toml = folder / "space.toml"
    text = toml.read_text()
    start = text.index("[vendor]")
    end = text.index("[constraints]")
    toml.write_text(text[:start] + "[vendor]\n" + section + "\n\n" + text[end:])
    with pytest.raises(TemplateError, match=re.escape(message)):
        load_template(folder)
