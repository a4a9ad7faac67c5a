"""The splits that derive online softmax, and partially_equivalent_then_correct.

- exponential_split: `exp(u+v)` -> `exp(u)*exp(v)` where `v` depends on fewer loops than `u+v`, so
  the factor `exp(v)` can be hoisted out of the inner loop (on one chosen exp and term);
- multiplicative_split: a sum reduction `S=S+f*g` with `f` invariant in the reduction loop becomes
  `T=T+g` then `S=f*T` (distributivity: f applied once per result instead of once per term);
- additive_split: `S=S+(g+t)` becomes `S=S+g` then `S=S+t`, with `t` summed in closed form (`n*t`)
  when it does not depend on the reduction loop;
- partially_equivalent_then_correct: `S=S+exp(y-R)` with an offset `R` computed by an earlier pass
  (the max) becomes the partially equivalent `S=S+exp(y-y0)` with the first element `y0` as offset,
  then the correction `S=S*exp(y0-R)`: the sum no longer waits for the pass that computes `R`.

The last three share a shape (`ReductionSplit`): a sum reduction nest becomes two nests.
"""
from __future__ import annotations

import sympy

from leir.analysis import reduction_op
from leir.ast import Access, BinOp, Call, Nest, Num, Stmt, Var, accesses, replace_expr, walk_expr
from leir.printer import format_expr
from strategies.analysis import expression_forms as forms
from strategies.analysis import recognition as rec
from strategies.analysis.algebra import algebra_target, unguarded_exp
from strategies.analysis.gates import finish_problem
from strategies.analysis.legality import accumulated_terms, iterations
from strategies.analysis.numerics import sum_drift_problem
from strategies.analysis.reductions import Reduction, depends_on, reductions
from strategies.analysis.sympy_bridge import Bridge, Untranslatable
from strategies.analysis.tree import fresh_tensors, replace_item, substitute_vars
from strategies.base import Context, Params, Rewrite, Site, Strategy, params_dataclass
from strategies.registry import register


def loops_of(bridge: Bridge, e: sympy.Expr) -> set[str]:
    """Loop variables a sympy term depends on (through subscripts or as values)."""
    out = set()
    for sym in e.free_symbols:
        node = bridge.node_of.get(sym)
        out.update(n.name for n in walk_expr(node) if isinstance(n, Var))
    return out


def exps(expr) -> list[Call]:
    """The exp calls of an expression, pre-order (source order)."""
    return [n for n in walk_expr(expr) if isinstance(n, Call) and n.fn == "exp"]


def replace_nth_exp(expr, k: int, new):
    """`expr` with its k-th exp call (pre-order, source order) replaced by `new` (an exp inside a
    subscript cannot occur in a float statement, so subscripts are not visited)."""
    seen = [0]

    def nth(n):
        if isinstance(n, Call) and n.fn == "exp":
            seen[0] += 1
            if seen[0] == k + 1:
                return new
        return None
    return replace_expr(expr, nth, subscripts=False)


# --- exponential_split ----------------------------------------------------------------------------------

@params_dataclass
class ExpSplitParams(Params):
    exp: int    # which exp of the statement (source order, from 0)
    term: str   # the term of its argument split off, as LEIR


