"""Memory-level strategies: where intermediates live, how they are laid out, what is staged in caches.

Known tensors (the signature) are never touched: they keep their names, shapes, dtypes and global
scope, and the program output never moves to shared or local memory.
"""
from __future__ import annotations

from itertools import permutations

from leir.analysis import affine_form, lhs_vars, reduction_op
from leir.ast import Access, BinOp, Loop, Nest, Num, Program, Stmt, Var, accesses, map_expr, map_stmt
from leir.printer import format_expr
from strategies.base import Context, Illegal, Rewrite, Site, Strategy
from strategies.graph import value_part
from strategies.legality import aligned, body_statements, iterations, merged_subscript_vars, stmt_reads
from strategies.loops import _reads_without_self
from strategies.registry import register
from strategies.tree import fresh_indices, fresh_tensors, literal, map_program_stmts, vars_in

SCOPE_NAMES = {"g": "global", "s": "shared", "l": "local"}
MAX_PERMUTATIONS = 6
MAX_INDEX_SITES = 12


def retag(program: Program, tensor: str, fn) -> Program:
    """Every access of `tensor` (reads, writes, gathers) rebuilt by `fn(access) -> access`."""
    def visit(n):
        return fn(n) if isinstance(n, Access) and n.tensor == tensor else n
    return map_program_stmts(program, lambda s: map_stmt(s, visit))


def tensor_accesses(ctx: Context, tensor: str) -> list[tuple[Access, object]]:
    """(access, statement site) for every access of `tensor`, writes first within a statement."""
    out = []
    for s in ctx.sites:
        for a in (*accesses(s.stmt.lhs), *accesses(s.stmt.rhs)):
            if a.tensor == tensor:
                out.append((a, s))
    return out


# --- set_storage_scope ------------------------------------------------------------------------------

def _written_first(uses, tensor: str) -> bool:
    """The first statement that touches `tensor` writes it without reading it."""
    first = uses[0][1].stmt
    return first.lhs.tensor == tensor and not any(a.tensor == tensor for a in stmt_reads(first))


def scope_problem(ctx: Context, tensor: str, scope: str) -> str | None:
    """Why `tensor` cannot live in `scope` (None when it can)."""
    info = ctx.tensors[tensor]
    if info.known:
        return f"{tensor} is a known tensor: it stays in global memory"
    uses = tensor_accesses(ctx, tensor)
    nests = {s.nest_index for _, s in uses}
    if len(nests) > 1 and scope == "g":
        return None
    if len(nests) > 1:
        return (f"{tensor} is used in nests {', '.join(str(n + 1) for n in sorted(nests))}: its value crosses "
                f"kernels, which {SCOPE_NAMES[scope]} memory does not survive")
    # Loops whose iterations share one copy of the tensor (parallel loops on the CPU; on CUDA, threads
    # share shared and global memory, blocks share global memory) must each touch their own elements;
    # where each iteration has a private copy, the iteration must write before it reads.
    top = ctx.program.nests[next(iter(nests))] if nests else None
    for lp in top.loops if top else ():
        shared = lp.kind == "P" or (lp.kind == "B" and (scope == "g" or (scope == "s" and lp.var[0] == "t")))
        if lp.kind not in ("P", "B"):
            continue
        if shared:
            for a, s in uses:
                for b, r in uses:
                    if not aligned(a, s.loops, b, r.loops, lp.var):
                        return (f"different iterations of {lp.var} touch the same element of {tensor}, but "
                                f"{SCOPE_NAMES[scope]} memory is shared between them")
        elif not _written_first(uses, tensor):
            return f"a private copy per {lp.var} would be read before this iteration writes it"
    return None


