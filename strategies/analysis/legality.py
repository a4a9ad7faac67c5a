"""Dependence facts the rules check (conservative: when unsure, the answer is 'carried'), and the
number of iterations a set of loops runs. Queries answer "why not, or None"; a rule turns a reason
into a refusal with `strategies.base.refuse`."""
from __future__ import annotations

import math

from leir.analysis import affine_form, integral_exponent, lhs_vars, loop_bounds, reduction_op
from leir.ast import Access, BinOp, Loop, Neg, Nest, Num, Stmt, accesses
from strategies.analysis.numerics import MANTISSA_BITS, exact_product_bits


def iterations(loops) -> int:
    """How many times the body of `loops` runs: the product of their extents (1 for no loop)."""
    return math.prod(lp.extent for lp in loops)


# --- fused multiply-adds: where contraction changes the rounding -------

def product_rounds(product, code: str) -> bool:
    """Whether `product` (a multiplication as `leir.analysis.is_product` sees it), computed in dtype
    `code`, is rounded, so that LLVM fusing it with an add into one FMA changes the result. It is not
    where the product is exact in `code` (the significands of its factors fit: two float16 or bfloat16
    reads in a float32 statement, docs/leir.md §4.5; a power-of-two literal only scales), nor in a bfloat16
    statement, which the lowering rounds explicitly after every operation (no FMA can form)."""
    if code == "bf16":
        return False
    bits = _significand_bits(product, code)
    return bits is None or not exact_product_bits(bits, code)


def _significand_bits(e, code: str) -> list[int] | None:
    """Significand widths of the factors of a product (None: a factor is itself rounded in `code`)."""
    if isinstance(e, Neg):
        return _significand_bits(e.operand, code)
    if isinstance(e, BinOp) and e.op == "*":
        left, right = _significand_bits(e.lhs, code), _significand_bits(e.rhs, code)
        return None if left is None or right is None else left + right
    if isinstance(e, BinOp) and e.op == "**":
        n, base = integral_exponent(e.rhs), _significand_bits(e.lhs, code)
        return None if n is None or base is None or n < 1 else base * n
    if isinstance(e, Access):
        return [MANTISSA_BITS[e.dtype]] if e.dtype in MANTISSA_BITS else None
    if isinstance(e, Num) and math.isfinite(float(e.value)) and float(e.value) != 0:
        numerator, _ = abs(float(e.value)).as_integer_ratio()
        odd = numerator >> ((numerator & -numerator).bit_length() - 1)
        return [odd.bit_length() - 1]  # a power of two scales exactly: 0 bits
    return None


# --- steps that cannot help: refused, with the reason, whatever else holds -------------------

def one_iteration_problem(loop: Loop, what: str) -> str | None:
    """Why marking `loop` (`what`: parallel, vectorized, unrolled, bound) cannot help, or None."""
    if loop.extent < 2:
        return (f"{loop.var} runs one iteration: a {what} loop of one iteration changes nothing but the "
                "text (no work to share, no lanes, no branch to remove)")
    return None


# The pipeline's bound on the work one start of a parallel loop shares (params.yaml `min_parallel_work`,
# strategies.base.Context). Below it the thread pool's start and join (microseconds each start) cost
# about what the shared work saves: in the default build (Intel Xeon, 2 cores) 59 of the 62 released
# parallelisations below 8,192 innermost iterations a start were slower or no faster (docs/cli.md, "Steps
# that cannot help").
MIN_PARALLEL_WORK = 8192


def parallel_work_problem(var: str, launches: int, per_launch: int, minimum: int) -> str | None:
    """Why making `var` parallel cannot help when the loop is started `launches` times (the
    iterations of the serial loops around it) and each start shares `per_launch` innermost
    iterations among the cores, fewer than `minimum`; or None."""
    if per_launch >= minimum:
        return None
    where = (f"started {launches} times inside serial loops, each start sharing" if launches > 1
             else "sharing")
    return (f"{var} would be a parallel loop {where} only {per_launch} innermost iterations among the cores: "
            f"below {minimum} the thread pool's start and join cost about what the shared work saves")


