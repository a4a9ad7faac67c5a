"""The canonical printer: no whitespace, minimal parentheses, numbers as Python's repr (LEIR.md §2)."""
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
    return "".join(format_nest(n) for n in program.nests)


def format_nest(nest: Nest) -> str:
    body = "".join(format_stmt(i) + ";" if isinstance(i, Stmt) else format_nest(i) for i in nest.body)
    return "".join(format_loop(lp) for lp in nest.loops) + "[" + body + "];"


def format_loop(loop: Loop) -> str:
    return f"{loop.kind}^{{{loop.extent}}}_{{{loop.var}={loop.start}}}"


def format_stmt(stmt: Stmt) -> str:
    return format_expr(stmt.lhs) + "=" + format_expr(stmt.rhs)


def format_expr(node) -> str:
    return _fmt(node, 0)


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


def _fmt(node, min_prec: int) -> str:
    text = _fmt_bare(node)
    prec = _prec(node)
    if prec >= min_prec:
        return text
    if prec < 10:
        raise UnprintableError(f"a {type(node).__name__} condition cannot stand inside another expression")
    return "(" + text + ")"


def _fmt_bare(node) -> str:
    match node:
        case Num(value=v):
            return str(v) if isinstance(v, int) else repr(v)
        case Var(name=n):
            return n
        case Access(tensor=t, dtype=d, scope=s, indices=ix):
            head = f"{t}^{{{d},{s}}}"
            return head + "_{" + ",".join(_fmt(i, 0) for i in ix) + "}" if ix else head
        case BinOp(op="**", lhs=a, rhs=b):
            return _fmt(a, _PREC["**"] + 1) + "**" + _fmt(b, _NEG_PREC)
        case BinOp(op=op, lhs=a, rhs=b):
            p = _PREC[op]
            return _fmt(a, p) + op + _fmt(b, p + 1)
        case Neg(operand=a):
            return "-" + _fmt(a, _NEG_PREC)
        case Call(fn=f, args=args):
            return f + "(" + ",".join(_fmt(a, 0) for a in args) + ")"
        case Select(cond=c, then=t, otherwise=o):
            return "if_then_else(" + _fmt(c, _OR) + "," + _fmt(t, 0) + "," + _fmt(o, 0) + ")"
        case Compare(operands=xs, ops=ops):
            parts = [_fmt(xs[0], 10)]
            for op, x in zip(ops, xs[1:], strict=True):
                parts.append(op + _fmt(x, 10))
            return "".join(parts)
        case And(terms=ts):
            return "&".join(_fmt(t, _COMPARE) for t in ts)
        case Or(terms=ts):
            return "|".join(_fmt(t, _AND) for t in ts)
    raise UnprintableError(f"not a LEIR expression node: {node!r}")
