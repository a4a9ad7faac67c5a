"""Operator-level strategies: loop transformations on one nest."""
from __future__ import annotations

from collections.abc import Iterator

from leir.ast import Loop, Nest
from strategies.base import Context, Illegal, Rewrite, Site, Strategy
from strategies.legality import body_statements, iterations, loop_carries_dependence
from strategies.registry import register
from strategies.tree import get_item, replace_item


def loop_positions(ctx: Context) -> Iterator[tuple[int, tuple[int, ...], int, Nest, tuple[Loop, ...]]]:
    """(top nest, path to the nest, loop position, nest, enclosing loops) for every loop, program order."""
    def visit(top, path, nest, outer):
        for k in range(len(nest.loops)):
            yield top, path, k, nest, outer
        for i, item in enumerate(nest.body):
            if isinstance(item, Nest):
                yield from visit(top, path + (i,), item, outer + nest.loops)

    for top, nest in enumerate(ctx.program.nests):
        yield from visit(top, (), nest, ())


def with_loop(nest: Nest, k: int, loop: Loop) -> Nest:
    return Nest(nest.loops[:k] + (loop,) + nest.loops[k + 1:], nest.body)


@register
class LoopParallelization(Strategy):
    name = "loop_parallelization"
    level = "operator"
    exactness = "exact"
    description = "Mark a serial loop whose iterations are independent as parallel (P)."

    def sites(self, ctx):
        for top, path, k, nest, _outer in loop_positions(ctx):
            if nest.loops[k].kind == "L":
                yield Site(top, path, loops=(nest.loops[k].var,), extra=(("loop_index", k),))

    def rewrite(self, ctx, site, params):
        nest = get_item(ctx.program, site.nest, site.path)
        k = dict(site.extra)["loop_index"]
        loop = nest.loops[k]
        enclosing = [lp for lp in nest.loops[:k] if lp.kind == "P"]
        if enclosing or any(lp.kind == "P" for lp in _outer_loops(ctx, site)):
            raise Illegal("an enclosing loop is already parallel")
        inner = Nest(nest.loops[k + 1:], nest.body)
        stmts = body_statements(inner, nest.loops[:k + 1])
        reason = loop_carries_dependence(stmts, loop.var)
        if reason:
            raise Illegal(reason)
        new = with_loop(nest, k, Loop("P", loop.extent, loop.var, loop.start))
        work = iterations(nest.loops[k + 1:])
        facts = (f"every statement under {loop.var} writes a distinct element per iteration of {loop.var} "
                 f"(it is a spatial axis of {', '.join(dict.fromkeys(s.lhs.tensor for s, _ in stmts))})",
                 f"no statement reads an element that another iteration of {loop.var} writes",
                 "no enclosing loop is already parallel")
        effect = (f"The {loop.extent} iterations of {loop.var} are independent, each doing {work} inner "
                  f"iteration{'s' if work != 1 else ''} of work, so they can run on separate cores.")
        return Rewrite(replace_item(ctx.program, site.nest, site.path, (new,)), facts, effect)


def _outer_loops(ctx: Context, site: Site) -> tuple[Loop, ...]:
    loops: tuple[Loop, ...] = ()
    item = ctx.program.nests[site.nest]
    for i in site.path:
        loops += item.loops
        item = item.body[i]
    return loops