def same_traversal_problem(old: list[Loop], new: list[Loop]) -> str | None:
    """Why a reordering from `old` to `new` cannot help (only loops of one iteration move), or None."""
    if [lp.var for lp in old if lp.extent > 1] == [lp.var for lp in new if lp.extent > 1]:
        return ("only loops of one iteration change places: every element is visited in the same order as "
                "before")
    return None


def copy_without_reuse_problem(tensor: str, reads_per_element: float) -> str | None:
    """Why a scratch copy of `tensor` read `reads_per_element` times per copied element cannot help."""
    if reads_per_element <= 1:
        return (f"each element copied from {tensor} would be read once: the scratch copy only adds a store "
                "and a load per element")
    return None


def body_statements(nest: Nest, outer: tuple[Loop, ...] = ()) -> list[tuple[Stmt, tuple[Loop, ...]]]:
    """Statements of a nest with all loops that enclose them (outer ones given), in order."""
    loops = outer + nest.loops
    out = []
    for item in nest.body:
        if isinstance(item, Stmt):
            out.append((item, loops))
        else:
            out.extend(body_statements(item, loops))
    return out


def separating_dim(acc: Access, var: str, loops: tuple[Loop, ...]) -> int | None:
    """A subscript dimension in which different values of `var` always give different elements:
    affine, `var` with coefficient c != 0, and every other term spanning less than |c|."""
    bounds = loop_bounds(loops)
    for d, ix in enumerate(acc.indices):
        form = affine_form(ix)
        if form is None or form[0].get(var, 0) == 0:
            continue
        c = abs(form[0][var])
        rest_span = 0
        for other, k in form[0].items():
            if other == var:
                continue
            if other not in bounds:
                break
            lo, hi = bounds[other]
            rest_span += abs(k) * (hi - lo)
        else:
            if rest_span < c or _mixed_radix(form[0], bounds):
                return d
    return None


def _mixed_radix(coeffs: dict[str, int], bounds) -> bool:
    """Whether an affine subscript is injective in all its variables jointly, like the digits of a
    mixed-radix number (`g*4+a` with a in 0..3): each coefficient exceeds the span of all smaller terms.
    Then distinct values of any one variable give distinct elements."""
    if any(v not in bounds for v in coeffs):
        return False
    span = 0
    for v, k in sorted(coeffs.items(), key=lambda kv: abs(kv[1])):
        if abs(k) <= span:
            return False
        lo, hi = bounds[v]
        span += abs(k) * (hi - lo)
    return True


def merged_subscript_vars(stmt: Stmt, loops: tuple[Loop, ...]) -> list[str]:
    """Loop variables in the statement's left-hand subscript that do not separate its elements
    (`F_{tx,a//16}`: sixteen iterations of `a` write one element): such a loop is a reduction axis
    too, although its variable appears on the left."""
    return [v for v in lhs_vars(stmt) if any(lp.var == v for lp in loops)
            and separating_dim(stmt.lhs, v, loops) is None]


def accumulated_terms(stmt: Stmt, loops: tuple[Loop, ...]) -> int:
    """How many terms an update accumulates into each element: the product of the extents of its
    reduction loops (those not in the left-hand subscript, and those merged by it)."""
    spatial = set(lhs_vars(stmt)) - set(merged_subscript_vars(stmt, loops))
    return iterations(lp for lp in loops if lp.var not in spatial)


def loop_carries_dependence(stmts: list[tuple[Stmt, tuple[Loop, ...]]], var: str) -> str | None:
    """Why iterations of loop `var` may interact, or None when they are independent: each write
    separates iterations in some dimension, and every read of a tensor written under the loop uses
    the same subscript as the write in that dimension."""
    written: dict[str, tuple[int, object]] = {}
    for stmt, loops in stmts:
        d = separating_dim(stmt.lhs, var, loops)
        if d is None:
            return (f"{stmt.lhs.tensor} is written at the same element by several iterations of {var} "
                    f"({var} is a reduction axis of it or does not separate its writes)")
        prev = written.get(stmt.lhs.tensor)
        if prev is not None and prev != (d, stmt.lhs.indices[d]):
            return f"{stmt.lhs.tensor} is written with different subscripts in dimension {d + 1}"
        written[stmt.lhs.tensor] = (d, stmt.lhs.indices[d])
    for stmt, _ in stmts:
        for acc in _reads(stmt):
            if acc.tensor in written:
                d, ix = written[acc.tensor]
                if len(acc.indices) <= d or acc.indices[d] != ix:
                    return f"{acc.tensor} is read at another iteration's element than the one written"
    return None


