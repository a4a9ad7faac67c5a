"""operator_fusion and operator_fission: a consumer nest moved into its producer's loops, and a nest
that does several things distributed into nests with the same loops."""
from __future__ import annotations

from leir.ast import Nest
from strategies.analysis import recognition as rec
from strategies.analysis.legality import body_statements, dependence_names, misaligned, read_tensors, written_tensors
from strategies.analysis.loops import common_depth, contracted_products, fuse_nests, fusion_facts, fusion_problem
from strategies.analysis.tree import bands, enclosing_loops, get_item, replace_item, replace_nests
from strategies.base import Nests, Params, Rewrite, Site, Strategy, params_dataclass
from strategies.registry import register


@register
class OperatorFusion(Strategy):
    name = "operator_fusion"
    level = "graph"
    exactness = "exact"
    description = "Fuse a consumer nest into its producer's loops as deeply as dependences allow."
    search_prior = 6.5

    def recognizes(self, before, after, signature):
        """Fewer top-level nests holding the same statements."""
        return rec.fewer_nests(before, after)

    def sites(self, ctx):
        nests = ctx.program.nests
        for i in range(len(nests) - 1):
            made = set(written_tensors(body_statements(nests[i])))
            used = [t for t in read_tensors(body_statements(nests[i + 1])) if t in made]
            if used and common_depth(nests[i], nests[i + 1]):
                yield Site(i, tensors=tuple(used), match=Nests((i, i + 1)))

    def check(self, ctx, site, params):
        if self._deepest(ctx, site) is None:
            return f"every fusion depth would reverse a dependence on {', '.join(site.tensors)}"
        return None

    def build(self, ctx, site, params):
        depth = self._deepest(ctx, site)
        fusion = fuse_nests(ctx.program, site.nest, depth)
        program = replace_nests(ctx.program, site.nest, 2, (fusion.nest,))
        produced = ", ".join(site.tensors)
        facts = fusion_facts(fusion) + (f"{depth} is the deepest fusion the dependences on {produced} allow",)
        return Rewrite(program, facts, self._summary(produced, depth), fusion.exactness)

    def _deepest(self, ctx, site) -> int | None:
        """The deepest fusion of the site's nests that reverses no dependence, or None."""
        a, b = ctx.program.nests[site.nest], ctx.program.nests[site.nest + 1]
        return next((d for d in range(common_depth(a, b), 0, -1)
                     if fusion_problem(ctx.program, site.nest, d) is None), None)

    def _summary(self, produced: str, depth: int) -> str:
        return (f"The producer of {produced} and its consumer run in one loop nest over "
                f"{depth} shared loop{'s' if depth > 1 else ''}: {produced} is consumed right after it is "
                "produced, while it is still in cache, and one pass over memory disappears.")


@params_dataclass
class FissionParams(Params):
    at: int   # the body items before it stay in the first nest


@register
class OperatorFission(Strategy):
    name = "operator_fission"
    level = "graph"
    exactness = "exact"
    description = "Split a nest whose body does several things into two nests with the same loops."
    enables = ("loop_parallelization", "loop_vectorization", "loop_binding", "loop_reorder")
    params_type = FissionParams

    def recognizes(self, before, after, signature):
        """More top-level nests, no statement lost."""
        return len(after.nests) > len(before.nests) and len(rec.statements(after)) >= len(rec.statements(before))

    def sites(self, ctx):
        for top, path, nest, _ in bands(ctx.program):
            if len(nest.body) >= 2 and nest.loops:
                yield Site(top, path, loops=tuple(lp.var for lp in nest.loops))

    def parameters(self, ctx, site):
        nest = get_item(ctx.program, site.nest, site.path)
        for i in range(1, len(nest.body)):
            yield {"at": i}

    def check(self, ctx, site, params):
        nest = get_item(ctx.program, site.nest, site.path)
        if not 1 <= params.at < len(nest.body):
            return f"the nest's body has {len(nest.body)} items: it is split after item 1 to {len(nest.body) - 1}"
        head, tail, first, second = self._parts(ctx, site, params.at)
        return misaligned(first, second, [lp.var for lp in nest.loops])

    def _parts(self, ctx, site, i: int):
        nest = get_item(ctx.program, site.nest, site.path)
        outer = enclosing_loops(ctx.program, site.nest, site.path)
        head, tail = Nest(nest.loops, nest.body[:i]), Nest(nest.loops, nest.body[i:])
        return head, tail, body_statements(head, outer), body_statements(tail, outer)

    def build(self, ctx, site, params):
        nest = get_item(ctx.program, site.nest, site.path)
        i = params.at
        head, tail, first, second = self._parts(ctx, site, i)
        program = replace_item(ctx.program, site.nest, site.path, (head, tail))
        contracted = contracted_products(first, second)
        return Rewrite(program, self._facts(dependence_names(first, second), contracted),
                       self._summary(nest, i), "reassociating" if contracted else None)

    def _facts(self, deps: list[str], contracted: list[str]) -> tuple[str, ...]:
        facts = ((f"the two parts meet only at the same iteration ({'; '.join(deps)}), and the first part "
                  "still runs first" if deps else "the two parts access no common tensor that either writes"),
                 "statement order is unchanged, so implicit initialisations stay as they were")
        if contracted:  # the fused multiply-add the compiler formed in one iteration is gone
            facts = facts + (f"{', '.join(contracted)} is a product added to another value in the same iteration: "
                             "in one nest the compiler fused that multiply-add (one rounding), in two it rounds "
                             "twice, so the results agree within rounding, not bit for bit",)
        return facts

    def _summary(self, nest: Nest, i: int) -> str:
        rest = len(nest.body) - i
        return (f"The nest over {', '.join(f'{lp.var}:{lp.extent}' for lp in nest.loops)} is distributed into "
                f"two nests ({i} and {rest} body item{'s' if rest > 1 else ''}): each "
                "is simpler to vectorize, parallelize or schedule on its own.")
