"""Small expression builder for the translator: Python operators build LEIR trees (never text).

`X(node)` wraps an expression so that `1 / (1 + exp(-x))` builds `BinOp('/', Num(1), ...)`. Python
numbers become literals (a negative one is `Neg(Num(...))`, docs/leir.md §3). `ex(value)` unwraps.
"""
from __future__ import annotations

import math

from leir.ast import And, BinOp, Call, Compare, Neg, Num, Or, Select


def lit(value) -> object:
    """A Python number as a LEIR literal tree."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, float) and math.isinf(value):
        return Num(math.inf) if value > 0 else Neg(Num(math.inf))
    if value < 0:
        return Neg(Num(-value))
    return Num(value)


def ex(value):
    """The LEIR node of a wrapped expression, a Python number or a bare node."""
    if isinstance(value, X):
        return value.node
    if isinstance(value, int | float):
        return lit(value)
    return value


class X:
    """A LEIR value expression with Python arithmetic operators."""

    __slots__ = ("node",)

    def __init__(self, node):
        self.node = ex(node)

    def _bin(self, op, other, reflected=False):
        a, b = (ex(other), self.node) if reflected else (self.node, ex(other))
        return X(BinOp(op, a, b))

    def __add__(self, o):
        return self._bin("+", o)

    def __radd__(self, o):
        return self._bin("+", o, True)

    def __sub__(self, o):
        return self._bin("-", o)

    def __rsub__(self, o):
        return self._bin("-", o, True)

    def __mul__(self, o):
        return self._bin("*", o)

    def __rmul__(self, o):
        return self._bin("*", o, True)

    def __truediv__(self, o):
        return self._bin("/", o)

    def __rtruediv__(self, o):
        return self._bin("/", o, True)

    def __floordiv__(self, o):
        return self._bin("//", o)

    def __mod__(self, o):
        return self._bin("%", o)

    def __pow__(self, o):
        return self._bin("**", o)

    def __rpow__(self, o):
        return self._bin("**", o, True)

    def __neg__(self):
        return X(Neg(self.node))

    # Comparisons build conditions (only valid as the first argument of `select`).
    def lt(self, o):
        return Compare((self.node, ex(o)), ("<",))

    def le(self, o):
        return Compare((self.node, ex(o)), ("<=",))

    def gt(self, o):
        return Compare((self.node, ex(o)), (">",))

    def ge(self, o):
        return Compare((self.node, ex(o)), (">=",))

    def eq(self, o):
        return Compare((self.node, ex(o)), ("==",))

    def ne(self, o):
        return Compare((self.node, ex(o)), ("!=",))


def _call(fn, *args) -> X:
    return X(Call(fn, tuple(ex(a) for a in args)))


def exp(x) -> X:
    return _call("exp", x)


def log(x) -> X:
    return _call("log", x)


def sqrt(x) -> X:
    return _call("sqrt", x)


def fabs(x) -> X:
    return _call("abs", x)


def erf(x) -> X:
    return _call("erf", x)


def vmax(a, b) -> X:
    return _call("max", a, b)


def vmin(a, b) -> X:
    return _call("min", a, b)


def cond(c):
    """A condition node from a comparison, a bool access or a wrapped bool expression."""
    return c.node if isinstance(c, X) else c


def select(c, then, otherwise) -> X:
    return X(Select(cond(c), ex(then), ex(otherwise)))


def both(*conds):
    terms = tuple(cond(c) for c in conds)
    return terms[0] if len(terms) == 1 else And(terms)


def either(*conds):
    terms = tuple(cond(c) for c in conds)
    return terms[0] if len(terms) == 1 else Or(terms)


def within(lo: int, x, hi: int):
    """`lo<=x<hi` as one comparison chain (the padding guard of docs/leir.md §5)."""
    return Compare((ex(lo), ex(x), ex(hi)), ("<=", "<"))


def affine(var, scale: int = 1, offset: int = 0):
    """`var*scale+offset` with the trivial parts left out (`c`, `c*2`, `c-1`, `c*2+1`)."""
    node = ex(var)
    if scale != 1:
        node = BinOp("*", node, Num(scale))
    if offset > 0:
        node = BinOp("+", node, Num(offset))
    elif offset < 0:
        node = BinOp("-", node, Num(-offset))
    return node


def add_index(a, b):
    """Sum of two index expressions, dropping literal zeros."""
    a, b = ex(a), ex(b)
    if a == Num(0):
        return b
    if b == Num(0):
        return a
    return BinOp("+", a, b)