def _reads(stmt: Stmt):
    for ix in stmt.lhs.indices:
        yield from accesses(ix)
    yield from accesses(stmt.rhs)


def reads_without_self(stmt: Stmt) -> list[Access]:
    """The accesses an accumulation folds in, without the accumulator it updates: `e` of
    `max(X,e)`, the right operands of the left spine `X op e1 op e2 ...`."""
    op = reduction_op(stmt)
    rhs = stmt.rhs
    if op in ("max", "min"):
        return list(accesses(rhs.args[1]))
    out = []
    node = rhs
    while isinstance(node, BinOp) and node != stmt.lhs:
        out += list(accesses(node.rhs))
        node = node.lhs
    return out


# --- dependences between loops, statements and nests (graph and loop strategies) ---------------------

def carrying_loops(stmts: list[tuple[Stmt, tuple[Loop, ...]]], loops: tuple[Loop, ...]) -> list[str]:
    """The loops of `loops` across whose iterations the statements may interact (dependence carried);
    the others can move anywhere in the band without changing the order of dependent accesses."""
    return [lp.var for lp in loops if loop_carries_dependence(stmts, lp.var) is not None]


def keeps_relative_order(old: list[str], new: list[str], keep: list[str]) -> bool:
    """Whether the loops in `keep` appear in the same relative order in `new` as in `old`."""
    return [v for v in old if v in keep] == [v for v in new if v in keep]


def stmt_reads(stmt: Stmt) -> list[Access]:
    return list(_reads(stmt))


def written_tensors(stmts) -> list[str]:
    return list(dict.fromkeys(s.lhs.tensor for s, _ in stmts))


def read_tensors(stmts) -> list[str]:
    return list(dict.fromkeys(a.tensor for s, _ in stmts for a in _reads(s)))


def conflicts(first, second) -> list[tuple[str, Access, tuple, Access, tuple]]:
    """Pairs of accesses to one tensor, one from each statement list, at least one a write
    (true, anti and output dependences): (kind, access in first, its loops, access in second, loops)."""
    out = []
    for s1, l1 in first:
        acc1 = [("w", s1.lhs)] + [("r", a) for a in _reads(s1)]
        for s2, l2 in second:
            acc2 = [("w", s2.lhs)] + [("r", a) for a in _reads(s2)]
            for k1, a1 in acc1:
                for k2, a2 in acc2:
                    if a1.tensor == a2.tensor and "w" in (k1, k2):
                        kind = {"wr": "true", "rw": "anti", "ww": "output"}[k1 + k2]
                        out.append((kind, a1, l1, a2, l2))
    return out


def dependence_names(first, second) -> list[str]:
    """'true dependence on X', 'anti dependence on Y', ... between two statement lists."""
    return list(dict.fromkeys(f"{kind} dependence on {a1.tensor}" for kind, a1, _, _, _ in conflicts(first, second)))


def aligned(a1: Access, l1: tuple[Loop, ...], a2: Access, l2: tuple[Loop, ...], var: str) -> bool:
    """Both accesses name the same element only at the same value of `var`: the same subscript in a
    dimension that separates the values of `var` in both."""
    d1, d2 = separating_dim(a1, var, l1), separating_dim(a2, var, l2)
    return d1 is not None and d1 == d2 and a1.indices[d1] == a2.indices[d2]


def misaligned(first, second, fused: list[str]) -> str | None:
    """Why executing `second` interleaved with `first` over the shared loops `fused` (per iteration:
    first's part, then second's part) could change a result, or None: every conflicting access
    pair must meet only at the same iteration of every shared loop."""
    for kind, a1, l1, a2, l2 in conflicts(first, second):
        for var in fused:
            if not aligned(a1, l1, a2, l2, var):
                return (f"{kind} dependence on {a1.tensor}: the two accesses can meet at different "
                        f"iterations of {var}")
    return None
