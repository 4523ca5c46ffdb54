"""The include check sees what the preprocessor sees: each way of spelling an include of a host
file is refused, both by the check and when a template is loaded."""
import shutil
from pathlib import Path

import pytest

from porter.build.includes import forbidden_include
from porter.errors import TemplateError
from porter.spec.template import load_template

PLANTED = Path(__file__).resolve().parent / "data" / "templates" / "planted"
ALLOWED = {"porter.cuh", "hopper/tma.cuh"}

BYPASSES = [
    '%:include "/etc/passwd"',                 # digraph for #
    '%: include </etc/passwd>',
    '#/**/include "/etc/passwd"',              # a comment between # and include
    '/*x*/ #include "/etc/passwd"',            # a comment before #
    '#\\\ninclude "/etc/passwd"',              # a line splice
    '#inc\\\nlude "/etc/passwd"',
    '??=include "/etc/passwd"',                # trigraph
    '#define P "/etc/passwd"\n#include P',     # a computed include
    '#define H(x) #x\n#include H(/etc/passwd)',
    '#include "porter.cuh" /*\n*/ \n#include "../../etc/passwd"',
    '#include "hopper/../../../etc/passwd"',
    '#include_next <passwd>',
    '#import "/etc/passwd"',
    '#embed "/etc/passwd"',
    '  #  include\t"/etc/passwd"',
]


@pytest.mark.parametrize("src", BYPASSES)
def test_bypass_forms_refused(src, tmp_path):
    assert forbidden_include(src, ALLOWED) is not None
    d = tmp_path / "tpl"
    shutil.copytree(PLANTED, d)
    k = d / "kernel.cu"
    k.write_text(src + "\n" + k.read_text())
    with pytest.raises(TemplateError, match="outside the project's include folder"):
        load_template(d)


@pytest.mark.parametrize("src", [
    '#include "porter.cuh"',
    '# include <hopper/tma.cuh> // the TMA helpers',
    '%:include "porter.cuh" /* digraph, allowed header */',
    'const char *s = "#include \\"/etc/passwd\\"";',      # inside a string: not a directive
    '// #include "/etc/passwd"',
    '/* #include "/etc/passwd" */',
    'const char *r = R"(\n#include "/etc/passwd"\n)";',     # inside a raw string
])
def test_allowed_forms(src):
    assert forbidden_include(src, ALLOWED) is None
