"""layout_transformation and set_storage_layout: how a tensor's elements are laid out in memory. An
intermediate's layout is free (its dimensions permuted, or flattened row- or column-major); a known
input keeps its layout, but a re-laid copy of it (transposed, or packed in SIMD-wide blocks) can
serve every read."""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import permutations
from typing import Literal

from leir.analysis import affine_form, loop_bounds, tensor_table
from leir.ast import Access, BinOp, Loop, Nest, Num, Program, Stmt, Var, map_stmt
from leir.printer import format_expr
from leir.signature import Signature
from strategies.analysis import recognition as rec
from strategies.analysis.legality import copy_without_reuse_problem, iterations
from strategies.analysis.tree import fresh_indices, fresh_tensors, map_accesses, replace_nests, tensor_accesses
from strategies.base import Context, Match, Params, Rewrite, Site, Strategy, params_dataclass, unhelpful
from strategies.registry import register

MAX_PERMUTATIONS = 6
PACK_FACTORS = (4, 8, 16, 32)  # inner block widths of a packed copy (SIMD widths of float32/float64)


def layout_sites(ctx: Context):
    for name, info in ctx.tensors.items():
        if not info.known and info.shape is not None and len(info.shape) >= 2:
            yield Site(tensor_accesses(ctx, name)[0][1].nest_index, tensors=(name,))


@dataclass(frozen=True)
class InputCopy(Match):
    """The site's tensor is a known input a re-laid copy can replace."""

    def to_json(self) -> dict:
        return {"copy": True}


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
        if sum(iterations(s.loops) for _, s in uses) > math.prod(info.shape):
            yield Site(uses[0][1].nest_index, tensors=(name,), match=InputCopy())


@params_dataclass
class LayoutParams(Params):
    """An intermediate's dimensions permuted (`order`), or a known input re-laid into a copy:
    `copy: transposed` with `order`, or `copy: packed` with dimension `dim` in blocks of `factor`."""

    copy: Literal["transposed", "packed"] | None = None
    order: list[int] | None = None
    dim: int | None = None
    factor: int | None = None


@register
class LayoutTransformation(Strategy):
    name = "layout_transformation"
    level = "memory"
    exactness = "exact"
    description = ("Permute the dimensions of an intermediate (a transposed storage layout), or re-lay a known "
                   "input into a new intermediate (a transposed or packed copy) that every later read uses.")
    enables = ("loop_vectorization", "loop_reorder", "loop_parallelization")
    search_prior = 2.5
    params_type = LayoutParams

    def recognizes(self, before, after, signature):
        """An intermediate stored with its dimensions permuted (its shape, or where its dimensions
        are equal its subscripts, permuted), or a new copy of a tensor in another layout (transposed,
        or one dimension packed into blocks) that the program reads instead."""
        old, new = rec.intermediates(before, signature), rec.intermediates(after, signature)
        if any(name in old and old[name].shape and info.shape and old[name].shape != info.shape
               and sorted(old[name].shape) == sorted(info.shape) for name, info in new.items()):
            return True
        return (any(rec.permuted_subscripts(before, after, name) for name in old)
                or _relaid_copy(before, after, signature))

    def sites(self, ctx):
        yield from layout_sites(ctx)
        yield from copy_sites(ctx)

    def parameters(self, ctx, site):
        shape = ctx.tensors[site.tensors[0]].shape
        rank = len(shape)
        perms = [list(p) for p in permutations(range(rank)) if list(p) != list(range(rank))]
        if not isinstance(site.match, InputCopy):
            for p in perms[:MAX_PERMUTATIONS]:
                yield {"order": p}
            return
        for dim in reversed(range(rank)):            # the contiguous (last) dimension first
            for f in PACK_FACTORS:
                if shape[dim] % f == 0 and f < shape[dim]:
                    yield {"copy": "packed", "dim": dim, "factor": f}
        for p in perms[:MAX_PERMUTATIONS]:
            yield {"copy": "transposed", "order": p}

    def check(self, ctx, site, params):
        if params.copy is not None:
            return relaid_copy_problem(ctx, site.tensors[0], params)
        tensor, order = site.tensors[0], params.order
        info = ctx.tensors[tensor]
        if info.known:
            return f"{tensor} is a known tensor: its layout is fixed by the signature (re-lay a copy)"
        if order is None or params.dim is not None or params.factor is not None:
            return "an intermediate's layout is a permutation of its dimensions (order)"
        if sorted(order) != list(range(len(info.shape))):
            return "not a permutation of the dimensions"
        return None

    def build(self, ctx, site, params):
        if params.copy is not None:
            return relaid_copy(ctx, site.tensors[0], params)
        tensor, order = site.tensors[0], params.order
        info = ctx.tensors[tensor]
        program = map_accesses(ctx.program, {tensor: lambda a: Access(a.tensor, a.dtype, a.scope,
                                                                       tuple(a.indices[d] for d in order))})
        uses = tensor_accesses(ctx, tensor)
        facts = (f"{tensor} is an intermediate, so its layout is free",
                 f"every access of {tensor} (all {len(uses)} of them) is permuted the "
                 "same way, so each element keeps its value")
        summary = (f"{tensor} is stored as {[info.shape[d] for d in order]} instead of {list(info.shape)}: dimension "
                   f"{order[-1] + 1} ({format_expr(uses[0][0].indices[order[-1]])}) becomes the contiguous one, "
                   "which changes which loop walks it with stride 1.")
        return Rewrite(program, facts, summary)


