"""The sympy forms of the statements a step rewrote, and the properties of them that the algebraic
strategies' recognisers read (`Strategy.recognizes`).

`rewritten_expressions` finds the statements whose right-hand side changed (the programs otherwise
alike: the same statements, loops and left-hand sides) and translates the changed part of both
(`algebra_target`: the whole right-hand side, or `e` of an accumulation `X op e`) with one bridge,
so that one access is one symbol on both sides. Translation keeps products of sums as they are
written (`distribute(False)`: sympy would otherwise turn `2*(A+C)` into `2*A+2*C`); sympy's own
canonicalisation (order of operands, `A*A` = `A**2`) is what makes another spelling comparable.
Expressions over `MAX_OPS` operations or `MAX_SYMBOLS` symbols are not looked at, as the strategies
themselves leave them.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import sympy
from sympy.core.parameters import distribute

from leir.analysis import statement_sites
from leir.ast import Program, Stmt
from strategies.analysis.algebra import MAX_OPS, MAX_SYMBOLS, algebra_target, atomize
from strategies.analysis.sympy_bridge import Bridge, Untranslatable, count_ops, is_reciprocal

SYMPY_ERRORS = (sympy.PolynomialError, sympy.SympifyError, NotImplementedError, ValueError, TypeError,
                AttributeError, RecursionError, ZeroDivisionError)


def shown_in_rewrites(a: Program, b: Program, shows: Callable[[sympy.Expr, sympy.Expr], bool]) -> bool:
    """Whether one rewritten statement's (original, answer) sympy forms have the property `shows`."""
    return any(shown_in_statement(s, t, shows) for s, t in changed_statements(a, b))


def shown_in_statement(s: Stmt, t: Stmt, shows: Callable[[sympy.Expr, sympy.Expr], bool]) -> bool:
    """Whether statement `s` rewritten as `t` (the same left-hand side) has the property `shows`."""
    pair = statement_forms(s, t) if s.lhs == t.lhs and s.rhs != t.rhs else None
    if pair is None:
        return False
    try:
        return pair[0] != pair[1] and shows(*pair)
    except SYMPY_ERRORS:
        return False


def rewritten_expressions(a: Program, b: Program) -> list[tuple[sympy.Expr, sympy.Expr]]:
    """(original, answer) sympy forms of every statement whose right-hand side changed, when the two
    programs are otherwise alike (same statements in the same places, loops and left-hand sides).
    Accumulations must keep their operator; the accumulated part is compared."""
    return [pair for s, t in changed_statements(a, b) if (pair := statement_forms(s, t)) is not None]


def changed_statements(a: Program, b: Program) -> list[tuple[Stmt, Stmt]]:
    """The (original, answer) statements whose right-hand side changed, when the two programs are
    otherwise alike (same statements in the same places, loops and left-hand sides); else none."""
    sa, sb = statement_sites(a), statement_sites(b)
    if len(sa) != len(sb):
        return []
    changed = []
    for x, y in zip(sa, sb, strict=True):
        if (x.nest_index, x.path, x.loops, x.stmt.lhs) != (y.nest_index, y.path, y.loops, y.stmt.lhs):
            return []
        if x.stmt.rhs != y.stmt.rhs:
            changed.append((x.stmt, y.stmt))
    return changed


def statement_forms(s: Stmt, t: Stmt) -> tuple[sympy.Expr, sympy.Expr] | None:
    """The sympy forms of what `s` and `t` compute (the accumulated part of an accumulation, whose
    operator must be kept) in one symbol table, or None when they are not comparable or too large."""
    ts, tt = algebra_target(s), algebra_target(t)
    if ts is None or tt is None or ts.op != tt.op:
        return None
    if count_ops(ts.expr) > MAX_OPS or count_ops(tt.expr) > MAX_OPS:
        return None
    bridge = Bridge()  # one symbol table: the same access is the same symbol on both sides
    try:
        with distribute(False):
            e0, e1 = bridge.to_sympy(ts.expr), bridge.to_sympy(tt.expr)
    except Untranslatable:
        return None
    return (e0, e1) if len(e0.free_symbols | e1.free_symbols) <= MAX_SYMBOLS else None


def accumulated_element(stmt: Stmt) -> sympy.Expr | None:
    """The accumulated part of an accumulation, in sympy (None when it has none)."""
    target = algebra_target(stmt)
    if target is None or target.op is None or count_ops(target.expr) > MAX_OPS:
        return None
    try:
        with distribute(False):
            return Bridge().to_sympy(target.expr)
    except Untranslatable:
        return None


def numerator_factors(node: sympy.Expr) -> list[sympy.Expr]:
    return [f for f in sympy.Mul.make_args(node) if not is_reciprocal(f)]


def denominator(term: sympy.Expr) -> sympy.Expr:
    return sympy.Mul(*[sympy.Pow(f.base, -f.exp) for f in sympy.Mul.make_args(term) if is_reciprocal(f)])


def is_sum_power(f: sympy.Expr) -> bool:
    return bool(f.is_Pow and f.base.is_Add and f.exp.is_Integer and f.exp > 1)


