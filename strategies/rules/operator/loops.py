"""Operator-level rules on one band (a nest at (nest, path)): loops moved (reorder, split, tiling) and
loops given another kind (unrolled, parallel, vectorized, bound to a GPU index).

Legality rests on one fact (`legality.carrying_loops`): a loop whose iterations do not interact can
move anywhere in its band; the loops that carry a dependence (a reduction axis, a scan, a repeated
store) must keep their relative order. Keeping that order also keeps the order in which each
accumulator element is updated, so reordering, splitting and tiling are bitwise exact.

`LoopRule` is the shape most of them share: a site per loop the rule takes (its position in the
band, `LoopAt`), and a rewrite that replaces the band in place (`in_band`).
"""
from __future__ import annotations

from itertools import product
from typing import Literal

from leir.analysis import lhs_vars, reduction_op, statement_sites
from leir.ast import FAST_OF, Call, Loop, Nest, Select, Stmt, Var, map_stmt, walk_expr
from leir.names import BIND_PREFIXES, bind_name
from strategies.analysis import recognition as rec
from strategies.analysis.legality import (
    body_statements,
    carrying_loops,
    iterations,
    keeps_relative_order,
    loop_carries_dependence,
    one_iteration_problem,
    parallel_work_problem,
    reads_without_self,
    same_traversal_problem,
)
from strategies.analysis.loops import (
    MAX_FACTORS,
    by_preference,
    divisors,
    factor_rank,
    factor_reduction,
    factor_reduction_problem,
    factored_facts,
    split_loop,
    statements_under,
    vector_friendly,
)
from strategies.analysis.prose import loops_text
from strategies.analysis.tree import (
    bands,
    enclosing_loops,
    fresh_indices,
    get_item,
    loop_positions,
    loop_vars,
    map_nest_stmts,
    replace_item,
    replace_nests,
    substitute_in_nest,
    with_loop,
)
from strategies.base import Context, LoopAt, Params, Rewrite, Site, Strategy, params_dataclass, unhelpful
from strategies.registry import register

MAX_TILES = 12         # factor pairs tried per tiled loop pair
MAX_ORDERS = 16        # loop pairs swapped per band
MAX_UNROLL = 16        # largest extent unrolled
MAX_UNROLL_BODY = 512  # copies of the innermost body an unrolled loop may create
MAX_VECTOR = 64        # largest extent vectorized
MAX_THREADS = 1024     # CUDA threads per block
VECTOR_WIDTHS = (16, 8, 32)   # lanes of a split-off vector loop: float32 in AVX-512, AVX2, two registers
FAST_EXP_DTYPES = ("f32", "f16", "bf16")  # where fast_exp's float32 error (~2e-7) is within the tolerance


class LoopRule(Strategy):
    """A rule on one loop of a band. Sites: every loop `takes` accepts, program order, outer loops
    first, with its position (`LoopAt`). The check and the build get the band and the position
    (`check_loop`, `build_loop`)."""

    level = "operator"
    exactness = "exact"

    def takes(self, ctx: Context, nest: Nest, k: int) -> bool:
        raise NotImplementedError

    def sites(self, ctx):
        for top, path, k, nest, _ in loop_positions(ctx.program):
            if self.takes(ctx, nest, k):
                yield Site(top, path, loops=(nest.loops[k].var,), match=LoopAt(k))

    def check(self, ctx, site, params):
        return self.check_loop(ctx, site, get_item(ctx.program, site.nest, site.path), site.match.loop_index, params)

    def build(self, ctx, site, params):
        return self.build_loop(ctx, site, get_item(ctx.program, site.nest, site.path), site.match.loop_index, params)

    def check_loop(self, ctx: Context, site: Site, nest: Nest, k: int, params: Params) -> str | None:
        raise NotImplementedError

    def build_loop(self, ctx: Context, site: Site, nest: Nest, k: int, params: Params) -> Rewrite:
        raise NotImplementedError


def in_band(ctx: Context, site: Site, new: Nest, facts, summary: str, exactness: str | None = None) -> Rewrite:
    """The rewrite that replaces the site's band by `new`."""
    return Rewrite(replace_item(ctx.program, site.nest, site.path, (new,)), facts, summary, exactness)


def band_carries(program, top: int, path: tuple[int, ...], nest: Nest) -> list[str]:
    return carrying_loops(body_statements(nest, enclosing_loops(program, top, path)), nest.loops)


def reorder_facts(carry: list[str], order_old: list[str], order_new: list[str]) -> tuple[str, ...]:
    facts = []
    free = [v for v in order_old if v not in carry]
    if free:
        facts.append(f"iterations of {', '.join(free)} are independent (each writes its own elements "
                     "and reads no element another iteration writes), so these loops can move freely")
    if carry:
        facts.append(f"{', '.join(carry)} carr{'ies' if len(carry) == 1 else 'y'} a dependence (reduction "
                     "axis or repeated store); their relative order is unchanged, so every accumulator "
                     "element is updated in the same order as before")
    return tuple(facts)


