"""The 12 algebraic rules: one sympy transformation each of a statement's target expression
(`strategies.analysis.algebra.Target`), written as `SympyStrategy` subclasses of a few lines.

The rewrite is a step only when the sympy result differs from the input's own canonical sympy form
(so `A*A` -> `A**2`, which sympy already writes as `A**2`, is no step). Every rewrite is checked:
exact back-substitution (the LEIR result translates back to the same sympy expression), no new
division by something that may be zero, an independent numeric spot check of the identity (which
must evaluate at least one sample point), no overflow or loss of conditioning in the dtype (the
check), and the gate on the result: `finish_problem` (validates, same implicit initialisations) and
the strategy's own sign (a respelling is no step). All are `reassociating`: the floating-point
operations change, so results agree within rounding.
"""
from __future__ import annotations

import threading
from functools import lru_cache

import sympy

from leir.ast import Access, Call, Neg, walk_expr
from leir.printer import format_expr, format_stmt
from strategies.analysis import expression_forms as forms
from strategies.analysis.algebra import Translated, atomize, identity_problem, translate, unguarded_exp
from strategies.analysis.gates import finish_problem
from strategies.analysis.legality import accumulated_terms, iterations
from strategies.analysis.magnitudes import conditioning_problem, overflow_problem
from strategies.analysis.numerics import sum_drift_problem
from strategies.analysis.prose import plural
from strategies.analysis.sympy_bridge import Untranslatable, count_ops, denominators, is_reciprocal, new_divisions
from strategies.analysis.tree import replace_item
from strategies.base import Context, Params, Rewrite, Site, Strategy, params_dataclass
from strategies.registry import get, register


@params_dataclass
class SymbolParams(Params):
    symbol: str   # the access or loop index the rewrite is taken in (its sympy symbol's name)