@register
class SetStorageScope(Strategy):
    name = "set_storage_scope"
    level = "memory"
    exactness = "exact"
    description = "Place an intermediate in global, shared or local memory."

    def sites(self, ctx):
        for name, info in ctx.tensors.items():
            if not info.known:
                yield Site(tensor_accesses(ctx, name)[0][1].nest_index, tensors=(name,))

    def parameters(self, ctx, site):
        current = ctx.tensors[site.tensors[0]].scope
        for scope in ("g", "s", "l"):
            if scope != current:
                yield {"scope": scope}

    def rewrite(self, ctx, site, params):
        tensor, scope = site.tensors[0], params["scope"]
        why = scope_problem(ctx, tensor, scope)
        if why:
            raise Illegal(why)
        info = ctx.tensors[tensor]
        program = retag(ctx.program, tensor, lambda a: Access(a.tensor, a.dtype, scope, a.indices))
        size = iterations(tuple(Loop("L", n, "_") for n in info.shape or ()))
        facts = (f"{tensor} is an intermediate (not in the signature); known tensors stay global",)
        if scope != "g":
            facts += (f"every access of {tensor} lies in one nest, so its value never crosses a kernel",
                      f"each {'thread' if scope == 'l' else 'block'} only touches its own elements of {tensor}")
        where = {"g": "global memory, visible to every kernel", "s": "shared memory, on chip, shared by a block",
                 "l": "local memory (registers), private to a thread"}[scope]
        target = "" if ctx.gpu else " (on the CPU the scope only records the intent; the result is unchanged)"
        effect = (f"The {size} elements of {tensor} ({info.dtype}) move from {SCOPE_NAMES[info.scope]} to "
                  f"{where}{target}.")
        return Rewrite(program, facts, effect)


# --- cache_read_write -------------------------------------------------------------------------------

@register
class CacheReadWrite(Strategy):
    name = "cache_read_write"
    level = "memory"
    exactness = "exact"
    description = ("Stage a reused input block in a local cache (cache read), or accumulate a reduction in "
                   "a local register and store it once (cache write).")

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

    def rewrite(self, ctx, site, params):
        if "read" in params:
            return cache_read(ctx, site.nest, params["read"], params["depth"])
        if "depth" in params:
            return cache_write_tile(ctx, site.nest, params["write"], int(params["depth"]))
        return cache_write(ctx, site.nest, params["write"])


def cache_read(ctx: Context, top: int, tensor: str, depth: int) -> Rewrite:
    nest = ctx.program.nests[top]
    outer, inner = nest.loops[:depth], nest.loops[depth:]
    if any(lp.kind == "P" for lp in outer):
        raise Illegal("a parallel loop encloses the cache: its iterations would share one cache")
    if any(lp.kind in ("B", "V") for lp in inner):
        raise Illegal("bound or vector loops below the cache level")
    uses = [a for s, _ in body_statements(nest) for a in stmt_reads(s) if a.tensor == tensor]
    if len(set(uses)) != 1:
        raise Illegal(f"{tensor} is read with different subscripts in the nest")
    acc = uses[0]
    if any(a.tensor != tensor for ix in acc.indices for a in accesses(ix)):
        raise Illegal(f"{tensor} is read through a gather")
    inner_vars = {lp.var for lp in inner}
    cached: list[str] = []
    for ix in acc.indices:
        used = set(vars_in(ix)) & inner_vars
        if not used:
            continue
        if not isinstance(ix, Var) or ix.name in cached:
            raise Illegal(f"subscript {format_expr(ix)} of {tensor} is not a plain inner loop index")
        cached.append(ix.name)
    reuse = [lp for lp in inner if lp.var not in cached]
    if not reuse:
        raise Illegal(f"no loop below the cache level reuses {tensor}")
    k = Access(fresh_tensors(ctx.program, ctx.signature).fresh(), acc.dtype, "l", tuple(Var(v) for v in cached))
    copy_loops = tuple(Loop("L", lp.extent, lp.var, lp.start) for lp in inner if lp.var in cached)
    copy = Nest(copy_loops, (Stmt(k, acc),)) if copy_loops else None
    body = tuple(map_stmt(s, lambda n: k if n == acc else n) for s in nest.body)
    rest = Nest(inner, body)
    items = ((copy,) if copy else ((Stmt(k, acc)),)) + (rest,)
    new = Nest(outer, items)
    program = Program(ctx.program.nests[:top] + (new,) + ctx.program.nests[top + 1:])
    size = iterations(copy_loops)
    factor = iterations(tuple(reuse))
    facts = (f"{tensor} is not written in this nest, so the copy holds the values every read sees",
             f"below {', '.join(lp.var for lp in outer)} the nest reads {tensor} only at {format_expr(acc)}, "
             f"which depends on the inner loops only through {', '.join(cached) or 'no index'}",
             f"{k.tensor} is local and no enclosing loop is parallel, so each iteration fills its own copy")
    effect = (f"For each iteration of {', '.join(lp.var for lp in outer)}, the {size} element"
              f"{'s' if size != 1 else ''} of {tensor} used below are copied once into local {k.tensor} and then "
              f"read {factor} times each ({', '.join(lp.var for lp in reuse)} reuse them) from fast memory.")
    return Rewrite(program, facts, effect)


