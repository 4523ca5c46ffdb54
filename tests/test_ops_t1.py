"""Kernel Tuner T1 files in full: Values, Conditions and argument sizes written the way real T1
files write them, imported by porter and checked against Kernel Tuner's own parsing of the same
files (its tune_kernel_T1 conversion and its Searchspace), configuration for configuration."""
import itertools
import json
import time
from pathlib import Path

import pytest

from porter.errors import TemplateError
from porter.interop.kt import import_kt, load_t1
from porter.spec.expr import Expr
from porter.spec.template import load_template

kernel_tuner = pytest.importorskip("kernel_tuner")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "kt"

# each Values string uses one construct Kernel Tuner accepts (it evals them as Python)
CONSTRUCTS = {
    "comprehension": "[16 * i for i in range(1, 9)]",
    "list + list(range)": "[1, 2, 4] + list(range(8, 33, 8))",
    "comprehension with condition": "[i for i in range(1, 17) if i % 3 != 0]",
    "power in comprehension": "[2**i for i in range(0, 4)]",
    "nested comprehension": "[a * b for a in range(1, 3) for b in (1, 3) if a != b]",
    "slice of list(range)": "list(range(0, 12))[::4]",
    "min/max arithmetic": "[max(1, 2) * 2, min(8, 9) + 1, 3 * 4 // 2]",
    "plain literal": "[0, 1]",
}
NAMES = ["block_size_x", "tile_size_x", "unroll", "vec", "pair", "offset", "misc", "flag"]


def _t1(tmp_path: Path, size_expr: str) -> Path:
    t1 = json.loads((DATA / "vector_add.T1.json").read_text())
    t1["ConfigurationSpace"] = {
        "TuningParameters": [{"Name": n, "Type": "int", "Values": v}
                             for n, v in zip(NAMES, CONSTRUCTS.values())],
        "Conditions": [
            {"Expression": "block_size_x * tile_size_x <= 512", "Parameters": ["block_size_x",
                                                                               "tile_size_x"]},
            {"Expression": "unroll in [1, 2, 4, 8] or flag == 1",
             "Parameters": ["unroll", "flag"]},
            {"Expression": "(vec + pair) % 2 == 0 and offset < max([4, 8])",
             "Parameters": ["vec", "pair", "offset"]},
            {"Expression": "misc >= 4 or block_size_x > 64", "Parameters": ["misc",
                                                                           "block_size_x"]}],
    }
    ks = t1["KernelSpecification"]
    ks["Device"] = {"Name": "any"}
    ks["ProblemSize"] = [4096]
    ks["Arguments"][0]["Size"] = size_expr
    ks["Arguments"][1]["Size"] = size_expr
    ks["Arguments"][2]["Size"] = size_expr
    ks["Arguments"][3]["Type"] = "int32"
    ks["Arguments"][3]["FillValue"] = 4096
    t1["Search"] = {"Name": "brute_force"}
    path = tmp_path / "many.T1.json"
    path.write_text(json.dumps(t1))
    (tmp_path / "vector_add.cu").write_text((DATA / "vector_add.cu").read_text())
    return path


def _kernel_tuner_parse(path: Path, monkeypatch) -> dict:
    """What Kernel Tuner's own T1 loader hands to tune_kernel, captured instead of tuning."""
    import kernel_tuner.interface as kti
    seen = {}

    def capture(kernel_name, kernel_source, problem_size, arguments, tune_params, **kw):
        seen.update(tune_params=tune_params, restrictions=kw["restrictions"],
                    arguments=arguments, problem_size=problem_size)
        return [], {}
    monkeypatch.setattr(kti, "tune_kernel", capture)
    kti.tune_kernel_T1(path, device="any", strategy="brute_force", output_T4=False)
    return seen


SIZE = "ProblemSize[0] + max(unroll) - min([1, 2]) + len([x for x in range(3)])"


def test_t1_spaces_match_kernel_tuner_configuration_for_configuration(tmp_path, monkeypatch):
    from kernel_tuner.searchspace import Searchspace
    path = _t1(tmp_path, SIZE)
    kt = _kernel_tuner_parse(path, monkeypatch)
    t1 = load_t1(path)
    # the value lists, in order
    assert {n: list(v) for n, v in t1.params.items()} == \
        {n: list(v) for n, v in kt["tune_params"].items()}
    assert len(set(CONSTRUCTS.values())) >= 6
    # the valid configurations: Kernel Tuner's Searchspace (no thread limit) against porter's
    # conditions, and against the imported template's constraints
    ks = Searchspace(kt["tune_params"], kt["restrictions"], 1 << 30)
    theirs = {tuple(c) for c in ks.list}
    ours = {vals for vals in itertools.product(*t1.params.values())
            if t1.is_valid(dict(zip(t1.params, vals)))}
    assert ours == theirs and ours
    assert len(ours) < len(list(itertools.product(*t1.params.values())))   # conditions bite
    folder = import_kt(tmp_path / "vector_add.cu", path, tmp_path / "tpl")
    tpl = load_template(folder)
    env_size = dict(zip(tpl.size_names, (4096,)))
    imported = {tuple(c.values()) for c in tpl.iter_configs()
                if all(bool(e({**env_size, **c})) for e in tpl.constraints)}
    assert imported == theirs
    # argument sizes: Kernel Tuner's arrays against the imported op's shapes
    kt_sizes = [a.size for a in kt["arguments"] if hasattr(a, "size") and a.ndim]
    st_sizes = [int(a.shape[0].walk(env_size)) for a in tpl.op_spec.args if a.is_buffer]
    assert st_sizes == kt_sizes == [4096 + 16 - 1 + 3] * 3