# --- layout_transformation of a known input: a re-laid copy ------------------------------------------

@dataclass(frozen=True)
class Transposed:
    """The copy holds the input with its dimensions in `order`."""

    order: tuple[int, ...]

    def shape(self, shape: list[int]) -> list[int]:
        return [shape[d] for d in self.order]

    def source(self, idx: list[str]) -> tuple:
        """The input's subscripts the copy nest reads at its loop indices `idx`."""
        source = [None] * len(self.order)
        for k, d in enumerate(self.order):
            source[d] = Var(idx[k])
        return tuple(source)

    def read(self, a: Access, bounds) -> tuple:
        """The copy's subscripts that hold the element `a` reads."""
        return tuple(a.indices[d] for d in self.order)

    def describe(self, shape: list[int]) -> str:
        return f"transposed to dimension order {list(self.order)}"


@dataclass(frozen=True)
class Packed:
    """The copy holds dimension `dim` in blocks of `factor`: the block index outermost, the other
    dimensions, then the `factor` elements of a block contiguous."""

    dim: int
    factor: int
    rank: int

    @property
    def rest(self) -> list[int]:
        return [d for d in range(self.rank) if d != self.dim]

    def shape(self, shape: list[int]) -> list[int]:
        return [shape[self.dim] // self.factor] + [shape[d] for d in self.rest] + [self.factor]

    def source(self, idx: list[str]) -> tuple:
        source = [None] * self.rank
        source[self.dim] = BinOp("+", BinOp("*", Var(idx[0]), Num(self.factor)), Var(idx[-1]))
        for k, d in enumerate(self.rest):
            source[d] = Var(idx[k + 1])
        return tuple(source)

    def read(self, a: Access, bounds) -> tuple:
        q, r = _split_index(a.indices[self.dim], self.factor, bounds)
        return (q,) + tuple(a.indices[d] for d in self.rest) + (r,)

    def describe(self, shape: list[int]) -> str:
        f = self.factor
        return (f"packed: dimension {self.dim + 1} split into {shape[self.dim] // f} blocks of {f}, the block index "
                f"outermost and the {f} elements of a block contiguous")


def _block_and_lane(ix, factor: int, bounds: dict[str, tuple[int, int]]):
    """`o*factor+v` with v in [0, factor) as (o, v), a lane index v alone as (0, v); None otherwise."""
    if isinstance(ix, BinOp) and ix.op == "+" and isinstance(ix.rhs, Var) \
            and bounds.get(ix.rhs.name) == (0, factor - 1) \
            and isinstance(ix.lhs, BinOp) and ix.lhs.op == "*" and ix.lhs.rhs == Num(factor):
        return ix.lhs.lhs, ix.rhs
    if isinstance(ix, Var) and bounds.get(ix.name) == (0, factor - 1):
        return Num(0), ix
    return None


def _split_problem(ix, factor: int, bounds: dict[str, tuple[int, int]]) -> str | None:
    """Why the subscript cannot be split into block and lane as (ix // factor, ix % factor), or None."""
    if _block_and_lane(ix, factor, bounds) is not None:
        return None
    form = affine_form(ix)
    if form is not None and any(c < 0 for c in form[0].values()):
        # TVM 0.27's simplifier folds a decreasing index split into block and lane wrongly: with c in
        # [0, 16), A[(15-c)//4*4 + (15-c)%4] reads A[12-c] (and past the end for c > 12); the argmax
        # reversal `2047-c` of a packed input verified as a mismatch (release-shape survey)
        return (f"the subscript {format_expr(ix)} decreases with a loop index: its "
                "block and lane (//, %) are miscompiled by TVM 0.27's simplifier")
    return None


def _split_index(ix, factor: int, bounds: dict[str, tuple[int, int]]):
    """(ix // factor, ix % factor) as subscripts; `o*factor+v` with v in [0, factor) gives (o, v)."""
    return _block_and_lane(ix, factor, bounds) or (BinOp("//", ix, Num(factor)), BinOp("%", ix, Num(factor)))


def _layout_problem(params: LayoutParams, shape: list[int], tensor: str) -> str | None:
    """Why `params` name no copy layout of `tensor`, or None."""
    rank = len(shape)
    if params.copy == "transposed":
        order = params.order
        if order is None or sorted(order) != list(range(rank)) or order == list(range(rank)):
            return "not a permutation of the dimensions"
        return None
    dim, f = params.dim, params.factor
    if dim is None or f is None:
        return "a packed copy names the dimension and the block width (dim, factor)"
    if not 0 <= dim < rank:
        return f"{tensor} has no dimension {dim + 1} (rank {rank})"
    if f <= 1 or shape[dim] % f or f >= shape[dim]:
        return f"{f} does not properly divide dimension {dim + 1} ({shape[dim]}) of {tensor}"
    return None


def _copy_layout(params: LayoutParams, shape: list[int]) -> Transposed | Packed:
    """The layout `params` asks for (one `_layout_problem` passed)."""
    if params.copy == "transposed":
        return Transposed(tuple(params.order))
    return Packed(params.dim, params.factor, len(shape))


def _map_reads_with_bounds(program: Program, tensor: str, fn) -> Program:
    """Every access of `tensor` rebuilt by `fn(access, loop bounds at that statement)`."""
    def visit(nest: Nest, outer: tuple) -> Nest:
        loops = outer + nest.loops
        bounds = loop_bounds(loops)

        def swap(n):
            return fn(n, bounds) if isinstance(n, Access) and n.tensor == tensor else n
        body = tuple(map_stmt(i, swap) if isinstance(i, Stmt) else visit(i, loops) for i in nest.body)
        return Nest(nest.loops, body)
    return Program(tuple(visit(n, ()) for n in program.nests))


def relaid_copy_problem(ctx: Context, tensor: str, params: LayoutParams) -> str | None:
    """Why a copy of `tensor` in the layout `params` name cannot serve every read (or cannot help)."""
    info = ctx.tensors[tensor]
    if info.role != "input" or info.shape is None or len(info.shape) < 2:
        return f"{tensor} is not a known input of rank 2 or more"
    uses = tensor_accesses(ctx, tensor)
    if not uses:
        return f"the program never reads {tensor}"
    if any(s.stmt.lhs.tensor == tensor for _, s in uses):
        return f"{tensor} is written by the program: a copy made once would miss the writes"
    reads = sum(iterations(s.loops) for _, s in uses)
    reason = (unhelpful(ctx, copy_without_reuse_problem(tensor, reads / math.prod(info.shape)))
              or _layout_problem(params, list(info.shape), tensor))
    if reason or params.copy != "packed":
        return reason
    problems: list[str] = []

    def note(a: Access, bounds) -> Access:
        problems.append(_split_problem(a.indices[params.dim], params.factor, bounds))
        return a
    _map_reads_with_bounds(ctx.program, tensor, note)
    return next((p for p in problems if p), None)


def relaid_copy(ctx: Context, tensor: str, params: LayoutParams) -> Rewrite:
    """`Y = X` in another layout, inserted before the first nest that reads the known input X; every
    read of X then reads the same element of Y (the packing step of a fast GEMM)."""
    info = ctx.tensors[tensor]
    uses = tensor_accesses(ctx, tensor)
    shape = list(info.shape)
    names = fresh_indices(ctx.program)
    y = fresh_tensors(ctx.program, ctx.signature).fresh()
    layout = _copy_layout(params, shape)
    new_shape = layout.shape(shape)
    idx = [names.fresh() for _ in new_shape]
    dtype = uses[0][0].dtype
    fill = Stmt(Access(y, dtype, "g", tuple(Var(v) for v in idx)), Access(tensor, dtype, "g", layout.source(idx)))
    copy = Nest(tuple(Loop("L", n, v) for n, v in zip(new_shape, idx, strict=True)), (fill,))
    program = _map_reads_with_bounds(ctx.program, tensor,
                                     lambda a, bounds: Access(y, a.dtype, "g", layout.read(a, bounds)))
    first = uses[0][1].nest_index
    program = replace_nests(program, first, 0, (copy,))
    size = iterations(copy.loops)
    facts = (f"{tensor} is a known input that the program reads and never writes, so a copy made before its "
             f"first read (nest {first + 1}) holds the value every later read sees",
             f"{y} is a fresh intermediate of shape {new_shape}; the copy nest writes each of its {size} elements "
             f"exactly once from one element of {tensor}",
             f"every read of {tensor} (all {len(uses)} of them) reads the element of {y} the copy took from that "
             f"element of {tensor}, so each value is unchanged")
    summary = (f"{tensor} ({list(shape)}) is re-laid once into {y}, {layout.describe(shape)}. The {size}-element copy "
               f"is paid once, and the loops that read it can now walk memory with stride 1 (or a SIMD block at a "
               f"time) where {tensor}'s own layout made them jump.")
    return Rewrite(program, facts, summary)


# --- set_storage_layout ------------------------------------------------------------------------------

@params_dataclass
class FlatParams(Params):
    layout: Literal["row_major", "column_major"]


@register
class SetStorageLayout(Strategy):
    name = "set_storage_layout"
    level = "memory"
    exactness = "exact"
    description = "Store a multi-dimensional intermediate as a flat buffer (row- or column-major)."
    enables = ("loop_vectorization",)
    search_prior = 2.0
    params_type = FlatParams

    def recognizes(self, before, after, signature):
        """An intermediate of two or more dimensions stored flat."""
        old, new = rec.intermediates(before, signature), rec.intermediates(after, signature)
        return any(name in old and old[name].shape and len(old[name].shape) > 1 and info.shape
                   and len(info.shape) == 1 and math.prod(info.shape) == math.prod(old[name].shape)
                   for name, info in new.items())

    def sites(self, ctx):
        for site in layout_sites(ctx):
            if all(affine_form(ix) is not None for a, s in tensor_accesses(ctx, site.tensors[0])
                   if a is s.stmt.lhs for ix in a.indices):
                yield site

    def parameters(self, ctx, site):
        yield {"layout": "row_major"}
        yield {"layout": "column_major"}

    def check(self, ctx, site, params):
        tensor = site.tensors[0]
        if ctx.tensors[tensor].known:
            return f"{tensor} is a known tensor: its layout is fixed by the signature"
        return None

    def build(self, ctx, site, params):
        tensor, layout = site.tensors[0], params.layout
        info = ctx.tensors[tensor]
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

        program = map_accesses(ctx.program, {tensor: flat})
        facts = (f"{tensor} is an intermediate of shape {shape}, so its storage is free",
                 f"the strides ({', '.join(str(strides[d]) for d in range(len(shape)))}) map each element to its "
                 f"own offset in 0..{step - 1}, for every access")
        summary = (f"{tensor} becomes one flat buffer of {step} elements in {layout.replace('_', '-')} order: "
                   "address arithmetic is explicit and a later pass can vectorize or pad it.")
        return Rewrite(program, facts, summary)


def _relaid_copy(before: Program, after: Program, signature: Signature) -> bool:
    """A new intermediate written as a plain copy of a tensor of `before`, with as many elements in
    another shape or order, and that tensor read no more often."""
    old, new = tensor_table(before, signature), rec.intermediates(after, signature)
    reads_before, reads_after = rec.readers(before), rec.readers(after)
    for stmt, src in rec.copies(after):
        name = stmt.lhs.tensor
        if name in old or name not in new or src.tensor not in old:
            continue
        shape, relaid = old[src.tensor].shape, new[name].shape
        if shape and relaid and math.prod(shape) == math.prod(relaid) \
                and reads_after[src.tensor] <= reads_before[src.tensor] \
                and (tuple(shape) != tuple(relaid) or tuple(src.indices) != tuple(stmt.lhs.indices)):
            return True
    return False