@register
class ExponentialSplit(Strategy):
    name = "exponential_split"
    level = "mathematical"
    exactness = "reassociating"
    description = ("Split exp(u+v) into exp(u)*exp(v) where v depends on fewer loops, so exp(v) can be "
                   "hoisted (e.g. exp(x-m) -> exp(x)/exp(m)).")
    enables = ("multiplicative_split", "powsimp")
    params_type = ExpSplitParams

    def recognizes(self, before, after, signature):
        """More exponentials."""
        return rec.calls(after, "exp") > rec.calls(before, "exp")

    def sites(self, ctx):
        for st in ctx.sites:
            target = algebra_target(st.stmt)
            if target is not None and any(self._splits(target.expr, k) for k in range(len(exps(target.expr)))):
                yield Site(st.nest_index, st.path, stmts=(st.order,), tensors=(st.stmt.lhs.tensor,))

    def parameters(self, ctx, site):
        target = algebra_target(ctx.sites[site.stmts[0]].stmt)
        for k in range(len(exps(target.expr))):
            for _, term, _ in self._splits(target.expr, k):
                yield {"exp": k, "term": term}

    def _splits(self, expr, k):
        """(bridge, LEIR text of the term, term) for each term of the k-th exp's argument that
        depends on strictly fewer loops than the whole argument."""
        bridge = Bridge()
        try:
            arg = bridge.to_sympy(exps(expr)[k].args[0])
        except Untranslatable:
            return []
        if not arg.is_Add:
            return []
        whole = loops_of(bridge, arg)
        out = []
        for t in arg.as_ordered_terms():
            if loops_of(bridge, t) < whole:
                try:
                    out.append((bridge, format_expr(bridge.from_sympy(t)), t))
                except Untranslatable:
                    continue
        return out

    def _split(self, target, params):
        """(bridge, the k-th exp's argument, the term split off), or None when there is no such term."""
        if not 0 <= params.exp < len(exps(target.expr)):
            return None
        found = [s for s in self._splits(target.expr, params.exp) if s[1] == params.term]
        if not found:
            return None
        bridge, _, t = found[0]
        return bridge, bridge.to_sympy(exps(target.expr)[params.exp].args[0]), t

    def check(self, ctx, site, params):
        st = ctx.sites[site.stmts[0]]
        target = algebra_target(st.stmt)
        split = None if target is None else self._split(target, params)
        if split is None:
            return "no such term"
        bridge, arg, t = split
        return (unguarded_exp(ctx, bridge.from_sympy(arg - t), bridge.from_sympy(t), st.stmt.lhs.dtype)
                or (sum_drift_problem(accumulated_terms(st.stmt, st.loops), st.stmt.lhs.dtype, st.stmt.lhs.tensor,
                                      ctx.result_code) if target.op is not None else None))

    def build(self, ctx, site, params):
        st = ctx.sites[site.stmts[0]]
        target = algebra_target(st.stmt)
        bridge, arg, t = self._split(target, params)
        rest = Call("exp", (bridge.from_sympy(arg - t),))
        if t.could_extract_minus_sign():
            new = BinOp("/", rest, Call("exp", (bridge.from_sympy(-t),)))
        else:
            new = BinOp("*", rest, Call("exp", (bridge.from_sympy(t),)))
        stmt = target.rebuild(replace_nth_exp(target.expr, params.exp, new))
        program = replace_item(ctx.program, site.nest, site.path, (stmt,))
        inner = sorted(loops_of(bridge, arg) - loops_of(bridge, t))
        return Rewrite(program, self._facts(params.term, inner), self._summary(params.term, inner, st))

    def gate(self, ctx, site, params, rewrite):
        return finish_problem(ctx, rewrite.program)

    def _facts(self, term: str, inner: list[str]) -> tuple[str, ...]:
        return (f"exp(u+v) = exp(u)*exp(v) for real u, v; the split-off term {term} does not "
                f"depend on loop{'s' if len(inner) > 1 else ''} {', '.join(inner)}",
                "one symbol per distinct access, so terms of different elements are never merged",
                "the inputs of the verifier stay far from exp overflow; very wide ranges may overflow exp(u)")

    def _summary(self, term: str, inner: list[str], st) -> str:
        return (f"The factor exp({term}) no longer depends on {', '.join(inner)}, so a later "
                f"step can hoist it out of that loop (it is evaluated {iterations(st.loops)} times now).")


# --- splits of a sum reduction ---------------------------------------------------------------------------