def test_sizes_drive_the_imported_arguments(tmp_path):
    folder = import_kt(DATA / "vector_add.cu", _t1(tmp_path, SIZE), tmp_path / "tpl")
    tpl = load_template(folder)
    n = {a.name: a for a in tpl.op_spec.args}
    env = dict(zip(tpl.size_names, tpl.parse_size("100000")))
    assert n["n"].value.walk(env) == 100000                     # FillValue = ProblemSize[0]
    assert n["c"].shape[0].walk(env) == 100000 + 16 - 1 + 3
    assert tpl.op_spec.reference_config is not None


@pytest.mark.parametrize("values,says", [
    ("list(range(10**9))", "at most 1000000"),
    ("[0] * 1000000000", "more than 1000000"),
    ("[2**2**2**2**2**2]", "exponent too large"),
    # whichever bound comes first on a busy machine: the elements or the time
    ("[i for i in range(10**6) for j in range(10**6)]", ("more than 1000000", "longer than 2 s")),
    ("[i for i in range(10**6) for j in range(10**6) if j < 0]", ("2 s", "steps")),
    ("__import__('os').listdir('.')", "calls something other than"),
    ("[x.real for x in range(3)]", "Attribute"),
])
def test_values_that_would_hang_or_escape_are_refused_in_one_line(tmp_path, values, says):
    t1 = json.loads((DATA / "vector_add.T1.json").read_text())
    t1["ConfigurationSpace"]["TuningParameters"][0]["Values"] = values
    path = tmp_path / "bad.T1.json"
    path.write_text(json.dumps(t1))
    t0 = time.monotonic()
    with pytest.raises(TemplateError) as e:
        load_t1(path)
    says = (says,) if isinstance(says, str) else says
    assert any(s in str(e.value) for s in says) and "\n" not in str(e.value)
    assert "block_size_x" in str(e.value)
    assert time.monotonic() - t0 < 30            # bounded, never a hang


@pytest.mark.parametrize("edit,says", [
    (lambda t: t["KernelSpecification"].update(Language="OpenCL"), "Language 'OpenCL'"),
    (lambda t: t["KernelSpecification"].update(ReferenceArguments=[{"Name": "c"}]),
     "ReferenceArguments"),
    (lambda t: t["KernelSpecification"]["Arguments"][1].update(FillType="BinaryRaw"),
     "FillType 'BinaryRaw'"),
    (lambda t: t["KernelSpecification"]["Arguments"][1].update(MemoryType="Local"),
     "MemoryType 'Local'"),
    (lambda t: t["KernelSpecification"]["Arguments"][1].update(Type="float4"), "Type 'float4'"),
    (lambda t: t["ConfigurationSpace"]["TuningParameters"][0].update(Type="complex"),
     "Type 'complex'"),
    (lambda t: t.update(Budget=[{"Type": "ConfigurationFraction", "BudgetValue": 0.1}]),
     "Budget Type 'ConfigurationFraction'"),
])
def test_fields_porter_cannot_honour_are_refused_by_name(tmp_path, edit, says):
    t1 = json.loads((DATA / "vector_add.T1.json").read_text())
    edit(t1)
    path = tmp_path / "x.T1.json"
    path.write_text(json.dumps(t1))
    with pytest.raises(TemplateError, match=says):
        load_t1(path)


def test_expr_bounds_leave_template_expressions_compiled():
    assert Expr("ceil_div(M, BM) * BN")._code is not None       # the fast path stays
    assert Expr("[16 * i for i in range(1, 17)]")._code is None
    assert Expr("x in [1, 2]").names == {"x"}
    assert Expr("[i * k for i in range(k)]").names == {"k"}     # i is bound, k is free


SHARED_T1S = sorted((ROOT.parent / "shared" / "replay").glob("*.T1.json"))


@pytest.mark.skipif(not SHARED_T1S, reason="no T1 files in shared/replay")
@pytest.mark.parametrize("path", SHARED_T1S, ids=lambda p: p.name)
def test_shared_t1_spaces_match_kernel_tuner(tmp_path, monkeypatch, path):
    """The recorded benchmark T1 files: the same valid configurations as Kernel Tuner's."""
    from kernel_tuner.searchspace import Searchspace
    t1_raw = json.loads(path.read_text())
    kfile = tmp_path / t1_raw["KernelSpecification"]["KernelFile"]
    kfile.parent.mkdir(parents=True, exist_ok=True)
    kfile.write_text("// placeholder: Kernel Tuner's loader only checks that it exists\n")
    t1_raw.setdefault("KernelSpecification", {}).setdefault("Device", {"Name": "any"})
    copy = tmp_path / path.name
    copy.write_text(json.dumps(t1_raw))
    kt = _kernel_tuner_parse(copy, monkeypatch)
    t1 = load_t1(path)
    ks = Searchspace(kt["tune_params"], kt["restrictions"], 1 << 30)
    env = {f"ProblemSize_{i}": v for i, v in enumerate(t1.problem_size)}
    ours = {vals for vals in itertools.product(*t1.params.values())
            if all(bool(c({**env, **dict(zip(t1.params, vals))})) for c in t1.conditions)}
    assert ours == {tuple(c) for c in ks.list}
