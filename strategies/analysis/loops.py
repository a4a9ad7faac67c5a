"""Loop transformations more than one rule builds on: splitting a loop, fusing two nests over their
common loops (graph and operator fusion), factoring a reduction axis (rfactor, and the partial
results of a vectorised reduction), and the split factors worth trying first. Each comes as a
`..._problem` check (the reason the transformation would change a result, or None) and the surgery
that a passed check allows; the facts and effects the rules state about them are built here too,
from the records they return, since two rules state them."""
from __future__ import annotations

import math
from dataclasses import dataclass

from leir.analysis import contraction_contexts, is_product, lhs_vars, reduction_op
from leir.ast import Access, BinOp, Call, Loop, Nest, Num, Program, Stmt, Var, accesses, map_stmt
from strategies.analysis.legality import (
    accumulated_terms,
    body_statements,
    iterations,
    loop_carries_dependence,
    merged_subscript_vars,
    misaligned,
    product_rounds,
    reads_without_self,
    written_tensors,
)
from strategies.analysis.numerics import sum_drift_problem
from strategies.analysis.tree import (
    enclosing_loops,
    fresh_indices,
    fresh_tensors,
    rename_vars_in_nest,
    replace_nests,
    substitute_in_nest,
)
from strategies.base import Context

# Factors tried first: SIMD widths of float32 (AVX-512, two registers, AVX2) and cache-sized blocks;
# the enumeration caps of the rules keep the best-placed variants, not the smallest ones.
PREFERRED_FACTORS = (16, 32, 8, 4, 64, 2)
MAX_FACTORS = 8  # divisors tried per split loop


def vector_friendly(params: dict) -> float:
    """The search's bonus for a split, tiling or rfactor whose (largest) factor is a vector width."""
    factor = params.get("factor") or max(params.get("factors", [1]))
    return 0.5 if factor in (4, 8, 16) else 0.0


def divisors(n: int) -> list[int]:
    """Proper divisors of n (1 < d < n), ascending. Pairs up to the square root: a loop of extent 2^40
    (a fuzzed program) costs a million steps, not a trillion."""
    small, large = [], []
    for d in range(2, math.isqrt(max(n, 0)) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]


def by_preference(factors: list[int]) -> list[int]:
    """`factors` in PREFERRED_FACTORS order, the others after them, ascending."""
    return sorted(factors, key=lambda f: (PREFERRED_FACTORS.index(f) if f in PREFERRED_FACTORS else 99, f))


def factor_rank(f: int) -> int:
    return PREFERRED_FACTORS.index(f) if f in PREFERRED_FACTORS else len(PREFERRED_FACTORS) + f


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


def statements_under(program: Program, top: int, path: tuple[int, ...], nest: Nest, k: int):
    """The statements below loop k of the band at (top, path), with all loops enclosing each."""
    outer = enclosing_loops(program, top, path) + nest.loops[:k + 1]
    return body_statements(Nest(nest.loops[k + 1:], nest.body), outer)


# --- fusing two adjacent nests ---------------------------------------------------------------------

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


@dataclass(frozen=True)
class Fusion:
    """Two adjacent nests fused over their first `len(shared)` loops."""

    nest: Nest
    shared: tuple[Loop, ...]
    common: tuple[str, ...]      # tensors the first part writes and the second accesses
    contracted: tuple[str, ...]  # products the compiler may now contract into an FMA

    @property
    def exactness(self) -> str | None:
        return "reassociating" if self.contracted else None


def _renamed_second(program: Program, i: int, depth: int) -> tuple[Nest, Nest, tuple[Loop, ...]]:
    """(nest i, nest i+1 with its first `depth` loops named as nest i's and its others renamed apart,
    the shared loops)."""
    a, b = program.nests[i], program.nests[i + 1]
    shared = a.loops[:depth]
    mapping = {lb.var: la.var for la, lb in zip(shared, b.loops[:depth], strict=True)}
    fresh = fresh_indices(program)
    taken = {lp.var for lp in shared}
    for lb in b.loops[depth:]:
        if lb.var in taken:
            mapping[lb.var] = fresh.fresh()
    return a, rename_vars_in_nest(b, mapping), shared


