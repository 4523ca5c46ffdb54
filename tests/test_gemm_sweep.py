"""The bf16 GEMM sweep's CPU-testable parts: its shape list covers what models run, the warm
start picks seeds from the nearest tuned shapes and repairs them into the new shape's feasible
set, the pathology rule and the summary, and the committed results file's fields."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gemm_sweep as gs  # noqa: E402
from porter.build.check import static_check  # noqa: E402
from porter.search.warm import (Tuned, nearest_seeds, repair, seeds_for,  # noqa: E402
                                size_distance, tuned_from_records)
from porter.spec.arch import get_arch  # noqa: E402
from porter.spec.template import find_template  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "gemm_sweep_h200.json"


def shapes(cat=None):
    return [tuple(s[1:]) for s in gs.SHAPES if cat is None or s[0] == cat]


def test_shape_list_covers_what_models_run():
    all_ = shapes()
    assert len(all_) >= 40 and len(set(all_)) == len(all_)
    assert all(k % 8 == 0 for _, _, k in all_)          # TMA: K's pitch a multiple of 16 bytes
    sq = [m for m, n, k in all_ if m == n == k]
    assert any(m & (m - 1) == 0 for m in sq) and sum(m & (m - 1) != 0 for m in sq) >= 3
    llm = shapes("llm") + shapes("skinny")
    dims = {4096, 5120, 8192, 14336, 28672}
    assert all(n in dims and k in dims for _, n, k in llm)
    ms = {m for m, _, _ in llm}
    assert min(ms) == 1 and max(ms) == 16384 and len(ms) >= 8
    assert {n for _, n, _ in llm} == dims and {k for _, _, k in llm} == dims
    ragged = shapes("ragged")
    assert len(ragged) >= 6 and all(m % 64 and n % 64 for m, n, _ in ragged)
    assert any(n % 8 for _, n, _ in ragged)             # no TMA-stored epilogue there
    assert len([s for s in all_ if s[2] <= 1024]) >= 6
    assert len([s for s in all_ if s[2] >= 32768]) >= 3
    assert len([s for s in all_ if s[0] <= 64]) >= 6


def test_nearest_seeds_take_the_nearest_shapes_first():
    a, b, c = {"X": 1}, {"X": 2}, {"X": 3}
    tuned = [Tuned((4096, 4096, 4096), (a, b)), Tuned((16, 8192, 8192), (c,)),
             Tuned((3000, 5000, 1000), ({"X": 9},))]
    # 4096^3 is 9 doublings away, 3000x5000x1000 10.3: its best comes before 4096^3's second
    assert nearest_seeds((32, 8192, 8192), tuned, 4) == [c, a, {"X": 9}, b]
    assert nearest_seeds((4096, 4096, 4096), tuned, 2) == [{"X": 9}, c]   # not its own
    # a source of the very shape is left out: a re-port does not start from its own answer
    assert {"X": 9} not in nearest_seeds((3000, 5000, 1000), tuned, 5)
    # ... unless it was tuned on another GPU: a port to a new GPU starts from that answer
    other = Tuned((3000, 5000, 1000), ({"X": 8},), "h200", other_gpu=True)
    assert nearest_seeds((3000, 5000, 1000), tuned + [other], 5)[0] == {"X": 8}
    assert size_distance((1, 2, 4), (4, 2, 1)) == 4.0
    # with K's alignment counted, K = 1000 (rows 2000 bytes apart) is far from K = 1024
    near = size_distance((4096, 4096, 1000), (4096, 4096, 1024))
    assert near < 0.05
    assert size_distance((4096, 4096, 1000), (4096, 4096, 1024), align=(0, 0, 1)) == \
        pytest.approx(near + 3)        # 2^3 divides 1000, 2^6 (the cap) 1024
    assert size_distance((1, 1, 1000), (1, 1, 3000), align=(0, 0, 1)) == \
        pytest.approx(size_distance((1, 1, 1000), (1, 1, 3000)))


def test_repair_changes_the_fewest_and_latest_parameters():
    params = {"A": [1, 2], "B": [1, 2, 3], "C": [0, 1]}
    ok = {(2, 3, 1), (1, 1, 0), (1, 3, 0)}
    feasible = lambda c: (c["A"], c["B"], c["C"]) in ok   # noqa: E731
    assert repair({"A": 2, "B": 3, "C": 1}, params, feasible) == {"A": 2, "B": 3, "C": 1}
    # one change, the last parameter first: C, not A
    assert repair({"A": 1, "B": 3, "C": 1}, params, feasible) == {"A": 1, "B": 3, "C": 0}
    assert repair({"A": 2, "B": 2, "C": 0}, params, feasible, max_changes=1) is None
    # two changes: C and B before C and A
    assert repair({"A": 2, "B": 2, "C": 0}, params, feasible) == {"A": 2, "B": 3, "C": 1}


def test_seeds_for_a_ragged_n_are_feasible_and_keep_the_tile():
    """N % 8 != 0 rules out the TMA-stored epilogues (EPI 2/3) and TAILW of every tuned seed;
    repaired, they keep their tiles."""
    tpl, arch = find_template("gemm_wgmma"), get_arch("sm_90a")
    shape = (2999, 4004, 1000)
    seeds = seeds_for(shape, gs.tuned_sources(), tpl.params,
                      lambda c: static_check(tpl, arch, c, [shape]) is None, 12)
    assert len(seeds) == 12
    assert all(static_check(tpl, arch, c, [shape]) is None for c in seeds)
    assert all(c["EPI"] < 2 and c["TAILW"] == 0 for c in seeds)
    assert (seeds[0]["BM"], seeds[0]["BN"]) == (128, 256)


def test_a_seed_gets_back_what_its_source_size_ruled_out():
    """A seed from 2999x4004x1000 (N % 8 != 0: no TMA-stored epilogue, so EPI=0 won there)
    starts 3000x5000x1000 with EPI=3 again (it measured 0.70 of cuBLAS there with EPI=0, 0.91
    with EPI=3); a value its source could have had and did not take (GROUP_M=4, CLUSTER=2) is
    kept, and without feasible_at nothing changes."""
    from porter.search.warm import unforce
    tpl, arch = find_template("gemm_wgmma"), get_arch("sm_90a")
    src, dst = (2999, 4004, 1000), (3000, 5000, 1000)

    def feasible(c, size=None):
        return static_check(tpl, arch, c, [tuple(size or dst)]) is None
    cfg = {**{n: v[0] for n, v in tpl.params.items()}, "GROUP_M": 4, "CLUSTER": 2, "EPI": 0}
    assert feasible(cfg, src) and not feasible({**cfg, "EPI": 3}, src)
    assert unforce(cfg, tpl.params, src, feasible) == {**cfg, "EPI": 3}
    assert unforce(cfg, tpl.params, dst, feasible) == cfg          # free at its source: kept
    tuned = [Tuned(src, (cfg,), "t")]
    assert seeds_for(dst, tuned, tpl.params, feasible, 1, feasible_at=feasible)[0]["EPI"] == 3
    assert seeds_for(dst, tuned, tpl.params, feasible, 1)[0]["EPI"] == 0


def test_variants_step_along_the_tile_and_schedule_first():
    """The best seed's neighbours, one parameter away: round robin over the parameters named,
    nearest values first, each repaired with the varied parameter kept."""
    from porter.search.warm import variants
    tpl, arch = find_template("gemm_wgmma"), get_arch("sm_90a")
    shape = (3000, 5000, 1000)
    ok = lambda c: static_check(tpl, arch, c, [shape]) is None   # noqa: E731
    best = {n: v[0] for n, v in tpl.params.items()}
    vs = variants(best, tpl.params, ("BN", "STREAMK"), ok)
    assert all(ok(v) for v in vs)
    assert [v["BN"] for v in vs[:2]] == [128, 256] and vs[1]["STREAMK"] == 1
    assert {v["BN"] for v in vs} >= {128, 192, 200, 224, 64}
    assert all(sum(v[k] != best[k] for k in best) <= 2 for v in vs)
    seeds = seeds_for(shape, gs.tuned_sources(), tpl.params, ok, 16, vary=("BN", "STREAMK"),
                      n_vary=6)
    assert len(seeds) == 16 and len({tpl.config_key(c) for c in seeds}) == 16


def test_wave_variants_pick_the_tile_that_fills_the_multiprocessors():
    """Template.wave_cost (space.toml's [launch] tiles and tile_cost) ranks tile shapes for a
    size: 128 x 192 leaves 36 of 132 SMs idle at 1536^3, 128 x 144 makes exactly 132 tiles;
    at 256x5120x5120, 128 x 80 makes 128 tiles where 128 x 128 makes 80; at 1024x1024x32768
    (32 tiles of 128 x 256) a split along K; on 114 SMs (H100 PCIe) the answer moves."""
    from porter.search.warm import wave_variants
    tpl = find_template("gemm_wgmma")
    best = {n: v[0] for n, v in tpl.params.items()}

    def firsts(shape, config, arch=get_arch("sm_90a"), vary=("BM", "BN", "SPLITK")):
        ok = lambda c: static_check(tpl, arch, c, [shape]) is None   # noqa: E731
        cost = lambda c: tpl.wave_cost(c, arch, shape)              # noqa: E731
        vs = wave_variants(config, tpl.params, ok, cost, vary, 4)
        assert vs and all(ok(v) and cost(v) < cost(config) for v in vs)
        assert [cost(v) for v in vs] == sorted(cost(v) for v in vs)
        return vs

    def first(shape, config, arch=get_arch("sm_90a")):
        return firsts(shape, config, arch)[0]

    v = first((1536, 1536, 1536), {**best, "BN": 192})
    assert (v["BM"], v["BN"], v["SPLITK"]) == (128, 144, 1)
    # 256x5120x5120: 128 x 80 (measured 0.99 of cuBLAS) and 64 x 160 (0.96) make 128 tiles
    # where 128 x 128 makes 80; both come before the split along K (0.67-0.75)
    vs = firsts((256, 5120, 5120), {**best, "BN": 128})
    top = [(v["BM"], v["BN"], v["SPLITK"]) for v in vs[:3]]
    assert (128, 80, 1) in top and (64, 160, 1) in top and top[-1] != (128, 160, 2)
    assert first((1024, 1024, 32768), best)["SPLITK"] > 1
    assert tpl.wave_cost(best, get_arch("sm_90a"), (8192, 8192, 8192)) is not None
    h100 = get_arch("sm_90a").with_sms(114)
    assert (first((1536, 1536, 1536), {**best, "BN": 192}, h100)["BN"]) != 144
    # with CLUSTER varied too: a cluster multicasting B halves a CTA's B reads from L2 (at
    # 3000x5000x1000, K rows off 128-byte lines: 55 us in clusters of 2, 89 us without; ncu),
    # and 256 x 192 in clusters of 2 fills 10 whole waves at 7000x9000x3000 (0.93 of cuBLAS
    # where 128 x 256 reads 0.90; gemm_probe_weak2_h200.json)
    vs = firsts((3000, 5000, 1000), best, vary=("BM", "BN", "SPLITK", "CLUSTER"))
    assert all(v["CLUSTER"] > 1 for v in vs)
    vs = firsts((7000, 9000, 3000), best, vary=("BM", "BN", "SPLITK", "CLUSTER"))
    assert (256, 192, 2) in [(v["BM"], v["BN"], v["CLUSTER"]) for v in vs]
    # what counts is rows off 32-byte sectors: K = 2000 (rows 4000 bytes apart, on sectors)
    # ran 1.003 of cuBLAS without a cluster and 0.923 with (the sweep's 6000x7000x2000 trials)
    arch = get_arch("sm_90a")
    for k, clustered in ((2000, False), (1000, True)):
        c1, c2 = (tpl.wave_cost({**best, "CLUSTER": c}, arch, (3000, 5000, k)) for c in (1, 2))
        assert (c2 < c1) == clustered, (k, c1, c2)


def test_tuned_records_fill_new_parameters_and_skip_removed_ones():
    defaults = {"BM": 128, "TAILW": 0}
    recs = [{"template": "gemm_wgmma", "shape": [1, 2, 3], "params": {"BM": 64}, "ratio": 1.0,
             "finalists": [{"params": {"BM": 256}, "ratio": 1.01},
                           {"params": {"BM": 64}, "ratio": 1.0}]},
            {"template": "gemm_wgmma", "shape": [4, 5, 6], "params": {"BM": 64, "NARROW": 1}},
            {"template": "other", "shape": [1, 2, 3], "params": {"BM": 64}}]
    (t,) = tuned_from_records(recs, "gemm_wgmma", defaults)
    # the reported configuration first, then the finalists by ratio, no repeats
    assert t.configs == ({"BM": 64, "TAILW": 0}, {"BM": 256, "TAILW": 0})
    assert t.size == (1, 2, 3)


def test_every_tuned_source_and_sweep_record_is_usable():
    tuned = gs.tuned_sources()
    assert {(4096, 4096, 4096), (16, 8192, 8192), (4096, 28672, 8192)} <= {t.size for t in tuned}
    tpl = find_template("gemm_wgmma")
    full = tpl.complete({})
    rec = {"shape": [5, 6, 7], "params": {"BM": 64}, "ratio": 1.0,
           "finalists": [{"params": {"BM": 256}, "ratio": 1.1}, {"params": {"BM": 64}, "ratio": 1},
                         {"params": {"BM": 128, "GONE": 1}, "ratio": 1.2}]}
    # the reported one first, then the finalists by ratio; parameters a record lacks take the
    # template's default; a configuration with a parameter the template lost is left out
    assert gs.sweep_tuned(rec).configs == ({**full, "BM": 64}, {**full, "BM": 256})
    # every recorded configuration names only parameters the template still has (one added
    # since, PINGPONG, takes its default)
    for r in json.loads(RESULTS.read_text())["records"]:
        t = gs.sweep_tuned(r)
        assert t is not None and set(r["params"]) <= set(tpl.params), r["shape"]
        assert set(t.configs[0]) == set(tpl.params) and t.configs[0]["BM"] == r["params"]["BM"]


def test_pathology_rule_and_summary():
    recs = [{"shape": [4096, 4096, 4096], "category": "a", "ratio": 1.0, "trials": 30,
             "baseline_ms": 0.176 / 0.9},
            {"shape": [8192, 8192, 8192], "category": "a", "ratio": 1.02, "trials": 60,
             "baseline_ms": 1.41 / 0.9},
            # cuBLAS at a fifth of its usual share of the roofline and 3x our time
            {"shape": [2999, 4001, 4104], "category": "b", "ratio": 3.0, "trials": 40,
             "baseline_ms": gs.roofline_ms((2999, 4001, 4104), 4000) / 0.18},
            {"shape": [3000, 5000, 1000], "category": "b", "ratio": 0.95, "trials": 41,
             "baseline_ms": gs.roofline_ms((3000, 5000, 1000), 4000) / 0.85}]
    gs.mark_pathological(recs, 4000)
    assert [r["baseline_pathological"] for r in recs] == [False, False, True, False]
    s = gs.summarize(recs)
    assert s["counted"] == 3 and s["pathological"] == [[2999, 4001, 4104]]
    assert s["geomean"] == pytest.approx((1.0 * 1.02 * 0.95) ** (1 / 3))
    assert s["below_0.97"] == [{"shape": [3000, 5000, 1000], "ratio": 0.95}]
    assert s["accept"] == {"geomean_at_least_1": False, "none_below_0.97": False,
                           "trials_at_most_60": True}


def test_converged_hook_stops_after_patience():
    from _sweep_port import Converged
    from porter.records import TrialRecord

    class Store:
        def cancel_requested(self, job):
            return False
    h = Converged(min_trials=4, patience=4)
    h.start(Store(), 1)
    for i, obj in enumerate([1.0, 0.9, 0.899, 0.9, 0.95]):
        h.on_trial(TrialRecord(number=i, params={}, config_key="", status="measured",
                               objective=obj), None)
        assert h.beat() is None
    h.on_trial(TrialRecord(number=9, params={}, config_key="", status="infeasible"), None)
    assert h.beat() is None            # infeasible trials do not count
    h.on_trial(TrialRecord(number=5, params={}, config_key="", status="measured",
                           objective=0.91), None)
    assert h.beat() == "stop" and h.stopped


def test_finalists_add_near_ties_of_another_structure():
    """The two fastest, then the fastest of each other structure within 3 % (GROUP_M or
    RELEASE alone is not another structure); nothing beyond 3 %, at most two more."""
    from types import SimpleNamespace as T

    from _sweep_port import pick_finalists
    base = dict(BM=128, BN=144, STAGES=5, CONSUMERS=2, GROUP_M=4, PERSIST=1, CLUSTER=1, EPI=2,
                SPLITK=1, STREAMK=0, TAILW=0, SWAP=0, PINGPONG=0, RELEASE=0)
    trials = [T(params={**base, **d}, objective=o) for d, o in [
        ({}, 1.000), ({"RELEASE": 1}, 1.004), ({"GROUP_M": 8}, 1.006),   # the same structure
        ({"PERSIST": 0, "EPI": 3}, 1.012), ({"PERSIST": 0, "EPI": 3, "GROUP_M": 16}, 1.013),
        ({"STAGES": 4}, 1.020), ({"CONSUMERS": 1}, 1.025), ({"BN": 192}, 1.040)]]
    got = pick_finalists(trials)
    assert [t.objective for t in got] == [1.000, 1.004, 1.012, 1.020]
    assert [t.objective for t in pick_finalists(trials, distinct=5)] == \
        [1.000, 1.004, 1.012, 1.020, 1.025]                          # 1.040 is beyond 3 %
    assert [t.objective for t in pick_finalists(trials, near=0.005)] == [1.000, 1.004]
    assert pick_finalists(trials[:1]) == trials[:1] and pick_finalists([]) == []


def test_bad_shape_is_one_line():
    with pytest.raises(SystemExit, match="write MxNxK"):
        gs.parse_shape("4096x4096")


@pytest.mark.skipif(not RESULTS.is_file(), reason="no sweep results committed yet")
def test_seed_check_replays_the_warm_start_on_the_results():
    """Leave-one-shape-out on the sweep's own records: counting K's alignment puts the final
    configuration among the 16 seeds more often (the figure the notes quote)."""
    out = gs.seed_check(str(RESULTS))
    plain, aligned = out["(0.0, 0.0, 0.0)"], out["(0.0, 0.0, 1.0)"]
    assert plain["shapes"] == aligned["shapes"] >= 40
    assert aligned["final_among_seeds"] > plain["final_among_seeds"]
    assert aligned["seed_within_1pct_of_best_tried"] >= plain["seed_within_1pct_of_best_tried"]


@pytest.mark.skipif(not RESULTS.is_file(), reason="no sweep results committed yet")
def test_results_file_has_every_field():
    doc = json.loads(RESULTS.read_text())
    assert len(doc["records"]) >= 40
    for r in doc["records"]:
        for key in ("gpu", "shape", "params", "trials", "seconds", "ratio",
                    "baseline_pathological"):
            assert key in r, (r["shape"], key)
        assert r["trials"] <= 60
    assert "geomean" in doc["summary"]


def test_tuned_sizes_from_a_database(tmp_path):
    """Each one-size job of the template becomes a tuned size with its best configurations,
    best first; jobs of several sizes and unmeasured trials are left out."""
    from porter.job.jobs import make_spec, template_record, template_snapshot
    from porter.records import TrialRecord
    from porter.search.warm import tuned_from_store
    from porter.store.base import open_store
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}")
    base = {n: v[0] for n, v in find_template("gemm_wgmma").params.items()}

    def job(sizes, objectives):
        spec, tpl, _ = make_spec("gemm_wgmma", "sm_90a", sizes, trials=4,
                                 backend="compile-only")
        src, space = template_record(tpl)
        j = store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                             snapshot=template_snapshot(tpl))
        for i, obj in enumerate(objectives):
            cfg = {**base, "STAGES": tpl.params["STAGES"][i]}
            store.record_trial(j, TrialRecord(number=i, params=cfg, config_key=tpl.config_key(
                cfg), status="measured" if obj else "compiled", objective=obj))
        return j
    job(["3000x5000x1000"], [1.10, 0.95, None, 1.02])
    job(["4096x4096x4096", "8192x8192x8192"], [0.9])
    (t,) = tuned_from_store(store, "gemm_wgmma", "sm_90a")
    assert t.size == (3000, 5000, 1000) and t.ratio == pytest.approx(1 / 0.95)
    assert [c["STAGES"] for c in t.configs] == [3, 6, 4]      # objectives 0.95, 1.02, 1.10


def test_warm_from_reads_another_gpus_sweep(tmp_path):
    """--warm-from: each record's best and finalists, as other-GPU sources of its shape."""
    f = tmp_path / "sweep.json"
    f.write_text(json.dumps({"records": [
        {"shape": [3000, 5000, 1000], "params": {"BM": 128}, "ratio": 0.9,
         "finalists": [{"params": {"BM": 64}, "ratio": 0.8}]},
        {"shape": [1, 2, 3], "params": None, "ratio": None}]}))
    (t,) = gs.other_gpu_sources(f)
    assert t.other_gpu and t.size == (3000, 5000, 1000) and t.source == "sweep.json"
    full = find_template("gemm_wgmma").complete({})
    assert t.configs == ({**full, "BM": 128}, {**full, "BM": 64})


def test_sweep_jobs_compile_in_the_shared_pool_lent_to_the_engine(tmp_path, monkeypatch):
    """shared_compiles patches nothing of porter's: SweepPorter lends its pool to each shape's
    Engine (`compiles`), every job compiles there, and the pool outlives the jobs until the
    sweep closes it."""
    import porter.job.loop as loop
    from _sweep_port import SharedPool, SweepPorter, shared_compiles
    from porter.measure.backends.base import CompileOnlyBackend
    from porter.store.base import open_store

    class Device(CompileOnlyBackend):          # stands in for the GPU: compiles, no device
        sms = 132

        def device_info(self):
            return {"gpu": "none (compile-only)", "sms": self.sms}

    submitted = []

    class Counting(SharedPool):
        def submit(self, token, *args):
            submitted.append(token)
            return super().submit(token, *args)

    original = loop.compiles_for
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("_sweep_port.SharedPool", Counting)
    with shared_compiles(workers=2, ahead=3) as pool:
        assert loop.compiles_for is original
        monkeypatch.setattr(loop, "compiles_for", lambda *a: pytest.fail("a pool per job"))
        sweep = SweepPorter(open_store(f"sqlite:///{tmp_path / 's.db'}"), trials=2,
                            min_trials=2, patience=10, backends=(Device(), Device()),
                            compiles=pool)
        for shape in ((1024, 1024, 1024), (2048, 1024, 512)):
            found = sweep.port(shape, [])
            assert found["trials"] == 2 and found["stopped"] == "done", found
            assert found["counts"].get("compiled") == 2
            assert pool.pending() == 0
        assert len([t for t in submitted if t is not None]) == 4
    with pytest.raises(RuntimeError):               # shut down with the sweep
        pool.submit(None, sweep.tpl, sweep.tpl.start_configs()[0], sweep.arch)


def test_pitch_table_takes_the_best_trial_of_the_tile_each_way():
    from sweep_pitch import pitch_table
    params = ["BM", "BN", "CLUSTER"]
    recs = [{"shape": [3000, 5000, 1000], "tried": [
                ["128,256,1", "measured", 0.70], ["128,256,1", "measured", 0.71],
                ["128,256,2", "measured", 0.93], ["128,256,4", "failed", None],
                ["128,192,2", "measured", 0.99]]},
            {"shape": [4096, 4096, 4096], "tried": [["128,256,1", "measured", 1.0]]}]
    assert pitch_table(recs, params) == [{"shape": [3000, 5000, 1000], "pitch_mod32": 16,
                                          "pitch_mod128": 80, "no_cluster": 0.71,
                                          "cluster": 0.93}]
    assert pitch_table(recs, params, (128, 192)) == []     # never tried without a cluster
