"""Helpers for strategy tests: contexts from text, golden before/expected comparison."""
from __future__ import annotations

from leir import Signature, format_program, parse_program
from leir.ast import Access, map_stmt
from strategies.analysis.tree import map_program_stmts
from strategies.base import Context
from strategies.registry import get


def sig(*tensors) -> Signature:
    """sig(("A", [4, 6], "float64", "input"), ...)"""
    return Signature.from_json({"tensors": [{"name": n, "shape": s, "dtype": d, "role": r}
                                            for n, s, d, r in tensors]})


def ctx(text: str, signature: Signature, target: str = "llvm") -> Context:
    return Context(parse_program(text), signature, target)


def results(strategy: str, text: str, signature: Signature, target: str = "llvm") -> list[str]:
    """Canonical texts of every transformation, in the strategy's order."""
    return [t.after_text for t in get(strategy).transformations(ctx(text, signature, target))]


def assert_golden(strategy: str, before: str, expected: list[str], signature: Signature, target: str = "llvm"):
    """TVM-style golden test: the strategy's results equal `expected` structurally (as trees)."""
    got = [parse_program(t) for t in results(strategy, before, signature, target)]
    want = [parse_program(t) for t in expected]
    assert got == want, "\n".join(["got:", *map(format_program, got), "expected:", *map(format_program, want)])


def in_dtype(text: str, code: str) -> str:
    """The same program with every access in dtype `code` (`f16`, `f32`, `f64`): parsed, every access
    retyped on the tree, printed."""
    def retype(n):
        return Access(n.tensor, code, n.scope, n.indices) if isinstance(n, Access) else n
    return format_program(map_program_stmts(parse_program(text), lambda s: map_stmt(s, retype)))