# --- loops moved: reorder, split, tiling ------------------------------------------------------------------

@params_dataclass
class ReorderParams(Params):
    """One loop moved to a position of its band (`move`, `to`), or two loops swapped (`swap`)."""

    move: str | None = None
    to: int | None = None
    swap: list[str] | None = None


@register
class LoopReorder(Strategy):
    name = "loop_reorder"
    level = "operator"
    exactness = "exact"
    description = "Interchange two loops of a nest when no dependence is reversed."
    enables = ("loop_vectorization", "loop_parallelization", "loop_unrolling",
               "loop_fusion", "cache_read_write", "loop_binding")
    search_prior = 3.0
    search_variants = (24, 12)
    params_type = ReorderParams

    def promise(self, t):
        """A reorder that makes the innermost loop walk memory contiguously promises much more."""
        return self.search_prior + (5.0 if _stride_one_innermost(t) else 0.0)

    def recognizes(self, before, after, signature):
        """The same loops of a nest (each known by its extent and where its index is used) in another
        order."""
        return any(len(x.loops) == len(y.loops) and sorted(rec.roles(x)) == sorted(rec.roles(y))
                   and rec.roles(x) != rec.roles(y) for x, y in rec.changed_nests(before, after))

    def sites(self, ctx):
        for top, path, nest, _ in bands(ctx.program):
            if len(self._movable(ctx, nest)) >= 2:
                yield Site(top, path, loops=tuple(lp.var for lp in nest.loops))

    def _movable(self, ctx, nest):
        # On CUDA the thread-bound loops stay where they are (outside the serial work).
        return [k for k, lp in enumerate(nest.loops) if not (ctx.gpu and lp.kind == "B")]

    def parameters(self, ctx, site):
        nest = get_item(ctx.program, site.nest, site.path)
        movable = self._movable(ctx, nest)
        # One loop moved two or more places (a rotation of the loops between): a loop sunk to the
        # innermost position (stride 1, vector lanes) comes first, then the pairwise swaps, then the
        # other moves (a reduction axis hoisted above a tile's point loops, as register blocking needs).
        last = movable[-1] if movable else 0
        sinks = [(i, last) for i in movable if last - i >= 2]
        pairs = [(i, j) for n, i in enumerate(movable) for j in movable[n + 1:]]
        moves = [(i, j) for i in movable for j in movable if abs(i - j) >= 2 and j != last]
        for i, j in sinks:
            yield {"move": nest.loops[i].var, "to": j}
        for i, j in pairs[:MAX_ORDERS]:
            yield {"swap": [nest.loops[i].var, nest.loops[j].var]}
        for i, j in moves[:MAX_ORDERS]:
            yield {"move": nest.loops[i].var, "to": j}

    def check(self, ctx, site, params):
        nest = get_item(ctx.program, site.nest, site.path)
        reason = self._move_problem(nest, params)
        if reason:
            return reason
        names = [lp.var for lp in nest.loops]
        _, _, loops, moved = self._moved(nest, params)
        bound = [lp.var for lp in loops if lp.kind == "B"] != [lp.var for lp in nest.loops if lp.kind == "B"]
        carry = band_carries(ctx.program, site.nest, site.path, nest)
        return (unhelpful(ctx, same_traversal_problem(list(nest.loops), loops))
                or ("thread-bound loops stay where they are on CUDA" if ctx.gpu and bound else None)
                or (None if keeps_relative_order(names, [lp.var for lp in loops], carry) else
                    f"{', '.join(moved)} include two loops that carry dependences (e.g. two reduction "
                    "axes); exchanging them would change the order of the updates")
                or ("the vectorized loop must stay innermost" if any(lp.kind == "V" for lp in loops[:-1]) else None))

    def build(self, ctx, site, params):
        nest = get_item(ctx.program, site.nest, site.path)
        names = [lp.var for lp in nest.loops]
        i, j, loops, _ = self._moved(nest, params)
        carry = band_carries(ctx.program, site.nest, site.path, nest)
        new = Nest(tuple(loops), nest.body)
        return in_band(ctx, site, new, reorder_facts(carry, names, [lp.var for lp in loops]),
                       self._summary(nest, new, i, j, params.move is not None))

    def _move_problem(self, nest: Nest, params: ReorderParams) -> str | None:
        """Why the parameters name no move of this band, or None."""
        names = [lp.var for lp in nest.loops]
        if params.move is not None:
            if params.to is None or params.swap is not None:
                return "a move names the loop and the position it goes to (move, to), and nothing else"
            if params.move not in names:
                return f"{params.move} is not a loop of this band ({', '.join(names)})"
            if not 0 <= params.to < len(names) or abs(names.index(params.move) - params.to) < 2:
                return "a move goes two or more places inside the band (one place is a swap)"
            return None
        if params.swap is None or params.to is not None or len(params.swap) != 2:
            return "a reorder is a move (move, to) or a swap of two loops (swap)"
        missing = [v for v in params.swap if v not in names]
        if missing:
            return f"{missing[0]} is not a loop of this band ({', '.join(names)})"
        return None

    def _moved(self, nest: Nest, params: ReorderParams) -> tuple[int, int, list[Loop], list[str]]:
        """(from, to, the loops in their new order, the loops whose order changes)."""
        names = [lp.var for lp in nest.loops]
        loops = list(nest.loops)
        if params.move is not None:
            i, j = names.index(params.move), params.to
            loops.insert(j, loops.pop(i))
            between = nest.loops[min(i, j):max(i, j) + 1]
            return i, j, loops, [params.move] + [lp.var for lp in between if lp.var != params.move]
        i, j = (names.index(v) for v in params.swap)
        loops[i], loops[j] = loops[j], loops[i]
        return i, j, loops, list(params.swap)

    def _summary(self, nest: Nest, new: Nest, i: int, j: int, move: bool) -> str:
        a, b = nest.loops[i], nest.loops[j]
        how = (f"Moving {a.var} (extent {a.extent}) to position {j + 1}" if move else
               f"Swapping {a.var} (extent {a.extent}) and {b.var} (extent {b.extent})")
        return (f"{how} changes the traversal from {loops_text(nest)} to {loops_text(new)}, which "
                "changes which subscripts vary fastest (stride-1 access and reuse in the innermost loop).")