def _cacheable_reduction(ctx: Context, top: int, tensor: str) -> tuple[Nest, Stmt, int]:
    """The nest, its one reduction statement into `tensor` and that statement's order, or Illegal
    when a cache of `tensor`'s accumulator would change the result."""
    nest = ctx.program.nests[top]
    if len(nest.body) != 1 or not isinstance(nest.body[0], Stmt) or nest.body[0].lhs.tensor != tensor:
        raise Illegal("the nest is not a single reduction")
    stmt = nest.body[0]
    order = next(s.order for s in ctx.sites if s.nest_index == top)
    if order not in ctx.inits:
        raise Illegal(f"{tensor} accumulates onto earlier values: caching would reassociate")
    if any(a.tensor == tensor for a in _reads_without_self(stmt)):
        raise Illegal(f"the reduction reads {tensor} elsewhere than as the accumulator")
    merged = merged_subscript_vars(stmt, nest.loops)
    if merged:
        raise Illegal(f"{merged[0]} appears in {tensor}'s subscript but several of its iterations accumulate into "
                      "one element: a cache per iteration would lose the other iterations' terms")
    return nest, stmt, order


def cache_write(ctx: Context, top: int, tensor: str) -> Rewrite:
    nest, stmt, order = _cacheable_reduction(ctx, top, tensor)
    spatial = set(lhs_vars(stmt))
    depth = 0
    while depth < len(nest.loops) and nest.loops[depth].var in spatial:
        depth += 1
    if depth == 0 or any(lp.var in spatial for lp in nest.loops[depth:]) or depth == len(nest.loops):
        raise Illegal("the spatial loops do not all enclose the reduction loops")
    outer, inner = nest.loops[:depth], nest.loops[depth:]
    if any(lp.kind == "P" for lp in outer):
        raise Illegal("a parallel loop encloses the cache")
    if any(lp.kind == "B" for lp in inner):
        raise Illegal("a bound loop is among the reduction loops")
    x = stmt.lhs
    k = Access(fresh_tensors(ctx.program, ctx.signature).fresh(), x.dtype, "l", ())
    update = map_stmt(stmt, lambda n: k if n == x else n)
    init = Stmt(k, literal(ctx.inits[order]))
    new = Nest(outer, (init, Nest(inner, (update,)), Stmt(x, k)))
    program = Program(ctx.program.nests[:top] + (new,) + ctx.program.nests[top + 1:])
    op = reduction_op(stmt)
    facts = (f"{tensor} starts from the identity of {op!r} here (implicit initialisation), so starting the "
             f"local {k.tensor} from {format_expr(literal(ctx.inits[order]))} and storing it once gives the same "
             "value, with the updates in the same order",
             f"{', '.join(lp.var for lp in outer)} are the spatial loops of {tensor} and enclose every reduction loop",
             f"{k.tensor} is private to one iteration of the spatial loops (no enclosing loop is parallel)")
    effect = (f"Each element of {tensor} accumulates {iterations(inner)} terms in a register ({k.tensor}) and is "
              f"written to memory once instead of {iterations(inner)} times.")
    return Rewrite(program, facts, effect)