class SympyStrategy(Strategy):
    """A statement-level sympy rewrite. Subclasses define `transform` (and `parameters` with
    `params_type = SymbolParams` when the rewrite depends on a chosen symbol), `why` (what the form
    buys) and optionally `expression_problem` and `extra_facts`."""

    level = "mathematical"
    exactness = "reassociating"
    why = ""
    # `why` promises fewer operations: where the count does not drop, it is not said.
    saves = False
    # Rational-function strategies see exp/log/erf/abs/max/min and fractional powers as opaque atoms:
    # factor() must not split exp(a-b) into exp(a)*exp(-b) (that is expand_powsimp's step).
    rational = True

    def sites(self, ctx: Context):
        for st in ctx.sites:
            if translate(st.stmt) is not None:
                yield Site(st.nest_index, st.path, stmts=(st.order,), tensors=(st.stmt.lhs.tensor,))

    def transform(self, tr: Translated, params: Params) -> sympy.Expr:
        raise NotImplementedError

    def shows(self, e0: sympy.Expr, e1: sympy.Expr) -> bool:
        """Whether the rewritten expression `e1` has this strategy's structural sign against `e0`
        (the sympy forms of `strategies.analysis.expression_forms`)."""
        raise NotImplementedError

    def recognizes(self, before, after, signature):
        """One statement's right-hand side rewritten, the programs otherwise alike, and its two sympy
        forms showing the strategy's sign (`shows`)."""
        return forms.shown_in_rewrites(before, after, self.shows)

    def expression_problem(self, ctx: Context, tr: Translated, new_expr) -> str | None:
        """Why the rewritten expression is refused, beyond the checks every algebraic rule makes, or
        None."""
        return None

    def extra_facts(self, tr: Translated, after: sympy.Expr, params: Params) -> tuple[str, ...]:
        return ()

    def symbol_parameters(self, ctx: Context, site: Site):
        """One variant per access or loop index occurring in the expression, first occurrence order."""
        tr = translate(ctx.sites[site.stmts[0]].stmt)
        for sym in tr.bridge.access_symbols():
            if sym in tr.expr.free_symbols:
                yield {"symbol": sym.name}

    def check(self, ctx, site, params):
        st = ctx.sites[site.stmts[0]]
        tr = translate(st.stmt)
        if tr is None:
            return "the statement has no faithful algebraic form"
        rewritten = _rewritten(self.name, st.stmt, _key(params))
        if isinstance(rewritten, str):
            return rewritten
        new_expr, code = rewritten[1], st.stmt.lhs.dtype
        return (overflow_problem(ctx.program, ctx.signature, st.loops, tr.target.expr, new_expr, code)
                or conditioning_problem(ctx.program, ctx.signature, st.loops, tr.target.expr, new_expr, code)
                or (sum_drift_problem(accumulated_terms(st.stmt, st.loops), code, st.stmt.lhs.tensor,
                                      ctx.result_code) if tr.target.op in ("+", "-", "*") else None)
                or self.expression_problem(ctx, tr, new_expr))

    def build(self, ctx, site, params):
        st = ctx.sites[site.stmts[0]]
        tr = translate(st.stmt)
        after, new_expr = _rewritten(self.name, st.stmt, _key(params))
        program = replace_item(ctx.program, site.nest, site.path, (tr.target.rebuild(new_expr),))
        return Rewrite(program, self._facts(tr, after, params), self._summary(st, tr, new_expr))

    def gate(self, ctx, site, params, rewrite):
        if problem := finish_problem(ctx, rewrite.program):
            return problem
        st = ctx.sites[site.stmts[0]]
        new_stmt = translate(st.stmt).target.rebuild(_rewritten(self.name, st.stmt, _key(params))[1])
        if not _shown(self, st.stmt, new_stmt):  # `recognizes`, on the one statement `build` rewrote
            return (f"sympy's {self.name} only respelled the expression here (the order of its operands, "
                    f"a constant's form, or another rewrite), which is no {self.name}")
        return None

    def _facts(self, tr: Translated, after, params) -> tuple[str, ...]:
        facts = [_symbols_fact(tr), "the new expression equals the old one as an exact symbolic identity "
                 "(sympy, rational arithmetic; literals back-substituted exactly) and agrees at random "
                 "sample points"]
        dens = denominators(after)
        if dens:
            facts.append("every denominator of the result (" + ", ".join(_show(tr, d) for d in dens)
                         + ") already divides the original expression or is provably non-zero")
        else:
            facts.append("no division is introduced")
        if tr.target.op is not None:
            facts.append(f"the accumulation form {tr.target.stmt.lhs.tensor}{tr.target.op}... is kept, so the "
                         "implicit initialisation is unchanged")
        facts.extend(self.extra_facts(tr, after, params))
        return tuple(facts)

    def _summary(self, st, tr: Translated, new_expr) -> str:
        before, after = count_ops(tr.target.expr), count_ops(new_expr)
        n = iterations(st.loops)
        change = (f"saves {before - after} per element, {(before - after) * n} in all" if after < before else
                  f"costs {after - before} more per element" if after > before else "keeps the count")
        why = self.why if after < before or not self.saves else "Here the rewritten form is not cheaper."
        return (f"{why} The expression of {st.stmt.lhs.tensor} goes from {plural(before, 'operation')} to "
                f"{after} per evaluation; it is evaluated {n} times, so this {change}.")


def _shown(strategy: SympyStrategy, before, after) -> bool:
    """`strategy.recognizes` on programs alike but for statement `before` rewritten as `after`. Kept
    by the statements' texts (trees that differ only in a literal's type, 1 against 1.0, are equal as
    trees): a statement and its rewrite come back at every state that holds them."""
    key = (strategy.name, format_stmt(before), format_stmt(after))
    shown = _SHOWN.get(key)
    if shown is None:
        shown = forms.shown_in_statement(before, after, strategy.shows)
        with _SHOWN_LOCK:
            _SHOWN[key] = shown
            if len(_SHOWN) > _SHOWN_KEPT:
                del _SHOWN[next(iter(_SHOWN))]  # the oldest
    return shown


_SHOWN: dict[tuple[str, str, str], bool] = {}
_SHOWN_KEPT = 4096
_SHOWN_LOCK = threading.Lock()


def _key(params: Params) -> tuple:
    return tuple(sorted(params.to_json().items()))