@params_dataclass
class SplitParams(Params):
    factor: int   # the inner loop's extent


@register
class LoopSplit(LoopRule):
    name = "loop_split"
    description = "Split a loop into an outer and an inner loop (v = outer*factor + inner)."
    enables = ("loop_vectorization", "loop_unrolling", "loop_parallelization", "loop_binding", "loop_reorder")
    search_prior = 4.5
    params_type = SplitParams

    def promise(self, t):
        return self.search_prior + vector_friendly(t.params)

    def recognizes(self, before, after, signature):
        """One loop split into an adjacent outer and inner loop whose extents multiply to it."""
        return any(rec.split_from(rec.extents(x), rec.extents(y), 1, adjacent=True)
                   for x, y in rec.changed_nests(before, after))

    def takes(self, ctx, nest, k):
        return bool(divisors(nest.loops[k].extent))

    def parameters(self, ctx, site):
        nest = get_item(ctx.program, site.nest, site.path)
        for f in by_preference(divisors(nest.loops[site.match.loop_index].extent))[:MAX_FACTORS]:
            yield {"factor": f}

    def check_loop(self, ctx, site, nest, k, params):
        f, lp = params.factor, nest.loops[k]
        if f <= 1 or lp.extent % f or f >= lp.extent:
            return f"{f} is not a proper divisor of the extent {lp.extent}"
        return None

    def build_loop(self, ctx, site, nest, k, params):
        f, lp = params.factor, nest.loops[k]
        outer = fresh_indices(ctx.program).fresh()
        facts = (f"{f} divides the extent {lp.extent} exactly, so {outer}*{f}+{lp.var} enumerates 0..{lp.extent - 1} "
                 "once each, in the original order",)
        summary = (f"Loop {lp.var} (extent {lp.extent}) becomes {outer} ({lp.extent // f}) x {lp.var} ({f}): an "
                   f"inner block of {f} iterations that can later be vectorized, unrolled or bound, or "
                   "reordered for locality.")
        return in_band(ctx, site, split_loop(nest, k, f, outer), facts, summary)


@params_dataclass
class TileParams(Params):
    factors: list[int]   # the point loops' extents of the two tiled loops


