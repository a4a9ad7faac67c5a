"""The canonical printer: no whitespace, minimal parentheses, numbers as Python's repr (docs/leir.md §2)."""
from __future__ import annotations

from leir.ast import (
    Access,
    And,
    BinOp,
    Call,
    Compare,
    Loop,
    Neg,
    Nest,
    Num,
    Or,
    Program,
    Select,
    Stmt,
    Var,
)

_PREC = {"+": 10, "-": 10, "*": 20, "/": 20, "//": 20, "%": 20, "**": 40}
_NEG_PREC = 30
_ATOM = 100
_COMPARE, _AND, _OR = 5, 3, 2


class UnprintableError(ValueError):
    """A tree that has no LEIR text (a condition nested where the grammar has no place for it)."""


def format_program(program: Program) -> str:
    out: list[str] = []
    for nest in program.nests:
        _emit_nest(nest, out)
    return "".join(out)


def format_nest(nest: Nest) -> str:
    out: list[str] = []
    _emit_nest(nest, out)
    return "".join(out)


def _emit_nest(nest: Nest, out: list[str]) -> None:
    """A nest and the nests inside it, with an explicit stack (nesting depth is not bounded)."""
    stack: list = [nest]
    while stack:
        item = stack.pop()
        if item.__class__ is str:
            out.append(item)
        elif isinstance(item, Stmt):
            out.append(format_stmt(item))
            out.append(";")
        else:
            out.extend(format_loop(lp) for lp in item.loops)
            out.append("[")
            stack.append("];")
            stack.extend(reversed(item.body))


def format_loop(loop: Loop) -> str:
    return f"{loop.kind}^{{{loop.extent}}}_{{{loop.var}={loop.start}}}"


def format_stmt(stmt: Stmt) -> str:
    return format_expr(stmt.lhs) + "=" + format_expr(stmt.rhs)


def format_expr(node) -> str:
    out: list[str] = []
    _emit(node, 0, out)
    return "".join(out)


def _prec(node) -> int:
    match node:
        case BinOp(op=op):
            return _PREC[op]
        case Neg():
            return _NEG_PREC
        case Compare():
            return _COMPARE
        case And():
            return _AND
        case Or():
            return _OR
    return _ATOM


class _At:
    """A sub-expression still to print, with the least precedence its place allows."""

    __slots__ = ("node", "min_prec")

    def __init__(self, node, min_prec: int):
        self.node, self.min_prec = node, min_prec


def _emit(root, min_prec: int, out: list[str]) -> None:
    """Append the text of `root` to `out`. The work stack holds literal text and `_At` items, in
    reverse order of output, so that a sum of 10,000 terms or a nesting 10,000 deep prints without
    recursion (and in linear time)."""
    stack: list = [_At(root, min_prec)]
    while stack:
        item = stack.pop()
        if item.__class__ is str:
            out.append(item)
            continue
        node = item.node
        prec = _prec(node)
        parts = _parts(node)
        if prec < item.min_prec:
            if prec < 10:
                raise UnprintableError(f"a {type(node).__name__} condition cannot stand inside another expression")
            parts = ["(", *parts, ")"]
        stack.extend(reversed(parts))


def _parts(node) -> list:
    """The pieces of one node's text: strings, and `_At` for its sub-expressions."""
    match node:
        case Num(value=v):
            return [str(v) if isinstance(v, int) else repr(v)]
        case Var(name=n):
            return [n]
        case Access(tensor=t, dtype=d, scope=s, indices=ix):
            head = f"{t}^{{{d},{s}}}"
            if not ix:
                return [head]
            return [head + "_{", *_joined((_At(i, 0) for i in ix), ","), "}"]
        case BinOp(op="**", lhs=a, rhs=b):
            return [_At(a, _PREC["**"] + 1), "**", _At(b, _NEG_PREC)]
        case BinOp(op=op, lhs=a, rhs=b):
            p = _PREC[op]
            return [_At(a, p), op, _At(b, p + 1)]
        case Neg(operand=a):
            return ["-", _At(a, _NEG_PREC)]
        case Call(fn=f, args=args):
            return [f + "(", *_joined((_At(a, 0) for a in args), ","), ")"]
        case Select(cond=c, then=t, otherwise=o):
            return ["if_then_else(", _At(c, _OR), ",", _At(t, 0), ",", _At(o, 0), ")"]
        case Compare(operands=xs, ops=ops):
            parts = [_At(xs[0], 10)]
            for op, x in zip(ops, xs[1:], strict=True):
                parts += [op, _At(x, 10)]
            return parts
        case And(terms=ts):
            return _joined((_At(t, _COMPARE) for t in ts), "&")
        case Or(terms=ts):
            return _joined((_At(t, _AND) for t in ts), "|")
    raise UnprintableError(f"not a LEIR expression node: {node!r}")


def _joined(items, sep: str) -> list:
    out: list = []
    for item in items:
        if out:
            out.append(sep)
        out.append(item)
    return out
