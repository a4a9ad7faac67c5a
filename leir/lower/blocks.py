"""The decisions of the TensorIR (block) form, as pure functions over the lowering plan (no TVM).

One block per LEIR statement (and per explicit initialisation), whose iterators are the statement's
enclosing LEIR loops, each with a kind:

- `S` (spatial): the loop index appears in the left-hand subscript (docs/leir.md §4.3) and distinct
  values of it write distinct elements (`data_parallel`);
- `R` (reduction): it does not appear, so iterations update or overwrite the same elements;
- `opaque` for an index that appears but whose distinct values may write the same element
  (`F_{a//3}`, a scatter through a gather): TVM takes an `S` iterator as data parallel and would
  let the scheduler run it in parallel, and an `R` iterator must not index the written buffer;
- `scan` (TVM's ordered iterator): a spatial loop across whose iterations a value flows through an
  intermediate (`H_{a}=H_{a-1}+...`). TVM allocates an intermediate at the lowest loop that encloses
  all its accesses and keeps only what one iteration touches (PlanAndUpdateBufferAllocationLocation,
  CompactBufferAllocation); a `scan` iterator whose index appears in the block's region of the
  intermediate makes it allocate above that loop instead (buffer_access_lca_detector.cc), so the
  value survives from one iteration to the next. Reduction iterators already have that effect.
- `opaque`, too, for a vectorized loop that encloses every access of an intermediate. TVM 0.27
  would allocate the intermediate inside the loop, one element per iteration, and its VectorizeLoop
  then hoists that allocation out of the loop without widening it, so all lanes share one element
  (wrong results); an opaque iterator moves the allocation above the loop, as a scan does, without
  claiming an order.
  Likewise for a loop bound to a CUDA thread around every access of a global intermediate: CUDA
  allocates global memory outside kernels only (TVM lifts such buffers above `blockIdx` loops itself,
  not above `threadIdx` ones).

Implicit initialisation (§4.4) becomes `T.init()` where that is exact: TVM runs the init when every
reduction iterator is at its first value, which is "before the first update of each element" exactly
when distinct spatial points write distinct elements (every LEIR-spatial index is `S`). Otherwise the
plan's explicit fill stays, as a block of its own, where the plain form puts it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from leir.analysis import StmtSite, affine_form, implicit_inits, lhs_vars, statement_sites
from leir.ast import Access, Program, Var, accesses, walk_expr
from leir.lower.planner import Plan, PLoop, PStore
from leir.signature import Signature

SPATIAL, REDUCTION, SCAN, OPAQUE = "S", "R", "scan", "opaque"
# Above this many spatial points, injectivity is only proven by the mixed-radix test (cheap, sufficient).
EXACT_INJECTIVITY_POINTS = 1 << 20


@dataclass(frozen=True, slots=True)
class BlockSpec:
    """One block: its name, its iterators (LEIR loop variables, outermost first) with their kinds, and
    the identity `T.init()` stores (None: no init)."""

    name: str
    iters: tuple[str, ...]
    kinds: tuple[str, ...]
    init: int | float | None = None


@dataclass(frozen=True)
class BlockPlan:
    """`blocks[(statement order, is_fill)]`; `init_orders`: statements initialised by `T.init()`, whose
    explicit fills are left out; `notes`: why a statement keeps its fill, where a scan was marked."""

    blocks: dict[tuple[int, bool], BlockSpec]
    init_orders: frozenset[int]
    notes: tuple[str, ...] = field(default=())

    def spec(self, store: PStore) -> BlockSpec:
        return self.blocks[(store.order, store.is_fill)]


def plan_blocks(plan: Plan, program: Program, signature: Signature) -> BlockPlan:
    sites = {s.order: s for s in statement_sites(program)}
    placed = list(_stores_in_place(plan.items))
    inits = implicit_inits(program, signature)
    notes: list[str] = []
    marks = _allocation_marks(placed, plan, notes)
    names = _block_names(placed, sites)
    init_orders, blocks = set(), {}
    for store, chain in placed:
        site = sites[store.order]
        loops = _iter_loops(chain, site)
        in_lhs = set(lhs_vars(site.stmt))
        leir_spatial = [lp for lp in loops if lp.var in in_lhs]
        spatial = {lp.var for lp in data_parallel(store.lhs, leir_spatial)}
        opaque = [lp.var for lp in leir_spatial if lp.var not in spatial]
        if opaque:
            notes.append(f"{_where(site)}{' (its initialisation)' if store.is_fill else ''}: {', '.join(opaque)} "
                         "iterated as opaque (distinct iterations may write the same element)")
        if store.order in inits and not store.is_fill:
            if opaque:
                notes.append(f"{_where(site)}: explicit initialisation block (distinct spatial iterations may write "
                             "the same element, so T.init() would reset a partial result)")
            else:
                init_orders.add(store.order)
        kinds = tuple(marks.get((store.order, store.is_fill, lp.uid)) or (
            SPATIAL if lp.var in spatial else OPAQUE if lp.var in in_lhs else REDUCTION) for lp in loops)
        init = inits[store.order] if not store.is_fill and store.order in init_orders else None
        blocks[(store.order, store.is_fill)] = BlockSpec(names[(store.order, store.is_fill)],
                                                         tuple(lp.var for lp in loops), kinds, init)
    return BlockPlan(blocks, frozenset(init_orders), tuple(dict.fromkeys(notes)))


def _where(site: StmtSite) -> str:
    return f"nest {site.nest_index + 1}, statement `{site.stmt.lhs.tensor}=...` (#{site.order + 1})"


def _stores_in_place(items, chain: tuple[PLoop, ...] = ()):
    """(store, enclosing plan loops outermost first) in execution order."""
    for item in items:
        if isinstance(item, PStore):
            yield item, chain
        else:
            yield from _stores_in_place(item.body, chain + (item,))


def _iter_loops(chain: tuple[PLoop, ...], site: StmtSite) -> tuple[PLoop, ...]:
    """The plan loops that are LEIR loops of the statement (not a CUDA one-thread kernel wrapper)."""
    names = {lp.var for lp in site.loops}
    return tuple(lp for lp in chain if not lp.wrapper and lp.var in names)


def _block_names(placed, sites) -> dict[tuple[int, bool], str]:
    """A statement's block is named after the tensor it writes (`D`, then `D_1`, ... in program order);
    an explicit initialisation is `D_init`."""
    out, seen = {}, {}
    for store, _ in sorted(placed, key=lambda sc: (sc[0].order, not sc[0].is_fill)):
        tensor = sites[store.order].stmt.lhs.tensor
        if store.is_fill:
            out[(store.order, True)] = f"{tensor}_init"
            continue
        k = seen.get(tensor, 0)
        seen[tensor] = k + 1
        out[(store.order, False)] = tensor if k == 0 else f"{tensor}_{k}"
    return out


# --- T.init: distinct spatial points write distinct elements -------------------------------------------

def data_parallel(lhs: Access, loops: list[PLoop]) -> list[PLoop]:
    """The largest-found subset of `loops` (indices of the left-hand side) whose distinct values write
    distinct elements whatever the other indices are: those that appear in a non-affine subscript go
    first (`a//3`, a gather), then the innermost until the rest is `injective`."""
    chosen = [lp for lp in loops if not any(lp.var in _vars_of(ix) and affine_form(ix) is None
                                            for ix in lhs.indices)]
    while chosen and not injective(lhs, chosen):
        chosen.pop()
    return chosen


def injective(lhs: Access, loops: list[PLoop]) -> bool:
    """Whether distinct values of the `loops`' indices make `lhs` name distinct elements (over the
    loops' box), any other index held fixed. False when it cannot be shown (a gather or a
    non-affine subscript over these indices, a huge box)."""
    names = {lp.var for lp in loops}
    forms = []
    for ix in lhs.indices:
        if not _vars_of(ix) & names:
            continue  # the same element for every value of these indices
        form = affine_form(ix)
        if form is None:
            return False
        forms.append(({v: c for v, c in form[0].items() if v in names}, 0))  # the others only shift it
    if _mixed_radix_injective(forms, loops):
        return True
    points = math.prod(lp.extent for lp in loops)
    if points > EXACT_INJECTIVITY_POINTS:
        return False
    return _enumerated_injective(forms, loops)


def _mixed_radix_injective(forms, loops: list[PLoop]) -> bool:
    """Sufficient: in some order of the loops, each subscript vector moves further per step of a loop
    than all smaller loops together can (`d*2+a` with a < 2), judged on one linear combination of the
    subscripts whose weights exceed the ranges of the lower subscripts."""
    weights, weight = [], 1
    for coeffs, _ in reversed(forms):
        weights.append(weight)
        span = sum(abs(c) * (lp.extent - 1) for lp in loops for v, c in coeffs.items() if v == lp.var)
        weight *= span + 1
    weights.reverse()
    linear = {lp.var: sum(w * coeffs.get(lp.var, 0) for w, (coeffs, _) in zip(weights, forms, strict=True))
              for lp in loops}
    reach = 0
    for lp in sorted(loops, key=lambda lp: abs(linear[lp.var])):
        step = abs(linear[lp.var])
        if lp.extent > 1 and step <= reach:
            return False
        reach += step * (lp.extent - 1)
    return True


def _enumerated_injective(forms, loops: list[PLoop]) -> bool:
    grids = np.meshgrid(*[np.arange(lp.start, lp.start + lp.extent, dtype=np.int64) for lp in loops],
                        indexing="ij") if loops else []
    index = {lp.var: g.ravel() for lp, g in zip(loops, grids, strict=True)}
    points = math.prod(lp.extent for lp in loops)
    columns = [sum((c * index[v] for v, c in coeffs.items()), np.full(points, k, dtype=np.int64))
               for coeffs, k in forms]
    if not columns:
        return points <= 1
    return len(np.unique(np.stack(columns, axis=1), axis=0)) == points


# --- allocations: where TVM may put an intermediate, and what keeps it above a loop ----------------------

@dataclass(frozen=True, slots=True)
class _Use:
    store: PStore
    chain: tuple[PLoop, ...]
    access: Access
    write: bool


def _allocation_marks(placed, plan: Plan, notes: list[str]) -> dict[tuple[int, bool, int], str]:
    """{(statement order, is_fill, loop uid): kind} for the writers' iterators that must keep an
    intermediate's allocation above a loop enclosing all of its accesses: `scan` where its value
    crosses the loop's iterations, `opaque` where the loop is vectorized, or bound to a CUDA thread
    while the intermediate is global (see the module's notes)."""
    uses: dict[str, list[_Use]] = {}
    intermediates = {n for n, info in plan.tensors.items() if not info.known}
    for store, chain in placed:
        for acc in accesses(store.lhs):
            if acc.tensor in intermediates:
                uses.setdefault(acc.tensor, []).append(_Use(store, chain, acc, acc is store.lhs))
        if store.rhs is not None:
            for acc in accesses(store.rhs):
                if acc.tensor in intermediates:
                    uses.setdefault(acc.tensor, []).append(_Use(store, chain, acc, False))
    marks: dict[tuple[int, bool, int], str] = {}
    for tensor in sorted(uses):
        group = uses[tensor]
        for depth, loop in enumerate(_common_loops([u.chain for u in group])):
            if loop.wrapper:
                continue
            if not _partitioned(group, loop, depth):
                kind, why = SCAN, "carries values of {t} from one iteration to the next"
            elif loop.kind == "vectorized":
                kind, why = OPAQUE, "is vectorized and holds every access of {t}"
            elif loop.kind == "thread" and plan.scopes.get(tensor) == "global":
                kind, why = OPAQUE, "is a GPU thread loop around every access of {t}, a global buffer"
            else:
                continue
            writers = [u for u in group if u.write and loop.var in _vars(u.access)]
            for u in writers:
                marks.setdefault((u.store.order, u.store.is_fill, loop.uid), kind)
            if writers:
                notes.append(f"{tensor}: loop {loop.var} {why.format(t=tensor)}, so {tensor}'s writers iterate it "
                             f"as {kind} (T.axis.{kind}) and TVM allocates {tensor} above it")
    return marks


def _common_loops(chains) -> list[PLoop]:
    out = []
    for loops in zip(*chains, strict=False):
        if any(lp.uid != loops[0].uid for lp in loops):
            break
        out.append(loops[0])
    return out


def _vars(acc: Access) -> set[str]:
    return {v for ix in acc.indices for v in _vars_of(ix)}


def _vars_of(expr) -> set[str]:
    return {n.name for n in walk_expr(expr) if isinstance(n, Var)}


def _partitioned(group: list[_Use], loop: PLoop, depth: int) -> bool:
    """Whether distinct iterations of `loop` touch disjoint elements of the tensor: some dimension's
    subscript is `k*i + rest` in every access, with one k, the same outer part, and the inner part's
    range over all accesses narrower than |k|."""
    rank = len(group[0].access.indices)
    for d in range(rank):
        if _dimension_partitions(group, loop, depth, d):
            return True
    return False


def _dimension_partitions(group: list[_Use], loop: PLoop, depth: int, d: int) -> bool:
    step, outer_part, lo, hi = None, None, math.inf, -math.inf
    outer = {lp.var for lp in group[0].chain[:depth]}
    for u in group:
        form = affine_form(u.access.indices[d])
        if form is None:
            return False
        coeffs, const = form
        k = coeffs.get(loop.var, 0)
        if k == 0 or (step is not None and k != step):
            return False
        step = k
        part = {v: c for v, c in coeffs.items() if v in outer}
        if outer_part is not None and part != outer_part:
            return False
        outer_part = part
        inner = {lp.var: lp for lp in u.chain[depth + 1:]}
        r_lo = r_hi = const
        for v, c in coeffs.items():
            if v in outer or v == loop.var:
                continue
            if v not in inner:
                return False
            a, b = c * inner[v].start, c * (inner[v].start + inner[v].extent - 1)
            r_lo, r_hi = r_lo + min(a, b), r_hi + max(a, b)
        lo, hi = min(lo, r_lo), max(hi, r_hi)
    return step is not None and hi - lo < abs(step)