def fusion_problem(program: Program, i: int, depth: int) -> str | None:
    """Why nests i and i+1 cannot be fused over their first `depth` loops (a dependence between them
    would be reversed, or a fused P/V loop would carry one), or None."""
    if depth < 1 or depth > common_depth(program.nests[i], program.nests[i + 1]):
        return "the nests do not share that many loops"
    a, b, shared = _renamed_second(program, i, depth)
    first, second = body_statements(a), body_statements(b)
    reason = misaligned(first, second, [lp.var for lp in shared])
    if reason:
        return reason
    for lp in shared:
        if lp.kind in ("P", "V"):  # such a loop must stay free of carried dependences (docs/leir.md §4.1)
            why = loop_carries_dependence(first + second, lp.var)
            if why:
                return f"the fused {lp.kind} loop {lp.var} would carry a dependence: {why}"
    return None


def fuse_nests(program: Program, i: int, depth: int) -> Fusion:
    """Nests i and i+1 fused over their first `depth` loops (a fusion `fusion_problem` passed)."""
    a, b, shared = _renamed_second(program, i, depth)
    first, second = body_statements(a), body_statements(b)
    second_names = {x for s, _ in second for x in [s.lhs.tensor] + [acc.tensor for acc in accesses(s.rhs)]}
    common = tuple(t for t in written_tensors(first) if t in second_names)
    fused = Nest(shared, _fused_part(a, depth) + _fused_part(b, depth))
    return Fusion(fused, shared, common, tuple(contracted_products(first, second)))


def _fused_part(nest: Nest, depth: int) -> tuple:
    """The body items a nest contributes when its first `depth` loops are fused away."""
    if depth == len(nest.loops):
        return nest.body
    return (Nest(nest.loops[depth:], nest.body),)


def fusion_facts(f: Fusion) -> tuple[str, ...]:
    depth = len(f.shared)
    facts = (f"the nests share {depth} loop{'s' if depth > 1 else ''} "
             f"({', '.join(f'{lp.var}:{lp.extent}' for lp in f.shared)}) with the same extents and kinds",
             "every element one nest writes and the other accesses is accessed at the same iteration of "
             "the shared loops, and within an iteration the first nest's part still runs first",
             "statement order is unchanged, so implicit initialisations stay as they were")
    if f.contracted:
        facts = facts + (f"{', '.join(f.contracted)} is a product added to another value in the same iteration: "
                         "the compiler forwards it from the store and fuses the multiply-add (one rounding "
                         "instead of two), so the results agree within rounding, not bit for bit",)
    return facts


def fusion_summary(f: Fusion) -> str:
    reuse = f"; {', '.join(f.common)} is produced and consumed in the same iteration" if f.common else ""
    return (f"One pass over {iterations(f.shared)} iterations of {', '.join(lp.var for lp in f.shared)} instead of "
            f"two{reuse}, which saves loop overhead and improves locality.")


def contracted_products(first, second) -> list[str]:
    """Tensors that the first part stores as a product and the second part adds to something: once
    both run in one iteration, LLVM replaces the load by the stored value and contracts the multiply
    and the add into an FMA, which rounds once where the two nests rounded twice."""
    products = {s.lhs.tensor: s.lhs.dtype for s, _ in first if is_product(s.rhs) and product_rounds(s.rhs, s.lhs.dtype)}
    # a product stored in another dtype than its reader computes in is rounded by the store: no FMA forms
    return list(dict.fromkeys(a.tensor for s, _ in second for a in accesses(s.rhs)
                              if products.get(a.tensor) == s.lhs.dtype and contraction_contexts(s.rhs, a)))


# --- factoring a reduction axis (rfactor) ------------------------------------------------------------

@dataclass(frozen=True)
class Factored:
    """A reduction nest split into partial results over `part` (a fresh tensor) and a combining nest."""

    program: Program
    acc: Access          # the reduction's accumulator
    part: str            # the tensor of partial results
    loop: Loop           # the factored reduction loop
    factor: int
    op: str              # the reduction operator
    part_op: str         # the operator partials and the combination apply


