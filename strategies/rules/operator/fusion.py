"""loop_fusion: the common outer loops of two adjacent nests fused into one loop nest, at a chosen depth
(the fusion itself and its legality: `strategies.analysis.loops.fuse_nests`, `fusion_problem`)."""
from __future__ import annotations

from strategies.analysis import recognition as rec
from strategies.analysis.loops import common_depth, fuse_nests, fusion_facts, fusion_problem, fusion_summary
from strategies.analysis.tree import replace_nests
from strategies.base import Nests, Params, Rewrite, Site, Strategy, params_dataclass
from strategies.registry import register


@params_dataclass
class FusionParams(Params):
    depth: int   # the common outer loops fused


@register
class LoopFusion(Strategy):
    name = "loop_fusion"
    level = "operator"
    exactness = "exact"
    description = "Fuse the common outer loops of two adjacent nests into one loop nest."
    search_prior = 6.5
    params_type = FusionParams

    def recognizes(self, before, after, signature):
        """Fewer top-level nests holding the same statements."""
        return rec.fewer_nests(before, after)

    def sites(self, ctx):
        nests = ctx.program.nests
        for i in range(len(nests) - 1):
            depth = common_depth(nests[i], nests[i + 1])
            if depth:
                yield Site(i, loops=tuple(lp.var for lp in nests[i].loops[:depth]), match=Nests((i, i + 1)))

    def parameters(self, ctx, site):
        nests = ctx.program.nests
        for depth in range(1, common_depth(nests[site.nest], nests[site.nest + 1]) + 1):
            yield {"depth": depth}

    def check(self, ctx, site, params):
        return fusion_problem(ctx.program, site.nest, params.depth)

    def build(self, ctx, site, params):
        fusion = fuse_nests(ctx.program, site.nest, params.depth)
        return Rewrite(replace_nests(ctx.program, site.nest, 2, (fusion.nest,)), fusion_facts(fusion),
                       fusion_summary(fusion), fusion.exactness)
