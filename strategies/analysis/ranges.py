"""Value ranges: an interval for every tensor of a program and every sub-expression of a statement,
from the inputs' magnitude (`numerics.DATA_MAGNITUDE`) forward through the statements in program
order. Coarse on purpose (a sum of n terms spans n times its term's range): it is used to compare an
expression with its rewrite in the same program, never to promise that a value is small.

An unknown range is (-inf, inf): integer tensors, products over many terms, scans and other updates
that read their own earlier elements. Comparisons that involve an unknown range decide nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from leir.analysis import implicit_inits, loop_bounds, reduction_op, statement_sites
from leir.ast import Access, BinOp, Call, Neg, Num, Program, Select, Stmt, Var, accesses
from leir.signature import Signature
from strategies.analysis.legality import accumulated_terms
from strategies.analysis.numerics import DATA_MAGNITUDE, FORMATS

INF = math.inf


@dataclass(frozen=True)
class Interval:
    lo: float
    hi: float

    @property
    def magnitude(self) -> float:
        return max(abs(self.lo), abs(self.hi))

    @property
    def known(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    def union(self, other: Interval) -> Interval:
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))

    def scaled(self, n: int) -> Interval:
        return Interval(_mul(self.lo, n), _mul(self.hi, n))


UNKNOWN = Interval(-INF, INF)
DATA = Interval(-DATA_MAGNITUDE, DATA_MAGNITUDE)


def _mul(a: float, b: float) -> float:
    return 0.0 if a == 0 or b == 0 else a * b


@lru_cache(maxsize=256)
def tensor_ranges(program: Program, signature: Signature) -> dict[str, Interval]:
    """The interval of every tensor: inputs of a float dtype span DATA, others are unknown; each
    statement widens its tensor's interval by what it writes (an accumulation by its term's range
    times the number of terms)."""
    ranges = {t.name: DATA if t.code in FORMATS else UNKNOWN for t in signature.inputs}
    inits = implicit_inits(program, signature)
    for site in statement_sites(program):
        stmt, name = site.stmt, site.stmt.lhs.tensor
        written = _written_range(stmt, site.loops, ranges, site.order in inits)
        ranges[name] = written if name not in ranges or site.order in inits else ranges[name].union(written)
    return ranges


def _written_range(stmt: Stmt, loops, ranges, fresh: bool) -> Interval:
    if stmt.lhs.dtype not in FORMATS:
        return UNKNOWN
    own = stmt.lhs.tensor
    if not any(a.tensor == own for a in accesses(stmt.rhs)):
        return expr_range(stmt.rhs, ranges, loop_bounds(loops))[0]
    op = reduction_op(stmt)
    start = Interval(0.0, 0.0) if fresh else ranges.get(own, UNKNOWN)
    if op in ("max", "min") and isinstance(stmt.rhs, Call) and own not in _reads(stmt.rhs.args[1]):
        term = expr_range(stmt.rhs.args[1], ranges, loop_bounds(loops))[0]
        return term if fresh else start.union(term)
    if op in ("+", "-") and isinstance(stmt.rhs, BinOp) and stmt.rhs.lhs == stmt.lhs \
            and own not in _reads(stmt.rhs.rhs):
        term = expr_range(stmt.rhs.rhs, ranges, loop_bounds(loops))[0]
        if op == "-":
            term = Interval(-term.hi, -term.lo)
        grown = term.scaled(accumulated_terms(stmt, loops))
        return Interval(start.lo + grown.lo, start.hi + grown.hi)
    return UNKNOWN  # products, scans, running updates: no useful bound


def _reads(expr) -> set[str]:
    return {a.tensor for a in accesses(expr)}


def expr_range(expr, ranges: dict[str, Interval], bounds: dict[str, tuple[int, int]]) -> tuple[Interval, float]:
    """(interval of `expr`, the largest magnitude any value it computes can take). Leaves (literals,
    indices, the tensors it reads) count for the interval but not for the peak: an expression and
    its rewrite read the same tensors, what differs is what they compute from them."""
    match expr:
        case Num(value=v):
            v = float(v)
            return Interval(v, v), 0.0
        case Var(name=n):
            lo, hi = bounds.get(n, (-INF, INF))
            return Interval(lo, hi), 0.0
        case Access(tensor=t):
            return ranges.get(t, UNKNOWN), 0.0
        case Neg(operand=a):
            r, peak = expr_range(a, ranges, bounds)
            return Interval(-r.hi, -r.lo), peak
        case BinOp(op=op, lhs=a, rhs=b) if op in _BINARY:
            ra, pa = expr_range(a, ranges, bounds)
            rb, pb = expr_range(b, ranges, bounds)
            r = _BINARY[op](ra, rb)
            return r, max(pa, pb, r.magnitude)
        case Call(fn=f, args=args) if f in _CALLS:
            found = [expr_range(a, ranges, bounds) for a in args]
            r = _CALLS[f](*[x[0] for x in found])
            return r, max([r.magnitude] + [x[1] for x in found])
        case Select(then=t, otherwise=o):
            rt, pt = expr_range(t, ranges, bounds)
            ro, po = expr_range(o, ranges, bounds)
            r = rt.union(ro)
            return r, max(pt, po, r.magnitude)
    return UNKNOWN, INF


def _add(a: Interval, b: Interval) -> Interval:
    return Interval(a.lo + b.lo, a.hi + b.hi) if a.known and b.known else UNKNOWN


def _sub(a: Interval, b: Interval) -> Interval:
    return _add(a, Interval(-b.hi, -b.lo))


def _times(a: Interval, b: Interval) -> Interval:
    if not (a.known and b.known):
        return UNKNOWN
    products = [_mul(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return Interval(min(products), max(products))


def _div(a: Interval, b: Interval) -> Interval:
    if not b.known or b.lo <= 0 <= b.hi:
        return UNKNOWN  # a divisor that may be zero: no bound
    return _times(a, Interval(1 / b.hi, 1 / b.lo))


def _pow(a: Interval, b: Interval) -> Interval:
    if not (a.known and b.known) or b.lo != b.hi:
        return UNKNOWN
    e = b.lo
    if e == int(e) and e >= 0:
        e = int(e)
        ends = [a.lo ** e, a.hi ** e]
        lo, hi = min(ends), max(ends)
        if e % 2 == 0 and a.lo < 0 < a.hi:
            lo = 0.0
        return Interval(lo, hi)
    if a.lo > 0:
        ends = [a.lo ** e, a.hi ** e]
        return Interval(min(ends), max(ends))
    return UNKNOWN


def _exp(a: Interval) -> Interval:
    return Interval(math.exp(min(a.lo, 709.0)), math.exp(min(a.hi, 709.0)) if a.hi < 709 else INF)


def _log(a: Interval) -> Interval:
    if not a.known or a.hi <= 0:
        return UNKNOWN
    return Interval(math.log(a.lo) if a.lo > 0 else -INF, math.log(a.hi))


def _sqrt(a: Interval) -> Interval:
    return Interval(math.sqrt(max(a.lo, 0.0)), math.sqrt(a.hi)) if a.known and a.hi >= 0 else UNKNOWN


def _abs(a: Interval) -> Interval:
    lo = 0.0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
    return Interval(lo, a.magnitude)


_BINARY = {"+": _add, "-": _sub, "*": _times, "/": _div, "**": _pow}
_CALLS = {
    "exp": _exp, "fast_exp": _exp, "log": _log, "fast_log": _log, "sqrt": _sqrt, "abs": _abs,
    "erf": lambda a: Interval(-1.0, 1.0), "fast_erf": lambda a: Interval(-1.0, 1.0),
    "max": lambda a, b: Interval(max(a.lo, b.lo), max(a.hi, b.hi)),
    "min": lambda a, b: Interval(min(a.lo, b.lo), min(a.hi, b.hi)),
}

