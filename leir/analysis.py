"""Facts about a program that everything downstream needs (docs/leir.md §4).

- `statement_sites`: every statement with its enclosing loops, in program order;
- `index_range` / `affine_form`: integer ranges of subscripts over the loop box (exact when affine);
- `tensor_table`: known tensors from the signature, intermediates with inferred shapes (bounding
  box of the subscripts that write them), dtypes and scopes;
- `init_identity` / `implicit_inits`: which statements are reductions with implicit initialisation
  and from which identity (§4.4);
- `spatial_axes` / `reduction_axes` per statement, and read/write sets per nest.
Everything returned is ordered by first occurrence: no set or hash order leaks out.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from leir.ast import (
    EXTENSION_FNS,
    Access,
    And,
    BinOp,
    Call,
    Compare,
    Loop,
    Neg,
    Nest,
    Num,
    Or,
    Program,
    Select,
    Stmt,
    Var,
    accesses,
    children,
    walk_expr,
)
from leir.signature import Signature


@dataclass(frozen=True, slots=True)
class StmtSite:
    """One statement in place: `path` indexes bodies from the top-level nest down to it."""

    order: int                 # position in program order (0-based)
    nest_index: int            # top-level nest that contains it
    path: tuple[int, ...]      # body positions below the top-level nest
    loops: tuple[Loop, ...]    # enclosing loops, outermost first
    stmt: Stmt

    @property
    def bounds(self) -> dict[str, tuple[int, int]]:
        return loop_bounds(self.loops)


def statement_sites(program: Program) -> list[StmtSite]:
    sites: list[StmtSite] = []
    for top, nest in enumerate(program.nests):
        # (nest, path, enclosing loops, next body position): an explicit stack, so that nests nested
        # any number of levels deep are walked without recursion.
        stack = [(nest, (), nest.loops, 0)]
        while stack:
            current, path, loops, i = stack.pop()
            body = current.body
            while i < len(body):
                item = body[i]
                if isinstance(item, Stmt):
                    sites.append(StmtSite(len(sites), top, path + (i,), loops, item))
                    i += 1
                    continue
                stack.append((current, path, loops, i + 1))
                stack.append((item, path + (i,), loops + item.loops, 0))
                break
    return sites


def extensions_used(program: Program) -> list[str]:
    """The project's extensions of the published format (`leir.ast.EXTENSION_FNS`) that `program`
    uses, in first-use order."""
    return list(dict.fromkeys(n.fn for site in statement_sites(program)
                              for part in (site.stmt.lhs, site.stmt.rhs) for n in walk_expr(part)
                              if isinstance(n, Call) and n.fn in EXTENSION_FNS))


def iter_nests(program: Program) -> Iterator[tuple[Nest, tuple[Loop, ...]]]:
    """Every nest (nested ones included) with the loops that enclose it, in program order."""
    for top in program.nests:
        stack = [(top, ())]
        while stack:
            nest, outer = stack.pop()
            yield nest, outer
            inner = outer + nest.loops
            stack.extend((item, inner) for item in reversed(nest.body) if isinstance(item, Nest))


def loop_bounds(loops) -> dict[str, tuple[int, int]]:
    """Inclusive range of each loop variable: [start, start + extent - 1]."""
    return {lp.var: (lp.start, lp.start + lp.extent - 1) for lp in loops}


# --- integer ranges of index expressions -----------------------------------------------------------

def element_bytes(code: str) -> int:
    """Bytes of one element of a LEIR dtype code (`f32` -> 4, `bool` -> 1)."""
    digits = "".join(ch for ch in code if ch.isdigit())
    return max(int(digits) // 8, 1) if digits else 1


def tensor_boxes(program: Program) -> dict[str, tuple[int, ...] | None]:
    """Each tensor's shape as the bounding box of every access to it, known tensors included (None:
    ranks differ); a subscript that is not affine does not widen the box."""
    boxes: dict[str, list[int] | None] = {}
    for site in statement_sites(program):
        bounds = site.bounds
        for acc in (*accesses(site.stmt.lhs), *accesses(site.stmt.rhs)):
            box = boxes.setdefault(acc.tensor, [1] * len(acc.indices))
            if box is None or len(box) != len(acc.indices):
                boxes[acc.tensor] = None
                continue
            for d, ix in enumerate(acc.indices):
                form = affine_form(ix)
                if form is not None:
                    hi = form[1] + sum(c * bounds[v][1 if c > 0 else 0] for v, c in form[0].items() if v in bounds)
                    box[d] = max(box[d], hi + 1)
    return {k: tuple(v) if v is not None else None for k, v in boxes.items()}


def access_strides(shape: tuple[int, ...] | None, acc: Access) -> dict[str, int] | None:
    """Element stride of `acc` per loop variable (row-major); None for a gather or an unknown shape."""
    found = partial_strides(shape, acc)
    return None if found is None or found[1] else found[0]


def partial_strides(shape: tuple[int, ...] | None, acc: Access) -> tuple[dict[str, int], set[str]] | None:
    """The element strides of `acc`'s affine subscripts per loop variable (row-major), and the names
    in its other subscripts (a grouped-query head's `a//2`, a gather), whose strides are unknown;
    None for an unknown shape."""
    if shape is None or len(shape) != len(acc.indices):
        return None
    out: dict[str, int] = {}
    opaque: set[str] = set()
    step = 1
    for extent, ix in zip(reversed(shape), reversed(acc.indices), strict=True):
        form = affine_form(ix)
        if form is None:
            opaque |= {n.name for n in walk_expr(ix) if isinstance(n, Var)}
        else:
            for var, c in form[0].items():
                out[var] = out.get(var, 0) + c * step
        step *= max(int(extent), 1)
    return out, opaque


def affine_form(expr) -> tuple[dict[str, int], int] | None:
    """`expr` as ({var: coefficient}, constant) when it is affine in loop variables, else None."""
    return _ranges(expr, None)[0]


def index_range(expr, bounds: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    """Inclusive integer range of an index expression over the loop box; None when it depends on
    data (a gather) or on a name without bounds. Exact for affine expressions."""
    return _ranges(expr, bounds)[1]


def _ranges(expr, bounds: dict[str, tuple[int, int]] | None):
    """(affine form, range) of `expr`, bottom-up with an explicit stack (a subscript may be a sum of
    any length). A node's range is its affine form's exact range when it has one, else the interval
    combination of its operands' ranges (`bounds` None: ranges are not wanted)."""
    if isinstance(expr, Var | Num):  # the common subscript, without the walk
        form = _affine_leaf(expr)
        return form, (_affine_range(form, bounds) if form is not None and bounds is not None else None)
    done: dict[int, tuple] = {}
    stack = [(expr, False)]
    while stack:
        node, ready = stack.pop()
        if not ready and isinstance(node, Neg | BinOp):
            stack.append((node, True))
            stack.extend((c, False) for c in ((node.operand,) if isinstance(node, Neg) else (node.rhs, node.lhs))
                         if id(c) not in done)
            continue
        if id(node) in done:
            continue
        if isinstance(node, Neg):
            form, r = done[id(node.operand)]
            form = None if form is None else ({k: -c for k, c in form[0].items()}, -form[1])
            r = None if r is None else (-r[1], -r[0])
        elif isinstance(node, BinOp):
            (fa, ra), (fb, rb) = done[id(node.lhs)], done[id(node.rhs)]
            form = _affine_binop(node.op, fa, fb)
            r = None if ra is None or rb is None else _interval(node.op, ra, rb)
        else:
            form, r = _affine_leaf(node), None
        if form is not None and bounds is not None:
            r = _affine_range(form, bounds)
        done[id(node)] = (form, r)
    return done[id(expr)]


def _affine_leaf(node):
    match node:
        case Num(value=v) if isinstance(v, int):
            return {}, v
        case Var(name=n):
            return {n: 1}, 0
    return None


def _affine_binop(op: str, fa, fb):
    if fa is None or fb is None:
        return None
    if op in ("+", "-"):
        sign = 1 if op == "+" else -1
        coeffs = dict(fa[0])
        for k, c in fb[0].items():
            coeffs[k] = coeffs.get(k, 0) + sign * c
        return {k: c for k, c in coeffs.items() if c}, fa[1] + sign * fb[1]
    if op == "*":
        if not fa[0]:
            fa, fb = fb, fa
        if fb[0]:
            return None  # product of two variables
        k = fb[1]
        return {v: c * k for v, c in fa[0].items() if c * k}, fa[1] * k
    return None


def _affine_range(form, bounds) -> tuple[int, int] | None:
    lo = hi = form[1]
    for var, c in form[0].items():
        if var not in bounds:
            return None
        vlo, vhi = bounds[var]
        lo += min(c * vlo, c * vhi)
        hi += max(c * vlo, c * vhi)
    return lo, hi


def _interval(op, ra, rb):
    if op == "+":
        return ra[0] + rb[0], ra[1] + rb[1]
    if op == "-":
        return ra[0] - rb[1], ra[1] - rb[0]
    if op == "*":
        products = [x * y for x in ra for y in rb]
        return min(products), max(products)
    if op == "//" and rb[0] == rb[1] and rb[0] > 0:
        return ra[0] // rb[0], ra[1] // rb[0]
    if op == "%" and rb[0] == rb[1] and rb[0] > 0:
        c = rb[0]
        if ra[0] // c == ra[1] // c:
            return ra[0] % c, ra[1] % c
        return 0, c - 1
    return None


# --- depth -----------------------------------------------------------------------------------------

# Everything in `leir` walks trees with explicit stacks, so no depth breaks parsing, printing, hashing
# or validation. Lowering hands the tree to TVM, whose C++ passes recurse on it: leir.lower runs
# them on a thread whose stack grows with the expression's depth (leir/lower/stack.py), up to these
# limits, which validation reports too (`too-deep`), so that `leir check` and lowering agree.
MAX_EXPRESSION_DEPTH = 50_000
MAX_LOOP_DEPTH = 64


def expression_depth(expr) -> int:
    """Levels of the deepest path from `expr` to a leaf (subscripts included; 1 for a leaf), as the
    lowered expression has them: a condition of k terms (`a&b&...`, a chain `a<b<c`) is a chain of k
    binary nodes there."""
    deepest = 0
    stack = [(expr, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        kids = children(node)
        step = len(kids) if isinstance(node, And | Or | Compare) else 1
        stack.extend((c, depth + step) for c in kids)
    return deepest


def statement_depth(stmt: Stmt) -> int:
    return max(expression_depth(stmt.lhs), expression_depth(stmt.rhs))


def program_depth(program: Program) -> int:
    """The deepest expression of the program (what TVM's recursive passes see)."""
    return max((statement_depth(site.stmt) for site in statement_sites(program)), default=0)


def site_depth_problem(site: StmtSite) -> str:
    """Why the statement is too deep to lower ("" when it is not): lowering refuses it, validation
    reports it as `too-deep`."""
    if len(site.loops) > MAX_LOOP_DEPTH:
        return f"{len(site.loops)} loops enclose the statement; lowering handles at most {MAX_LOOP_DEPTH}"
    depth = statement_depth(site.stmt)
    if depth > MAX_EXPRESSION_DEPTH:
        return f"an expression {depth:,} levels deep; lowering handles at most {MAX_EXPRESSION_DEPTH:,}"
    return ""


# --- bounds of accesses (what validation and lowering both check) --------------------------------

def unguarded_reads(stmt: Stmt) -> Iterator[Access]:
    """Accesses that execute whenever the statement does: gathers in the left-hand subscript and
    reads of the right-hand side that are not inside a branch of `if_then_else` (padding reads
    legitimately fall outside the tensor there; the branch is never evaluated)."""
    stack = list(stmt.lhs.indices) + [stmt.rhs]
    while stack:
        node = stack.pop()
        if isinstance(node, Select):
            stack.append(node.cond)
            continue
        if isinstance(node, Access):
            yield node
        stack.extend(children(node))


def subscript_overflow(acc: Access, bounds: dict[str, tuple[int, int]], shape: tuple[int, ...]
                       ) -> tuple[int, tuple[int, int]] | None:
    """(dimension, range) of the first subscript of `acc` whose range over the loop box (`index_range`:
    exact for affine subscripts, interval arithmetic otherwise; gathers are unknown until run time)
    leaves 0..size-1 of `shape`, else None."""
    for d, (ix, size) in enumerate(zip(acc.indices, shape, strict=False)):
        r = index_range(ix, bounds)
        if r is not None and (r[0] < 0 or r[1] >= size):
            return d, r
    return None


# --- tensors ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dtype: str                    # LEIR code (f32, ...)
    scope: str
    shape: tuple[int, ...] | None  # None when it cannot be inferred (see `shape_problem`)
    role: str                     # "input", "output" or "intermediate"
    shape_problem: str = ""

    @property
    def known(self) -> bool:
        return self.role != "intermediate"


def tensor_order(program: Program) -> list[str]:
    """Tensor names in order of first occurrence (left-hand side before right-hand side)."""
    seen: dict[str, None] = {}
    for site in statement_sites(program):
        for acc in _stmt_accesses(site.stmt):
            seen.setdefault(acc.tensor, None)
    return list(seen)


def _stmt_accesses(stmt: Stmt) -> Iterator[Access]:
    yield from accesses(stmt.lhs)
    yield from accesses(stmt.rhs)


def first_types(program: Program) -> dict[str, tuple[str, str]]:
    """The (dtype, scope) of each tensor's first access."""
    out: dict[str, tuple[str, str]] = {}
    for site in statement_sites(program):
        for acc in _stmt_accesses(site.stmt):
            out.setdefault(acc.tensor, (acc.dtype, acc.scope))
    return out


def tensor_table(program: Program, signature: Signature) -> dict[str, TensorInfo]:
    """Known tensors (signature order) then intermediates (order of first occurrence)."""
    table = {t.name: TensorInfo(t.name, t.code, "g", t.shape, t.role) for t in signature.tensors}
    types = first_types(program)
    writes: dict[str, list[tuple[Access, dict]]] = {}
    for site in statement_sites(program):
        writes.setdefault(site.stmt.lhs.tensor, []).append((site.stmt.lhs, site.bounds))
    for name in tensor_order(program):
        if name in table:
            continue
        dtype, scope = types[name]
        shape, problem = _written_box(writes.get(name, []))
        table[name] = TensorInfo(name, dtype, scope, shape, "intermediate", problem)
    return table


def _written_box(writes) -> tuple[tuple[int, ...] | None, str]:
    if not writes:
        return None, "never written"
    ranks = {len(acc.indices) for acc, _ in writes}
    if len(ranks) > 1:
        return None, f"written with {sorted(ranks)} subscripts (ranks disagree)"
    rank = ranks.pop()
    hi = [-1] * rank
    for acc, bounds in writes:
        for d, ix in enumerate(acc.indices):
            r = index_range(ix, bounds)
            if r is None:
                return None, f"subscript {d + 1} of a write depends on data (gather) or an unbound name"
            if r[0] < 0:
                return None, f"subscript {d + 1} of a write can be negative ({r[0]})"
            hi[d] = max(hi[d], r[1])
    return tuple(h + 1 for h in hi), ""


# --- statements: updates, implicit initialisation, axes --------------------------------------------

# `x**n` with an integral literal n, |n| <= this, is lowered as repeated multiplication (docs/leir.md §5).
MAX_POWER_BY_MULTIPLICATION = 8


def integral_exponent(e) -> int | None:
    """The integer value of a literal exponent (`2`, `2.0`, `-1`), else None."""
    sign = 1
    if isinstance(e, Neg):
        sign, e = -1, e.operand
    if isinstance(e, Num) and not math.isinf(e.value) and e.value == int(e.value):
        return sign * int(e.value)
    return None


def is_product(e) -> bool:
    """A multiplication as the compiler sees it (`a*b`, a positive integral power `x**2`, which is
    lowered to `x*x`, or the negation of one): fused with an enclosing + or - into one FMA by LLVM."""
    while isinstance(e, Neg):
        e = e.operand
    if isinstance(e, BinOp) and e.op == "**":
        n = integral_exponent(e.rhs)
        return n is not None and 2 <= n <= MAX_POWER_BY_MULTIPLICATION
    return isinstance(e, BinOp) and e.op == "*"


def contraction_contexts(expr, target) -> bool:
    """Whether `target` occurs as a direct operand of + or - in `expr` (outside subscripts): moving a
    product into or out of such a place changes whether the compiler fuses it into an FMA, which
    changes the rounding, so an `exact` rewrite must not do it."""
    stack = [expr]
    while stack:
        n = stack.pop()
        if isinstance(n, Access):
            continue
        if isinstance(n, BinOp) and n.op in ("+", "-") and target in (n.lhs, n.rhs):
            return True
        stack.extend(children(n))
    return False


IDENTITIES = {"+": 0, "-": 0, "*": 1, "max": -math.inf, "min": math.inf}


def is_update(stmt: Stmt) -> bool:
    """The left-hand tensor also occurs on the right-hand side."""
    return any(a.tensor == stmt.lhs.tensor for a in accesses(stmt.rhs))


def reduction_op(stmt: Stmt) -> str | None:
    """'+', '-', '*', 'max' or 'min' when the right-hand side has the form `X+e`, `X-e`, `X*e`,
    `max(X,e)` or `min(X,e)` with X written exactly as the left-hand side (the canonical text begins
    with `X+`, `X-`, `X*`, `max(X,` or `min(X,`)."""
    x, rhs = stmt.lhs, stmt.rhs
    if isinstance(rhs, Call) and rhs.fn in ("max", "min") and rhs.args[0] == x:
        return rhs.fn
    # Walk the left spine while the text still starts with X: a +/- below a */ would be parenthesised.
    node, parent_op = rhs, None
    while isinstance(node, BinOp) and node.op != "**":
        if parent_op in ("*", "/", "//", "%") and node.op in ("+", "-"):
            return None
        parent_op, node = node.op, node.lhs
        if node == x:
            return parent_op if parent_op in ("+", "-", "*") else None
    return None


def implicit_inits(program: Program, signature: Signature) -> dict[int, int | float]:
    """{statement order: identity} for every reduction with implicit initialisation (§4.4): an
    update of the form above, of a tensor that is not an input and that no earlier statement writes."""
    inputs = {t.name for t in signature.inputs}
    written: set[str] = set()
    out: dict[int, int | float] = {}
    for site in statement_sites(program):
        name = site.stmt.lhs.tensor
        if name not in inputs and name not in written and is_update(site.stmt):
            op = reduction_op(site.stmt)
            if op is not None:
                out[site.order] = IDENTITIES[op]
        written.add(name)
    return out


def lhs_vars(stmt: Stmt) -> list[str]:
    seen: dict[str, None] = {}
    for ix in stmt.lhs.indices:
        for n in walk_expr(ix):
            if isinstance(n, Var):
                seen.setdefault(n.name, None)
    return list(seen)


def spatial_axes(site: StmtSite) -> tuple[str, ...]:
    """Enclosing loop variables that appear in the left-hand subscript, outermost first."""
    used = set(lhs_vars(site.stmt))
    return tuple(lp.var for lp in site.loops if lp.var in used)


def reduction_axes(site: StmtSite) -> tuple[str, ...]:
    used = set(lhs_vars(site.stmt))
    return tuple(lp.var for lp in site.loops if lp.var not in used)


# --- read/write sets -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AccessSets:
    reads: tuple[str, ...]   # tensor names, first occurrence order
    writes: tuple[str, ...]


def nest_access_sets(nest: Nest) -> AccessSets:
    reads: dict[str, None] = {}
    writes: dict[str, None] = {}
    for site in statement_sites(Program((nest,))):
        writes.setdefault(site.stmt.lhs.tensor, None)
        for ix in site.stmt.lhs.indices:  # gathers in a write subscript are reads
            for a in accesses(ix):
                reads.setdefault(a.tensor, None)
        for a in accesses(site.stmt.rhs):
            reads.setdefault(a.tensor, None)
    return AccessSets(tuple(reads), tuple(writes))


def program_access_sets(program: Program) -> list[AccessSets]:
    return [nest_access_sets(n) for n in program.nests]
