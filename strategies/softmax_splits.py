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
"""
from __future__ import annotations

import sympy

from leir.ast import Access, And, BinOp, Call, Compare, Neg, Nest, Num, Or, Select, Stmt, Var, walk_expr
from strategies.algebra_common import algebra_target, executions, finish, text, unguarded_exp
from strategies.base import Illegal, Rewrite, Site, Strategy
from strategies.legality import accumulated_terms
from strategies.numerics import sum_drift_problem
from strategies.registry import register
from strategies.softmax import Reduction, depends_on, fresh_tensors, reductions
from strategies.sympy_bridge import Bridge, Untranslatable
from strategies.tree import replace_item, substitute_vars


def loop_vars(bridge: Bridge, e: sympy.Expr) -> set[str]:
    """Loop variables a sympy term depends on (through subscripts or as values)."""
    out = set()
    for sym in e.free_symbols:
        node = bridge.node_of.get(sym)
        out.update(n.name for n in walk_expr(node) if isinstance(n, Var))
    return out


def nth_exp(expr, k: int):
    exps = [n for n in walk_expr(expr) if isinstance(n, Call) and n.fn == "exp"]
    return exps[k] if k < len(exps) else None


def replace_nth_exp(expr, k: int, new):
    """`expr` with its k-th exp call (pre-order, source order) replaced by `new`."""
    count = [0]

    def visit(n):
        if isinstance(n, Call) and n.fn == "exp":
            if count[0] == k:
                count[0] += 1
                return new
            count[0] += 1
        match n:
            case BinOp(op=op, lhs=a, rhs=b):
                return BinOp(op, visit(a), visit(b))
            case Neg(operand=a):
                return Neg(visit(a))
            case Call(fn=f, args=args):
                return Call(f, tuple(visit(a) for a in args))
            case Select(cond=c, then=t, otherwise=o):
                return Select(visit(c), visit(t), visit(o))
            case Compare(operands=xs, ops=ops):
                return Compare(tuple(visit(x) for x in xs), ops)
            case And(terms=ts):
                return And(tuple(visit(x) for x in ts))
            case Or(terms=ts):
                return Or(tuple(visit(x) for x in ts))
        return n  # accesses: an exp inside a subscript cannot occur in a float statement

    return visit(expr)


@register
class ExponentialSplit(Strategy):
    name = "exponential_split"
    level = "mathematical"
    exactness = "reassociating"
    description = ("Split exp(u+v) into exp(u)*exp(v) where v depends on fewer loops, so exp(v) can be "
                   "hoisted (e.g. exp(x-m) -> exp(x)/exp(m)).")

    def sites(self, ctx):
        for st in ctx.sites:
            target = algebra_target(st.stmt)
            if target is not None and any(self._splits(target.expr, k)
                                          for k in range(_count_exps(target.expr))):
                yield Site(st.nest_index, st.path, stmts=(st.order,), tensors=(st.stmt.lhs.tensor,))

    def parameters(self, ctx, site):
        target = algebra_target(ctx.sites[site.stmts[0]].stmt)
        for k in range(_count_exps(target.expr)):
            for _, term, _ in self._splits(target.expr, k):
                yield {"exp": k, "term": term}

    def _splits(self, expr, k):
        """(bridge, LEIR text of the term, term) for each term of the k-th exp's argument that
        depends on strictly fewer loops than the whole argument."""
        call = nth_exp(expr, k)
        bridge = Bridge()
        try:
            arg = bridge.to_sympy(call.args[0])
        except Untranslatable:
            return []
        if not arg.is_Add:
            return []
        whole = loop_vars(bridge, arg)
        out = []
        for t in arg.as_ordered_terms():
            if loop_vars(bridge, t) < whole:
                try:
                    out.append((bridge, text(bridge.from_sympy(t)), t))
                except Untranslatable:
                    continue
        return out

    def rewrite(self, ctx, site, params):
        st = ctx.sites[site.stmts[0]]
        target = algebra_target(st.stmt)
        k = params["exp"]
        found = [s for s in self._splits(target.expr, k) if s[1] == params["term"]]
        if not found:
            raise Illegal("no such term")
        bridge, _, t = found[0]
        arg = bridge.to_sympy(nth_exp(target.expr, k).args[0])
        rest = Call("exp", (bridge.from_sympy(arg - t),))
        if t.could_extract_minus_sign():
            new = BinOp("/", rest, Call("exp", (bridge.from_sympy(-t),)))
        else:
            new = BinOp("*", rest, Call("exp", (bridge.from_sympy(t),)))
        reason = unguarded_exp(ctx, bridge.from_sympy(arg - t), bridge.from_sympy(t))
        if not reason and target.op is not None:
            reason = sum_drift_problem(accumulated_terms(st.stmt, st.loops), st.stmt.lhs.dtype, st.stmt.lhs.tensor)
        if reason:
            raise Illegal(reason)
        stmt = target.rebuild(replace_nth_exp(target.expr, k, new))
        program = finish(ctx, replace_item(ctx.program, site.nest, site.path, (stmt,)))
        inner = sorted(loop_vars(bridge, arg) - loop_vars(bridge, t))
        facts = (f"exp(u+v) = exp(u)*exp(v) for real u, v; the split-off term {params['term']} does not "
                 f"depend on loop{'s' if len(inner) > 1 else ''} {', '.join(inner)}",
                 "one symbol per distinct access, so terms of different elements are never merged",
                 "the inputs of the verifier stay far from exp overflow; very wide ranges may overflow exp(u)")
        effect = (f"The factor exp({params['term']}) no longer depends on {', '.join(inner)}, so a later "
                  f"step can hoist it out of that loop (it is evaluated {executions(st)} times now).")
        return Rewrite(program, facts, effect)


def _count_exps(expr) -> int:
    return sum(1 for n in walk_expr(expr) if isinstance(n, Call) and n.fn == "exp")


class _ReductionSplit(Strategy):
    level = "mathematical"
    exactness = "reassociating"

    def sites(self, ctx):
        for r in reductions(ctx):
            if r.op == "+" and r.spatial and any(True for _ in self.parameters_of(r)):
                yield r.site()

    def parameters(self, ctx, site):
        r = _reduction(ctx, site, rewriting=False)
        yield from (p for p, _ in self.parameters_of(r))

    def parameters_of(self, r: Reduction):
        raise NotImplementedError


def _reduction(ctx, site: Site, rewriting: bool = True) -> Reduction:
    """The site's sum reduction; when rewriting, refused where splitting it moves the result beyond its
    dtype's precision."""
    r = next((r for r in reductions(ctx) if r.order == site.stmts[0]), None)
    if r is None:
        raise Illegal("the nest is no longer a sum reduction with implicit initialisation")
    drift = sum_drift_problem(r.red_loop.extent, r.acc.dtype, r.acc.tensor) if rewriting else None
    if drift:
        raise Illegal(drift)
    return r


