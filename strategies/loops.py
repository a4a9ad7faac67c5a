"""Operator-level strategies: loop transformations on one nest (or two adjacent nests).

Legality rests on one fact (`legality.carrying_loops`): a loop whose iterations do not interact can
move anywhere in its band; the loops that carry a dependence (a reduction axis, a scan, a repeated
store) must keep their relative order. Keeping that order also keeps the order in which each
accumulator element is updated, so reordering, splitting and tiling are bitwise exact.
"""
from __future__ import annotations

from collections.abc import Iterator
from itertools import product

from leir.analysis import contraction_contexts, is_product, lhs_vars, reduction_op
from leir.ast import BinOp, Call, Loop, Nest, Num, Program, Stmt, Var, accesses, map_stmt, walk_expr
from leir.names import BIND_PREFIXES, bind_name
from strategies.base import Context, Illegal, Rewrite, Site, Strategy
from strategies.legality import (
    accumulated_terms,
    body_statements,
    carrying_loops,
    iterations,
    keeps_relative_order,
    loop_carries_dependence,
    merged_subscript_vars,
    misaligned,
    written_tensors,
)
from strategies.numerics import sum_drift_problem
from strategies.registry import register
from strategies.tree import (
    enclosing_loops,
    fresh_indices,
    fresh_tensors,
    get_item,
    loop_vars,
    map_nest_stmts,
    rename_vars_in_nest,
    replace_item,
)

MAX_FACTORS = 8        # divisors tried per split loop
MAX_TILES = 12         # factor pairs tried per tiled loop pair
MAX_ORDERS = 16        # loop pairs swapped per band
MAX_UNROLL = 16        # largest extent unrolled
MAX_UNROLL_BODY = 512  # copies of the innermost body an unrolled loop may create
MAX_VECTOR = 64        # largest extent vectorized
MAX_THREADS = 1024     # CUDA threads per block


def loop_positions(ctx: Context) -> Iterator[tuple[int, tuple[int, ...], int, Nest, tuple[Loop, ...]]]:
    """(top nest, path to the nest, loop position, nest, enclosing loops) for every loop, program order."""
    for top, path, nest, outer in bands(ctx.program):
        for k in range(len(nest.loops)):
            yield top, path, k, nest, outer


def bands(program: Program) -> Iterator[tuple[int, tuple[int, ...], Nest, tuple[Loop, ...]]]:
    """(top nest, path, nest, enclosing loops) for every nest, nested ones included, program order."""
    def visit(top, path, nest, outer):
        yield top, path, nest, outer
        for i, item in enumerate(nest.body):
            if isinstance(item, Nest):
                yield from visit(top, path + (i,), item, outer + nest.loops)

    for top, nest in enumerate(program.nests):
        yield from visit(top, (), nest, ())


def with_loop(nest: Nest, k: int, loop: Loop) -> Nest:
    return Nest(nest.loops[:k] + (loop,) + nest.loops[k + 1:], nest.body)


def divisors(n: int) -> list[int]:
    """Proper divisors of n (1 < d < n), ascending."""
    return [d for d in range(2, n) if n % d == 0]


# Factors tried first: SIMD widths of float32 (AVX-512, two registers, AVX2) and cache-sized blocks;
# the enumeration caps (MAX_FACTORS, MAX_TILES) keep the best-placed variants, not the smallest ones.
PREFERRED_FACTORS = (16, 32, 8, 4, 64, 2)


def by_preference(factors: list[int]) -> list[int]:
    """`factors` in PREFERRED_FACTORS order, the others after them, ascending."""
    return sorted(factors, key=lambda f: (PREFERRED_FACTORS.index(f) if f in PREFERRED_FACTORS else 99, f))


def _factor_rank(f: int) -> int:
    return PREFERRED_FACTORS.index(f) if f in PREFERRED_FACTORS else len(PREFERRED_FACTORS) + f


def substitute_in_nest(nest: Nest, mapping: dict) -> Nest:
    return map_nest_stmts(nest, lambda s: map_stmt(s, lambda n: mapping.get(n.name, n)
                                                   if isinstance(n, Var) else n))


