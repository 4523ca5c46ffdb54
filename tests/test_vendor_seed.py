"""The vendor's seed (porter.search.vendor): cuBLAS's nvjet kernel names read as gemm_wgmma's
tile, stages and cluster, put on a warm seed and fitted to the shape, and the sweep's warm start
taking it second. Real names from benchmarks/results/baseline_kernels_h100.json; no GPU."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from porter.build.check import static_check  # noqa: E402
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