class ReductionSplit(Strategy):
    """A sum reduction (with implicit initialisation) split into two nests. Subclasses give
    `parameters_of(r)`: (params, what the split needs) per variant, `missing` (the reason when a
    variant is not there), `split_problem(ctx, r, params, found)` (why the split would change a
    result, or None) and `split(ctx, r, params, found)`, which builds the two nests and hands them to
    `two_nests`."""

    level = "mathematical"
    exactness = "reassociating"
    missing: str

    def sites(self, ctx):
        for r in reductions(ctx):
            if r.op == "+" and r.spatial and any(True for _ in self.parameters_of(r)):
                yield r.site()

    def parameters(self, ctx, site):
        yield from (p for p, _ in self.parameters_of(site.match))

    def parameters_of(self, r: Reduction):
        raise NotImplementedError

    def _found(self, r: Reduction, params: Params):
        """What the split of the variant `params` needs, or None when the reduction has no such variant."""
        return next((x for p, x in self.parameters_of(r) if p == params.to_json()), None)

    def check(self, ctx, site, params):
        r = site.match
        # splitting reassociates the sum: refused where that moves it beyond its dtype's precision
        drift = sum_drift_problem(r.red_loop.extent, r.acc.dtype, r.acc.tensor, ctx.result_code)
        if drift:
            return drift
        found = self._found(r, params)
        return self.missing if found is None else self.split_problem(ctx, r, params, found)

    def build(self, ctx, site, params):
        return self.split(ctx, site.match, params, self._found(site.match, params))

    def gate(self, ctx, site, params, rewrite):
        return finish_problem(ctx, rewrite.program, same_inits=False)

    def split_problem(self, ctx: Context, r: Reduction, params: Params, found) -> str | None:
        return None

    def split(self, ctx: Context, r: Reduction, params: Params, found) -> Rewrite:
        raise NotImplementedError

    @staticmethod
    def two_nests(ctx: Context, r: Reduction, first: Nest, second: Nest):
        """The program with the reduction's nest replaced by `first` and `second`."""
        return replace_item(ctx.program, r.index, (), (first, second))


def _translate(r: Reduction) -> tuple[Bridge, sympy.Expr] | None:
    bridge = Bridge()
    try:
        return bridge, bridge.to_sympy(r.elem)
    except Untranslatable:
        return None


@register
class MultiplicativeSplit(ReductionSplit):
    name = "multiplicative_split"
    description = ("Split a sum of products S=S+f*g with f invariant in the reduction loop into T=T+g and "
                   "then S=f*T.")
    missing = "no factor is invariant in the reduction loop"

    def recognizes(self, before, after, signature):
        """A sum accumulation of a product `S=S+f*g` became a new sum `T=T+...` and a store of `S`
        from `T` in fewer loops."""
        old, new = rec.writers(before), rec.writers(after)
        for name, sites in old.items():
            if len(sites) != 1 or not rec.sum_accumulation(sites[0].stmt):
                continue
            whole = forms.accumulated_element(sites[0].stmt)
            if whole is None or len([f for f in sympy.Mul.make_args(whole) if not f.is_Number]) < 2:
                continue
            for site in new.get(name, []):
                if reduction_op(site.stmt) is not None or len(site.loops) >= len(sites[0].loops):
                    continue
                added = {acc.tensor for acc in accesses(site.stmt.rhs)} - set(old)
                if any(rec.sum_accumulation(w.stmt) for t in sorted(added) for w in new.get(t, [])):
                    return True
        return False

    def parameters_of(self, r):
        tr = _translate(r)
        if tr is None:
            return
        bridge, e = tr
        inv = [f for f in sympy.Mul.make_args(e) if r.var not in loops_of(bridge, f)]
        var = [f for f in sympy.Mul.make_args(e) if r.var in loops_of(bridge, f)]
        if inv and var:
            yield {}, (bridge, sympy.Mul(*inv), sympy.Mul(*var))

    def _parts(self, ctx, r, found):
        """(the fresh partial sum, g as LEIR, f times the partial sum as LEIR)."""
        bridge, f, g = found
        name = fresh_tensors(ctx.program, ctx.signature).fresh()
        t = Access(name, r.acc.dtype, r.acc.scope, r.acc.indices)
        return t, bridge.from_sympy(g), bridge.from_sympy(f * bridge.to_sympy(t))

    def split_problem(self, ctx, r, params, found):
        try:
            self._parts(ctx, r, found)
        except Untranslatable as e:
            return str(e)
        return None

    def split(self, ctx, r, params, found):
        bridge, f, g = found
        t, g_leir, final = self._parts(ctx, r, found)
        name = t.tensor
        program = self.two_nests(ctx, r, Nest(r.nest.loops, (Stmt(t, BinOp("+", t, g_leir)),)),
                                 Nest(r.spatial, (Stmt(r.acc, final),)))
        n = r.red_loop.extent
        facts = (f"the factor {format_expr(bridge.from_sympy(f))} does not depend on the reduction loop {r.var}, "
                 f"so sum over {r.var} of f*g = f * (sum over {r.var} of g)",
                 f"{name} is a fresh sum with implicit initialisation 0; {r.acc.tensor} is written once "
                 "afterwards, so its readers see the same value")
        summary = (f"The invariant factor is applied once per result instead of {n} times: "
                   f"{(n - 1) * iterations(r.spatial)} fewer multiplications in all.")
        return Rewrite(program, facts, summary)