@lru_cache(maxsize=4096)
def _rewritten(name: str, stmt, key: tuple) -> tuple[sympy.Expr, object] | str:
    """(the sympy result of strategy `name` on the statement's target expression, that result as
    LEIR), or why it is no rewrite: the strategy leaves the expression as it is, or the result is not
    exact, divides by something new that may be zero, or fails the spot check (one statement and one
    parameter choice: the same answer at every state that holds the statement)."""
    tr = translate(stmt)
    after = _cached_transform(name, stmt, key)
    if after is None or after == tr.expr:
        return f"{name} leaves the expression as it is"
    bad = new_divisions(tr.expr, after)
    if bad:
        return f"would divide by {bad[0]}, which may be zero"
    try:
        new_expr = tr.bridge.from_sympy(after)
        back = tr.bridge.to_sympy(new_expr)
    except Untranslatable as e:
        return f"no exact LEIR form: {e}"
    if back != after and sympy.cancel(sympy.expand(back - after)) != 0:
        return "back-substitution is not exact"
    return identity_problem(tr.expr, after) or (after, new_expr)


@lru_cache(maxsize=4096)
def _cached_transform(name: str, stmt, key: tuple) -> sympy.Expr | None:
    tr = translate(stmt)
    strategy = get(name)
    params = strategy.params_type.from_json(dict(key))
    try:
        if not strategy.rational:
            return strategy.transform(tr, params)
        table: dict = {}
        opaque = Translated(tr.target, tr.bridge, atomize(tr.expr, table))
        out = strategy.transform(opaque, params)
        return out.xreplace({sym: e for e, sym in table.items()})
    except (sympy.PolynomialError, sympy.SympifyError, NotImplementedError, ValueError, TypeError,
            AttributeError, RecursionError):
        return None  # sympy cannot do it here (not rational in the symbol, ...): no step


def _symbols_fact(tr: Translated) -> str:
    names = [s.name for s in tr.bridge.access_symbols()]
    by_tensor: dict[str, list[str]] = {}
    for node, sym in tr.bridge.symbol_of.items():
        if hasattr(node, "tensor"):
            by_tensor.setdefault(node.tensor, []).append(sym.name)
    multi = [", ".join(v) for v in by_tensor.values() if len(v) > 1]
    fact = "one symbol per distinct access or loop index: " + ", ".join(names)
    if multi:
        fact += "; accesses of one tensor with different subscripts stay distinct (" + "; ".join(multi) + ")"
    return fact


def _show(tr: Translated, e) -> str:
    try:
        return format_expr(tr.bridge.from_sympy(e))
    except Untranslatable:
        return str(e)


# --- the twelve strategies -------------------------------------------------------------------------

@register
class Factorization(SympyStrategy):
    name = "factorization"
    description = "Factor the expression (sympy.factor): common factors pulled out, polynomials factored."
    saves = True
    why = "Factoring shares the common factors, so fewer multiplications are needed."

    def shows(self, e0, e1):
        """A sum of the original became a product: the answer holds a new product with a sum among
        its factors (or an integer power of a sum) that multiplies out to a sum of the original (or to
        the numerator of one, over a common denominator), or to a constant multiple of a sum or
        product of sums of the original (a constant factor pulled out). A product the original
        already had, respelled (`(C+A)*0.5` as `(A+C)/2`), is not new."""
        targets = set()
        for s in forms.sums(e0):
            targets.add(sympy.expand(s))
            targets.add(sympy.expand(sympy.fraction(sympy.together(s))[0]))
        known = forms.products_of_sums(e0)
        new = [p for p in forms.products_of_sums(e1) if not any(forms.same_value(p, q) for q in known)]
        return any(sympy.expand(p) in targets or any(forms.constant_multiple(p, q) for q in forms.sums(e0) + known)
                   for p in new)

    def transform(self, tr, params):
        out = sympy.factor(tr.expr)
        return out if out != tr.expr else sympy.factor(tr.expr, deep=True)