def cache_write_tile(ctx: Context, top: int, tensor: str, depth: int) -> Rewrite:
    """Accumulate the tile of `tensor` that one iteration of the first `depth` loops writes in a local
    array (register blocking): zero it, run the inner loops on it, store it once."""
    nest, stmt, order = _cacheable_reduction(ctx, top, tensor)
    spatial = set(lhs_vars(stmt))
    outer, inner = nest.loops[:depth], nest.loops[depth:]
    if not 0 < depth < len(nest.loops) or any(lp.var not in spatial for lp in outer):
        raise Illegal("the loops above the tile must all be spatial loops of the accumulator")
    tile = [lp for lp in inner if lp.var in spatial]
    if not tile or len(tile) == len(inner):
        raise Illegal("the tile needs spatial loops and reduction loops below the cache level")
    if any(lp.kind == "P" for lp in outer) or any(lp.kind in ("B", "P") for lp in inner):
        raise Illegal("a parallel or bound loop would share the local tile")
    for ix in stmt.lhs.indices:
        if any(isinstance(a, Access) for a in accesses(ix)):
            raise Illegal(f"{tensor} is written through a gather")
    x = stmt.lhs
    k = Access(fresh_tensors(ctx.program, ctx.signature).fresh(), x.dtype, "l", tuple(Var(lp.var) for lp in tile))
    point = tuple(Loop("V" if lp.kind == "V" else "L", lp.extent, lp.var, lp.start) for lp in tile)
    init = Nest(point, (Stmt(k, literal(ctx.inits[order])),))
    update = Nest(inner, (map_stmt(stmt, lambda n: k if n == x else n),))
    store = Nest(point, (Stmt(x, k),))
    new = Nest(outer, (init, update, store))
    program = Program(ctx.program.nests[:top] + (new,) + ctx.program.nests[top + 1:])
    size = iterations(point)
    reduce_loops = tuple(lp for lp in inner if lp.var not in spatial)
    facts = (f"{tensor} starts from the identity of {reduction_op(stmt)!r} (implicit initialisation), so a local "
             f"tile started from {format_expr(literal(ctx.inits[order]))} and stored once holds the same values, "
             "each element updated in the same order",
             f"{', '.join(lp.var for lp in outer)} are spatial loops of {tensor}; below them "
             f"{', '.join(lp.var for lp in tile)} select distinct elements of the tile",
             f"no loop above or inside the tile is parallel or bound, so one copy of {k.tensor} serves every iteration")
    effect = (f"For each iteration of {', '.join(lp.var for lp in outer)}, a {'x'.join(str(lp.extent) for lp in tile)} "
              f"tile of {tensor} ({size} accumulators) stays in local {k.tensor} through the "
              f"{iterations(reduce_loops)} steps of {', '.join(lp.var for lp in reduce_loops)} and is written to "
              "memory once: register blocking.")
    return Rewrite(program, facts, effect)


# --- layout_transformation / set_storage_layout ------------------------------------------------------

def layout_sites(ctx: Context):
    for name, info in ctx.tensors.items():
        if not info.known and info.shape is not None and len(info.shape) >= 2:
            yield Site(tensor_accesses(ctx, name)[0][1].nest_index, tensors=(name,))


PACK_FACTORS = (4, 8, 16, 32)  # inner block widths of a packed copy (SIMD widths of float32/float64)


def copy_sites(ctx: Context):
    """Known inputs of rank >= 2 that the program reads and never writes, and reads more often than
    it has elements (a copy is paid once per element, so only reuse can pay for it): a re-laid copy
    can replace every read."""
    for name, info in ctx.tensors.items():
        if info.role != "input" or info.shape is None or len(info.shape) < 2:
            continue
        uses = tensor_accesses(ctx, name)
        if not uses or any(s.stmt.lhs.tensor == name for _, s in uses):
            continue
        if sum(iterations(s.loops) for _, s in uses) > iterations(tuple(Loop("L", n, "_") for n in info.shape)):
            yield Site(uses[0][1].nest_index, tensors=(name,), extra=(("copy", True),))


