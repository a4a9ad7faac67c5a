"""Helpers for strategy tests: contexts from text, golden before/expected comparison."""
from __future__ import annotations

from leir import Signature, format_program, parse_program
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