@register
class LoopTiling(LoopRule):
    name = "loop_tiling"
    description = "Tile two adjacent loops: split both and move the tile loops outside the point loops."
    enables = ("loop_vectorization", "loop_unrolling", "loop_parallelization", "loop_binding", "cache_read_write")
    search_prior = 5.5
    search_variants = (16, 8)
    params_type = TileParams

    def promise(self, t):
        return self.search_prior + vector_friendly(t.params)

    def recognizes(self, before, after, signature):
        """Two loops split, both tile loops outside both point loops."""
        return any(rec.split_from(rec.extents(x), rec.extents(y), 2, adjacent=False)
                   for x, y in rec.changed_nests(before, after))

    def sites(self, ctx):  # a site per pair of adjacent loops, named by its first
        for top, path, nest, _ in bands(ctx.program):
            for k in range(len(nest.loops) - 1):
                a, b = nest.loops[k], nest.loops[k + 1]
                if divisors(a.extent) and divisors(b.extent):
                    yield Site(top, path, loops=(a.var, b.var), match=LoopAt(k))

    def parameters(self, ctx, site):
        nest = get_item(ctx.program, site.nest, site.path)
        k = site.match.loop_index
        pairs = list(product(divisors(nest.loops[k].extent), divisors(nest.loops[k + 1].extent)))
        order = sorted(range(len(pairs)), key=lambda i: (factor_rank(pairs[i][0]) + factor_rank(pairs[i][1]), i))
        for fa, fb in [pairs[i] for i in order][:MAX_TILES]:
            yield {"factors": [fa, fb]}

    def check_loop(self, ctx, site, nest, k, params):
        if len(params.factors) != 2:
            return "tiling takes two factors, one per loop of the pair"
        fa, fb = params.factors
        a, b = nest.loops[k], nest.loops[k + 1]
        if not (1 < fa < a.extent and 1 < fb < b.extent) or a.extent % fa or b.extent % fb:
            return "tile sizes must be proper divisors of the extents"
        split, loops, carry, bo = self._tiled(ctx, site, nest, k, params)
        if not keeps_relative_order([lp.var for lp in split.loops], [lp.var for lp in loops], carry):
            return (f"{a.var} and {b.var} both carry dependences: moving the tile loop {bo} outside "
                    f"{a.var} would reorder the updates")
        return None

    def _tiled(self, ctx, site, nest, k, params) -> tuple[Nest, list[Loop], list[str], str]:
        """(the band with both loops split: ao a bo b; its loops in the tiled order ao bo a b; the
        loops that carry a dependence; the name of b's tile loop)."""
        fa, fb = params.factors
        names = fresh_indices(ctx.program)
        ao, bo = names.fresh(), names.fresh()
        split = split_loop(split_loop(nest, k + 1, fb, bo), k, fa, ao)  # ao a bo b
        loops = list(split.loops)
        loops[k + 1], loops[k + 2] = loops[k + 2], loops[k + 1]          # ao bo a b
        probe = replace_item(ctx.program, site.nest, site.path, (split,))
        return split, loops, band_carries(probe, site.nest, site.path, split), bo

    def build_loop(self, ctx, site, nest, k, params):
        fa, fb = params.factors
        a, b = nest.loops[k], nest.loops[k + 1]
        split, loops, carry, _ = self._tiled(ctx, site, nest, k, params)
        old_order, new_order = [lp.var for lp in split.loops], [lp.var for lp in loops]
        facts = (f"{fa} divides {a.extent} and {fb} divides {b.extent}",) + reorder_facts(carry, old_order, new_order)
        summary = (f"The {a.extent}x{b.extent} iteration space of {a.var},{b.var} is walked in {fa}x{fb} tiles "
                   f"({a.extent // fa}x{b.extent // fb} of them)" + _tile_reuse(nest, a, b))
        return in_band(ctx, site, Nest(tuple(loops), split.body), facts, summary)


def _tile_reuse(nest: Nest, a: Loop, b: Loop) -> str:
    """What the tiles do for reuse: the tensors read again across a or b stay in cache within a tile;
    with none, the tiles bring no reuse by themselves (no benefit the step does not bring)."""
    reused = []
    for stmt, _ in body_statements(nest):
        for acc in reads_without_self(stmt):
            used = {n.name for ix in acc.indices for n in walk_expr(ix) if isinstance(n, Var)}
            if not {a.var, b.var} <= used and acc.tensor not in reused:
                reused.append(acc.tensor)
    if reused:
        return (f": {', '.join(reused)} {'is' if len(reused) == 1 else 'are'} read again across {a.var} or {b.var}, "
                "and the data one tile touches stays in cache while it is reused.")
    return (f": no tensor here is read again across {a.var} or {b.var}, so the tiles bring no reuse by themselves; "
            "their point loops are what a later step can unroll, vectorize or bind.")


# --- loops of another kind: unrolled, parallel, vectorized, bound -------------------------------------------

def body_iterations(nest: Nest) -> int:
    """Iterations of the innermost body per run of the nest (the largest over nested nests)."""
    inner = [body_iterations(i) for i in nest.body if isinstance(i, Nest)]
    return iterations(nest.loops) * max([1] + inner)


@register
class LoopUnrolling(LoopRule):
    name = "loop_unrolling"
    description = "Unroll a serial loop with a small extent (U)."
    search_prior = 3.5

    def recognizes(self, before, after, signature):
        """More unrolled loops over the same extents."""
        return rec.more_of_kind(before, after, "U")

    def takes(self, ctx, nest, k):
        lp = nest.loops[k]
        return lp.kind == "L" and 2 <= lp.extent <= MAX_UNROLL

    def check_loop(self, ctx, site, nest, k, params):
        lp = nest.loops[k]
        body = lp.extent * body_iterations(Nest(nest.loops[k + 1:], nest.body))
        return (unhelpful(ctx, one_iteration_problem(lp, "unrolled"))
                or (f"unrolling {lp.var} would copy the body {body} times"
                    if lp.kind != "L" or lp.extent > MAX_UNROLL or body > MAX_UNROLL_BODY else None))

    def build_loop(self, ctx, site, nest, k, params):
        lp = nest.loops[k]
        outer = enclosing_loops(ctx.program, site.nest, site.path) + nest.loops[:k]
        copies = lp.extent * iterations(x for x in outer if x.kind == "U")
        body = lp.extent * body_iterations(Nest(nest.loops[k + 1:], nest.body))
        facts = (f"the extent {lp.extent} is a small constant (at most {MAX_UNROLL})",
                 f"the unrolled code holds {body} copies of the innermost body (at most {MAX_UNROLL_BODY}), "
                 f"{copies} counting enclosing unrolled loops",
                 "unrolling keeps the execution order, so it cannot change a result")
        summary = (f"The {lp.extent} iterations of {lp.var} are written out: no loop counter or branch per "
                   "iteration, and the compiler can schedule the copies together.")
        return in_band(ctx, site, with_loop(nest, k, Loop("U", lp.extent, lp.var, lp.start)), facts, summary)