@register
class LayoutTransformation(Strategy):
    name = "layout_transformation"
    level = "memory"
    exactness = "exact"
    description = ("Permute the dimensions of an intermediate (a transposed storage layout), or re-lay a known "
                   "input into a new intermediate (a transposed or packed copy) that every later read uses.")

    def sites(self, ctx):
        yield from layout_sites(ctx)
        yield from copy_sites(ctx)

    def parameters(self, ctx, site):
        shape = ctx.tensors[site.tensors[0]].shape
        rank = len(shape)
        perms = [list(p) for p in permutations(range(rank)) if list(p) != list(range(rank))]
        if not dict(site.extra).get("copy"):
            for p in perms[:MAX_PERMUTATIONS]:
                yield {"order": p}
            return
        for dim in reversed(range(rank)):            # the contiguous (last) dimension first
            for f in PACK_FACTORS:
                if shape[dim] % f == 0 and f < shape[dim]:
                    yield {"copy": "packed", "dim": dim, "factor": f}
        for p in perms[:MAX_PERMUTATIONS]:
            yield {"copy": "transposed", "order": p}

    def rewrite(self, ctx, site, params):
        if "copy" in params:
            return relaid_copy(ctx, site.tensors[0], params)
        tensor, order = site.tensors[0], params["order"]
        info = ctx.tensors[tensor]
        if info.known:
            raise Illegal(f"{tensor} is a known tensor: its layout is fixed by the signature (re-lay a copy)")
        if sorted(order) != list(range(len(info.shape))):
            raise Illegal("not a permutation of the dimensions")
        program = retag(ctx.program, tensor,
                        lambda a: Access(a.tensor, a.dtype, a.scope, tuple(a.indices[d] for d in order)))
        shape = [info.shape[d] for d in order]
        facts = (f"{tensor} is an intermediate, so its layout is free",
                 f"every access of {tensor} (all {len(tensor_accesses(ctx, tensor))} of them) is permuted the "
                 "same way, so each element keeps its value")
        last = [a for a, _ in tensor_accesses(ctx, tensor)][0].indices[order[-1]]
        effect = (f"{tensor} is stored as {shape} instead of {list(info.shape)}: dimension {order[-1] + 1} "
                  f"({format_expr(last)}) becomes the contiguous one, which changes which loop walks it with stride 1.")
        return Rewrite(program, facts, effect)


# --- layout_transformation of a known input: a re-laid copy ------------------------------------------

def _split_index(ix, factor: int, bounds: dict[str, tuple[int, int]]):
    """(ix // factor, ix % factor) as subscripts; `o*factor+v` with v in [0, factor) gives (o, v)."""
    if isinstance(ix, BinOp) and ix.op == "+" and isinstance(ix.rhs, Var) \
            and bounds.get(ix.rhs.name) == (0, factor - 1) \
            and isinstance(ix.lhs, BinOp) and ix.lhs.op == "*" and ix.lhs.rhs == Num(factor):
        return ix.lhs.lhs, ix.rhs
    if isinstance(ix, Var) and bounds.get(ix.name) == (0, factor - 1):
        return Num(0), ix
    form = affine_form(ix)
    if form is not None and any(c < 0 for c in form[0].values()):
        # TVM 0.27's simplifier folds a decreasing index split into block and lane wrongly: with c in
        # [0, 16), A[(15-c)//4*4 + (15-c)%4] reads A[12-c] (and past the end for c > 12); the argmax
        # reversal `2047-c` of a packed input verified as a mismatch (issue 18's release-shape survey)
        raise Illegal(f"the subscript {format_expr(ix)} decreases with a loop index: its "
                      "block and lane (//, %) are miscompiled by TVM 0.27's simplifier")
    return BinOp("//", ix, Num(factor)), BinOp("%", ix, Num(factor))


def _map_reads_with_bounds(program: Program, tensor: str, fn) -> Program:
    """Every access of `tensor` rebuilt by `fn(access, loop bounds at that statement)`."""
    def visit(nest: Nest, outer: tuple) -> Nest:
        loops = outer + nest.loops
        bounds = {lp.var: (lp.start, lp.start + lp.extent - 1) for lp in loops}

        def swap(n):
            return fn(n, bounds) if isinstance(n, Access) and n.tensor == tensor else n
        body = tuple(map_stmt(i, swap) if isinstance(i, Stmt) else visit(i, loops) for i in nest.body)
        return Nest(nest.loops, body)
    return Program(tuple(visit(n, ()) for n in program.nests))