def factor_reduction_problem(ctx: Context, top: int, k: int, factor: int) -> str | None:
    """Why the reduction loop k of the one-statement nest `top` cannot be factored by `factor`, or
    None."""
    nest = ctx.program.nests[top]
    stmt, lp = nest.body[0], nest.loops[k]
    op = reduction_op(stmt)
    if not 1 < factor < lp.extent or lp.extent % factor:
        return "the factor must properly divide the extent"
    if op is None or lp.var in lhs_vars(stmt):
        return f"{lp.var} is not a reduction axis of a reduction"
    merged = merged_subscript_vars(stmt, nest.loops)
    if merged:
        return (f"{merged[0]} appears in {stmt.lhs.tensor}'s subscript but several of its iterations "
                "accumulate into one element: the combining nest cannot run over it")
    if op in ("+", "-", "*"):
        drift = sum_drift_problem(accumulated_terms(stmt, nest.loops), stmt.lhs.dtype, stmt.lhs.tensor,
                                  ctx.result_code)
        if drift:
            return drift
    if any(a.tensor == stmt.lhs.tensor for a in reads_without_self(stmt)):
        return f"the reduced value reads {stmt.lhs.tensor} elsewhere than as the accumulator"
    return None


def factor_reduction(ctx: Context, top: int, k: int, factor: int) -> Factored:
    """The one-statement reduction nest `top` with its reduction loop k factored by `factor`: partial
    results per inner index into a new tensor, then a short reduction over them (a factoring that
    `factor_reduction_problem` passed)."""
    nest = ctx.program.nests[top]
    stmt, lp = nest.body[0], nest.loops[k]
    op, x = reduction_op(stmt), stmt.lhs
    split = split_loop(nest, k, factor, fresh_indices(ctx.program).fresh())
    part_op = "+" if op == "-" else op
    y = Access(fresh_tensors(ctx.program, ctx.signature).fresh(), x.dtype, "g", x.indices + (Var(lp.var),))
    partial = Nest(split.loops, (map_stmt(split.body[0], lambda n: y if n == x else n),))
    spatial = set(lhs_vars(stmt))
    combine_loops = tuple(q for q in nest.loops if q.var in spatial) + (Loop("L", factor, lp.var),)
    combined = Call(part_op, (x, y)) if part_op in ("max", "min") else BinOp(part_op, x, y)
    program = replace_nests(ctx.program, top, 1, (partial, Nest(combine_loops, (Stmt(x, combined),))))
    return Factored(program, x, y.tensor, lp, factor, op, part_op)


def serial_partials_problem(ctx: Context, top: int, factor: int) -> str | None:
    """Why factoring the reduction nest `top` cannot help on this target, or None: on the CPU its
    partial results land in a global tensor, and with every loop serial nothing then runs in parallel
    or as vector lanes; the step only adds a store per partial and a second pass (a vectorised split is
    loop_vectorization's `partials` variant, which marks the lane loop V)."""
    nest = ctx.program.nests[top]
    if ctx.gpu or any(lp.kind in ("P", "V") for lp in nest.loops):
        return None
    spatial = set(lhs_vars(nest.body[0])) if nest.body and isinstance(nest.body[0], Stmt) else set()
    size = iterations(lp for lp in nest.loops if lp.var in spatial) * factor
    return (f"on the CPU the partial results would land in a global tensor of {size} element"
            f"{'s' if size != 1 else ''} inside serial loops: nothing runs in parallel or as vector lanes, "
            "and the step adds a store per partial result and a second pass over them")


def factored_facts(r: Factored) -> tuple[str, ...]:
    return (f"{r.acc.tensor} is reduced with {r.op!r} over {r.loop.var}, which is not in its subscript",
            f"{r.factor} divides the extent {r.loop.extent}",
            f"{r.part} is a fresh tensor; its partial results start from the identity of {r.part_op!r} "
            "(implicit initialisation), and the combining nest applies the same operator",
            "the association of the reduction changes, so results agree within rounding")


def factored_summary(r: Factored) -> str:
    lp, f = r.loop, r.factor
    return (f"The reduction over {lp.var} ({lp.extent}) is factored into {f} partial reductions of "
            f"{lp.extent // f} terms ({r.part}), then combined: {f} independent accumulation chains instead of "
            f"one, over a loop {lp.var} that stays serial until a later step schedules it.")
