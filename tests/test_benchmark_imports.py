"""The benchmarks under benchmarks/ run outside the test suite, and import the project lazily inside
their functions: a module moved by a refactoring broke `bench_search.py` (`strategies.tree`, moved to
`strategies.analysis.tree` by issue 23's layout) without any test noticing. Every `from X import Y`
of every benchmark, at any depth, must resolve."""
from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _imports() -> list[tuple[str, str, int, str]]:
    out = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module != "__future__":
                out += [(path.name, node.module, node.lineno, alias.name) for alias in node.names]
    return out


@pytest.mark.parametrize("where,module,line,name", _imports(), ids=lambda v: str(v))
def test_every_name_a_benchmark_imports_exists(where, module, line, name, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(BENCHMARKS), *sys.path])   # a benchmark may import a sibling
    mod = importlib.import_module(module)
    assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}") is not None, \
        f"benchmarks/{where}:{line}: `from {module} import {name}`: {module} has no {name}"
