"""What the mathematical rules share: the part of a statement algebra may touch (`Target`), its sympy
translation within the size limits, the numeric spot check of an identity, and the guard that keeps
a softmax's max shift where exp could overflow without it."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache

import sympy

from leir.analysis import reduction_op
from leir.ast import Access, BinOp, Call, Num, Stmt, Var, accesses
from strategies.analysis.numerics import unshifted_exp_problem
from strategies.analysis.sympy_bridge import FLOAT_CODES, Bridge, Untranslatable, count_ops

MAX_OPS = 40       # larger expressions are left alone: sympy's factor/apart can take seconds
MAX_SYMBOLS = 10
# The numeric spot check's sample points: SPOT_POINTS values k/8 of each real symbol, first in
# [3/8, 29/8] (positive, where logs and roots are real), then, where none of those evaluates, in
# [1/8, 7/8] (where log(1-p) of a probability p is real too: a binary cross-entropy is complex at
# p > 1). Index symbols take integers 1..6.
SPOT_POINTS = 3
SPOT_RANGES = (("spot-check:", 3, 29), ("spot-check-unit:", 1, 7))


@dataclass(frozen=True)
class Target:
    """The expression of a statement that an algebraic rewrite may change: the whole right-hand side
    of a plain store, or `e` of an accumulation `X op e` / `max(X,e)` (the accumulator form must stay
    as it is, or the implicit initialisation of docs/leir.md §4.4 would change)."""

    stmt: Stmt
    expr: object
    op: str | None  # the accumulation operator kept around `expr`, None for a plain store

    def rebuild(self, expr) -> Stmt:
        x = self.stmt.lhs
        if self.op is None:
            return Stmt(x, expr)
        if self.op in ("max", "min"):
            return Stmt(x, Call(self.op, (x, expr)))
        return Stmt(x, BinOp(self.op, x, expr))


def algebra_target(stmt: Stmt) -> Target | None:
    """None for statements algebra must not touch: non-float results, accumulations of other shapes."""
    if stmt.lhs.dtype not in FLOAT_CODES:
        return None
    rhs, x = stmt.rhs, stmt.lhs
    op = reduction_op(stmt)
    if op in ("max", "min") and isinstance(rhs, Call) and rhs.args[0] == x:
        return Target(stmt, rhs.args[1], op)
    if op is not None and isinstance(rhs, BinOp) and rhs.lhs == x:
        return Target(stmt, rhs.rhs, op)
    if op is not None:
        return None  # `X+e1+e2`: the accumulator sits deeper in a chain; leave it
    return Target(stmt, rhs, None)


def is_plain_index(access: Access) -> bool:
    """Every subscript is a bare loop variable, all different (`D_{tx,a}`)."""
    names = [i.name for i in access.indices if isinstance(i, Var)]
    return len(names) == len(access.indices) and len(set(names)) == len(names)


def is_element_index(access: Access) -> bool:
    """Every subscript is a bare loop variable or an integer literal, the variables all different
    (`D_{tx,a}`, and `M_{tx,0}` as the translator writes a sum over a kept dimension)."""
    names = [i.name for i in access.indices if isinstance(i, Var)]
    literal = [i for i in access.indices if isinstance(i, Num) and isinstance(i.value, int)]
    return len(names) + len(literal) == len(access.indices) and len(set(names)) == len(names)


# --- sympy forms -------------------------------------------------------------------------------------

class Translated:
    """A statement's target expression in sympy, with the bridge that made it."""

    def __init__(self, target: Target, bridge: Bridge | None = None, expr: sympy.Expr | None = None):
        self.target = target
        self.bridge = bridge or Bridge()
        self.expr = expr if expr is not None else self.bridge.to_sympy(target.expr)


@lru_cache(maxsize=2048)
def translate(stmt: Stmt) -> Translated | None:
    """The statement's target in sympy, or None: no target, over MAX_OPS operations or MAX_SYMBOLS
    symbols, a constant, or no faithful sympy form."""
    target = algebra_target(stmt)
    if target is None or count_ops(target.expr) > MAX_OPS:
        return None
    try:
        tr = Translated(target)
    except Untranslatable:
        return None
    if len(tr.expr.free_symbols) > MAX_SYMBOLS or tr.expr.is_Number:
        return None
    return tr


