import shutil
from pathlib import Path

import pytest

from porter.spec.arch import ARCHS, get_arch
from porter.build.check import static_check
from porter.errors import ArchError, SpecError, TemplateError
from porter.spec.template import find_template, load_template

PLANTED = Path(__file__).parent / "data" / "templates" / "planted"


def copy_planted(tmp_path, space_edit=None, source_edit=None):
    d = tmp_path / "tpl"
    shutil.copytree(PLANTED, d)
    if space_edit:
        p = d / "space.toml"
        p.write_text(space_edit(p.read_text()))
    if source_edit:
        p = d / "kernel.cu"
        p.write_text(source_edit(p.read_text()))
    return d


def test_architecture_table_has_every_target():
    assert set(ARCHS) >= {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_103a",
                          "sm_120"}
    assert get_arch("sm_90a").has("wgmma") and not get_arch("sm_90").has("wgmma")
    assert get_arch("sm_100a").has("tcgen05") and not get_arch("sm_100a").has("wgmma")
    with pytest.raises(ArchError, match="unknown architecture 'sm_42'"):
        get_arch("sm_42")


def test_load_and_sizes():
    t = load_template(PLANTED)
    assert t.param_names == ("MODE", "THREADS")
    assert t.space_size() == 8
    assert t.parse_size("64x128") == (64, 128)
    assert t.parse_size("rows=4,cols=8") == (4, 8)
    for bad in ("64x", "64x128x3", "a x b", "-1x4", "rows=4"):
        with pytest.raises(SpecError, match="malformed size"):
            t.parse_size(bad)


def test_constraint_naming_unknown_parameter(tmp_path):
    d = copy_planted(tmp_path, lambda s: s + '\n[constraints]\nlist = ["BOGUS > 1"]\n')
    with pytest.raises(TemplateError, match="unknown parameter.*BOGUS"):
        load_template(d)


def test_include_outside_project_refused(tmp_path):
    d = copy_planted(tmp_path, source_edit=lambda s: '#include "/etc/passwd"\n' + s)
    with pytest.raises(TemplateError, match="outside the project's include folder"):
        load_template(d)


def test_unknown_template():
    with pytest.raises(TemplateError, match="unknown template 'nope'"):
        find_template("nope")


def test_missing_feature_named(tmp_path):
    d = copy_planted(tmp_path, lambda s: s.replace('version = "1"',
                                                   'version = "1"\nrequires = ["wgmma"]'))
    t = load_template(d)
    with pytest.raises(ArchError, match="needs wgmma, which sm_80 does not have"):
        t.check_arch(get_arch("sm_80"))
    t.check_arch(get_arch("sm_90a"))


def test_static_check_rejects_what_cannot_fit(tmp_path):
    d = copy_planted(tmp_path, lambda s: s.replace('block = ["THREADS"]',
                                                   'block = ["THREADS * 8"]\nsmem = "THREADS * 1024"'))
    t = load_template(d)
    a = get_arch("sm_86")
    why = static_check(t, a, {"MODE": 0, "THREADS": 256}, [(64, 64)])
    assert "threads per block" in why
    why = static_check(t, a, {"MODE": 0, "THREADS": 128}, [(64, 64)])
    assert "shared memory" in why
    assert static_check(t, get_arch("sm_90a"), {"MODE": 0, "THREADS": 128}, [(64, 64)]) is None


def test_workspace_clean_is_a_prefix_of_the_workspace(tmp_path):
    def edit(s):
        return s.replace("[launch]", '[launch]\nworkspace = "THREADS * 8"\n'
                                     'workspace_clean = "THREADS * 4 if MODE == 0 else 0"', 1)
    t = load_template(copy_planted(tmp_path, edit))
    arch, size = ARCHS["sm_90a"], (64, 128)
    cfg = {"MODE": 0, "THREADS": 64}
    assert t.workspace_bytes(cfg, arch, size) == 512
    assert t.workspace_clean_bytes(cfg, arch, size) == 256
    assert t.workspace_clean_bytes({**cfg, "MODE": 1}, arch, size) == 0
    # without it, all of the workspace must be left zeroed
    t = load_template(copy_planted(tmp_path / "b", lambda s: s.replace(
        "[launch]", '[launch]\nworkspace = "THREADS * 8"', 1)))
    assert t.workspace_clean_bytes(cfg, arch, size) == 512
    d = copy_planted(tmp_path / "c", lambda s: s.replace(
        "[launch]", '[launch]\nworkspace = "8"\nworkspace_clean = "BOGUS"', 1))
    with pytest.raises(TemplateError, match="BOGUS"):
        load_template(d)


def test_wave_cost_counts_whole_waves_of_tiles(tmp_path):
    """[launch] tiles / tile_cost: whole waves of tiles over arch_sms, times a tile's cost; no
    `tiles`: None; a name that is not a parameter, size or limit: a TemplateError."""
    t = load_template(copy_planted(tmp_path, lambda s: s.replace(
        "[launch]", '[launch]\ntiles = "ceil_div(cols, THREADS)"\ntile_cost = "THREADS"', 1)))
    arch, cfg = ARCHS["sm_90a"].with_sms(132), {"MODE": 0, "THREADS": 64}
    assert t.wave_cost(cfg, arch, (64, 64 * 132)) == 64            # 132 tiles: one wave
    assert t.wave_cost(cfg, arch, (64, 64 * 133)) == 128           # 133: a second wave
    assert t.wave_cost(cfg, arch.with_sms(133), (64, 64 * 133)) == 64
    assert load_template(copy_planted(tmp_path / "b")).wave_cost(cfg, arch, (64, 128)) is None
    d = copy_planted(tmp_path / "c", lambda s: s.replace(
        "[launch]", '[launch]\ntiles = "BOGUS"', 1))
    with pytest.raises(TemplateError, match="BOGUS"):
        load_template(d)