@params_dataclass
class TermParams(Params):
    term: str   # the term of the summed element split off, as LEIR


@register
class AdditiveSplit(ReductionSplit):
    name = "additive_split"
    description = ("Split a sum reduction of a sum S=S+(g+t) into S=S+g and S=S+t; a term t invariant "
                   "in the reduction loop is added once as n*t.")
    missing = "no such term"
    params_type = TermParams

    def recognizes(self, before, after, signature):
        """A tensor written by one sum accumulation `S=S+(g+t)` is written by two or more sum
        accumulations, each of fewer terms."""
        found = rec.writers(after)
        for name, sites in rec.writers(before).items():
            parts = found.get(name, [])
            if len(sites) != 1 or len(parts) < 2 or not rec.sum_accumulation(sites[0].stmt):
                continue
            whole = forms.accumulated_element(sites[0].stmt)
            if whole is None or len(sympy.Add.make_args(whole)) < 2 \
                    or not all(rec.sum_accumulation(p.stmt) for p in parts):
                continue
            sizes = [forms.accumulated_element(p.stmt) for p in parts]
            if all(e is not None and len(sympy.Add.make_args(e)) < len(sympy.Add.make_args(whole)) for e in sizes):
                return True
        return False

    def parameters_of(self, r):
        tr = _translate(r)
        if tr is None:
            return
        bridge, e = tr
        if not e.is_Add:
            return
        for t in e.as_ordered_terms():
            try:
                yield {"term": format_expr(bridge.from_sympy(t))}, (bridge, e, t)
            except Untranslatable:
                continue

    def _parts(self, r, found):
        """(the term is invariant in the reduction loop, what remains as LEIR, the part added in the
        second nest as LEIR, that part is subtracted)."""
        bridge, e, t = found
        invariant = r.var not in loops_of(bridge, t)
        part = t * r.red_loop.extent if invariant else t
        neg = part.could_extract_minus_sign()
        return invariant, bridge.from_sympy(e - t), bridge.from_sympy(-part if neg else part), neg

    def split_problem(self, ctx, r, params, found):
        bridge, e, t = found
        n = r.red_loop.extent
        try:
            invariant, g, _, _ = self._parts(r, found)
        except Untranslatable as err:
            return str(err)
        if not invariant and r.var not in loops_of(bridge, e - t):
            # log_cosh_loss's split with term=G left -ln2 summed 1024 times (the running sum
            # fell to -710, then climbed to +300 with G): 2.6e-5 off in float32, a mismatch
            return (f"what remains, {format_expr(g)}, does not depend on {r.var}: it would be added {n} times "
                    f"and rounded {n} times, where the split of that term adds it once as {n}*({format_expr(g)})")
        return None

    def split(self, ctx, r, params, found):
        invariant, g, tail, neg = self._parts(r, found)
        program = self.two_nests(ctx, r, Nest(r.nest.loops, (Stmt(r.acc, BinOp("+", r.acc, g)),)),
                                 Nest(r.spatial if invariant else r.nest.loops,
                                      (Stmt(r.acc, BinOp("-" if neg else "+", r.acc, tail)),)))
        return Rewrite(program, self._facts(r, params.term, invariant), self._summary(r, invariant))

    def _facts(self, r: Reduction, term: str, invariant: bool) -> tuple[str, ...]:
        facts = (f"sum over {r.var} of (g+t) = sum of g + sum of t, t = {term}",
                 f"the second nest accumulates onto {r.acc.tensor} after the first wrote it, "
                 "so it gets no second initialisation")
        if invariant:
            n = r.red_loop.extent
            facts += (f"t does not depend on {r.var}: its {n} equal terms are added once as {n}*t",)
        return facts

    def _summary(self, r: Reduction, invariant: bool) -> str:
        n = r.red_loop.extent
        if invariant:
            return (f"The invariant term is added once per result instead of {n} times: "
                    f"{(n - 1) * iterations(r.spatial)} fewer additions in all.")
        return "The two parts become separate reductions that later steps can schedule, fuse or hoist apart."