def atomize(e: sympy.Expr, table: dict) -> sympy.Expr:
    """`e` with every transcendental call and fractional power replaced by a symbol (same sign facts)."""
    if e.is_Atom:
        return e
    if e.is_Pow and not e.exp.is_Integer and e.exp.is_Number and e.exp < 0:
        return sympy.Pow(atomize(sympy.Pow(e.base, -e.exp), table), -1)
    if isinstance(e, sympy.Function) or (e.is_Pow and not e.exp.is_Integer):
        if e not in table:
            table[e] = sympy.Symbol("@" + str(e), real=True, positive=e.is_positive or None,
                                    nonnegative=e.is_nonnegative or None, nonzero=e.is_nonzero or None)
        return table[e]
    return e.func(*[atomize(a, table) for a in e.args])


def identity_problem(before: sympy.Expr, after: sympy.Expr, points: int = SPOT_POINTS) -> str | None:
    """Why a numeric spot check does not confirm `before == after`, or None. Both sides are evaluated
    at deterministic sample points (SPOT_RANGES); a point where a side cannot be evaluated or is not
    finite is skipped, and a check that evaluated no point confirms nothing."""
    syms = sorted(before.free_symbols | after.free_symbols, key=lambda s: s.name)
    for seed, lo, hi in SPOT_RANGES:
        rng = random.Random(seed + ",".join(s.name for s in syms))
        checked = 0
        for _ in range(points):
            values = {s: sympy.Rational(rng.randint(lo, hi), 8) if not s.is_integer else rng.randint(1, 6)
                      for s in syms}
            agree = _agree_at(before, after, values)
            if agree is False:
                return "numeric spot check of the identity failed"
            checked += agree is True
        if checked:
            return None
    return (f"the numeric spot check evaluated none of its {points * len(SPOT_RANGES)} sample points (at each, "
            "a side could not be evaluated or was not finite), so the identity is untested")


def _agree_at(before: sympy.Expr, after: sympy.Expr, values: dict) -> bool | None:
    """Whether both sides have the same value at `values`; None where a side has no finite value."""
    try:
        a = complex(before.evalf(30, subs=values))
        b = complex(after.evalf(30, subs=values))
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    if not all(math.isfinite(v.real) and math.isfinite(v.imag) for v in (a, b)):
        return None
    return abs(a - b) <= 1e-9 * max(1.0, abs(a))


# --- the max shift of a softmax ----------------------------------------------------------------------

def contraction_values(ctx) -> set[str]:
    """Tensors whose values can grow with a reduction length: written by a sum reduction (`X=X+e`,
    `X=X-e`) or computed from such a tensor (attention logits, matmul outputs and what is derived
    from them). Raw inputs stay bounded by how they were drawn; these do not."""
    grown: set[str] = set()
    for s in ctx.sites:
        lhs = s.stmt.lhs.tensor
        if reduction_op(s.stmt) in ("+", "-") or any(a.tensor in grown and a.tensor != lhs
                                                      for a in accesses(s.stmt.rhs)):
            grown.add(lhs)
    return grown


def unguarded_exp(ctx, shifted, shift, code: str | None = None) -> str | None:
    """Why exp(`shifted`) without the shift `shift` may overflow, or None: dropping or replacing the
    max shift of a softmax is only safe when the shifted values cannot grow (exp(x) is inf for
    x > 88 in float32), so it is refused for values that come out of a sum reduction, and always in
    a dtype whose exp overflows within the range of ordinary data (float16: above 11). `code` is the
    dtype the exp is computed in (its statement's left-hand dtype, docs/leir.md §4.5: a float32 statement
    over float16 reads computes exp in float32); without it, the dtype of the values read."""
    shifts = {s.stmt.lhs.tensor for s in ctx.sites if reduction_op(s.stmt) == "max"}
    if shift is not None and not any(a.tensor in shifts for a in accesses(shift)):
        return None
    codes = [code] if code else [a.dtype for a in (*accesses(shift if shift is not None else shifted),
                                                     *accesses(shifted))]
    dtype_problem = unshifted_exp_problem(codes[0]) if codes else None
    if dtype_problem:
        return dtype_problem
    grown = contraction_values(ctx)
    hit = sorted({a.tensor for a in accesses(shifted) if a.tensor in grown})
    if hit:
        return (f"{', '.join(hit)} come{'s' if len(hit) == 1 else ''} out of a sum reduction, so without the max "
                "shift exp can overflow")
    return None
