"""The codebase's own rules, checked: imports run one way, nothing reaches into the store's
internals, no Python module grows past 400 lines, results files are cited."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY_DIRS = ("porter", "db", "workers", "dashboard", "benchmarks", "search_spaces", "examples",
           "tests")


def python_files(*dirs):
    for d in dirs:
        yield from (p for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return mods


def test_imports_run_one_way():
    """porter imports nothing of ours; db and workers may use porter; the dashboard reads
    through db (and imports no SQLAlchemy of its own)."""
    allowed = {"porter": set(), "db": {"porter"}, "workers": {"porter", "db"},
               "dashboard": {"porter", "db"}}
    ours = {"porter", "db", "workers", "dashboard", "search_spaces", "benchmarks"}
    for pkg, ok in allowed.items():
        for p in python_files(pkg):
            bad = (imported_modules(p) & ours) - ok - {pkg}
            assert not bad, f"{p.relative_to(ROOT)} imports {sorted(bad)}"
    for p in python_files("dashboard"):
        assert "sqlalchemy" not in imported_modules(p), p.relative_to(ROOT)


def test_no_caller_reaches_into_the_store():
    private = re.compile(r"\bstore\w*\(?[^)\n]*\)?\._[a-z]")
    for p in python_files("porter", "workers", "dashboard", "benchmarks", "examples", "tests"):
        text = p.read_text()
        rel = p.relative_to(ROOT)
        assert not re.search(r"list_jobs\(\s*1000", text), f"{rel} lists 1000 jobs to filter"
        assert not re.search(r"hasattr\(\s*\w*store", text), f"{rel} checks the store's type"
        for n, line in enumerate(text.splitlines(), 1):
            assert not private.search(line), f"{rel}:{n} uses a private store attribute"


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in python_files(*PY_DIRS)
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_results_files_are_cited():
    """benchmarks/results keeps only what the README, docs, tests or benchmark scripts cite."""
    texts = [ROOT.joinpath("README.md").read_text()]
    texts += [p.read_text() for p in (ROOT / "docs").rglob("*.md")]
    texts += [p.read_text() for p in python_files("tests", "benchmarks")]
    corpus = "\n".join(texts)
    uncited = [p.name for p in (ROOT / "benchmarks" / "results").iterdir()
               if p.name not in corpus and p.stem not in corpus]
    assert not uncited, uncited
