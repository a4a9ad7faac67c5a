"""cache_read_write: a reused input block staged in a local cache (cache read), or a reduction
accumulated in a local register, or a local tile of registers, and stored once (cache write)."""
from __future__ import annotations

from leir.analysis import lhs_vars, reduction_op
from leir.ast import Access, Loop, Nest, Stmt, Var, accesses, map_stmt
from leir.printer import format_expr
from strategies.analysis import recognition as rec
from strategies.analysis.legality import (
    body_statements,
    copy_without_reuse_problem,
    iterations,
    merged_subscript_vars,
    reads_without_self,
    stmt_reads,
)
from strategies.analysis.tree import fresh_tensors, literal, replace_nests, vars_in
from strategies.base import Context, Params, Rewrite, Site, Strategy, params_dataclass, unhelpful
from strategies.registry import register


@params_dataclass
class CacheParams(Params):
    """A cache read of `read` below the first `depth` loops; a cache write of `write` in a register,
    or, with `depth`, in a tile of registers below the first `depth` loops."""

    read: str | None = None
    depth: int | None = None
    write: str | None = None


@register
class CacheReadWrite(Strategy):
    name = "cache_read_write"
    level = "memory"
    exactness = "exact"
    description = ("Stage a reused input block in a local cache (cache read), or accumulate a reduction in "
                   "a local register and store it once (cache write).")
    search_prior = 5.0
    params_type = CacheParams

    def promise(self, t):
        """An accumulator kept in a register (a cache write) promises more than a staged read."""
        return self.search_prior + (2.0 if "write" in t.params else 0.0)

    def recognizes(self, before, after, signature):
        """A new local or shared tensor."""
        table = rec.intermediates(after, signature)
        return any(table[name].scope in ("l", "s") for name in rec.new_intermediates(before, after, signature))

    def sites(self, ctx):
        for top, nest in enumerate(ctx.program.nests):
            if nest.loops and all(isinstance(i, Stmt) for i in nest.body):
                yield Site(top, loops=tuple(lp.var for lp in nest.loops))

    def parameters(self, ctx, site):
        nest = ctx.program.nests[site.nest]
        stmts = body_statements(nest)
        written = {s.lhs.tensor for s, _ in stmts}
        for tensor in dict.fromkeys(a.tensor for s, _ in stmts for a in stmt_reads(s)):
            if tensor in written:
                continue
            for depth in range(1, len(nest.loops)):
                yield {"read": tensor, "depth": depth}
        if len(nest.body) == 1:
            yield {"write": nest.body[0].lhs.tensor}
            # register blocking: a tile of accumulators below the first `depth` (spatial) loops
            for depth in range(1, len(nest.loops) - 1):
                yield {"write": nest.body[0].lhs.tensor, "depth": depth}

    def check(self, ctx, site, params):
        if params.read is not None:
            if params.write is not None or params.depth is None:
                return "a cache read names the tensor and the loop depth it is copied below (read, depth)"
            return cache_read_problem(ctx, site.nest, params.read, params.depth)
        if params.write is None:
            return "a cache names the tensor it reads (read, depth) or the accumulator it writes (write)"
        if params.depth is not None:
            return cache_write_tile_problem(ctx, site.nest, params.write, params.depth)
        return cache_write_problem(ctx, site.nest, params.write)

    def build(self, ctx, site, params):
        if params.read is not None:
            return cache_read(ctx, site.nest, params.read, params.depth)
        if params.depth is not None:
            return cache_write_tile(ctx, site.nest, params.write, params.depth)
        return cache_write(ctx, site.nest, params.write)


# --- cache read ---------------------------------------------------------------------------------------

def _cached_vars(acc: Access, inner: tuple[Loop, ...]) -> tuple[list[str], object | None]:
    """(the inner loop indices the access of the cached tensor uses, in subscript order; the first
    subscript that uses inner loops other than as one plain index, or None)."""
    inner_vars = {lp.var for lp in inner}
    cached: list[str] = []
    for ix in acc.indices:
        if not set(vars_in(ix)) & inner_vars:
            continue
        if not isinstance(ix, Var) or ix.name in cached:
            return cached, ix
        cached.append(ix.name)
    return cached, None


def _reads_of(nest: Nest, tensor: str) -> list[Access]:
    return [a for s, _ in body_statements(nest) for a in stmt_reads(s) if a.tensor == tensor]


def cache_read_problem(ctx: Context, top: int, tensor: str, depth: int) -> str | None:
    """Why a local copy of `tensor` per iteration of the nest's first `depth` loops would not serve
    every read (or cannot help), or None."""
    nest = ctx.program.nests[top]
    outer, inner = nest.loops[:depth], nest.loops[depth:]
    if any(lp.kind == "P" for lp in outer):
        return "a parallel loop encloses the cache: its iterations would share one cache"
    if any(lp.kind in ("B", "V") for lp in inner):
        return "bound or vector loops below the cache level"
    uses = _reads_of(nest, tensor)
    if len(set(uses)) != 1:
        return f"{tensor} is read with different subscripts in the nest"
    acc = uses[0]
    if any(a.tensor != tensor for ix in acc.indices for a in accesses(ix)):
        return f"{tensor} is read through a gather"
    cached, bad = _cached_vars(acc, inner)
    if bad is not None:
        return f"subscript {format_expr(bad)} of {tensor} is not a plain inner loop index"
    if not [lp for lp in inner if lp.var not in cached]:
        return f"no loop below the cache level reuses {tensor}"
    return unhelpful(ctx, copy_without_reuse_problem(tensor, iterations(lp for lp in inner if lp.var not in cached)))


