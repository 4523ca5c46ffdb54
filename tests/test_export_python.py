"""The python export's module on constructed tuning tables (no cubins, CPU only): which tuned
configuration it runs at an untuned size, and the launch it carries (tensor maps, clusters)."""
from __future__ import annotations

import json
import math

import pytest

from test_export import _load_module, run_c


def _module(tmp_path, rows, template="gemm_wgmma"):
    """A python-format module over a constructed tuning table (no cubins: CPU only)."""
    from porter.export.fmt_python import python_module
    from porter.spec.template import find_template
    tpl = find_template(template)
    files = {json.dumps(r["params"], sort_keys=True): f"v{i}.cubin" for i, r in enumerate(rows)}
    path = tmp_path / f"{template}_tuned.py"
    path.write_text(python_module(tpl, "sm_90a", rows, files))
    return _load_module(path)


def test_python_module_picks_a_configuration_legal_at_the_size(tmp_path):
    """Acceptance 4: at 4096x4000x4096 the nearest tuned configuration (4096^3, re-cut last
    rows TAILW = 224) is illegal (N % TAILW too large), so the module runs the one tuned for
    8192^3, says so once, and refuses a size no configuration fits (K % 8 != 0)."""
    from porter.spec.template import find_template
    default = find_template("gemm_wgmma").start_configs()[0]
    rows = [{"size": [4096] * 3, "params": {**default, "TAILW": 224}, "ratio": 1.005},
            {"size": [8192] * 3, "params": {**default, "STREAMK": 1}, "ratio": 1.042}]
    mod = _module(tmp_path, rows)
    assert mod.nearest((4096, 4000, 4096))["size"] == [4096] * 3
    assert mod.select((4096, 4096, 4096))["size"] == [4096] * 3      # tuned here: itself
    with pytest.warns(UserWarning, match=r"4096x4000x4096: the nearest tuned configuration is "
                      r"illegal there \(tuned for 4096x4096x4096: constraint .*TAILW.* fails\); "
                      r"using the one tuned for 8192x8192x8192"):
        chosen = mod.select((4096, 4000, 4096))
    assert chosen["size"] == [8192] * 3
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # said once: the second call is silent
        assert mod.select((4096, 4000, 4096)) is chosen
    with pytest.raises(ValueError, match="no tuned configuration is legal at 4096x4096x4100"):
        mod.select((4096, 4096, 4100))
    grid, block, smem, ws = mod.geometry(chosen, (4096, 4000, 4096))
    assert block == (384, 1, 1) and grid[0] == 132 and ws > 0     # stream-K: a workspace


def test_python_module_carries_tensor_maps_and_clusters(tmp_path):
    from porter.spec.template import find_template
    default = find_template("gemm_wgmma").start_configs()[0]
    mod = _module(tmp_path, [{"size": [4096] * 3, "params": {**default, "CLUSTER": 2}}])
    plan = mod.KERNEL.plan(mod.TABLE[0], (4096, 4096, 4096))
    assert plan["cluster"] == [2, 1, 1]
    assert plan["maps"] == [("A", [64, 128], 128), ("B", [64, 128], 128), ("C", [64, 64], 128),
                            ("B", [0, 0], 128)]
    assert [a for a, _ in mod.SPEC["args"]] == ["A", "B", "C", "M", "N", "K", "workspace"]
    assert [m[3] for m in mod.SPEC["space"]["maps"]] == ["bf16"] * 4
    with pytest.raises(TypeError, match="takes 6 arguments"):
        mod.launch(1, 2, 3)


def test_an_untuned_size_takes_the_tuned_one_of_its_row_pitch(tmp_path):
    """A size whose rows are off 32-byte sectors (K = 1000, N = 5000) runs what was tuned at
    another such size, not the nearer aligned one (where rows are off sectors a tile needs a
    cluster to share them: 3000x4000x4104 on an H100, 128x256 0.675 without one, 0.982 with,
    gemm_wgmma.md); among sizes of one pitch class the nearest still wins."""
    from porter.spec.template import find_template
    default = find_template("gemm_wgmma").start_configs()[0]
    rows = [{"size": [3072, 5120, 1024], "params": {**default, "CLUSTER": 1}},
            {"size": [1000, 3000, 1000], "params": {**default, "CLUSTER": 2}},
            {"size": [8192, 8192, 8192], "params": {**default, "STREAMK": 1}}]
    mod = _module(tmp_path, rows)
    k = mod.KERNEL
    assert k.pitches((3000, 5000, 1000)) == {"A": False, "B": False, "C": False}
    assert k.pitches((3072, 5120, 1024)) == {"A": True, "B": True, "C": True}
    assert k.pitches((3000, 5000, 1024)) == {"A": True, "B": True, "C": False}
    assert mod.nearest((3000, 5000, 1000))["size"] == [1000, 3000, 1000]
    assert mod.select((3000, 5000, 1000))["params"]["CLUSTER"] == 2
    assert mod.nearest((3000, 5120, 1024))["size"] == [3072, 5120, 1024]
    assert mod.nearest((6000, 8000, 8000))["size"] == [8192, 8192, 8192]
    # one buffer's pitch class (C at N = 5000) costs PITCH_COST over the plain log distance
    plain = sum(abs(math.log(a / b)) for a, b in zip((3072, 5120, 1024), (3000, 5000, 1024)))
    assert k.distance(rows[0], (3000, 5000, 1024)) == pytest.approx(plain + mod.PITCH_COST)


def test_header_lookup_weighs_the_row_pitch_too(tmp_path):
    """The header's C lookup (sum of relative differences) adds 0.5 for each buffer whose
    rows are on 32-byte sectors at one size and not the other: K = 1000 runs K = 1000's row."""
    from porter.export.formats import header
    from porter.spec.template import find_template
    tpl = find_template("gemm_wgmma")
    default = tpl.start_configs()[0]
    text = header(tpl, {"sm_90a": [
        {"size": [3072, 5120, 1024], "params": {**default, "CLUSTER": 1}},
        {"size": [1000, 3000, 1000], "params": {**default, "CLUSTER": 2}}]})
    assert "0.5 * (((long long)N * 2LL % 32 == 0) != ((long long)e->N * 2LL % 32 == 0))" in text
    (tmp_path / "k.h").write_text(text)
    assert run_c(tmp_path, "k.h",
                 '  printf("%lld %lld\\n", gemm_wgmma_lookup(90, 3000, 5000, 1000)->K,\n'
                 "         gemm_wgmma_lookup(90, 3000, 5000, 1024)->K);\n") == ["1000", "1024"]