def _translate(r: Reduction) -> tuple[Bridge, sympy.Expr] | None:
    bridge = Bridge()
    try:
        return bridge, bridge.to_sympy(r.elem)
    except Untranslatable:
        return None


@register
class MultiplicativeSplit(_ReductionSplit):
    name = "multiplicative_split"
    description = ("Split a sum of products S=S+f*g with f invariant in the reduction loop into T=T+g and "
                   "then S=f*T.")

    def parameters_of(self, r):
        tr = _translate(r)
        if tr is None:
            return
        bridge, e = tr
        inv = [f for f in sympy.Mul.make_args(e) if r.var not in loop_vars(bridge, f)]
        var = [f for f in sympy.Mul.make_args(e) if r.var in loop_vars(bridge, f)]
        if inv and var:
            yield {}, (bridge, sympy.Mul(*inv), sympy.Mul(*var))

    def rewrite(self, ctx, site, params):
        r = _reduction(ctx, site)
        found = list(self.parameters_of(r))
        if not found:
            raise Illegal("no factor is invariant in the reduction loop")
        bridge, f, g = found[0][1]
        name = fresh_tensors(ctx).fresh()
        t = Access(name, r.acc.dtype, r.acc.scope, r.acc.indices)
        try:
            g_leir = bridge.from_sympy(g)
            final = bridge.from_sympy(f * bridge.to_sympy(t))
        except Untranslatable as e:
            raise Illegal(str(e)) from e
        first = Nest(r.nest.loops, (Stmt(t, BinOp("+", t, g_leir)),))
        second = Nest(r.spatial, (Stmt(r.acc, final),))
        program = finish(ctx, replace_item(ctx.program, r.index, (), (first, second)), same_inits=False)
        n = r.red_loop.extent
        facts = (f"the factor {text(bridge.from_sympy(f))} does not depend on the reduction loop {r.var}, "
                 f"so sum over {r.var} of f*g = f * (sum over {r.var} of g)",
                 f"{name} is a fresh sum with implicit initialisation 0; {r.acc.tensor} is written once "
                 "afterwards, so its readers see the same value")
        effect = (f"The invariant factor is applied once per result instead of {n} times: "
                  f"{(n - 1) * executions_of(r.spatial)} fewer multiplications in all.")
        return Rewrite(program, facts, effect)