def cache_read(ctx: Context, top: int, tensor: str, depth: int) -> Rewrite:
    nest = ctx.program.nests[top]
    outer, inner = nest.loops[:depth], nest.loops[depth:]
    acc = _reads_of(nest, tensor)[0]
    cached, _ = _cached_vars(acc, inner)
    k = Access(fresh_tensors(ctx.program, ctx.signature).fresh(), acc.dtype, "l", tuple(Var(v) for v in cached))
    copy_loops = tuple(Loop("L", lp.extent, lp.var, lp.start) for lp in inner if lp.var in cached)
    fill = Nest(copy_loops, (Stmt(k, acc),)) if copy_loops else Stmt(k, acc)
    rest = Nest(inner, tuple(map_stmt(s, lambda n: k if n == acc else n) for s in nest.body))
    program = replace_nests(ctx.program, top, 1, (Nest(outer, (fill, rest)),))
    reuse = [lp for lp in inner if lp.var not in cached]
    size, factor = iterations(copy_loops), iterations(reuse)
    facts = (f"{tensor} is not written in this nest, so the copy holds the values every read sees",
             f"below {', '.join(lp.var for lp in outer)} the nest reads {tensor} only at {format_expr(acc)}, "
             f"which depends on the inner loops only through {', '.join(cached) or 'no index'}",
             f"{k.tensor} is local and no enclosing loop is parallel, so each iteration fills its own copy")
    summary = (f"For each iteration of {', '.join(lp.var for lp in outer)}, the {size} element"
               f"{'s' if size != 1 else ''} of {tensor} used below are copied once into local {k.tensor} and then "
               f"read {factor} times each ({', '.join(lp.var for lp in reuse)} reuse them)"
               + (" from fast memory." if ctx.gpu else f". On the CPU {k.tensor} is an ordinary buffer behind the same "
                 f"caches as {tensor}, so the copy brings no memory benefit by itself; it stages the tile the way "
                 "a GPU schedule would."))
    return Rewrite(program, facts, summary)


# --- cache write: a register, or a tile of registers ------------------------------------------------------

def cacheable_reduction_problem(ctx: Context, top: int, tensor: str) -> str | None:
    """Why a cache of `tensor`'s accumulator in the nest would change the result, or None."""
    nest = ctx.program.nests[top]
    if len(nest.body) != 1 or not isinstance(nest.body[0], Stmt) or nest.body[0].lhs.tensor != tensor:
        return "the nest is not a single reduction"
    stmt = nest.body[0]
    if _order(ctx, top) not in ctx.inits:
        return f"{tensor} accumulates onto earlier values: caching would reassociate"
    if any(a.tensor == tensor for a in reads_without_self(stmt)):
        return f"the reduction reads {tensor} elsewhere than as the accumulator"
    merged = merged_subscript_vars(stmt, nest.loops)
    if merged:
        return (f"{merged[0]} appears in {tensor}'s subscript but several of its iterations accumulate into "
                "one element: a cache per iteration would lose the other iterations' terms")
    return None


def _order(ctx: Context, top: int) -> int:
    """The program order of the nest's first statement."""
    return next(s.order for s in ctx.sites if s.nest_index == top)


def _spatial_depth(nest: Nest, stmt: Stmt) -> int:
    """How many outer loops of the nest are spatial loops of the statement's result."""
    spatial = set(lhs_vars(stmt))
    depth = 0
    while depth < len(nest.loops) and nest.loops[depth].var in spatial:
        depth += 1
    return depth


def cache_write_problem(ctx: Context, top: int, tensor: str) -> str | None:
    """Why the reduction into `tensor` cannot accumulate in a register below its spatial loops."""
    reason = cacheable_reduction_problem(ctx, top, tensor)
    if reason:
        return reason
    nest = ctx.program.nests[top]
    stmt = nest.body[0]
    spatial, depth = set(lhs_vars(stmt)), _spatial_depth(nest, stmt)
    if depth == 0 or any(lp.var in spatial for lp in nest.loops[depth:]) or depth == len(nest.loops):
        return "the spatial loops do not all enclose the reduction loops"
    if any(lp.kind == "P" for lp in nest.loops[:depth]):
        return "a parallel loop encloses the cache"
    if any(lp.kind == "B" for lp in nest.loops[depth:]):
        return "a bound loop is among the reduction loops"
    return None


