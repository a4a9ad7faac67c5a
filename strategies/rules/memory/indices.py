"""precompute_indices: a compound subscript computed once into an index array (i64) that the statement
reads instead."""
from __future__ import annotations

from dataclasses import dataclass

from leir.analysis import affine_form
from leir.ast import Access, Loop, Nest, Stmt, Var, accesses, map_expr
from leir.printer import format_expr
from strategies.analysis import recognition as rec
from strategies.analysis.legality import iterations, stmt_reads
from strategies.analysis.tree import fresh_indices, fresh_tensors, replace_nests, replace_stmt, vars_in
from strategies.base import Match, Rewrite, Site, Strategy
from strategies.registry import register

MAX_INDEX_SITES = 12


@dataclass(frozen=True)
class Subscript(Match):
    """The compound subscript (an index expression) of the site's statement to precompute."""

    index: object

    def to_json(self) -> dict:
        return {"subscript": format_expr(self.index)}


def compound_subscripts(stmt: Stmt) -> list[object]:
    """Affine subscripts that are more than a loop index or a constant, in the reads of a statement."""
    out: dict[object, None] = {}
    for a in stmt_reads(stmt):
        for ix in a.indices:
            form = affine_form(ix)
            if form is not None and form[0] and not isinstance(ix, Var) and not any(True for _ in accesses(ix)):
                out.setdefault(ix, None)
    return list(out)


@register
class PrecomputeIndices(Strategy):
    name = "precompute_indices"
    level = "memory"
    exactness = "exact"
    description = "Precompute a compound subscript into an index array (i64) read by the statement."
    enables = ("loop_vectorization",)
    search_prior = 3.0

    def recognizes(self, before, after, signature):
        """A new integer tensor read inside a subscript."""
        table = rec.intermediates(after, signature)
        in_subscripts = {acc.tensor for stmt in rec.statements(after) for top in accesses(stmt.rhs)
                         for ix in top.indices for acc in accesses(ix)}
        return any(table[name].dtype.startswith(("i", "u")) and name in in_subscripts
                   for name in rec.new_intermediates(before, after, signature))

    def sites(self, ctx):
        count = 0
        for s in ctx.sites:
            for ix in compound_subscripts(s.stmt):
                if count >= MAX_INDEX_SITES:
                    return
                count += 1
                yield Site(s.nest_index, s.path, stmts=(s.order,), match=Subscript(ix))

    def check(self, ctx, site, params):
        """Always legal where the site is: the table holds the subscript's values, computed before."""
        return None

    def build(self, ctx, site, params):
        s, ix = ctx.sites[site.stmts[0]], site.match.index
        loops = [lp for lp in s.loops if lp.var in vars_in(ix)]
        fresh = fresh_indices(ctx.program)
        names = {lp.var: fresh.fresh() for lp in loops}
        q = fresh_tensors(ctx.program, ctx.signature).fresh()
        q_def = Access(q, "i64", "g", tuple(Var(names[lp.var]) for lp in loops))
        q_use = Access(q, "i64", "g", tuple(Var(lp.var) for lp in loops))
        value = map_expr(ix, lambda n: Var(names[n.name]) if isinstance(n, Var) else n)
        table = Nest(tuple(Loop("L", lp.extent, names[lp.var], lp.start) for lp in loops), (Stmt(q_def, value),))

        def swap(n):
            if isinstance(n, Access):
                return Access(n.tensor, n.dtype, n.scope, tuple(q_use if i == ix else i for i in n.indices))
            return n
        program = replace_stmt(ctx.program, s, Stmt(s.stmt.lhs, map_expr(s.stmt.rhs, swap)))
        program = replace_nests(program, s.nest_index, 0, (table,))
        return Rewrite(program, self._facts(ix, loops, q), self._summary(ix, loops, q, s))

    def _facts(self, ix, loops: list[Loop], q: str) -> tuple[str, ...]:
        return (f"{format_expr(ix)} depends only on the loop indices {', '.join(vars_in(ix))}, so a table over "
                f"their ranges ({', '.join(str(lp.extent) for lp in loops)}) holds every value the statement needs",
                f"{q} is computed in a nest of its own before the statement's nest and never changes",
                "the table is i64, so every index value is represented exactly")

    def _summary(self, ix, loops: list[Loop], q: str, s) -> str:
        return (f"The subscript {format_expr(ix)} is read from the {iterations(loops)}-entry index table {q} instead "
                f"of being recomputed on each of the {iterations(s.loops)} executions of statement {s.order + 1}.")