def executions_of(loops) -> int:
    n = 1
    for lp in loops:
        n *= lp.extent
    return n


@register
class AdditiveSplit(_ReductionSplit):
    name = "additive_split"
    description = ("Split a sum reduction of a sum S=S+(g+t) into S=S+g and S=S+t; a term t invariant "
                   "in the reduction loop is added once as n*t.")

    def parameters_of(self, r):
        tr = _translate(r)
        if tr is None:
            return
        bridge, e = tr
        if not e.is_Add:
            return
        for t in e.as_ordered_terms():
            try:
                yield {"term": text(bridge.from_sympy(t))}, (bridge, e, t)
            except Untranslatable:
                continue

    def rewrite(self, ctx, site, params):
        r = _reduction(ctx, site)
        found = [x for p, x in self.parameters_of(r) if p == params]
        if not found:
            raise Illegal("no such term")
        bridge, e, t = found[0]
        n = r.red_loop.extent
        invariant = r.var not in loop_vars(bridge, t)
        part = t * n if invariant else t
        neg = part.could_extract_minus_sign()
        try:
            g = bridge.from_sympy(e - t)
            tail = bridge.from_sympy(-part if neg else part)
        except Untranslatable as err:
            raise Illegal(str(err)) from err
        first = Nest(r.nest.loops, (Stmt(r.acc, BinOp("+", r.acc, g)),))
        second = Nest(r.spatial if invariant else r.nest.loops,
                      (Stmt(r.acc, BinOp("-" if neg else "+", r.acc, tail)),))
        program = finish(ctx, replace_item(ctx.program, r.index, (), (first, second)), same_inits=False)
        facts = [f"sum over {r.var} of (g+t) = sum of g + sum of t, t = {params['term']}",
                 f"the second nest accumulates onto {r.acc.tensor} after the first wrote it (LEIR.md §4.4), "
                 "so it gets no second initialisation"]
        if invariant:
            facts.append(f"t does not depend on {r.var}: its {n} equal terms are added once as {n}*t")
            effect = (f"The invariant term is added once per result instead of {n} times: "
                      f"{(n - 1) * executions_of(r.spatial)} fewer additions in all.")
        else:
            effect = "The two parts become separate reductions that later steps can schedule, fuse or hoist apart."
        return Rewrite(program, tuple(facts), effect)


@register
class PartiallyEquivalentThenCorrect(_ReductionSplit):
    name = "partially_equivalent_then_correct"
    description = ("Replace the offset R of S=S+exp(y-R) (computed by an earlier pass) by the first "
                   "element y0, then correct with S=S*exp(y0-R).")

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
                if r.var in loop_vars(bridge, y):
                    yield {"offset": text(node)}, (bridge, node, y)

    def rewrite(self, ctx, site, params):
        r = _reduction(ctx, site)
        found = [x for p, x in self.parameters_of(r) if p == params]
        if not found:
            raise Illegal("no offset to replace")
        bridge, offset, y = found[0]
        y_leir = bridge.from_sympy(y)
        reason = unguarded_exp(ctx, y_leir, offset)
        if reason:
            raise Illegal(reason)
        y0 = substitute_vars(y_leir, {r.var: Num(0)})
        first = Nest(r.nest.loops, (Stmt(r.acc, BinOp("+", r.acc, Call("exp", (BinOp("-", y_leir, y0),)))),))
        fix = Nest(r.spatial, (Stmt(r.acc, BinOp("*", r.acc, Call("exp", (BinOp("-", y0, offset),)))),))
        program = finish(ctx, replace_item(ctx.program, r.index, (), (first, fix)), same_inits=False)
        n = r.red_loop.extent
        facts = (f"exp(y-{text(offset)}) = exp(y-y0)*exp(y0-{text(offset)}) with y0 = {text(y0)} (the element "
                 f"at {r.var}=0), so the partial sum with offset y0 times exp(y0-{text(offset)}) is the "
                 "original sum",
                 f"{text(offset)} does not depend on {r.var}; the correction multiplies {r.acc.tensor} after "
                 "the sum is complete (an update of a written tensor, no new initialisation)",
                 "exp(y-y0) stays finite as long as the values of one row span less than ~700 "
                 "(float64) or ~88 (float32)")
        effect = (f"The {n}-term sum no longer reads {offset.tensor}, so it need not wait for the pass that "
                  f"computes it (the two can be fused); the correction costs one exp and one multiply per "
                  f"result ({executions_of(r.spatial)} in all).")
        return Rewrite(program, facts, effect)