@register
class ExpandFactorization(SympyStrategy):
    name = "expand_factorization"
    description = ("Multiply out products and integer powers of sums (the inverse of factorization); "
                   "fractions stay whole.")
    why = ("Multiplying out turns a product of sums into independent terms that can be computed, reused "
           "or vectorised separately.")
    enables = ("collect", "cancellation", "factorization")

    def shows(self, e0, e1):
        """Fewer products with a sum among their factors."""
        return len(forms.products_of_sums(e1)) < len(forms.products_of_sums(e0))

    def transform(self, tr, params):
        return _expand_products(tr.expr)


def _expand_products(e: sympy.Expr) -> sympy.Expr:
    if e.is_Atom:
        return e
    if e.is_Mul:
        num, den = [], []
        for f in e.args:
            (den if is_reciprocal(f) else num).append(f)
        n = sympy.expand(sympy.Mul(*[_expand_products(f) for f in num]), deep=False, power_base=False,
                         power_exp=False, log=False, mul=True, multinomial=True)
        d = [sympy.Pow(_expand_products(f.base), f.exp) for f in den]
        return sympy.Mul(n, *d)
    if e.is_Pow and e.exp.is_Integer and e.exp > 1 and e.base.is_Add:
        return sympy.expand_multinomial(sympy.Pow(_expand_products(e.base), e.exp))
    return e.func(*[_expand_products(a) for a in e.args])


@register
class Cancellation(SympyStrategy):
    name = "cancellation"
    description = ("Write the expression as one fraction p/q with the common factors of p and q cancelled "
                   "(sympy.cancel).")
    saves = True
    why = "Cancelling common factors of numerator and denominator removes work and one source of rounding."

    def shows(self, e0, e1):
        """The answer is one fraction in lowest terms, and the original had a common factor (a larger
        degree) or was a sum of fractions (sympy.cancel combines those too). Exponentials, logarithms
        and roots are opaque atoms and must be the same on both sides."""
        before, after = forms.rational_form(e0), forms.rational_form(e1)
        if before is None or after is None or after[2] != before[2] or not after[1] or forms.sums_of_fractions(e1):
            return False
        return after[0] < before[0] or forms.sums_of_fractions(e0) > 0

    def transform(self, tr, params):
        return sympy.cancel(tr.expr)


@register
class ExpandCancellation(SympyStrategy):
    name = "expand_cancellation"
    description = ("Split a fraction whose numerator is a sum into one fraction per term over the same "
                   "denominator (the inverse of cancellation).")
    why = ("Splitting (p1+p2)/q into p1/q+p2/q exposes terms that can be simplified, hoisted or reused "
           "separately.")
    enables = ("cancellation", "collect")

    def shows(self, e0, e1):
        """More terms of a sum over one denominator that the original divides by (at least two: a
        numerator split term by term)."""
        known = {forms.denominator(node) for node in sympy.preorder_traversal(e0) if node.is_Mul or is_reciprocal(node)}
        known.discard(sympy.Integer(1))
        old, new = forms.terms_over(e0), forms.terms_over(e1)
        return any(n >= 2 and n > old[d] and d in known for d, n in new.items())

    def transform(self, tr, params):
        return _split_fractions(tr.expr)


def _split_fractions(e: sympy.Expr) -> sympy.Expr:
    if e.is_Atom:
        return e
    args = [_split_fractions(a) for a in e.args]
    e = e.func(*args)
    if e.is_Mul:
        num = [f for f in e.args if not is_reciprocal(f)]
        den = [f for f in e.args if f not in num]
        if den:
            n = sympy.expand_mul(sympy.Mul(*num), deep=False)
            if n.is_Add:
                d = sympy.Mul(*den)
                return sympy.Add(*[t * d for t in n.args])
    return e