def _serial_form(ctx: Context, site: Site, nest: Nest, k: int) -> tuple[Context, Nest]:
    """The context and band with loop k serial: on the CPU a bound (B) loop is a serial loop, which a
    P loop replaces under an index name (P loops take index names, not binding names)."""
    loop = nest.loops[k]
    if loop.kind != "B":
        return ctx, nest
    renamed = fresh_indices(ctx.program).fresh()
    body = substitute_in_nest(Nest(nest.loops[k + 1:], nest.body), {loop.var: Var(renamed)})
    nest = Nest(nest.loops[:k] + (Loop("L", loop.extent, renamed, loop.start),) + body.loops, body.body)
    return ctx.with_program(replace_item(ctx.program, site.nest, site.path, (nest,))), nest


def _has_inner_parallel(nest: Nest) -> bool:
    return any(lp.kind == "P" for lp in nest.loops) or any(
        _has_inner_parallel(i) for i in nest.body if isinstance(i, Nest))


@register
class LoopParallelization(LoopRule):
    name = "loop_parallelization"
    description = "Mark a serial loop whose iterations are independent as parallel (P)."
    targets = ("llvm",)  # CPU cores; inside a CUDA kernel a P loop runs serially
    search_prior = 9.0

    def promise(self, t):
        """Outer spatial loops first."""
        depth = (t.site.match.loop_index if isinstance(t.site.match, LoopAt) else 0) + len(t.site.path)
        return self.search_prior - 1.5 * depth

    def recognizes(self, before, after, signature):
        """More parallel loops over the same extents."""
        return rec.more_of_kind(before, after, "P")

    def takes(self, ctx, nest, k):
        # On the CPU a bound (B) loop is a serial loop: it can become parallel too (with an index name).
        return nest.loops[k].kind in ("L", "B")

    def check_loop(self, ctx, site, nest, k, params):
        reason = unhelpful(ctx, one_iteration_problem(nest.loops[k], "parallel"))
        if reason:
            return reason
        ctx, nest = _serial_form(ctx, site, nest, k)
        loop = nest.loops[k]
        outer = enclosing_loops(ctx.program, site.nest, site.path) + nest.loops[:k]
        if any(lp.kind == "P" for lp in outer) or _has_inner_parallel(Nest(nest.loops[k + 1:], nest.body)):
            return "an enclosing or enclosed loop is already parallel"
        work = body_iterations(Nest(nest.loops[k + 1:], nest.body))
        return (loop_carries_dependence(statements_under(ctx.program, site.nest, site.path, nest, k), loop.var)
                or unhelpful(ctx, parallel_work_problem(loop.var, iterations(outer), loop.extent * work,
                                                        ctx.min_parallel_work)))

    def build_loop(self, ctx, site, nest, k, params):
        ctx, nest = _serial_form(ctx, site, nest, k)
        loop = nest.loops[k]
        stmts = statements_under(ctx.program, site.nest, site.path, nest, k)
        work = body_iterations(Nest(nest.loops[k + 1:], nest.body))
        facts = (f"every statement under {loop.var} writes a distinct element per iteration of {loop.var} "
                 f"(it is a spatial axis of {', '.join(dict.fromkeys(s.lhs.tensor for s, _ in stmts))})",
                 f"no statement reads an element that another iteration of {loop.var} writes",
                 "no enclosing or enclosed loop is already parallel")
        summary = (f"The {loop.extent} iterations of {loop.var} are independent, each doing {work} inner "
                   f"iteration{'s' if work != 1 else ''} of work, so they can run on separate cores."
                   if not ctx.gpu else
                   f"{loop.var} is marked parallel: its {loop.extent} iterations are independent, but inside a CUDA "
                   "kernel only bound loops are spread over threads, so on the GPU it stays serial in each thread.")
        return in_band(ctx, site, with_loop(nest, k, Loop("P", loop.extent, loop.var, loop.start)), facts, summary)


# --- loop_vectorization -----------------------------------------------------------------------------------------

FAST_EXP_FACTS = ("every exp below the vector loop computes a float32 (or narrower) result, where fast_exp's "
                  "relative error of about 2e-7 stays inside the dtype's tolerance; no exp decides a condition",
                  "fast_exp rounds differently from exp: the step is reassociating (verified close, not exact)")
FAST_EXP_EFFECT = (" Each exp becomes fast_exp (range reduction and a polynomial in plain arithmetic), so the lanes "
                   "compute it as vector code instead of one scalar expf call per element.")


