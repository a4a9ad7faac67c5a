"""reduction_factorization (rfactor): a reduction axis split into independent partial reductions and a
short combining reduction (the transformation and its legality:
`strategies.analysis.loops.factor_reduction`, `factor_reduction_problem`)."""
from __future__ import annotations

from leir.analysis import lhs_vars, reduction_op
from leir.ast import Stmt
from strategies.analysis import recognition as rec
from strategies.analysis.loops import (
    MAX_FACTORS,
    by_preference,
    divisors,
    factor_reduction,
    factor_reduction_problem,
    factored_facts,
    factored_summary,
    serial_partials_problem,
    vector_friendly,
)
from strategies.base import LoopAt, Params, Rewrite, Site, Strategy, params_dataclass, unhelpful
from strategies.registry import register


@params_dataclass
class FactorParams(Params):
    factor: int   # partial results per element


@register
class ReductionFactorization(Strategy):
    name = "reduction_factorization"
    level = "operator"
    exactness = "reassociating"
    description = ("Factor a reduction axis (rfactor): partial results per inner index into a new tensor, "
                   "then a second, short reduction over them.")
    enables = ("loop_parallelization", "loop_vectorization", "loop_binding", "loop_reorder")
    search_prior = 5.0
    params_type = FactorParams

    def promise(self, t):
        """Partial results a vector loop can compute (8, 16 or 32 of them) promise more."""
        factor = t.params.get("factor", 1)
        return self.search_prior + vector_friendly(t.params) + (1.5 if factor in (8, 16, 32) else 0.0)

    def recognizes(self, before, after, signature):
        """A new intermediate (the partial results) and one more nest (the one that combines them)."""
        return len(after.nests) == len(before.nests) + 1 and bool(rec.new_intermediates(before, after, signature))

    def sites(self, ctx):
        for top, nest in enumerate(ctx.program.nests):
            if len(nest.body) != 1 or not isinstance(nest.body[0], Stmt):
                continue
            stmt = nest.body[0]
            if reduction_op(stmt) is None:
                continue
            spatial = set(lhs_vars(stmt))
            for k, lp in enumerate(nest.loops):
                if lp.var not in spatial and lp.kind == "L" and divisors(lp.extent):
                    order = next(s.order for s in ctx.sites if s.nest_index == top)
                    yield Site(top, loops=(lp.var,), stmts=(order,), tensors=(stmt.lhs.tensor,), match=LoopAt(k))

    def parameters(self, ctx, site):
        lp = ctx.program.nests[site.nest].loops[site.match.loop_index]
        for f in by_preference(divisors(lp.extent))[:MAX_FACTORS]:   # vector-width partials first
            yield {"factor": f}

    def check(self, ctx, site, params):
        return (unhelpful(ctx, serial_partials_problem(ctx, site.nest, params.factor))
                or factor_reduction_problem(ctx, site.nest, site.match.loop_index, params.factor))

    def build(self, ctx, site, params):
        factored = factor_reduction(ctx, site.nest, site.match.loop_index, params.factor)
        return Rewrite(factored.program, factored_facts(factored), factored_summary(factored))