def cache_write_tile_problem(ctx: Context, top: int, tensor: str, depth: int) -> str | None:
    """Why the tile of `tensor` below the first `depth` loops cannot accumulate in local registers."""
    reason = cacheable_reduction_problem(ctx, top, tensor)
    if reason:
        return reason
    nest = ctx.program.nests[top]
    stmt = nest.body[0]
    spatial = set(lhs_vars(stmt))
    outer, inner = nest.loops[:depth], nest.loops[depth:]
    if not 0 < depth < len(nest.loops) or any(lp.var not in spatial for lp in outer):
        return "the loops above the tile must all be spatial loops of the accumulator"
    tile = [lp for lp in inner if lp.var in spatial]
    if not tile or len(tile) == len(inner):
        return "the tile needs spatial loops and reduction loops below the cache level"
    if any(lp.kind == "P" for lp in outer) or any(lp.kind in ("B", "P") for lp in inner):
        return "a parallel or bound loop would share the local tile"
    if any(isinstance(a, Access) for ix in stmt.lhs.indices for a in accesses(ix)):
        return f"{tensor} is written through a gather"
    return None


def cache_write(ctx: Context, top: int, tensor: str) -> Rewrite:
    nest, order = ctx.program.nests[top], _order(ctx, top)
    stmt = nest.body[0]
    depth = _spatial_depth(nest, stmt)
    outer, inner = nest.loops[:depth], nest.loops[depth:]
    x = stmt.lhs
    k = Access(fresh_tensors(ctx.program, ctx.signature).fresh(), x.dtype, "l", ())
    update = map_stmt(stmt, lambda n: k if n == x else n)
    new = Nest(outer, (Stmt(k, literal(ctx.inits[order])), Nest(inner, (update,)), Stmt(x, k)))
    start = format_expr(literal(ctx.inits[order]))
    facts = (f"{tensor} starts from the identity of {reduction_op(stmt)!r} here (implicit initialisation), so "
             f"starting the local {k.tensor} from {start} and storing it once gives the same "
             "value, with the updates in the same order",
             f"{', '.join(lp.var for lp in outer)} are the spatial loops of {tensor} and enclose every reduction loop",
             f"{k.tensor} is private to one iteration of the spatial loops (no enclosing loop is parallel)")
    summary = (f"Each element of {tensor} accumulates {iterations(inner)} terms in a register ({k.tensor}) and is "
               f"written to memory once instead of {iterations(inner)} times.")
    return Rewrite(replace_nests(ctx.program, top, 1, (new,)), facts, summary)


def cache_write_tile(ctx: Context, top: int, tensor: str, depth: int) -> Rewrite:
    """Accumulate the tile of `tensor` that one iteration of the first `depth` loops writes in a local
    array (register blocking): zero it, run the inner loops on it, store it once."""
    nest, order = ctx.program.nests[top], _order(ctx, top)
    stmt = nest.body[0]
    spatial = set(lhs_vars(stmt))
    outer, inner = nest.loops[:depth], nest.loops[depth:]
    tile = [lp for lp in inner if lp.var in spatial]
    x = stmt.lhs
    k = Access(fresh_tensors(ctx.program, ctx.signature).fresh(), x.dtype, "l", tuple(Var(lp.var) for lp in tile))
    point = tuple(Loop("V" if lp.kind == "V" else "L", lp.extent, lp.var, lp.start) for lp in tile)
    new = Nest(outer, (Nest(point, (Stmt(k, literal(ctx.inits[order])),)),
                       Nest(inner, (map_stmt(stmt, lambda n: k if n == x else n),)),
                       Nest(point, (Stmt(x, k),))))
    program = replace_nests(ctx.program, top, 1, (new,))
    return Rewrite(program, _tile_facts(ctx, stmt, order, outer, tile, k),
                   _tile_summary(tensor, outer, tile, point, [lp for lp in inner if lp.var not in spatial], k))


def _tile_facts(ctx, stmt, order, outer, tile, k) -> tuple[str, ...]:
    tensor = stmt.lhs.tensor
    return (f"{tensor} starts from the identity of {reduction_op(stmt)!r} (implicit initialisation), so a local "
            f"tile started from {format_expr(literal(ctx.inits[order]))} and stored once holds the same values, "
            "each element updated in the same order",
            f"{', '.join(lp.var for lp in outer)} are spatial loops of {tensor}; below them "
            f"{', '.join(lp.var for lp in tile)} select distinct elements of the tile",
            f"no loop above or inside the tile is parallel or bound, so one copy of {k.tensor} serves every iteration")


def _tile_summary(tensor, outer, tile, point, reduce_loops, k) -> str:
    return (f"For each iteration of {', '.join(lp.var for lp in outer)}, a {'x'.join(str(lp.extent) for lp in tile)} "
            f"tile of {tensor} ({iterations(point)} accumulators) stays in local {k.tensor} through the "
            f"{iterations(reduce_loops)} steps of {', '.join(lp.var for lp in reduce_loops)} and is written to "
            "memory once: register blocking.")