def fast_math_problem(stmts, fns: tuple[str, ...]) -> str | None:
    """Why the calls of `fns` in the statements cannot take their fast forms (a result held closer
    than float32, a call that decides a condition, no such call), or None."""
    def converted(n) -> bool:
        return isinstance(n, Call) and n.fn in fns

    for stmt, _ in stmts:
        calls = [n for n in walk_expr(stmt.rhs) if converted(n)]
        if not calls:
            continue
        if stmt.lhs.dtype not in FAST_EXP_DTYPES:
            return (f"{stmt.lhs.tensor} is {stmt.lhs.dtype}: {FAST_OF[calls[0].fn]} carries float32's error "
                    "(a few ulp), beyond what this result is held to (an exact or float64 result)")
        conditions = [n.cond for n in walk_expr(stmt.rhs) if isinstance(n, Select)]
        found = [c.fn for cond in conditions for c in walk_expr(cond) if converted(c)]
        if found:
            return f"an {found[0]} decides a condition: a close value could flip the branch"
    if not any(converted(n) for stmt, _ in stmts for n in walk_expr(stmt.rhs)):
        return f"no {' or '.join(fns)} below the loop"
    return None


def fast_forms(nest: Nest, fns: tuple[str, ...]) -> Nest:
    """Every call of `fns` (exp; with `math: fast` also log and erf) in the nest's statements as its
    fast form (`leir.ast.FAST_OF`), where `fast_math_problem` found no reason against it."""
    return map_nest_stmts(nest, lambda s: map_stmt(
        s, lambda n: Call(FAST_OF[n.fn], n.args) if isinstance(n, Call) and n.fn in fns else n))


def fast_math_variant(params: VectorParams) -> tuple[str, ...]:
    """The functions a variant computes in their fast forms: `exp: fast` exp only, `math: fast` exp,
    log and erf (none without either)."""
    return tuple(FAST_OF) if params.math == "fast" else ("exp",) if params.exp == "fast" else ()


def fast_math_text(fns: tuple[str, ...], stmts) -> tuple[tuple[str, ...], str]:
    """(facts, effect sentence) of a fast-math variant: the exp-only wording where exp is the only
    function converted, else naming the functions the nest calls."""
    used = [f for f in fns if any(isinstance(n, Call) and n.fn == f for s, _ in stmts for n in walk_expr(s.rhs))]
    if used in (["exp"], []):
        return FAST_EXP_FACTS, FAST_EXP_EFFECT
    names, fast = ", ".join(used), ", ".join(FAST_OF[f] for f in used)
    facts = (f"every {names} below the vector loop computes a float32 (or narrower) result, where the error of "
             f"{fast} (a few float32 ulp) stays inside the dtype's tolerance; none decides a condition",
             f"{fast} round differently from {names}: the step is reassociating (verified close, not exact)")
    summary = (f" Each {names} call becomes {fast} (polynomials in plain arithmetic), so the lanes compute it as "
               "vector code instead of one scalar library call per element.")
    return facts, summary


@params_dataclass
class VectorParams(Params):
    """`width`: the loop is split by it first, its inner loop vectorised; `partials`: a reduction axis
    whose lanes keep `width` partial results; `exp`/`math`: `fast` computes exp (exp, log and erf) in
    their vectorisable fast forms."""

    width: int | None = None
    partials: bool | None = None
    exp: Literal["fast"] | None = None
    math: Literal["fast"] | None = None


