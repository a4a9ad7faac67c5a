"""LEIR expressions <-> sympy, for the algebraic strategies.

One sympy symbol per *distinct access*, subscript included: `A_{tx,a}` and `A_{tx,a-1}` are different
values and get different symbols (the published implementation merged them and produced wrong
results). A loop index used as a value is a symbol too (integer, non-negative). Operations sympy must
not reason about (`//`, `%`, `if_then_else`) become one opaque real symbol per distinct subterm;
`max`/`min` become unevaluated real functions, so rewrites still reach their arguments.

Symbols are named by the LEIR text of what they stand for, so sympy's canonical order follows the
program's names and is deterministic. `from_sympy` is exact back-substitution: every symbol maps back
to the very node it came from, rationals map back to the literals they were (`1e-05` stays `1e-05`).
Only float statements are translated: integer and bool values would change meaning under algebra.
"""
from __future__ import annotations

import sympy

from leir.ast import Access, BinOp, Call, Neg, Num, Select, Var
from leir.printer import format_expr

FLOAT_CODES = ("f64", "f32", "f16", "bf16")


class Untranslatable(Exception):
    """The expression has no faithful sympy form (integers as values, inf, an unknown node)."""


class _LeirMax(sympy.Function):
    """`max(x, y)` kept unevaluated (sympy's Max rewrites itself under assumptions)."""

    nargs = 2
    is_real = True

    def _eval_evalf(self, prec):
        return sympy.Max(*[a.evalf(prec) for a in self.args])


class _LeirMin(sympy.Function):
    nargs = 2
    is_real = True

    def _eval_evalf(self, prec):
        return sympy.Min(*[a.evalf(prec) for a in self.args])


_BINARY_FN = {"max": _LeirMax, "min": _LeirMin}
_ARITH = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
          "/": lambda x, y: x / y, "**": sympy.Pow}
_UNARY_FN = {"exp": sympy.exp, "log": sympy.log, "sqrt": sympy.sqrt, "abs": sympy.Abs, "erf": sympy.erf}


class Bridge:
    """A symbol table shared by the `to_sympy` / `from_sympy` calls of one rewrite."""

    def __init__(self):
        self.symbol_of: dict[object, sympy.Symbol] = {}
        self.node_of: dict[sympy.Symbol, object] = {}

    # --- LEIR -> sympy --------------------------------------------------------------------------

    def to_sympy(self, node) -> sympy.Expr:
        match node:
            case Num(value=v):
                return _number(v)
            case Var():
                return self._symbol(node, integer=True, nonnegative=True)
            case Access(dtype=d):
                if d not in FLOAT_CODES:
                    raise Untranslatable(f"{format_expr(node)} is not a float value")
                return self._symbol(node, real=True)
            case Neg(operand=a):
                return -self.to_sympy(a)
            case BinOp(op="//" | "%"):
                return self._opaque(node)
            case BinOp(op=op, lhs=a, rhs=b):
                return _ARITH[op](self.to_sympy(a), self.to_sympy(b))
            case Call(fn=f, args=(a,)) if f in _UNARY_FN:
                return _UNARY_FN[f](self.to_sympy(a))
            case Call(fn=f, args=(a, b)) if f in _BINARY_FN:
                return _BINARY_FN[f](self.to_sympy(a), self.to_sympy(b))
            case Select():
                return self._opaque(node)
        raise Untranslatable(f"no sympy form for {type(node).__name__}")

    def _symbol(self, node, **assumptions) -> sympy.Symbol:
        sym = self.symbol_of.get(node)
        if sym is None:
            sym = sympy.Symbol(format_expr(node), **assumptions)
            self.symbol_of[node] = sym
            self.node_of[sym] = node
        return sym

    def _opaque(self, node) -> sympy.Symbol:
        # Values inside (inf, integer tensors) are never seen by sympy: the whole term is one symbol.
        return self._symbol(node, real=True)

    def access_symbols(self) -> list[sympy.Symbol]:
        """Symbols of accesses and loop indices (not opaque terms), in order of first translation."""
        return [s for n, s in self.symbol_of.items() if isinstance(n, Access | Var)]

    # --- sympy -> LEIR --------------------------------------------------------------------------

    def from_sympy(self, e: sympy.Expr):
        if isinstance(e, sympy.Symbol):
            if e not in self.node_of:
                raise Untranslatable(f"symbol {e} has no LEIR node")
            return self.node_of[e]
        if e.is_Rational:
            return _literal(e)
        if e.is_Add:
            return self._add(e)
        if e.is_Mul:
            return self._mul(e)
        if e.is_Pow:
            return self._pow(e)
        if isinstance(e, sympy.exp):
            return Call("exp", (self.from_sympy(e.args[0]),))
        if e is sympy.E:
            return Call("exp", (Num(1),))
        if isinstance(e, sympy.log) and len(e.args) == 1:
            return Call("log", (self.from_sympy(e.args[0]),))
        if isinstance(e, sympy.Abs):
            return Call("abs", (self.from_sympy(e.args[0]),))
        if isinstance(e, sympy.erf):
            return Call("erf", (self.from_sympy(e.args[0]),))
        for name, cls in _BINARY_FN.items():
            if isinstance(e, cls):
                return Call(name, tuple(self.from_sympy(a) for a in e.args))
        raise Untranslatable(f"no LEIR form for {type(e).__name__}: {e}")

    def _add(self, e):
        terms = e.as_ordered_terms()
        # A positive term first: `C-A*B`, not `-(A*B)+C`.
        terms = [t for t in terms if not t.could_extract_minus_sign()] + [
            t for t in terms if t.could_extract_minus_sign()]
        out = None
        for term in terms:
            negative = term.could_extract_minus_sign()
            node = self.from_sympy(-term if negative else term)
            if out is None:
                out = Neg(node) if negative else node
            else:
                out = BinOp("-" if negative else "+", out, node)
        return out

    def _mul(self, e):
        coeff, rest = e.as_coeff_Mul()
        negative = coeff < 0
        coeff = abs(coeff)
        num, den = [], []
        if coeff != 1:
            c = sympy.Rational(coeff)
            if c.q != 1 and (c.p == 1 or _exact_decimal(c) is None):
                if c.p != 1:
                    num.append(Num(int(c.p)))
                den.append(Num(int(c.q)))  # x/4 rather than x*0.25, x*3/7 rather than a rounded literal
            else:
                num.append(_literal(c))
        for f in sympy.Mul.make_args(rest):
            if is_reciprocal(f):
                den.append(self.from_sympy(sympy.Pow(f.base, -f.exp)))
            else:
                num.append(self.from_sympy(f))
        node = _product(num) if num else Num(1)
        if den:
            node = BinOp("/", node, _product(den))
        return Neg(node) if negative else node

    def _pow(self, e):
        base, exp = e.base, e.exp
        if base is sympy.E:
            return Call("exp", (self.from_sympy(exp),))
        if exp.is_Number and exp < 0:
            return BinOp("/", Num(1), self.from_sympy(sympy.Pow(base, -exp)))
        if exp == sympy.Rational(1, 2):
            return Call("sqrt", (self.from_sympy(base),))
        return BinOp("**", self.from_sympy(base), self.from_sympy(exp))