def split_loop(nest: Nest, k: int, factor: int, outer_var: str) -> Nest:
    """Loop k of `nest` split into an outer loop `outer_var` (extent/factor) and an inner loop that
    keeps the name and kind (a parallel loop stays parallel outside); v -> outer*factor + v."""
    lp = nest.loops[k]
    outer_kind = "P" if lp.kind == "P" else "L"
    inner_kind = "L" if lp.kind == "P" else lp.kind
    outer = Loop(outer_kind, lp.extent // factor, outer_var)
    inner = Loop(inner_kind, factor, lp.var)
    index = BinOp("+", BinOp("*", Var(outer_var), Num(factor)), Var(lp.var))
    if lp.start:
        index = BinOp("+", index, Num(lp.start))
    body = substitute_in_nest(Nest((), nest.body), {lp.var: index}).body
    return Nest(nest.loops[:k] + (outer, inner) + nest.loops[k + 1:], body)


def band_carries(program: Program, top: int, path: tuple[int, ...], nest: Nest) -> list[str]:
    stmts = body_statements(nest, enclosing_loops(program, top, path))
    return carrying_loops(stmts, nest.loops)


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


def nest_text_loops(nest: Nest) -> str:
    return "".join(f"{lp.var}({lp.extent})" for lp in nest.loops)


@register
class LoopReorder(Strategy):
    name = "loop_reorder"
    level = "operator"
    exactness = "exact"
    description = "Interchange two loops of a nest when no dependence is reversed."

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

    def rewrite(self, ctx, site, params):
        nest = get_item(ctx.program, site.nest, site.path)
        names = [lp.var for lp in nest.loops]
        loops = list(nest.loops)
        if "move" in params:
            i, j = names.index(params["move"]), int(params["to"])
            if not 0 <= j < len(loops) or abs(i - j) < 2:
                raise Illegal("a move goes two or more places inside the band (one place is a swap)")
            loops.insert(j, loops.pop(i))
            between = nest.loops[min(i, j):max(i, j) + 1]
            moved = [params["move"]] + [lp.var for lp in between if lp.var != params["move"]]
        else:
            i, j = (names.index(v) for v in params["swap"])
            loops[i], loops[j] = loops[j], loops[i]
            moved = list(params["swap"])
        new_order = [lp.var for lp in loops]
        if ctx.gpu and [lp.var for lp in loops if lp.kind == "B"] != [lp.var for lp in nest.loops if lp.kind == "B"]:
            raise Illegal("thread-bound loops stay where they are on CUDA")
        carry = band_carries(ctx.program, site.nest, site.path, nest)
        if not keeps_relative_order(names, new_order, carry):
            raise Illegal(f"{', '.join(moved)} include two loops that carry dependences (e.g. two reduction "
                          "axes); exchanging them would change the order of the updates")
        if any(lp.kind == "V" for lp in loops[:-1]):
            raise Illegal("the vectorized loop must stay innermost")
        new = Nest(tuple(loops), nest.body)
        a, b = nest.loops[i], nest.loops[j]
        how = (f"Moving {a.var} (extent {a.extent}) to position {j + 1}" if "move" in params else
               f"Swapping {a.var} (extent {a.extent}) and {b.var} (extent {b.extent})")
        effect = (f"{how} changes the traversal from {nest_text_loops(nest)} to {nest_text_loops(new)}, which "
                  "changes which subscripts vary fastest (stride-1 access and reuse in the innermost loop).")
        return Rewrite(replace_item(ctx.program, site.nest, site.path, (new,)),
                       reorder_facts(carry, names, new_order), effect)


@register
class LoopSplit(Strategy):
    name = "loop_split"
    level = "operator"
    exactness = "exact"
    description = "Split a loop into an outer and an inner loop (v = outer*factor + inner)."

    def sites(self, ctx):
        for top, path, k, nest, _ in loop_positions(ctx):
            if divisors(nest.loops[k].extent):
                yield Site(top, path, loops=(nest.loops[k].var,), extra=(("loop_index", k),))

    def parameters(self, ctx, site):
        nest = get_item(ctx.program, site.nest, site.path)
        k = dict(site.extra)["loop_index"]
        for f in by_preference(divisors(nest.loops[k].extent))[:MAX_FACTORS]:
            yield {"factor": f}

    def rewrite(self, ctx, site, params):
        nest = get_item(ctx.program, site.nest, site.path)
        k, f = dict(site.extra)["loop_index"], params["factor"]
        lp = nest.loops[k]
        if f <= 1 or lp.extent % f or f >= lp.extent:
            raise Illegal(f"{f} is not a proper divisor of the extent {lp.extent}")
        outer = fresh_indices(ctx.program).fresh()
        new = split_loop(nest, k, f, outer)
        facts = (f"{f} divides the extent {lp.extent} exactly, so {outer}*{f}+{lp.var} enumerates 0..{lp.extent - 1} "
                 "once each, in the original order",)
        effect = (f"Loop {lp.var} (extent {lp.extent}) becomes {outer} ({lp.extent // f}) x {lp.var} ({f}): an "
                  f"inner block of {f} iterations that can later be vectorized, unrolled or bound, or "
                  "reordered for locality.")
        return Rewrite(replace_item(ctx.program, site.nest, site.path, (new,)), facts, effect)


@register
class LoopTiling(Strategy):
    name = "loop_tiling"
    level = "operator"
    exactness = "exact"
    description = "Tile two adjacent loops: split both and move the tile loops outside the point loops."

    def sites(self, ctx):
        for top, path, nest, _ in bands(ctx.program):
            for k in range(len(nest.loops) - 1):
                a, b = nest.loops[k], nest.loops[k + 1]
                if divisors(a.extent) and divisors(b.extent):
                    yield Site(top, path, loops=(a.var, b.var), extra=(("loop_index", k),))

    def parameters(self, ctx, site):
        nest = get_item(ctx.program, site.nest, site.path)
        k = dict(site.extra)["loop_index"]
        pairs = list(product(divisors(nest.loops[k].extent), divisors(nest.loops[k + 1].extent)))
        order = sorted(range(len(pairs)), key=lambda i: (_factor_rank(pairs[i][0]) + _factor_rank(pairs[i][1]), i))
        for fa, fb in [pairs[i] for i in order][:MAX_TILES]:
            yield {"factors": [fa, fb]}

    def rewrite(self, ctx, site, params):
        nest = get_item(ctx.program, site.nest, site.path)
        k = dict(site.extra)["loop_index"]
        fa, fb = params["factors"]
        a, b = nest.loops[k], nest.loops[k + 1]
        if a.extent % fa or b.extent % fb or not (1 < fa < a.extent and 1 < fb < b.extent):
            raise Illegal("tile sizes must be proper divisors of the extents")
        names = fresh_indices(ctx.program)
        ao, bo = names.fresh(), names.fresh()
        split = split_loop(split_loop(nest, k + 1, fb, bo), k, fa, ao)  # ao a bo b
        loops = list(split.loops)
        loops[k + 1], loops[k + 2] = loops[k + 2], loops[k + 1]          # ao bo a b
        old_order = [lp.var for lp in split.loops]
        new_order = [lp.var for lp in loops]
        probe = replace_item(ctx.program, site.nest, site.path, (split,))
        carry = band_carries(probe, site.nest, site.path, split)
        if not keeps_relative_order(old_order, new_order, carry):
            raise Illegal(f"{a.var} and {b.var} both carry dependences: moving the tile loop {bo} outside "
                          f"{a.var} would reorder the updates")
        new = Nest(tuple(loops), split.body)
        facts = (f"{fa} divides {a.extent} and {fb} divides {b.extent}",) + reorder_facts(carry, old_order, new_order)
        effect = (f"The {a.extent}x{b.extent} iteration space of {a.var},{b.var} is walked in {fa}x{fb} tiles "
                  f"({a.extent // fa}x{b.extent // fb} of them), so the data a tile touches stays in cache "
                  "while it is reused.")
        return Rewrite(replace_item(ctx.program, site.nest, site.path, (new,)), facts, effect)


@register
class LoopFusion(Strategy):
    name = "loop_fusion"
    level = "operator"
    exactness = "exact"
    description = "Fuse the common outer loops of two adjacent nests into one loop nest."

    def sites(self, ctx):
        nests = ctx.program.nests
        for i in range(len(nests) - 1):
            if common_depth(nests[i], nests[i + 1]):
                yield Site(i, loops=tuple(lp.var for lp in nests[i].loops[:common_depth(nests[i], nests[i + 1])]),
                           extra=(("nests", [i, i + 1]),))

    def parameters(self, ctx, site):
        nests = ctx.program.nests
        for depth in range(1, common_depth(nests[site.nest], nests[site.nest + 1]) + 1):
            yield {"depth": depth}

    def rewrite(self, ctx, site, params):
        fused, facts, effect, exactness = fuse_nests(ctx.program, site.nest, params["depth"])
        program = Program(ctx.program.nests[:site.nest] + (fused,) + ctx.program.nests[site.nest + 2:])
        return Rewrite(program, facts, effect, exactness)


def common_depth(a: Nest, b: Nest) -> int:
    """How many leading loops two nests share (same kind and extent; bound loops the same binding)."""
    depth = 0
    for la, lb in zip(a.loops, b.loops, strict=False):
        if la.kind != lb.kind or la.extent != lb.extent or la.start != lb.start:
            break
        if la.kind == "B" and la.var != lb.var:
            break
        depth += 1
    return depth


def fuse_nests(program: Program, i: int, depth: int) -> tuple[Nest, tuple[str, ...], str, str | None]:
    """Nests i and i+1 fused over their first `depth` loops, with the legality facts, the effect and
    "reassociating" where the fusion changes rounding (else None); raises Illegal when a dependence
    between them would be reversed."""
    a, b = program.nests[i], program.nests[i + 1]
    if depth < 1 or depth > common_depth(a, b):
        raise Illegal("the nests do not share that many loops")
    shared = a.loops[:depth]
    mapping = {lb.var: la.var for la, lb in zip(shared, b.loops[:depth], strict=True)}
    fresh = fresh_indices(program)
    taken = {lp.var for lp in shared}
    for lb in b.loops[depth:]:
        if lb.var in taken:
            mapping[lb.var] = fresh.fresh()
    b = rename_vars_in_nest(b, mapping)
    first = body_statements(a)
    second = body_statements(b)
    reason = misaligned(first, second, [lp.var for lp in shared])
    if reason:
        raise Illegal(reason)
    for lp in shared:
        if lp.kind in ("P", "V"):  # such a loop must stay free of carried dependences (LEIR.md §4.1)
            why = loop_carries_dependence(first + second, lp.var)
            if why:
                raise Illegal(f"the fused {lp.kind} loop {lp.var} would carry a dependence: {why}")
    body = part(a, depth) + part(b, depth)
    fused = Nest(shared, body)
    common = [t for t in written_tensors(first) if t in {x for s, _ in second for x in _names(s)}]
    facts = (f"the nests share {depth} loop{'s' if depth > 1 else ''} "
             f"({', '.join(f'{lp.var}:{lp.extent}' for lp in shared)}) with the same extents and kinds",
             "every element one nest writes and the other accesses is accessed at the same iteration of "
             "the shared loops, and within an iteration the first nest's part still runs first",
             "statement order is unchanged, so implicit initialisations stay as they were")
    reuse = f"; {', '.join(common)} is produced and consumed in the same iteration" if common else ""
    effect = (f"One pass over {iterations(shared)} iterations of {', '.join(lp.var for lp in shared)} instead of "
              f"two{reuse}, which saves loop overhead and improves locality.")
    contracted = contracted_products(first, second)
    if contracted:
        facts = facts + (f"{', '.join(contracted)} is a product added to another value in the same iteration: "
                         "the compiler forwards it from the store and fuses the multiply-add (one rounding "
                         "instead of two), so the results agree within rounding, not bit for bit",)
    return fused, facts, effect, "reassociating" if contracted else None


def contracted_products(first, second) -> list[str]:
    """Tensors that the first part stores as a product and the second part adds to something: once
    both run in one iteration, LLVM replaces the load by the stored value and contracts the multiply
    and the add into an FMA, which rounds once where the two nests rounded twice."""
    products = {s.lhs.tensor for s, _ in first if is_product(s.rhs)}
    return list(dict.fromkeys(a.tensor for s, _ in second for a in accesses(s.rhs)
                              if a.tensor in products and contraction_contexts(s.rhs, a)))


def _names(stmt: Stmt) -> list[str]:
    from leir.ast import accesses

    return [stmt.lhs.tensor] + [a.tensor for a in accesses(stmt.rhs)]


def part(nest: Nest, depth: int) -> tuple:
    """The body items a nest contributes when its first `depth` loops are fused away."""
    if depth == len(nest.loops):
        return nest.body
    return (Nest(nest.loops[depth:], nest.body),)


def _under(ctx: Context, site_nest: int, path, nest: Nest, k: int):
    outer = enclosing_loops(ctx.program, site_nest, path) + nest.loops[:k + 1]
    return body_statements(Nest(nest.loops[k + 1:], nest.body), outer)


@register
class LoopUnrolling(Strategy):
    name = "loop_unrolling"
    level = "operator"
    exactness = "exact"
    description = "Unroll a serial loop with a small extent (U)."

    def sites(self, ctx):
        for top, path, k, nest, _outer in loop_positions(ctx):
            lp = nest.loops[k]
            if lp.kind == "L" and 2 <= lp.extent <= MAX_UNROLL:
                yield Site(top, path, loops=(lp.var,), extra=(("loop_index", k),))

    def rewrite(self, ctx, site, params):
        nest = get_item(ctx.program, site.nest, site.path)
        k = dict(site.extra)["loop_index"]
        lp = nest.loops[k]
        outer = enclosing_loops(ctx.program, site.nest, site.path) + nest.loops[:k]
        copies = lp.extent * iterations(tuple(x for x in outer if x.kind == "U"))
        body = lp.extent * _body_iterations(Nest(nest.loops[k + 1:], nest.body))
        if lp.kind != "L" or lp.extent > MAX_UNROLL or body > MAX_UNROLL_BODY:
            raise Illegal(f"unrolling {lp.var} would copy the body {body} times")
        new = with_loop(nest, k, Loop("U", lp.extent, lp.var, lp.start))
        facts = (f"the extent {lp.extent} is a small constant (at most {MAX_UNROLL})",
                 f"the unrolled code holds {body} copies of the innermost body (at most {MAX_UNROLL_BODY}), "
                 f"{copies} counting enclosing unrolled loops",
                 "unrolling keeps the execution order, so it cannot change a result")
        effect = (f"The {lp.extent} iterations of {lp.var} are written out: no loop counter or branch per "
                  "iteration, and the compiler can schedule the copies together.")
        return Rewrite(replace_item(ctx.program, site.nest, site.path, (new,)), facts, effect)


def _body_iterations(nest: Nest) -> int:
    inner = [_body_iterations(i) for i in nest.body if isinstance(i, Nest)]
    return iterations(nest.loops) * max([1] + inner)


VECTOR_WIDTHS = (16, 8, 32)   # lanes of a split-off vector loop: float32 in AVX-512, AVX2, two registers
FAST_EXP_DTYPES = ("f32", "f16", "bf16")  # where fast_exp's float32 error (~2e-7) is within the tolerance


@register
class LoopVectorization(Strategy):
    name = "loop_vectorization"
    level = "operator"
    exactness = "exact"
    description = ("Vectorize the innermost spatial loop of a nest on the CPU (V); a long loop is split first "
                   "(`width`), and `exp` below it may become the vectorisable `fast_exp` (`exp: fast`, "
                   "a reassociating variant: close, never bitwise equal).")

    def sites(self, ctx):
        if ctx.gpu:
            return  # on CUDA the parallel axis is the thread binding
        for top, path, k, nest, _ in loop_positions(ctx):
            innermost = k == len(nest.loops) - 1 and all(isinstance(i, Stmt) for i in nest.body)
            lp = nest.loops[k]
            if innermost and lp.kind == "L" and lp.extent >= 2 and (
                    lp.extent <= MAX_VECTOR or any(lp.extent % w == 0 for w in VECTOR_WIDTHS)):
                yield Site(top, path, loops=(lp.var,), extra=(("loop_index", k),))

    def parameters(self, ctx, site):
        nest = get_item(ctx.program, site.nest, site.path)
        lp = nest.loops[dict(site.extra)["loop_index"]]
        has_exp = any(isinstance(n, Call) and n.fn == "exp" for s in body_statements(nest)
                      for n in walk_expr(s[0].rhs))
        widths = [{}] if lp.extent <= MAX_VECTOR else []
        widths += [{"width": w} for w in VECTOR_WIDTHS if lp.extent % w == 0 and w < lp.extent]
        if not site.path and len(nest.body) == 1 and isinstance(nest.body[0], Stmt) \
                and reduction_op(nest.body[0]) is not None and lp.var not in lhs_vars(nest.body[0]):
            # a reduction axis: the lanes keep `width` partial results, combined after the loop
            widths = [{"width": w["width"], "partials": True} for w in widths if "width" in w]
        for w in widths:
            yield w
            if has_exp:
                yield {**w, "exp": "fast"}

    def _partials(self, ctx, site, params) -> Rewrite:
        """Vectorise a reduction axis: rfactor by `width` (the partial results per lane in a new
        tensor, then a short combining nest), the partial nest's lane loop marked V."""
        nest = ctx.program.nests[site.nest]
        k = dict(site.extra)["loop_index"]
        if site.path or k != len(nest.loops) - 1:
            raise Illegal("only the innermost loop of a top-level reduction nest is vectorised with partials")
        order = next(s.order for s in ctx.sites if s.nest_index == site.nest)
        stmt = nest.body[0]
        rf_site = Site(site.nest, loops=(nest.loops[k].var,), stmts=(order,), tensors=(stmt.lhs.tensor,),
                       extra=(("loop_index", k),))
        rf = ReductionFactorization().rewrite(ctx, rf_site, {"factor": params["width"]})
        partial = rf.program.nests[site.nest]
        lane = partial.loops[-1]
        stmts = body_statements(partial)
        reason = loop_carries_dependence(stmts, lane.var)
        if reason:
            raise Illegal(reason)
        new = with_loop(partial, len(partial.loops) - 1, Loop("V", lane.extent, lane.var, lane.start))
        facts = rf.facts + (f"the lanes of {lane.var} accumulate into distinct partial results, so the "
                            "partial nest's innermost loop carries no dependence",)
        effect = (f"The reduction over {lane.var} keeps {lane.extent} partial results, one per SIMD lane, "
                  f"updated as vector code, then combined in a short nest of {lane.extent} terms per element.")
        if params.get("exp") == "fast":
            new, more, why = fast_exp_below(new, stmts)
            facts += more
            effect += why
        program = Program(rf.program.nests[:site.nest] + (new,) + rf.program.nests[site.nest + 1:])
        return Rewrite(program, facts, effect, "reassociating")  # partial sums reassociate the reduction

    def rewrite(self, ctx, site, params):
        if ctx.gpu:
            raise Illegal("vector loops have no meaning inside a CUDA kernel")
        if params.get("partials"):
            return self._partials(ctx, site, params)
        nest = get_item(ctx.program, site.nest, site.path)
        k = dict(site.extra)["loop_index"]
        width = params.get("width")
        if width is not None:
            lp = nest.loops[k]
            if lp.extent % width or not 1 < width < lp.extent:
                raise Illegal(f"{width} does not properly divide the extent {lp.extent}")
            outer_var = fresh_indices(ctx.program).fresh()
            nest = split_loop(nest, k, width, outer_var)
            k += 1
        lp = nest.loops[k]
        if lp.extent > MAX_VECTOR:
            raise Illegal(f"{lp.extent} lanes are more than {MAX_VECTOR}: split the loop first")
        probe = replace_item(ctx.program, site.nest, site.path, (nest,))
        stmts = _under(ctx.with_program(probe), site.nest, site.path, nest, k)
        reason = loop_carries_dependence(stmts, lp.var)
        if reason:
            raise Illegal(reason)
        outer = enclosing_loops(ctx.program, site.nest, site.path) + nest.loops[:k]
        if any(x.kind == "V" for x in outer):
            raise Illegal("an enclosing loop is already vectorized")
        new = with_loop(nest, k, Loop("V", lp.extent, lp.var, lp.start))
        unit = [s.lhs.tensor for s, _ in stmts if s.lhs.indices and s.lhs.indices[-1] == Var(lp.var)]
        facts = (f"{lp.var} is the innermost loop and a spatial axis of every statement below it",
                 f"the extent {lp.extent} is small (at most {MAX_VECTOR}) and the target is the CPU",
                 f"no statement reads an element that another iteration of {lp.var} writes")
        if width is not None:
            facts = (f"{width} divides the extent {width * nest.loops[k - 1].extent}, so the split loop "
                     f"{nest.loops[k - 1].var}*{width}+{lp.var} enumerates every iteration once, in order",) + facts
        stride = f"; {', '.join(unit)} is written with stride 1" if unit else ""
        effect = f"The {lp.extent} iterations of {lp.var} run as SIMD lanes{stride}."
        if params.get("exp") == "fast":
            new, more, why = fast_exp_below(new, stmts)
            facts += more
            effect += why
        # fast_exp is close to exp, never bitwise equal
        return Rewrite(replace_item(ctx.program, site.nest, site.path, (new,)), facts, effect,
                       "reassociating" if params.get("exp") == "fast" else None)


def fast_exp_below(nest: Nest, stmts) -> tuple[Nest, tuple[str, ...], str]:
    """Every `exp` of the nest's statements as `fast_exp`; Illegal where a close result is not enough."""
    for stmt, _ in stmts:
        calls = [n for n in walk_expr(stmt.rhs) if isinstance(n, Call) and n.fn == "exp"]
        if not calls:
            continue
        if stmt.lhs.dtype not in FAST_EXP_DTYPES:
            raise Illegal(f"{stmt.lhs.tensor} is {stmt.lhs.dtype}: fast_exp carries float32's error (about 2e-7 "
                          "relative), beyond what this result is held to (an exact or float64 result)")
        if any(isinstance(c, Call) and c.fn == "exp" for cond in _conditions(stmt.rhs) for c in walk_expr(cond)):
            raise Illegal("an exp decides a condition: a close value could flip the branch")
    if not any(isinstance(n, Call) and n.fn == "exp" for stmt, _ in stmts for n in walk_expr(stmt.rhs)):
        raise Illegal("no exp below the loop")
    swapped = map_nest_stmts(nest, lambda s: map_stmt(s, lambda n: Call("fast_exp", n.args)
                                                      if isinstance(n, Call) and n.fn == "exp" else n))
    facts = ("every exp below the vector loop computes a float32 (or narrower) result, where fast_exp's relative "
             "error of about 2e-7 stays inside the dtype's tolerance; no exp decides a condition",
             "fast_exp rounds differently from exp: the step is reassociating (verified close, not exact)")
    why = (" Each exp becomes fast_exp (range reduction and a polynomial in plain arithmetic), so the lanes "
           "compute it as vector code instead of one scalar expf call per element.")
    return swapped, facts, why


def _conditions(expr):
    from leir.ast import Select

    return [n.cond for n in walk_expr(expr) if isinstance(n, Select)]


@register
class LoopParallelization(Strategy):
    name = "loop_parallelization"
    level = "operator"
    exactness = "exact"
    description = "Mark a serial loop whose iterations are independent as parallel (P)."

    def sites(self, ctx):
        # On the CPU a bound (B) loop is a serial loop: it can become parallel too (with an index name).
        kinds = ("L",) if ctx.gpu else ("L", "B")
        for top, path, k, nest, _outer in loop_positions(ctx):
            if nest.loops[k].kind in kinds:
                yield Site(top, path, loops=(nest.loops[k].var,), extra=(("loop_index", k),))

    def rewrite(self, ctx, site, params):
        nest = get_item(ctx.program, site.nest, site.path)
        k = dict(site.extra)["loop_index"]
        loop = nest.loops[k]
        if loop.kind == "B":
            if ctx.gpu:
                raise Illegal("a thread-bound loop is already parallel on the GPU")
            renamed = fresh_indices(ctx.program).fresh()   # P loops take index names, not binding names
            body = substitute_in_nest(Nest(nest.loops[k + 1:], nest.body), {loop.var: Var(renamed)})
            nest = Nest(nest.loops[:k] + (Loop("L", loop.extent, renamed, loop.start),) + body.loops, body.body)
            probe = replace_item(ctx.program, site.nest, site.path, (nest,))
            ctx = ctx.with_program(probe)
            loop = nest.loops[k]
        outer = enclosing_loops(ctx.program, site.nest, site.path) + nest.loops[:k]
        if any(lp.kind == "P" for lp in outer) or _has_inner_parallel(Nest(nest.loops[k + 1:], nest.body)):
            raise Illegal("an enclosing or enclosed loop is already parallel")
        stmts = _under(ctx, site.nest, site.path, nest, k)
        reason = loop_carries_dependence(stmts, loop.var)
        if reason:
            raise Illegal(reason)
        new = with_loop(nest, k, Loop("P", loop.extent, loop.var, loop.start))
        work = _body_iterations(Nest(nest.loops[k + 1:], nest.body))
        facts = (f"every statement under {loop.var} writes a distinct element per iteration of {loop.var} "
                 f"(it is a spatial axis of {', '.join(dict.fromkeys(s.lhs.tensor for s, _ in stmts))})",
                 f"no statement reads an element that another iteration of {loop.var} writes",
                 "no enclosing or enclosed loop is already parallel")
        effect = (f"The {loop.extent} iterations of {loop.var} are independent, each doing {work} inner "
                  f"iteration{'s' if work != 1 else ''} of work, so they can run on separate cores.")
        return Rewrite(replace_item(ctx.program, site.nest, site.path, (new,)), facts, effect)


def _has_inner_parallel(nest: Nest) -> bool:
    return any(lp.kind == "P" for lp in nest.loops) or any(
        _has_inner_parallel(i) for i in nest.body if isinstance(i, Nest))


def _bound_loops(nest: Nest) -> list[Loop]:
    out = [lp for lp in nest.loops if lp.kind == "B"]
    for item in nest.body:
        if isinstance(item, Nest):
            out += _bound_loops(item)
    return out


@register
class LoopBinding(Strategy):
    name = "loop_binding"
    level = "operator"
    exactness = "exact"
    description = "Bind a loop with independent iterations to a CUDA thread or block index (B)."
    needs_gpu = True

    def sites(self, ctx):
        if not ctx.gpu:
            return  # binding only means something on a GPU target
        for top, path, k, nest, _ in loop_positions(ctx):
            if nest.loops[k].kind in ("L", "P"):
                yield Site(top, path, loops=(nest.loops[k].var,), extra=(("loop_index", k),))

    def parameters(self, ctx, site):
        bound = _bound_loops(ctx.program.nests[site.nest])
        used = {lp.var[:2] for lp in bound}
        for prefix in BIND_PREFIXES:
            if prefix not in used:
                yield {"axis": prefix}

    def rewrite(self, ctx, site, params):
        if not ctx.gpu:
            raise Illegal("the target is not a GPU")
        nest = get_item(ctx.program, site.nest, site.path)
        k = dict(site.extra)["loop_index"]
        lp = nest.loops[k]
        axis = params["axis"]
        bound = _bound_loops(ctx.program.nests[site.nest])
        if axis in {b.var[:2] for b in bound}:
            raise Illegal(f"{axis} is already bound in this nest")
        threads = iterations(tuple(b for b in bound if b.var[0] == "t")) * (lp.extent if axis[0] == "t" else 1)
        if threads > MAX_THREADS or (axis == "tz" and lp.extent > 64):
            raise Illegal(f"a block would have {threads} threads (at most {MAX_THREADS})")
        stmts = _under(ctx, site.nest, site.path, nest, k)
        reason = loop_carries_dependence(stmts, lp.var)
        if reason:
            raise Illegal(reason)
        name = bind_name(axis, loop_vars(ctx.program))
        renamed = substitute_in_nest(Nest(nest.loops[k + 1:], nest.body), {lp.var: Var(name)})
        new = Nest(nest.loops[:k] + (Loop("B", lp.extent, name, lp.start),) + renamed.loops, renamed.body)
        kind = "thread" if axis[0] == "t" else "block"
        facts = (f"iterations of {lp.var} write distinct elements and read no element another iteration writes",
                 f"{axis} is not yet bound in this nest; the block has {threads} threads (at most {MAX_THREADS})",
                 "the target is a GPU (CUDA)")
        effect = (f"The {lp.extent} iterations of {lp.var} run on {lp.extent} GPU {kind}s ({name}) at once "
                  "instead of one after another.")
        return Rewrite(replace_item(ctx.program, site.nest, site.path, (new,)), facts, effect)


@register
class ReductionFactorization(Strategy):
    name = "reduction_factorization"
    level = "operator"
    exactness = "reassociating"
    description = ("Factor a reduction axis (rfactor): partial results per inner index into a new tensor, "
                   "then a second, short reduction over them.")

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
                    yield Site(top, loops=(lp.var,), stmts=(self._order(ctx, top),),
                               tensors=(stmt.lhs.tensor,), extra=(("loop_index", k),))

    def _order(self, ctx, top):
        return next(s.order for s in ctx.sites if s.nest_index == top)

    def parameters(self, ctx, site):
        lp = ctx.program.nests[site.nest].loops[dict(site.extra)["loop_index"]]
        for f in by_preference(divisors(lp.extent))[:MAX_FACTORS]:   # vector-width partials first
            yield {"factor": f}

    def rewrite(self, ctx, site, params):
        nest = ctx.program.nests[site.nest]
        k, f = dict(site.extra)["loop_index"], params["factor"]
        stmt = nest.body[0]
        op = reduction_op(stmt)
        lp = nest.loops[k]
        if lp.extent % f or not 1 < f < lp.extent:
            raise Illegal("the factor must properly divide the extent")
        if op is None or lp.var in lhs_vars(stmt):
            raise Illegal(f"{lp.var} is not a reduction axis of a reduction")
        merged = merged_subscript_vars(stmt, nest.loops)
        if merged:
            raise Illegal(f"{merged[0]} appears in {stmt.lhs.tensor}'s subscript but several of its iterations "
                          "accumulate into one element: the combining nest cannot run over it")
        if op in ("+", "-", "*"):
            drift = sum_drift_problem(accumulated_terms(stmt, nest.loops), stmt.lhs.dtype, stmt.lhs.tensor)
            if drift:
                raise Illegal(drift)
        x = stmt.lhs
        if any(a.tensor == x.tensor for a in _reads_without_self(stmt)):
            raise Illegal(f"the reduced value reads {x.tensor} elsewhere than as the accumulator")
        names = fresh_indices(ctx.program)
        outer = names.fresh()
        split = split_loop(nest, k, f, outer)
        part_op = "+" if op == "-" else op
        y_name = fresh_tensors(ctx.program, ctx.signature).fresh()
        y = type(x)(y_name, x.dtype, "g", x.indices + (Var(lp.var),))
        partial = map_stmt(split.body[0], lambda n: y if n == x else n)
        spatial = set(lhs_vars(stmt))
        combine_loops = tuple(q for q in nest.loops if q.var in spatial) + (Loop("L", f, lp.var),)
        combine = Stmt(x, _combine(part_op, x, y))
        first = Nest(split.loops, (partial,))
        second = Nest(combine_loops, (combine,))
        program = Program(ctx.program.nests[:site.nest] + (first, second) + ctx.program.nests[site.nest + 1:])
        facts = (f"{x.tensor} is reduced with {op!r} over {lp.var}, which is not in its subscript",
                 f"{f} divides the extent {lp.extent}",
                 f"{y_name} is a fresh tensor; its partial results start from the identity of {part_op!r} "
                 "(implicit initialisation), and the combining nest applies the same operator",
                 "the association of the reduction changes, so results agree within rounding")
        effect = (f"The reduction over {lp.var} ({lp.extent}) is factored into {f} independent partial "
                  f"reductions of {lp.extent // f} terms ({y_name}), which can run in parallel, then combined.")
        return Rewrite(program, facts, effect)


def _reads_without_self(stmt: Stmt):
    from leir.ast import accesses

    op = reduction_op(stmt)
    rhs = stmt.rhs
    if op in ("max", "min"):
        rest = rhs.args[1]
        return list(accesses(rest))
    # Left spine: X op e1 op e2 ...; collect accesses of the right operands only.
    out = []
    node = rhs
    while isinstance(node, BinOp) and node != stmt.lhs:
        out += list(accesses(node.rhs))
        node = node.lhs
    return out


def _combine(op: str, x, y):
    from leir.ast import Call

    if op in ("max", "min"):
        return Call(op, (x, y))
    return BinOp(op, x, y)