@register
class LoopVectorization(LoopRule):
    name = "loop_vectorization"
    description = ("Vectorize the innermost spatial loop of a nest on the CPU (V); a long loop is split first "
                   "(`width`), and `exp` below it may become the vectorisable `fast_exp` (`exp: fast`; with "
                   "`math: fast` also log and erf as `fast_log`, `fast_erf`: reassociating variants, close, "
                   "never bitwise equal).")
    targets = ("llvm",)  # SIMD lanes of the CPU; on CUDA the parallel axis is the thread binding
    search_prior = 8.0
    params_type = VectorParams

    def promise(self, t):
        """exp (log, erf) as vector code instead of scalar libm calls promises more."""
        fast = "fast" in (t.params.get("exp"), t.params.get("math"))
        return self.search_prior + (1.5 if fast else 0.0)

    def recognizes(self, before, after, signature):
        """More vector loops, as many unrolled and parallel ones, and no more bound ones than new
        nests (each nest of the published form starts with its bound loop). The extents may change: a
        width splits its loop first, and vector partial sums add a loop and a nest that combines them."""
        added_nests = max(0, len(after.nests) - len(before.nests))
        return (rec.kind_count(after, "V") > rec.kind_count(before, "V")
                and all(rec.kind_count(after, k) == rec.kind_count(before, k) for k in "UP")
                and rec.kind_count(after, "B") - rec.kind_count(before, "B") <= added_nests)

    def takes(self, ctx, nest, k):
        lp = nest.loops[k]
        innermost = k == len(nest.loops) - 1 and all(isinstance(i, Stmt) for i in nest.body)
        return innermost and lp.kind == "L" and lp.extent >= 2 and (
            lp.extent <= MAX_VECTOR or any(lp.extent % w == 0 for w in VECTOR_WIDTHS))

    def parameters(self, ctx, site):
        nest = get_item(ctx.program, site.nest, site.path)
        lp = nest.loops[site.match.loop_index]
        called = {n.fn for s in body_statements(nest) for n in walk_expr(s[0].rhs) if isinstance(n, Call)}
        # exp alone: `exp: fast`; log or erf too: `math: fast` (exp, log and erf in their fast forms)
        fast = {"math": "fast"} if called & {"log", "erf"} else {"exp": "fast"} if "exp" in called else None
        widths = [{}] if lp.extent <= MAX_VECTOR else []
        widths += [{"width": w} for w in VECTOR_WIDTHS if lp.extent % w == 0 and w < lp.extent]
        if not site.path and len(nest.body) == 1 and isinstance(nest.body[0], Stmt) \
                and reduction_op(nest.body[0]) is not None and lp.var not in lhs_vars(nest.body[0]):
            # a reduction axis: the lanes keep `width` partial results, combined after the loop
            widths = [{"width": w["width"], "partials": True} for w in widths if "width" in w]
        for w in widths:
            yield w
            if fast:
                yield {**w, **fast}

    def check_loop(self, ctx, site, nest, k, params):
        if params.partials:
            return self._partials_problem(ctx, site, k, params)
        lp = nest.loops[k]
        if params.width is not None and (not 1 < params.width < lp.extent or lp.extent % params.width):
            return f"{params.width} does not properly divide the extent {lp.extent}"
        nest, k, stmts = self._lanes(ctx, site, nest, k, params)
        lp = nest.loops[k]
        reason = (unhelpful(ctx, one_iteration_problem(lp, "vector"))
                  or (f"{lp.extent} lanes are more than {MAX_VECTOR}: split the loop first"
                      if lp.extent > MAX_VECTOR else None)
                  or loop_carries_dependence(stmts, lp.var)
                  or ("an enclosing loop is already vectorized"
                      if any(x.kind == "V" for x in enclosing_loops(ctx.program, site.nest, site.path) + nest.loops[:k])
                      else None))
        fns = fast_math_variant(params)
        return reason or (fast_math_problem(stmts, fns) if fns else None)

    def _lanes(self, ctx, site, nest, k, params) -> tuple[Nest, int, list]:
        """(the band with the loop split by `width` when given, the position of the lane loop, the
        statements under it)."""
        if params.width is not None:
            nest, k = split_loop(nest, k, params.width, fresh_indices(ctx.program).fresh()), k + 1
        stmts = statements_under(replace_item(ctx.program, site.nest, site.path, (nest,)), site.nest, site.path,
                                 nest, k)
        return nest, k, stmts

    def build_loop(self, ctx, site, nest, k, params):
        if params.partials:
            return self._partials(ctx, site, k, params)
        nest, k, stmts = self._lanes(ctx, site, nest, k, params)
        lp = nest.loops[k]
        new = with_loop(nest, k, Loop("V", lp.extent, lp.var, lp.start))
        facts, summary = self._facts(nest, k, params.width, stmts), self._summary(lp, stmts)
        fns = fast_math_variant(params)
        if fns:  # fast_exp is close to exp, never bitwise equal (the same for log and erf)
            more_facts, more_summary = fast_math_text(fns, stmts)
            return in_band(ctx, site, fast_forms(new, fns), facts + more_facts, summary + more_summary,
                           "reassociating")
        return in_band(ctx, site, new, facts, summary)

    def _facts(self, nest: Nest, k: int, width: int | None, stmts) -> tuple[str, ...]:
        lp = nest.loops[k]
        facts = (f"{lp.var} is the innermost loop and a spatial axis of every statement below it",
                 f"the extent {lp.extent} is small (at most {MAX_VECTOR}) and the target is the CPU",
                 f"no statement reads an element that another iteration of {lp.var} writes")
        if width is not None:
            facts = (f"{width} divides the extent {width * nest.loops[k - 1].extent}, so the split loop "
                     f"{nest.loops[k - 1].var}*{width}+{lp.var} enumerates every iteration once, in order",) + facts
        return facts

    def _summary(self, lp: Loop, stmts) -> str:
        unit = [s.lhs.tensor for s, _ in stmts if s.lhs.indices and s.lhs.indices[-1] == Var(lp.var)]
        stride = f"; {', '.join(unit)} is written with stride 1" if unit else ""
        return f"The {lp.extent} iterations of {lp.var} run as SIMD lanes{stride}."

    def _partials_problem(self, ctx, site, k, params) -> str | None:
        nest = ctx.program.nests[site.nest]
        if site.path or k != len(nest.loops) - 1:
            return "only the innermost loop of a top-level reduction nest is vectorised with partials"
        if params.width is None:
            return "partial results need a width (the lanes that keep them)"
        reason = factor_reduction_problem(ctx, site.nest, k, params.width)
        if reason:
            return reason
        partial = factor_reduction(ctx, site.nest, k, params.width).program.nests[site.nest]
        stmts = body_statements(partial)
        fns = fast_math_variant(params)
        return loop_carries_dependence(stmts, partial.loops[-1].var) or (fast_math_problem(stmts, fns) if fns else None)

    def _partials(self, ctx, site, k, params) -> Rewrite:
        """Vectorise a reduction axis: rfactor by `width` (the partial results per lane in a new
        tensor, then a short combining nest), the partial nest's lane loop marked V."""
        rf = factor_reduction(ctx, site.nest, k, params.width)
        partial = rf.program.nests[site.nest]
        lane = partial.loops[-1]
        stmts = body_statements(partial)
        new = with_loop(partial, len(partial.loops) - 1, Loop("V", lane.extent, lane.var, lane.start))
        facts = factored_facts(rf) + (f"the lanes of {lane.var} accumulate into distinct partial results, so the "
                                      "partial nest's innermost loop carries no dependence",)
        summary = (f"The reduction over {lane.var} keeps {lane.extent} partial results, one per SIMD lane, "
                   f"updated as vector code, then combined in a short nest of {lane.extent} terms per element.")
        fns = fast_math_variant(params)
        if fns:
            more_facts, more_summary = fast_math_text(fns, stmts)
            new, facts, summary = fast_forms(new, fns), facts + more_facts, summary + more_summary
        # partial sums reassociate the reduction
        return Rewrite(replace_nests(rf.program, site.nest, 1, (new,)), facts, summary, "reassociating")


