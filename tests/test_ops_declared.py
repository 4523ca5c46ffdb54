"""Declared ops ([op] in space.toml): what a user gets wrong is one line and exit 2 at port /
submit time on a CPU machine with nothing written; the harness builds inputs from the sizes and
checks outputs against the reference (run here on NumPy)."""
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from porter.errors import TemplateError
from porter.measure.ops import get_op, op_names, validate_template
from porter.measure.ops.declared import DeclaredOp
from porter.spec.template import load_template

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "examples" / "softmax"
BUILTIN_REF = 'reference = "porter.measure.ops.refs:softmax"'


def porter(*args, db, cache):
    env = dict(os.environ, COLUMNS="200", PORTER_DB_URL=f"sqlite:///{db}",
               PORTER_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "porter.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300, cwd=ROOT)


def jobs_written(db) -> int:
    if not Path(db).exists():
        return 0
    with sqlite3.connect(db) as c:
        try:
            return c.execute("select count(*) from porter_jobs").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def softmax_copy(tmp_path, space_edit=None, source_edit=None, keep_reference_py=True) -> Path:
    d = tmp_path / "softmax"
    shutil.copytree(SOFTMAX, d)
    if not keep_reference_py:
        (d / "reference.py").unlink()
    if space_edit:
        p = d / "space.toml"
        p.write_text(space_edit(p.read_text()))
    if source_edit:
        p = d / "kernel.cu"
        p.write_text(source_edit(p.read_text()))
    return d


def builtin_refs(text: str) -> str:
    return (text.replace('reference = "reference:softmax"', BUILTIN_REF)
            .replace('baseline = "reference:torch_softmax"', ""))


CASES = {
    "unimportable reference": (lambda t: builtin_refs(t).replace(
        BUILTIN_REF, 'reference = "no_such_refs_module:softmax"'), None,
        "cannot be imported: no module 'no_such_refs_module'"),
    "missing function": (lambda t: builtin_refs(t).replace(BUILTIN_REF,
                         'reference = "porter.measure.ops.refs:no_such_function"'), None,
                         "defines no no_such_function"),
    "signature count": (builtin_refs, lambda s: s.replace("int rows, int cols", "int rows"),
                        "takes 3 parameters but the op 'softmax' passes 4"),
    "signature kind": (builtin_refs, lambda s: s.replace("int rows, int cols",
                                                         "int* rows, int cols"),
                       "argument 3 (rows) is declared as a scalar"),
    "signature dtype": (builtin_refs, lambda s: s.replace("const float* __restrict__ x",
                                                          "const double* __restrict__ x"),
                        "argument 1 (x) is declared float32"),
    "template code untrusted": (None, None, "pass --trust-template-code"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_port_refuses_in_one_line_and_writes_nothing(tmp_path, case):
    space_edit, source_edit, says = CASES[case]
    d = softmax_copy(tmp_path, space_edit, source_edit, keep_reference_py=case.startswith(
        "template code"))
    db = tmp_path / "p.db"
    r = porter("port", str(d), "--arch", "sm_90a", "--backend", "compile-only", "--trials", "2",
               db=db, cache=tmp_path / "cache")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], r.stderr
    assert jobs_written(db) == 0


def test_unknown_builtin_op_is_refused_at_port_time(tmp_path):
    d = softmax_copy(tmp_path, lambda t: t.split("[op]")[0].replace(
        "[template]\n", '[template]\nop = "softmaxx"\n', 1) + "[params]" + t.split("[params]")[1],
        keep_reference_py=False)
    db = tmp_path / "p.db"
    r = porter("port", str(d), "--arch", "sm_90a", "--backend", "compile-only", db=db,
               cache=tmp_path / "cache")
    assert r.returncode == 2 and "unknown op 'softmaxx'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and jobs_written(db) == 0


def test_service_refuses_a_job_carrying_reference_py(tmp_path):
    d = softmax_copy(tmp_path)
    db = tmp_path / "p.db"
    r = porter("submit", str(d), "--arch", "sm_90a", "--db", f"sqlite:///{db}", db=db,
               cache=tmp_path / "cache")
    assert r.returncode == 2, r.stdout + r.stderr
    line, = r.stderr.strip().splitlines()
    assert "carries reference.py" in line and "never imports code" in line
    assert jobs_written(db) == 0
    # with --trust-template-code an embedded port of the same folder goes ahead
    r = porter("port", str(d), "--arch", "sm_90a", "--backend", "compile-only", "--trials", "2",
               "--trust-template-code", "--sizes", "64x256", db=db, cache=tmp_path / "cache")
    assert r.returncode == 0, r.stdout + r.stderr
    assert jobs_written(db) == 1


def test_every_builtin_template_passes_the_op_checks():
    from porter.spec.template import discover
    for name, folder in discover().items():
        validate_template(load_template(folder))
    assert {"gemm", "rmsnorm", "kt"} <= set(op_names())
    with pytest.raises(TemplateError, match="unknown op 'nope'"):
        get_op("nope")


def _numpy_op(tmp_path):
    d = softmax_copy(tmp_path, builtin_refs, keep_reference_py=False)
    tpl = load_template(d)
    return tpl, DeclaredOp(tpl, xp=np)


def test_inputs_and_scalars_follow_the_sizes(tmp_path):
    tpl, op = _numpy_op(tmp_path)
    for size in [(8, 64), (3, 1000)]:
        st = op.setup(size, seed=1)
        assert st["arrays"]["x"].shape == size and st["arrays"]["x"].dtype == np.float32
        assert st["scalars"] == {"rows": size[0], "cols": size[1]}
        assert 3.0 < float(st["arrays"]["x"].std()) < 5.0       # std = 4.0 in the space file
    assert op.rtol == 1e-5 and op.signature == ("p", "p", "s", "s")


def test_verification_catches_unwritten_and_wrong_outputs(tmp_path):
    from porter.measure.ops import refs
    tpl, op = _numpy_op(tmp_path)
    st = op.setup((16, 128), seed=0)
    op.poison(st)
    assert op.error(st) == float("inf")                  # nothing written: NaN
    x = st["arrays"]["x"].astype(np.float64)
    st["arrays"]["y"][...] = refs.softmax(x)
    assert op.error(st) < op.rtol
    st["arrays"]["y"][3, 5] += 0.05                       # one wrong element
    assert op.error(st) > op.rtol
    st["arrays"]["y"][...] = refs.softmax(x[:, ::-1])     # a permuted row
    assert op.error(st) > op.rtol


def test_spec_errors_say_what_to_fix(tmp_path):
    cases = [
        (lambda t: t.replace('shape = ["rows", "cols"]\nfill = "normal"',
                             'shape = ["rows", "K"]\nfill = "normal"'), "names K"),
        (lambda t: t.replace('fill = "normal"', 'fill = "gaussian"'), "fill 'gaussian'"),
        (lambda t: t.replace('dtype = "float32"', 'dtype = "float17"', 1), "dtype 'float17'"),
        (lambda t: t.replace("output = true", ""), "declares no output"),
        (lambda t: t.replace('reference = "reference:softmax"', 'reference = "softmax"'),
         "must read 'module:function'"),
        (lambda t: t.replace("rtol = 1e-5", "reference_config = { THREADS = 7 }"),
         "reference_config sets THREADS = 7"),
    ]
    for i, (edit, says) in enumerate(cases):
        d = softmax_copy(tmp_path / str(i), edit)
        with pytest.raises(TemplateError, match=says.replace("(", r"\(")):
            load_template(d)


def test_without_a_reference_a_named_configuration_is_the_reference(tmp_path):
    d = softmax_copy(tmp_path, lambda t: builtin_refs(t).replace(
        BUILTIN_REF, "reference_config = { THREADS = 512, ITEMS = 2 }"), keep_reference_py=False)
    tpl = load_template(d)
    op = DeclaredOp(tpl, xp=np)
    assert op.ref_config == {"THREADS": 512, "VEC": 4, "ITEMS": 2}
    assert "THREADS=512 VEC=4 ITEMS=2" in op.note and "names no reference" in op.note
