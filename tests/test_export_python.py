"""The python export's module on constructed tuning tables (no cubins, CPU only): which tuned
configuration it runs at an untuned size, and the launch it carries (tensor maps, clusters)."""
from __future__ import annotations

import json

import pytest

from test_export import _load_module


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