# --- loop_binding -------------------------------------------------------------------------------------------

def _bound_loops(nest: Nest) -> list[Loop]:
    out = [lp for lp in nest.loops if lp.kind == "B"]
    for item in nest.body:
        if isinstance(item, Nest):
            out += _bound_loops(item)
    return out


@params_dataclass
class BindParams(Params):
    axis: str   # the CUDA index: tx, ty, tz (threads) or bx, by, bz (blocks)


@register
class LoopBinding(LoopRule):
    name = "loop_binding"
    description = "Bind a loop with independent iterations to a CUDA thread or block index (B)."
    targets = ("cuda",)  # binding only means something on a GPU
    search_prior = 0.5
    params_type = BindParams

    def recognizes(self, before, after, signature):
        """More loops bound to GPU threads over the same extents."""
        return rec.more_of_kind(before, after, "B")

    def takes(self, ctx, nest, k):
        return nest.loops[k].kind in ("L", "P")

    def parameters(self, ctx, site):
        used = {lp.var[:2] for lp in _bound_loops(ctx.program.nests[site.nest])}
        for prefix in BIND_PREFIXES:
            if prefix not in used:
                yield {"axis": prefix}

    def check_loop(self, ctx, site, nest, k, params):
        lp, axis = nest.loops[k], params.axis
        if axis not in BIND_PREFIXES:
            return f"{axis} is not a CUDA index ({', '.join(BIND_PREFIXES)})"
        bound = _bound_loops(ctx.program.nests[site.nest])
        threads = self._threads(bound, lp, axis)
        return (unhelpful(ctx, one_iteration_problem(lp, "bound"))
                or (f"{axis} is already bound in this nest" if axis in {b.var[:2] for b in bound} else None)
                or (f"a block would have {threads} threads (at most {MAX_THREADS})"
                    if threads > MAX_THREADS or (axis == "tz" and lp.extent > 64) else None)
                or loop_carries_dependence(statements_under(ctx.program, site.nest, site.path, nest, k), lp.var))

    def _threads(self, bound: list[Loop], lp: Loop, axis: str) -> int:
        return iterations(b for b in bound if b.var[0] == "t") * (lp.extent if axis[0] == "t" else 1)

    def build_loop(self, ctx, site, nest, k, params):
        lp, axis = nest.loops[k], params.axis
        threads = self._threads(_bound_loops(ctx.program.nests[site.nest]), lp, axis)
        name = bind_name(axis, loop_vars(ctx.program))
        renamed = substitute_in_nest(Nest(nest.loops[k + 1:], nest.body), {lp.var: Var(name)})
        new = Nest(nest.loops[:k] + (Loop("B", lp.extent, name, lp.start),) + renamed.loops, renamed.body)
        kind = "thread" if axis[0] == "t" else "block"
        facts = (f"iterations of {lp.var} write distinct elements and read no element another iteration writes",
                 f"{axis} is not yet bound in this nest; the block has {threads} threads (at most {MAX_THREADS})",
                 "the target is a GPU (CUDA)")
        summary = (f"The {lp.extent} iterations of {lp.var} run on {lp.extent} GPU {kind}s ({name}) at once "
                   "instead of one after another.")
        return in_band(ctx, site, new, facts, summary)


def _stride_one_innermost(t) -> bool:
    """The step's nest now ends in a loop whose index is the last subscript of what it writes."""
    for site in statement_sites(t.after):
        if site.nest_index == t.site.nest and site.loops:
            last = site.stmt.lhs.indices[-1] if site.stmt.lhs.indices else None
            if last == Var(site.loops[-1].var):
                return True
    return False
