"""LEIR syntax tree: one frozen dataclass per node (LEIR.md §3).

Nodes compare and hash structurally. Value expressions and index expressions share node types; the
parser only lets integer forms into subscripts. Conditions (`Compare`, `And`, `Or`) appear only as the
first argument of `if_then_else`.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

LOOP_KINDS = ("L", "P", "V", "U", "B")
LOOP_KIND_NAMES = {"L": "serial", "P": "parallel", "V": "vectorized", "U": "unrolled", "B": "bound"}
SCOPES = ("g", "s", "l")
ARITH_OPS = ("+", "-", "*", "/", "//", "%", "**")
REL_OPS = ("<", "<=", ">", ">=", "==", "!=")
# `fast_exp` is an *extension* of this project, not part of the published Step-TP format: exp
# computed by range reduction and a polynomial (leir/lower/expr.py) that LLVM vectorises, where exp
# is a scalar `expf` call per element. It equals exp only within float32 rounding (relative error
# about 2e-7), never bitwise: a step that introduces it is `reassociating` (verified `close`), and
# data in the published format never contains it.
UNARY_FNS = ("exp", "log", "sqrt", "abs", "erf", "fast_exp")
EXTENSION_FNS = ("fast_exp",)
BINARY_FNS = ("max", "min")


@dataclass(frozen=True, slots=True)
class Num:
    """A non-negative literal: int, float or inf (negative values are `Neg(Num(...))`)."""

    value: int | float

    def __post_init__(self):
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise TypeError(f"Num needs an int or float, got {type(v).__name__}")
        if isinstance(v, float) and math.isnan(v):
            raise ValueError("Num cannot be NaN")
        if v < 0:
            raise ValueError("Num is non-negative; write Neg(Num(x)) for a negative literal")


@dataclass(frozen=True, slots=True)
class Var:
    """A loop index or binding name used as a value (the counter, converted to the LHS dtype)."""

    name: str


@dataclass(frozen=True, slots=True)
class Access:
    """`T^{dtype,scope}_{i,j,...}`; an empty subscript is a 0-d tensor."""

    tensor: str
    dtype: str
    scope: str
    indices: tuple[Expr, ...] = ()


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str
    lhs: Expr
    rhs: Expr


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Expr


@dataclass(frozen=True, slots=True)
class Call:
    """`exp/log/sqrt/abs/erf/fast_exp(x)`, `max/min(x, y)` (`fast_exp`: an extension, see UNARY_FNS)."""

    fn: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Compare:
    """A comparison chain `e0 op0 e1 op1 e2 ...` (Python meaning)."""

    operands: tuple[Expr, ...]
    ops: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class And:
    terms: tuple[Cond, ...]


@dataclass(frozen=True, slots=True)
class Or:
    terms: tuple[Cond, ...]


@dataclass(frozen=True, slots=True)
class Select:
    """`if_then_else(cond, then, otherwise)`."""

    cond: Cond
    then: Expr
    otherwise: Expr


Expr = Num | Var | Access | BinOp | Neg | Call | Select
Cond = Compare | And | Or | Expr


@dataclass(frozen=True, slots=True)
class Loop:
    kind: str
    extent: int
    var: str
    start: int = 0

    @property
    def is_bound(self) -> bool:
        return self.kind == "B"


@dataclass(frozen=True, slots=True)
class Stmt:
    lhs: Access
    rhs: Expr


@dataclass(frozen=True, slots=True)
class Nest:
    """A perfect loop nest: `loops[0]` is outermost; the body holds statements and nested nests."""

    loops: tuple[Loop, ...]
    body: tuple[Stmt | Nest, ...]


@dataclass(frozen=True, slots=True)
class Program:
    nests: tuple[Nest, ...] = field(default_factory=tuple)


Node = Expr | Compare | And | Or | Loop | Stmt | Nest | Program


def children(node) -> tuple:
    """The direct sub-expressions of an expression or condition node, in source order."""
    match node:
        case Access(indices=ix):
            return ix
        case BinOp(lhs=a, rhs=b):
            return (a, b)
        case Neg(operand=a):
            return (a,)
        case Call(args=args):
            return args
        case Select(cond=c, then=t, otherwise=o):
            return (c, t, o)
        case Compare(operands=ops):
            return ops
        case And(terms=ts) | Or(terms=ts):
            return ts
    return ()


def walk_expr(node) -> Iterator:
    """Pre-order walk over an expression or condition, subscripts included."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(children(n)))


def accesses(node) -> Iterator[Access]:
    """Every access in an expression, in source order, including gathers inside subscripts."""
    for n in walk_expr(node):
        if isinstance(n, Access):
            yield n


def _rebuild(node, fn, subscripts: bool = True):
    """`node` with each direct sub-expression replaced by `fn(child)`, in source order (an access's
    subscripts only when `subscripts`); leaves come back as they are."""
    match node:
        case Access(indices=ix) if ix and subscripts:
            return Access(node.tensor, node.dtype, node.scope, tuple(fn(i) for i in ix))
        case BinOp(op=op, lhs=a, rhs=b):
            return BinOp(op, fn(a), fn(b))
        case Neg(operand=a):
            return Neg(fn(a))
        case Call(fn=f, args=args):
            return Call(f, tuple(fn(a) for a in args))
        case Select(cond=c, then=t, otherwise=o):
            return Select(fn(c), fn(t), fn(o))
        case Compare(operands=ops, ops=rels):
            return Compare(tuple(fn(a) for a in ops), rels)
        case And(terms=ts):
            return And(tuple(fn(t) for t in ts))
        case Or(terms=ts):
            return Or(tuple(fn(t) for t in ts))
    return node


def map_expr(node, fn, subscripts: bool = True):
    """Bottom-up rebuild: `fn` is applied to each node after its children were mapped. Without
    `subscripts` an access is a leaf: `fn` sees it, but not the expressions inside its subscripts."""
    def visit(n):
        return fn(_rebuild(n, visit, subscripts))
    return visit(node)


def replace_expr(node, fn, subscripts: bool = True):
    """Top-down rebuild: where `fn(n)` returns a node, it replaces `n` whole (its inside is not
    visited); where it returns None, `n`'s children are visited, in source order."""
    def visit(n):
        new = fn(n)
        return new if new is not None else _rebuild(n, visit, subscripts)
    return visit(node)


def map_stmt(stmt: Stmt, fn) -> Stmt:
    lhs = map_expr(stmt.lhs, fn)
    if not isinstance(lhs, Access):
        raise TypeError("a statement's left-hand side must stay an access")
    return Stmt(lhs, map_expr(stmt.rhs, fn))