def products_of_sums(e: sympy.Expr) -> list[sympy.Expr]:
    """Products (numerator factors) with a sum among their factors, and integer powers of sums."""
    out = []
    for node in sympy.preorder_traversal(e):
        if node.is_Mul:
            num = numerator_factors(node)
            if len(num) >= 2 and any(f.is_Add or is_sum_power(f) for f in num):
                out.append(sympy.Mul(*num, evaluate=False))
        elif is_sum_power(node):
            out.append(node)
    return out


def sums(e: sympy.Expr) -> list[sympy.Expr]:
    return [node for node in sympy.preorder_traversal(e) if node.is_Add]


def power_of(f: sympy.Expr, symbols) -> tuple | None:
    """(x, k) when the factor is an access or index x, or its positive integer power x**k."""
    if f in symbols:
        return f, 1
    if f.is_Pow and f.base in symbols and f.exp.is_Integer and f.exp > 0:
        return f.base, int(f.exp)
    return None


def grouping(e: sympy.Expr, symbols) -> tuple[Counter, Counter]:
    """Per (x, k): products x**k*(sum) in `e`, and terms of sums of `e` that carry the factor x**k."""
    grouped, terms = Counter(), Counter()
    for node in sympy.preorder_traversal(e):
        if node.is_Mul:
            num = numerator_factors(node)
            if any(f.is_Add for f in num):
                for f in num:
                    key = power_of(f, symbols)
                    if key:
                        grouped[key] += 1
        if node.is_Add:
            for t in node.args:
                for f in sympy.Mul.make_args(t):
                    key = power_of(f, symbols)
                    if key:
                        terms[key] += 1
    return grouped, terms


def rational_form(e: sympy.Expr) -> tuple[int, bool, frozenset] | None:
    """For `e` as one fraction p/q, with transcendental calls and roots as atoms: (total degree of p
    plus that of q, whether p and q have no common factor, the atoms); None when `e` is no rational
    function of its atoms."""
    table: dict = {}
    at = atomize(e, table)
    p, q = sympy.fraction(sympy.together(at))
    gens = sorted(at.free_symbols, key=lambda s: s.name)
    if not gens:
        return None
    try:
        degree = sympy.Poly(p, *gens).total_degree() + sympy.Poly(q, *gens).total_degree()
        lowest = sympy.gcd(p, q).is_Number
    except sympy.PolynomialError:
        return None
    return degree, bool(lowest), frozenset(table)


def terms_over(e: sympy.Expr) -> Counter:
    """Per denominator: the terms of sums in `e` that divide by it."""
    out = Counter()
    for s in sums(e):
        for t in s.args:
            d = denominator(t)
            if d != 1:
                out[d] += 1
    return out


def apart_form(e: sympy.Expr, x: sympy.Symbol) -> bool:
    """A polynomial in x plus at least one proper fraction in x over a power of one factor in x."""
    fractions = 0
    for t in sympy.Add.make_args(atomize(e, {})):
        p, q = sympy.fraction(t)
        if not q.has(x):
            continue
        factors = [f for f, _ in sympy.factor_list(q)[1] if f.has(x)]
        if len(factors) != 1 or sympy.degree(p, x) >= sympy.degree(q, x):
            return False
        fractions += 1
    return fractions > 0


def sums_of_fractions(e: sympy.Expr) -> int:
    return sum(any(denominator(t) != 1 for t in s.args) for s in sums(e))


def combinable(e: sympy.Expr) -> int:
    """Factors of products that powsimp would combine: several exponentials, or several powers with
    one non-integer exponent (sympy itself already combines powers of one base)."""
    n = 0
    for node in sympy.preorder_traversal(e):
        if node.is_Mul:
            n += max(0, sum(isinstance(f, sympy.exp) for f in node.args) - 1)
            same_exp = Counter(f.exp for f in node.args if f.is_Pow and not f.exp.is_Integer)
            n += sum(c - 1 for c in same_exp.values())
    return n


def logs(e: sympy.Expr) -> int:
    return sum(isinstance(node, sympy.log) for node in sympy.preorder_traversal(e))


def log_factors(e: sympy.Expr) -> int:
    """The factors inside logarithms: each factor of a logarithm's argument, a power x**n with a
    numeric exponent other than 1 counted twice, its exponent being one more thing to take out (what
    expand_log takes out, logsimp puts in: log(exp(x)/F) -> x + log(1/F), log(1/F) -> -log(F),
    log(G)/256 <- log(G**(1/256)))."""
    def weight(f: sympy.Expr) -> int:
        return 2 if f.is_Pow and f.exp.is_Number and f.exp != 1 else 1
    return sum(weight(f) for node in sympy.preorder_traversal(e) if isinstance(node, sympy.log)
               for f in sympy.Mul.make_args(node.args[0]))


def same_value(p: sympy.Expr, q: sympy.Expr) -> bool:
    """`p` and `q` multiply out to the same expression (a float and a rational constant of one value
    count as the same: `0.5*A` and `A/2`)."""
    return sympy.expand(p - q) == 0


def constant_multiple(p: sympy.Expr, q: sympy.Expr) -> bool:
    """`p` multiplies out to `q` times a constant other than 1."""
    if q == 0:
        return False
    ratio = sympy.cancel(sympy.expand(p) / sympy.expand(q))
    return bool(ratio.is_Number) and ratio != 1 and ratio != 0