@params_dataclass
class OffsetParams(Params):
    offset: str   # the offset replaced, as LEIR


@register
class PartiallyEquivalentThenCorrect(ReductionSplit):
    name = "partially_equivalent_then_correct"
    description = ("Replace the offset R of S=S+exp(y-R) (computed by an earlier pass) by the first "
                   "element y0, then correct with S=S*exp(y0-R).")
    missing = "no offset to replace"
    enables = ("loop_fusion", "operator_fusion")
    params_type = OffsetParams

    def recognizes(self, before, after, signature):
        """The sum `S=S+exp(y-R)` no longer reads R, and a later statement multiplies S by an
        exponential that reads R (the correction)."""
        old, new = rec.writers(before), rec.writers(after)
        for name, sites in old.items():
            if len(sites) != 1 or not rec.sum_accumulation(sites[0].stmt):
                continue
            offsets = _exp_reads(sites[0].stmt.rhs) - {name}
            parts = new.get(name, [])
            sums = [p for p in parts if rec.sum_accumulation(p.stmt) and _exp_reads(p.stmt.rhs)]
            for r in sorted(offsets & set(old)):
                partial = [p for p in sums if r not in _exp_reads(p.stmt.rhs)]
                if partial and any(p.order > partial[0].order and r in _exp_reads(p.stmt.rhs)
                                   and name in {acc.tensor for acc in accesses(p.stmt.rhs)}
                                   and not rec.sum_accumulation(p.stmt) for p in parts):
                    return True
        return False

    def parameters_of(self, r):
        if not isinstance(r.elem, Call) or r.elem.fn != "exp":
            return
        bridge = Bridge()
        try:
            arg = bridge.to_sympy(r.elem.args[0])
        except Untranslatable:
            return
        for t in sympy.Add.make_args(arg):
            node = bridge.node_of.get(-t)
            if isinstance(node, Access) and not depends_on(node, r.var):
                y = arg - t
                if r.var in loops_of(bridge, y):
                    yield {"offset": format_expr(node)}, (bridge, node, y)

    def split_problem(self, ctx, r, params, found):
        bridge, offset, y = found
        return unguarded_exp(ctx, bridge.from_sympy(y), offset, r.acc.dtype)

    def split(self, ctx, r, params, found):
        bridge, offset, y = found
        y_leir = bridge.from_sympy(y)
        y0 = substitute_vars(y_leir, {r.var: Num(0)})
        first = Nest(r.nest.loops, (Stmt(r.acc, BinOp("+", r.acc, Call("exp", (BinOp("-", y_leir, y0),)))),))
        fix = Nest(r.spatial, (Stmt(r.acc, BinOp("*", r.acc, Call("exp", (BinOp("-", y0, offset),)))),))
        program = self.two_nests(ctx, r, first, fix)
        return Rewrite(program, self._facts(r, offset, y0), self._summary(r, offset))

    def _facts(self, r: Reduction, offset, y0) -> tuple[str, ...]:
        o = format_expr(offset)
        return (f"exp(y-{o}) = exp(y-y0)*exp(y0-{o}) with y0 = {format_expr(y0)} (the element "
                f"at {r.var}=0), so the partial sum with offset y0 times exp(y0-{o}) is the "
                "original sum",
                f"{o} does not depend on {r.var}; the correction multiplies {r.acc.tensor} after "
                "the sum is complete (an update of a written tensor, no new initialisation)",
                "exp(y-y0) stays finite as long as the values of one row span less than ~700 "
                "(float64) or ~88 (float32)")

    def _summary(self, r: Reduction, offset) -> str:
        return (f"The {r.red_loop.extent}-term sum no longer reads {offset.tensor}, so it need not wait for the pass "
                f"that computes it (the two can be fused); the correction costs one exp and one multiply per "
                f"result ({iterations(r.spatial)} in all).")


def _exp_reads(expr) -> set[str]:
    """Tensors read inside the arguments of the exponentials of `expr`."""
    return {acc.tensor for n in walk_expr(expr) if isinstance(n, Call) and n.fn == "exp" for acc in accesses(n)}