@register
class Apart(SympyStrategy):
    name = "apart"
    description = ("Partial-fraction decomposition in one chosen variable (sympy.apart): polynomial part plus "
                   "proper fractions.")
    why = ("Partial fractions separate the part that does not depend on the chosen variable's "
           "denominator from a proper remainder, so each part can be computed or hoisted on its own.")
    enables = ("additive_split", "collect")
    params_type = SymbolParams

    def shows(self, e0, e1):
        """For some access x in a denominator, the answer is a polynomial part in x plus proper
        fractions in x, each over a power of a single factor in x, and the original was not."""
        candidates = {s for d in denominators(e0) for s in d.free_symbols}
        return any(forms.apart_form(e1, x) and not forms.apart_form(e0, x)
                   for x in sorted(candidates, key=lambda s: s.name))

    def parameters(self, ctx, site):
        tr = translate(ctx.sites[site.stmts[0]].stmt)
        dens = denominators(tr.expr)
        for p in self.symbol_parameters(ctx, site):
            if any(s.name == p["symbol"] for d in dens for s in d.free_symbols):
                yield p

    def transform(self, tr, params):
        sym = _symbol(tr, params.symbol)
        return sympy.apart(tr.expr, sym)

    def extra_facts(self, tr, after, params):
        return (f"the expression is a rational function of {params.symbol}; the new denominators are "
                "factors of the old one",)


@register
class Together(SympyStrategy):
    name = "together"
    description = "Combine a sum of fractions over a common denominator (sympy.together)."
    saves = True
    why = "Over one common denominator, several divisions become a single one."
    enables = ("cancellation",)

    def shows(self, e0, e1):
        """Fewer sums that add fractions, and the answer still divides."""
        return bool(denominators(e1)) and forms.sums_of_fractions(e1) < forms.sums_of_fractions(e0)

    def transform(self, tr, params):
        out = sympy.together(tr.expr)
        return out if out != tr.expr else sympy.together(tr.expr, deep=True)


@register
class Powsimp(SympyStrategy):
    name = "powsimp"
    description = ("Combine powers with a common base or exponent and products of exponentials "
                   "(sympy.powsimp, assumptions respected).")
    saves = True
    why = "Combining powers and exponentials replaces several transcendental calls or multiplications by one."
    rational = False

    def shows(self, e0, e1):
        """Fewer products of several exponentials or of powers with one exponent."""
        return forms.combinable(e1) < forms.combinable(e0)

    def transform(self, tr, params):
        return sympy.powsimp(tr.expr, deep=True, combine="all", force=False)

    def extra_facts(self, tr, after, params):
        return ("powers are combined only where sympy proves the identity for real values "
                "(x**a*x**b = x**(a+b), exp(a)*exp(b) = exp(a+b)); sqrt(x)*sqrt(y) is not merged for "
                "values of unknown sign",)


@register
class ExpandPowsimp(SympyStrategy):
    name = "expand_powsimp"
    description = "Split powers and exponentials of sums into products (the inverse of powsimp)."
    why = ("Splitting exp(a+b) into exp(a)*exp(b) (or x**(a+b) into x**a*x**b) separates factors that "
           "depend on different loops, so one of them can be hoisted.")
    rational = False
    enables = ("multiplicative_split", "exponential_split")

    def shows(self, e0, e1):
        """More products of several exponentials or of powers with one exponent (`x**(a+b)` ->
        `x**a*x**b` is invisible here: sympy combines equal bases itself)."""
        return forms.combinable(e1) > forms.combinable(e0)

    def transform(self, tr, params):
        return sympy.expand_power_base(sympy.expand_power_exp(tr.expr), force=False)

    def expression_problem(self, ctx, tr, new_expr):
        """Splitting exp(x-M) with M a max reduction drops a softmax's overflow guard."""
        for node in walk_expr(new_expr):
            if isinstance(node, Call) and node.fn == "exp":
                arg = node.args[0]
                while isinstance(arg, Neg):
                    arg = arg.operand
                if isinstance(arg, Access):
                    problem = unguarded_exp(ctx, tr.target.expr, arg, tr.target.stmt.lhs.dtype)
                    if problem:
                        return problem
        return None