def relaid_copy(ctx: Context, tensor: str, params: dict) -> Rewrite:
    """`Y = X` in another layout, inserted before the first nest that reads the known input X; every
    read of X then reads the same element of Y (the packing step of a fast GEMM)."""
    info = ctx.tensors[tensor]
    if info.role != "input" or info.shape is None or len(info.shape) < 2:
        raise Illegal(f"{tensor} is not a known input of rank 2 or more")
    uses = tensor_accesses(ctx, tensor)
    if not uses:
        raise Illegal(f"the program never reads {tensor}")
    if any(s.stmt.lhs.tensor == tensor for _, s in uses):
        raise Illegal(f"{tensor} is written by the program: a copy made once would miss the writes")
    shape, rank = list(info.shape), len(info.shape)
    names = fresh_indices(ctx.program)
    y = fresh_tensors(ctx.program, ctx.signature).fresh()
    if params["copy"] == "transposed":
        order = list(params["order"])
        if sorted(order) != list(range(rank)) or order == list(range(rank)):
            raise Illegal("not a permutation of the dimensions")
        new_shape = [shape[d] for d in order]
        idx = [names.fresh() for _ in order]
        source = [None] * rank
        for k, d in enumerate(order):
            source[d] = Var(idx[k])

        def read(a: Access, bounds) -> Access:
            return Access(y, a.dtype, "g", tuple(a.indices[d] for d in order))
        layout = f"transposed to dimension order {order}"
    elif params["copy"] == "packed":
        dim, f = int(params["dim"]), int(params["factor"])
        if not 0 <= dim < rank or f <= 1 or shape[dim] % f or f >= shape[dim]:
            raise Illegal(f"{f} does not properly divide dimension {dim + 1} ({shape[dim]}) of {tensor}")
        rest = [d for d in range(rank) if d != dim]
        new_shape = [shape[dim] // f] + [shape[d] for d in rest] + [f]
        idx = [names.fresh() for _ in new_shape]
        source = [None] * rank
        source[dim] = BinOp("+", BinOp("*", Var(idx[0]), Num(f)), Var(idx[-1]))
        for k, d in enumerate(rest):
            source[d] = Var(idx[k + 1])

        def read(a: Access, bounds) -> Access:
            q, r = _split_index(a.indices[dim], f, bounds)
            return Access(y, a.dtype, "g", (q,) + tuple(a.indices[d] for d in rest) + (r,))
        layout = (f"packed: dimension {dim + 1} split into {shape[dim] // f} blocks of {f}, the block index "
                  f"outermost and the {f} elements of a block contiguous")
    else:
        raise Illegal(f"unknown copy layout {params['copy']!r}")
    dtype = uses[0][0].dtype
    copy = Nest(tuple(Loop("L", n, v) for n, v in zip(new_shape, idx, strict=True)),
                (Stmt(Access(y, dtype, "g", tuple(Var(v) for v in idx)), Access(tensor, dtype, "g", tuple(source))),))
    program = _map_reads_with_bounds(ctx.program, tensor, read)
    first = uses[0][1].nest_index
    program = Program(program.nests[:first] + (copy,) + program.nests[first:])
    size = iterations(copy.loops)
    facts = (f"{tensor} is a known input that the program reads and never writes, so a copy made before its "
             f"first read (nest {first + 1}) holds the value every later read sees",
             f"{y} is a fresh intermediate of shape {new_shape}; the copy nest writes each of its {size} elements "
             f"exactly once from one element of {tensor}",
             f"every read of {tensor} (all {len(uses)} of them) reads the element of {y} the copy took from that "
             f"element of {tensor}, so each value is unchanged")
    effect = (f"{tensor} ({list(shape)}) is re-laid once into {y}, {layout}. The {size}-element copy is paid once, "
              f"and the loops that read it can now walk memory with stride 1 (or a SIMD block at a time) "
              f"where {tensor}'s own layout made them jump.")
    return Rewrite(program, facts, effect)


@register
class SetStorageLayout(Strategy):
    name = "set_storage_layout"
    level = "memory"
    exactness = "exact"
    description = "Store a multi-dimensional intermediate as a flat buffer (row- or column-major)."

    def sites(self, ctx):
        for site in layout_sites(ctx):
            if all(affine_form(ix) is not None for a, s in tensor_accesses(ctx, site.tensors[0])
                   if a is s.stmt.lhs for ix in a.indices):
                yield site

    def parameters(self, ctx, site):
        yield {"layout": "row_major"}
        yield {"layout": "column_major"}

    def rewrite(self, ctx, site, params):
        tensor, layout = site.tensors[0], params["layout"]
        info = ctx.tensors[tensor]
        if info.known:
            raise Illegal(f"{tensor} is a known tensor: its layout is fixed by the signature")
        shape = list(info.shape)
        dims = list(range(len(shape)))
        if layout == "column_major":
            dims.reverse()
        strides = {}
        step = 1
        for d in reversed(dims):
            strides[d] = step
            step *= shape[d]

        def flat(a: Access) -> Access:
            terms = [ix if strides[d] == 1 else BinOp("*", ix, Num(strides[d])) for d, ix in enumerate(a.indices)]
            order = [terms[d] for d in dims]
            expr = order[0]
            for t in order[1:]:
                expr = BinOp("+", expr, t)
            return Access(a.tensor, a.dtype, a.scope, (expr,))

        program = retag(ctx.program, tensor, flat)
        size = step
        facts = (f"{tensor} is an intermediate of shape {shape}, so its storage is free",
                 f"the strides ({', '.join(str(strides[d]) for d in range(len(shape)))}) map each element to its "
                 f"own offset in 0..{size - 1}, for every access")
        effect = (f"{tensor} becomes one flat buffer of {size} elements in {layout.replace('_', '-')} order: "
                  "address arithmetic is explicit and a later pass can vectorize or pad it.")
        return Rewrite(program, facts, effect)


# --- precompute_indices -----------------------------------------------------------------------------

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

    def sites(self, ctx):
        count = 0
        for s in ctx.sites:
            for ix in compound_subscripts(s.stmt):
                if count >= MAX_INDEX_SITES:
                    return
                count += 1
                yield Site(s.nest_index, s.path, stmts=(s.order,), extra=(("subscript", format_expr(ix)),))

    def rewrite(self, ctx, site, params):
        s = ctx.sites[site.stmts[0]]
        text = dict(site.extra)["subscript"]
        found = [ix for ix in compound_subscripts(s.stmt) if format_expr(ix) == text]
        if not found:
            raise Illegal("the subscript is gone")
        ix = found[0]
        used = vars_in(ix)
        loops = [lp for lp in s.loops if lp.var in used]
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
        new_stmt = Stmt(s.stmt.lhs, map_expr(s.stmt.rhs, swap))
        program = _replace_stmt(ctx.program, s, new_stmt)
        program = Program(program.nests[:s.nest_index] + (table,) + program.nests[s.nest_index:])
        size = iterations(tuple(loops))
        facts = (f"{text} depends only on the loop indices {', '.join(used)}, so a table over their ranges "
                 f"({', '.join(str(lp.extent) for lp in loops)}) holds every value the statement needs",
                 f"{q} is computed in a nest of its own before the statement's nest and never changes",
                 "the table is i64, so every index value is represented exactly")
        effect = (f"The subscript {text} is read from the {size}-entry index table {q} instead of being "
                  f"recomputed on each of the {iterations(s.loops)} executions of statement {s.order + 1}.")
        return Rewrite(program, facts, effect)


def _replace_stmt(program: Program, site, stmt: Stmt) -> Program:
    from strategies.tree import replace_item
    return replace_item(program, site.nest_index, site.path, (stmt,))


__all__ = ["retag", "scope_problem", "cache_read", "cache_write", "value_part"]