def _number(v: int | float) -> sympy.Expr:
    if isinstance(v, int):
        return sympy.Integer(v)
    if v == float("inf"):
        raise Untranslatable("inf has no faithful sympy form (IEEE arithmetic differs from oo)")
    return sympy.Rational(repr(v))


def _exact_decimal(r: sympy.Rational) -> float | None:
    """The float whose repr denotes exactly `r`, if there is one (0.5, 1e-05), else None (1/3)."""
    f = float(r)
    return f if sympy.Rational(repr(f)) == r else None


def _literal(r: sympy.Rational):
    if r < 0:
        return Neg(_literal(-r))
    if r.q == 1:
        return Num(int(r.p))
    f = _exact_decimal(r)
    return Num(f) if f is not None else BinOp("/", Num(int(r.p)), Num(int(r.q)))


def _product(nodes: list):
    out = nodes[0]
    for n in nodes[1:]:
        out = BinOp("*", out, n)
    return out


def count_ops(node) -> int:
    """Arithmetic operations and calls in an expression (subscripts not counted)."""
    match node:
        case BinOp(lhs=a, rhs=b):
            return 1 + count_ops(a) + count_ops(b)
        case Neg(operand=a):
            return 1 + count_ops(a)
        case Call(args=args):
            return 1 + sum(count_ops(a) for a in args)
        case Select(then=t, otherwise=o):
            return 1 + count_ops(t) + count_ops(o)
    return 0


def is_reciprocal(f: sympy.Expr) -> bool:
    """A factor that divides: a power with a negative numeric exponent (x**-1, x**-2, x**-1/2)."""
    return bool(f.is_Pow and f.exp.is_Number and f.exp < 0)


def denominators(e: sympy.Expr) -> list[sympy.Expr]:
    """Bases that `e` divides by (powers with a negative exponent), in preorder."""
    out = []
    for sub in sympy.preorder_traversal(e):
        if is_reciprocal(sub):
            out.append(sub.base)
    return out


def new_divisions(before: sympy.Expr, after: sympy.Expr) -> list[sympy.Expr]:
    """Denominators of `after` that may be zero where `before` divides by nothing that is zero: every
    irreducible factor must divide one of `before`'s denominators or be provably non-zero."""
    allowed = set()
    # A log's argument is positive wherever the original is defined, so dividing by it is safe too.
    logs = [sub.args[0] for sub in sympy.preorder_traversal(before) if isinstance(sub, sympy.log)]
    for d in denominators(before) + logs:
        allowed.add(d)
        allowed.update(f for f, _ in _factors(d))
    bad = []
    for d in denominators(after):
        if d in allowed or d.is_zero is False:
            continue
        if all(f in allowed or f.is_zero is False for f, _ in _factors(d)):
            continue
        bad.append(d)
    return bad


def _factors(e: sympy.Expr):
    try:
        _, factors = sympy.factor_list(e)
    except (sympy.PolynomialError, NotImplementedError, ValueError):
        return [(e, 1)]
    return factors or [(e, 1)]