@register
class ExpandLog(SympyStrategy):
    name = "expand_log"
    description = ("Split log(a*b) into log(a)+log(b) and log(a**n) into n*log(a), only where the factors are "
                   "provably positive.")
    why = "Splitting a logarithm of a product separates factors that can be computed or hoisted on their own."
    rational = False
    enables = ("logsimp", "additive_split")

    def shows(self, e0, e1):
        """More logarithms, or fewer factors inside logarithms and no fewer logarithms."""
        return forms.logs(e1) > forms.logs(e0) or (forms.logs(e1) == forms.logs(e0)
                                                  and forms.log_factors(e1) < forms.log_factors(e0))

    def transform(self, tr, params):
        return sympy.expand_log(tr.expr, deep=True, force=False)

    def extra_facts(self, tr, after, params):
        return ("every factor split out of a logarithm is provably positive (an exponential, a positive "
                "constant, or a sum of squares and positive constants): the sign of a tensor value is "
                "never assumed, so log(A*C) with A, C of unknown sign is left alone",)


@register
class Logsimp(SympyStrategy):
    name = "logsimp"
    description = "Combine sums of logarithms into the logarithm of a product (the inverse of expand_log)."
    saves = True
    why = "One logarithm of a product costs one transcendental call instead of several."
    rational = False

    def shows(self, e0, e1):
        """Fewer logarithms, or more factors inside logarithms and no more logarithms."""
        return 0 < forms.logs(e1) < forms.logs(e0) or (forms.logs(e1) == forms.logs(e0) > 0
                                                       and forms.log_factors(e1) > forms.log_factors(e0))

    def transform(self, tr, params):
        return sympy.logcombine(tr.expr, force=True)

    def extra_facts(self, tr, after, params):
        return ("combining only widens the domain: wherever the original is defined every logarithm's "
                "argument is positive, and there log(a)+log(b) = log(a*b) and n*log(a) = log(a**n)",)


@register
class Collect(SympyStrategy):
    name = "collect"
    description = "Collect the terms of a sum by powers of one chosen access or index (sympy.collect)."
    saves = True
    why = "Collecting a common factor multiplies by it once instead of once per term."
    params_type = SymbolParams

    def shows(self, e0, e1):
        """For some access x and power k, a new product x**k*(sum) and fewer terms of sums that carry
        the factor x**k."""
        g0, t0 = forms.grouping(e0, e0.free_symbols)
        g1, t1 = forms.grouping(e1, e0.free_symbols)
        return any(g1[k] > g0[k] and t1[k] < t0[k] for k in sorted(set(g1) | set(t0), key=str))

    def parameters(self, ctx, site):
        yield from self.symbol_parameters(ctx, site)

    def transform(self, tr, params):
        return sympy.collect(tr.expr, _symbol(tr, params.symbol))


@register
class ExpandCollect(SympyStrategy):
    name = "expand_collect"
    description = "Distribute one chosen access or index over the sum it multiplies (the inverse of collect)."
    why = ("Distributing the factor over the sum separates the terms, so each can be simplified or "
           "reused on its own.")
    enables = ("factorization", "cancellation")
    params_type = SymbolParams

    def shows(self, e0, e1):
        """The reverse of collect: for some access x and power k that multiplied a sum, more terms of
        sums that carry the factor x**k and no more products x**k*(sum) (distributing x over a sum
        that holds a fraction of sums leaves one such product in place)."""
        g0, t0 = forms.grouping(e0, e0.free_symbols)
        g1, t1 = forms.grouping(e1, e0.free_symbols)
        return any(0 < g0[k] and g1[k] <= g0[k] and t1[k] > t0[k] for k in sorted(g0, key=str))

    def parameters(self, ctx, site):
        yield from self.symbol_parameters(ctx, site)

    def transform(self, tr, params):
        sym = _symbol(tr, params.symbol)

        def distributes(n):
            if not n.is_Mul:
                return False
            has_sym = any(f == sym or (f.is_Pow and f.base == sym and f.exp.is_positive) for f in n.args)
            return has_sym and any(f.is_Add for f in n.args)

        return tr.expr.replace(distributes, lambda n: sympy.expand_mul(n, deep=False))


def _symbol(tr: Translated, name: str) -> sympy.Symbol:
    for sym in tr.bridge.access_symbols():
        if sym.name == name:
            return sym
    raise ValueError(f"no symbol {name}")
