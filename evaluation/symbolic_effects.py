"""Structural effects of the symbolic rewrites, the splits of a sum reduction, the operand/statement
reorder and the stacked-tensor rewrites (issue 15, point 4; `evaluation.effects` merges these in).

The algebraic strategies rewrite one statement's expression. Their predicate finds the statements
whose right-hand side changed (the programs otherwise alike: the same statements, loops and
left-hand sides), translates the changed part of both (`strategies.analysis.algebra.algebra_target`: the whole
right-hand side, or `e` of an accumulation `X op e`) with the project's bridge
(`strategies.analysis.sympy_bridge`, one symbol per distinct access) and states the strategy's effect as a
property of the two sympy forms. Translation keeps products of sums as they are written
(`distribute(False)`: sympy would otherwise turn `2*(A+C)` into `2*A+2*C`); sympy's automatic
canonicalisation (order of operands, `A*A` = `A**2`, `x**a*x**b` = `x**(a+b)`) is what makes an
answer in another spelling comparable. Expressions over `strategies.analysis.algebra.MAX_OPS` operations or
`MAX_SYMBOLS` symbols are not looked at (no effect shown), as the strategies themselves leave them.

- `factorization`: a sum of the original became a product: the answer holds a product with a sum
  among its factors (or an integer power of a sum) that multiplies out to a sum of the original
  (or to the numerator of one, over a common denominator);
- `expand_factorization`: fewer products with a sum among their factors (multiplied out);
- `collect`: for some access x and power k, a new product x**k*(sum) and fewer terms of sums that
  carry the factor x**k (the terms grouped by it); `expand_collect`: the reverse;
- `cancellation`: the answer is one fraction p/q in lowest terms, where the original as one
  fraction had a larger total degree (a common factor of p and q removed) or was a sum of
  fractions (sympy.cancel, the library's step, combines those too); exponentials, logarithms and
  roots are opaque atoms and must be the same on both sides;
- `expand_cancellation`: more terms of a sum over one denominator that the original divides by
  (at least two: a numerator split term by term);
- `apart`: for some access x in a denominator, the answer is a polynomial part in x plus proper
  fractions in x, each over a power of a single factor in x, and the original was not;
- `together`: fewer sums that add fractions, and the answer still divides (over one denominator);
- `powsimp`: fewer products of several exponentials or of powers with one exponent (combined);
  `expand_powsimp`: more. `x**(a+b)` -> `x**a*x**b` is invisible here: sympy combines equal bases
  itself, so that spelling is left to the exact match;
- `additive_split`: a tensor written by one sum accumulation `S=S+(g+t)` is written by two or
  more sum accumulations, each of fewer terms;
- `multiplicative_split`: a sum accumulation of a product `S=S+f*g` became a new sum `T=T+...`
  and a store of `S` from `T` in fewer loops (the invariant factor applied once);
- `partially_equivalent_then_correct`: the sum `S=S+exp(y-R)` no longer reads R, and a later
  statement multiplies S by an exponential that reads R (the correction);
- `expression_reorder`: the same program up to the order of the operands of + and * (a chain of
  them, `-` read as adding a negation) and the order of nests and body items, and not equal;
- `tensor_concat_to_fuse_operators`: two or more intermediates of one shape are gone and a new
  intermediate has that shape with one more axis (the parts stacked, on any axis);
- `tensor_split_to_decouple_operators`: the reverse: new intermediates of a shape that a stacked
  intermediate has with one more axis, which is gone or accessed less.

Limits. A predicate is a structural sign, checked only once the answer verifies; it proves nothing
by itself. sympy's own steps sometimes do something else as a side effect, and such a library step
shows no effect here (it still passes by the exact match): `cancellation` that only multiplies out
a polynomial (cancel expands p and q; nothing is a fraction), `factorization` that only brings a sum
over a common denominator (factor does that first), `apart` in an access that only gathers the
terms free of it. Answers that rename loop indices or move statements as well as rewriting an
expression are not compared (the programs must be alike but for the rewritten expressions).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import sympy
from sympy.core.parameters import distribute

from leir.analysis import StmtSite, reduction_op, statement_sites, tensor_table
from leir.ast import BinOp, Call, Neg, Program, Stmt, accesses, walk_expr
from leir.signature import Signature
from strategies.analysis.algebra import MAX_OPS, MAX_SYMBOLS, algebra_target, atomize
from strategies.analysis.sympy_bridge import Bridge, Untranslatable, count_ops

Effect = Callable[[Program, Program, Signature], bool]
SYMBOLIC: dict[str, Effect] = {}
_SYMPY_ERRORS = (sympy.PolynomialError, sympy.SympifyError, NotImplementedError, ValueError, TypeError,
                 AttributeError, RecursionError, ZeroDivisionError)


def _expression_effect(*names: str):
    """Register a predicate over (original expression, answer expression) in sympy: it holds when
    one rewritten statement shows it."""
    def register(fn: Callable[[sympy.Expr, sympy.Expr], bool]):
        def check(a: Program, b: Program, sig: Signature) -> bool:
            for e0, e1 in rewritten_expressions(a, b):
                try:
                    if e0 != e1 and fn(e0, e1):
                        return True
                except _SYMPY_ERRORS:
                    continue
            return False
        for name in names:
            SYMBOLIC[name] = check
        return fn
    return register


def _program_effect(*names: str):
    def register(fn: Effect) -> Effect:
        for name in names:
            SYMBOLIC[name] = fn
        return fn
    return register


# --- the rewritten expressions ----------------------------------------------------------------------

def rewritten_expressions(a: Program, b: Program) -> list[tuple[sympy.Expr, sympy.Expr]]:
    """(original, answer) sympy forms of every statement whose right-hand side changed, when the two
    programs are otherwise alike (same statements in the same places, loops and left-hand sides).
    Accumulations must keep their operator; the accumulated part is compared."""
    sa, sb = statement_sites(a), statement_sites(b)
    if len(sa) != len(sb):
        return []
    changed = []
    for x, y in zip(sa, sb, strict=True):
        if (x.nest_index, x.path, x.loops, x.stmt.lhs) != (y.nest_index, y.path, y.loops, y.stmt.lhs):
            return []
        if x.stmt.rhs != y.stmt.rhs:
            changed.append((x.stmt, y.stmt))
    out = []
    for s, t in changed:
        ts, tt = algebra_target(s), algebra_target(t)
        if ts is None or tt is None or ts.op != tt.op:
            continue
        if count_ops(ts.expr) > MAX_OPS or count_ops(tt.expr) > MAX_OPS:
            continue
        bridge = Bridge()  # one symbol table: the same access is the same symbol on both sides
        try:
            with distribute(False):
                e0, e1 = bridge.to_sympy(ts.expr), bridge.to_sympy(tt.expr)
        except Untranslatable:
            continue
        if len(e0.free_symbols | e1.free_symbols) <= MAX_SYMBOLS:
            out.append((e0, e1))
    return out


def _is_den(f: sympy.Expr) -> bool:
    return bool(f.is_Pow and f.exp.is_Number and f.exp < 0)


def _numerator_factors(node: sympy.Expr) -> list[sympy.Expr]:
    return [f for f in sympy.Mul.make_args(node) if not _is_den(f)]


def _denominator(term: sympy.Expr) -> sympy.Expr:
    return sympy.Mul(*[sympy.Pow(f.base, -f.exp) for f in sympy.Mul.make_args(term) if _is_den(f)])


def _is_sum_power(f: sympy.Expr) -> bool:
    return bool(f.is_Pow and f.base.is_Add and f.exp.is_Integer and f.exp > 1)


def _products_of_sums(e: sympy.Expr) -> list[sympy.Expr]:
    """Products (numerator factors) with a sum among their factors, and integer powers of sums."""
    out = []
    for node in sympy.preorder_traversal(e):
        if node.is_Mul:
            num = _numerator_factors(node)
            if len(num) >= 2 and any(f.is_Add or _is_sum_power(f) for f in num):
                out.append(sympy.Mul(*num, evaluate=False))
        elif _is_sum_power(node):
            out.append(node)
    return out


def _sums(e: sympy.Expr) -> list[sympy.Expr]:
    return [node for node in sympy.preorder_traversal(e) if node.is_Add]


# --- factor / expand ----------------------------------------------------------------------------------

@_expression_effect("factorization")
def _factorization(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    targets = set()
    for s in _sums(e0):
        targets.add(sympy.expand(s))
        targets.add(sympy.expand(sympy.fraction(sympy.together(s))[0]))
    before = {sympy.expand(p) for p in _products_of_sums(e0)}
    return any(sympy.expand(p) in targets and sympy.expand(p) not in before for p in _products_of_sums(e1))


@_expression_effect("expand_factorization")
def _expand_factorization(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    return len(_products_of_sums(e1)) < len(_products_of_sums(e0))


def _power_of(f: sympy.Expr, symbols) -> tuple | None:
    """(x, k) when the factor is an access or index x, or its positive integer power x**k."""
    if f in symbols:
        return f, 1
    if f.is_Pow and f.base in symbols and f.exp.is_Integer and f.exp > 0:
        return f.base, int(f.exp)
    return None


def _grouping(e: sympy.Expr, symbols) -> tuple[Counter, Counter]:
    """Per (x, k): products x**k*(sum) in `e`, and terms of sums of `e` that carry the factor x**k."""
    grouped, terms = Counter(), Counter()
    for node in sympy.preorder_traversal(e):
        if node.is_Mul:
            num = _numerator_factors(node)
            if any(f.is_Add for f in num):
                for f in num:
                    key = _power_of(f, symbols)
                    if key:
                        grouped[key] += 1
        if node.is_Add:
            for t in node.args:
                for f in sympy.Mul.make_args(t):
                    key = _power_of(f, symbols)
                    if key:
                        terms[key] += 1
    return grouped, terms


@_expression_effect("collect")
def _collect(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    symbols = e0.free_symbols
    g0, t0 = _grouping(e0, symbols)
    g1, t1 = _grouping(e1, symbols)
    return any(g1[k] > g0[k] and t1[k] < t0[k] for k in set(g1) | set(t0))


@_expression_effect("expand_collect")
def _expand_collect(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    symbols = e0.free_symbols
    g0, t0 = _grouping(e0, symbols)
    g1, t1 = _grouping(e1, symbols)
    return any(g1[k] < g0[k] and t1[k] > t0[k] for k in set(g0) | set(t1))


# --- fractions ------------------------------------------------------------------------------------

def _rational_form(e: sympy.Expr) -> tuple[int, bool, frozenset] | None:
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


@_expression_effect("cancellation")
def _cancellation(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    """The answer is one fraction in lowest terms, and the original had a common factor (a larger
    degree) or was a sum of fractions (sympy.cancel combines those too)."""
    before, after = _rational_form(e0), _rational_form(e1)
    if before is None or after is None or after[2] != before[2] or not after[1] or _sums_of_fractions(e1):
        return False
    return after[0] < before[0] or _sums_of_fractions(e0) > 0


def _terms_over(e: sympy.Expr) -> Counter:
    """Per denominator: the terms of sums in `e` that divide by it."""
    out = Counter()
    for s in _sums(e):
        for t in s.args:
            d = _denominator(t)
            if d != 1:
                out[d] += 1
    return out


@_expression_effect("expand_cancellation")
def _expand_cancellation(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    known = {_denominator(node) for node in sympy.preorder_traversal(e0) if node.is_Mul or _is_den(node)} - {1}
    before, after = _terms_over(e0), _terms_over(e1)
    return any(n >= 2 and n > before[d] and d in known for d, n in after.items())


def _apart_form(e: sympy.Expr, x: sympy.Symbol) -> bool:
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


@_expression_effect("apart")
def _apart(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    candidates = {s for d in _denominators(e0) for s in d.free_symbols}
    return any(_apart_form(e1, x) and not _apart_form(e0, x) for x in sorted(candidates, key=lambda s: s.name))


def _denominators(e: sympy.Expr) -> list[sympy.Expr]:
    return [node.base for node in sympy.preorder_traversal(e) if _is_den(node)]


def _sums_of_fractions(e: sympy.Expr) -> int:
    return sum(any(_denominator(t) != 1 for t in s.args) for s in _sums(e))


@_expression_effect("together")
def _together(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    return bool(_denominators(e1)) and _sums_of_fractions(e1) < _sums_of_fractions(e0)


# --- powers -----------------------------------------------------------------------------------------

def _combinable(e: sympy.Expr) -> int:
    """Factors of products that powsimp would combine: several exponentials, or several powers with
    one non-integer exponent (sympy itself already combines powers of one base)."""
    n = 0
    for node in sympy.preorder_traversal(e):
        if node.is_Mul:
            n += max(0, sum(isinstance(f, sympy.exp) for f in node.args) - 1)
            same_exp = Counter(f.exp for f in node.args if f.is_Pow and not f.exp.is_Integer)
            n += sum(c - 1 for c in same_exp.values())
    return n


@_expression_effect("powsimp")
def _powsimp(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    return _combinable(e1) < _combinable(e0)


@_expression_effect("expand_powsimp")
def _expand_powsimp(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    return _combinable(e1) > _combinable(e0)


# --- splits of a sum reduction -------------------------------------------------------------------------

def _writers(program: Program) -> dict[str, list[StmtSite]]:
    out: dict[str, list[StmtSite]] = {}
    for site in statement_sites(program):
        out.setdefault(site.stmt.lhs.tensor, []).append(site)
    return out


def _element(stmt: Stmt) -> sympy.Expr | None:
    """The accumulated part of an accumulation, in sympy (None when it has none)."""
    target = algebra_target(stmt)
    if target is None or target.op is None or count_ops(target.expr) > MAX_OPS:
        return None
    try:
        with distribute(False):
            return Bridge().to_sympy(target.expr)
    except Untranslatable:
        return None


def _sum_accumulation(stmt: Stmt) -> bool:
    return reduction_op(stmt) in ("+", "-")


@_program_effect("additive_split")
def _additive_split(a: Program, b: Program, sig: Signature) -> bool:
    after = _writers(b)
    for name, sites in _writers(a).items():
        parts = after.get(name, [])
        if len(sites) != 1 or len(parts) < 2 or not _sum_accumulation(sites[0].stmt):
            continue
        whole = _element(sites[0].stmt)
        if whole is None or len(sympy.Add.make_args(whole)) < 2:
            continue
        if not all(_sum_accumulation(p.stmt) for p in parts):
            continue
        sizes = [_element(p.stmt) for p in parts]
        if all(e is not None and len(sympy.Add.make_args(e)) < len(sympy.Add.make_args(whole)) for e in sizes):
            return True
    return False


@_program_effect("multiplicative_split")
def _multiplicative_split(a: Program, b: Program, sig: Signature) -> bool:
    before, after = _writers(a), _writers(b)
    for name, sites in before.items():
        if len(sites) != 1 or not _sum_accumulation(sites[0].stmt):
            continue
        whole = _element(sites[0].stmt)
        if whole is None or len([f for f in sympy.Mul.make_args(whole) if not f.is_Number]) < 2:
            continue
        for site in after.get(name, []):
            if reduction_op(site.stmt) is not None or len(site.loops) >= len(sites[0].loops):
                continue
            new = {acc.tensor for acc in accesses(site.stmt.rhs)} - set(before)
            if any(_sum_accumulation(w.stmt) for t in new for w in after.get(t, [])):
                return True
    return False


def _exp_reads(expr) -> set[str]:
    """Tensors read inside the arguments of the exponentials of `expr`."""
    return {acc.tensor for n in walk_expr(expr) if isinstance(n, Call) and n.fn == "exp" for acc in accesses(n)}


@_program_effect("partially_equivalent_then_correct")
def _partial_then_correct(a: Program, b: Program, sig: Signature) -> bool:
    before, after = _writers(a), _writers(b)
    for name, sites in before.items():
        if len(sites) != 1 or not _sum_accumulation(sites[0].stmt):
            continue
        offsets = _exp_reads(sites[0].stmt.rhs) - {name}
        parts = after.get(name, [])
        sums = [p for p in parts if _sum_accumulation(p.stmt) and _exp_reads(p.stmt.rhs)]
        for r in offsets & set(before):
            partial = [p for p in sums if r not in _exp_reads(p.stmt.rhs)]
            if partial and any(p.order > partial[0].order and r in _exp_reads(p.stmt.rhs)
                               and name in {acc.tensor for acc in accesses(p.stmt.rhs)}
                               and not _sum_accumulation(p.stmt) for p in parts):
                return True
    return False


# --- reorder ----------------------------------------------------------------------------------------

def _ac(e) -> tuple:
    """`e` up to the order of the operands of chains of + (with - as adding a negation) and *."""
    if isinstance(e, BinOp) and e.op in ("+", "-"):
        return ("+",) + tuple(sorted((_ac(t) for t in _terms(e)), key=repr))
    if isinstance(e, BinOp) and e.op == "*":
        return ("*",) + tuple(sorted((_ac(f) for f in _factors(e)), key=repr))
    if isinstance(e, BinOp):
        return (e.op, _ac(e.lhs), _ac(e.rhs))
    if isinstance(e, Neg):
        return ("neg", _ac(e.operand))
    if isinstance(e, Call):
        return (e.fn,) + tuple(_ac(x) for x in e.args)
    return ("leaf", e)


def _terms(e) -> list:
    if isinstance(e, BinOp) and e.op == "+":
        return _terms(e.lhs) + _terms(e.rhs)
    if isinstance(e, BinOp) and e.op == "-":
        return _terms(e.lhs) + [Neg(e.rhs)]
    return [e]


def _factors(e) -> list:
    if isinstance(e, BinOp) and e.op == "*":
        return _factors(e.lhs) + _factors(e.rhs)
    return [e]


def _unordered(item) -> tuple:
    if isinstance(item, Stmt):
        return ("stmt", item.lhs, _ac(item.rhs))
    return ("nest", item.loops, tuple(sorted((_unordered(x) for x in item.body), key=repr)))


@_program_effect("expression_reorder")
def _reorder(a: Program, b: Program, sig: Signature) -> bool:
    if a == b:
        return False
    key = lambda p: sorted((_unordered(n) for n in p.nests), key=repr)  # noqa: E731
    return key(a) == key(b)


# --- stacked tensors ----------------------------------------------------------------------------------

def _stacks(stacked: tuple[int, ...], part: tuple[int, ...]) -> bool:
    """`stacked` is `part` with one more axis (of two or more parts) somewhere."""
    return len(stacked) == len(part) + 1 and any(
        stacked[:i] + stacked[i + 1:] == part and stacked[i] >= 2 for i in range(len(stacked)))


def _intermediates(program: Program, sig: Signature) -> dict:
    return {n: i for n, i in tensor_table(program, sig).items() if i.role == "intermediate" and i.shape}


@_program_effect("tensor_concat_to_fuse_operators")
def _concat(a: Program, b: Program, sig: Signature) -> bool:
    before, after = _intermediates(a, sig), _intermediates(b, sig)
    gone = Counter((tuple(i.shape), i.dtype) for n, i in before.items() if n not in after)
    return any(count >= 2 and _stacks(tuple(info.shape), shape) and info.dtype == dtype
               for name, info in after.items() if name not in before for (shape, dtype), count in gone.items())


def _uses(program: Program, tensor: str) -> int:
    return sum(acc.tensor == tensor for site in statement_sites(program)
               for acc in [site.stmt.lhs, *accesses(site.stmt.rhs)])


@_program_effect("tensor_split_to_decouple_operators")
def _split(a: Program, b: Program, sig: Signature) -> bool:
    before, after = _intermediates(a, sig), _intermediates(b, sig)
    new = [i for n, i in after.items() if n not in before]
    for name, info in before.items():
        if name in after and _uses(b, name) >= _uses(a, name):
            continue
        parts = [i for i in new if _stacks(tuple(info.shape), tuple(i.shape)) and i.dtype == info.dtype]
        if len(parts) >= 2 or (parts and name in after):  # all parts split off, or one of them
            return True
    return False
