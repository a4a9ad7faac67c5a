"""What a program costs where a step acts, read from the LEIR tree alone (the chain of
thought reasons from these figures; never from timings).

For the statements of a range of top-level nests (`figures`):

- **work**: executions of each statement, arithmetic operations and transcendental calls (exp, log,
  erf, sqrt) per execution;
- **memory traffic as written**: bytes each execution loads (distinct right-hand accesses) and
  stores (the left-hand access), counting only memory the target has: on a GPU shared and local
  scopes are on chip and do not count; on a CPU there is no such hierarchy (the scopes are ordinary
  buffers behind the same caches), only a local 0-d tensor is a register and does not count;
- **schedule on the target**: the parallel extent (CPU: the outermost `P` loop, TVM has no nested
  parallelism, `B` loops run serially; GPU: the product of the `B` loops, everything else runs
  serially inside a thread), the vector width (CPU: an innermost `V` loop; none on a GPU), unrolled
  iterations, and whether the innermost loop carries a reduction (a chain of dependent updates);
- **access pattern**: each access's stride along the innermost loop (0: kept in a register, 1:
  contiguous, more: strided, gather) and, for a read whose element is read again, how many times and
  across which loops, with its reuse distance: the bytes the inner loops touch between two reads of
  one element (what decides whether it is still in cache).

Shapes are the bounding box of every access (reads included), so no signature is needed.

The figures say what changes; they do not say which change wins where a step trades one figure for
another (a reorder that takes the reduction out of the innermost loop and makes its accesses
strided). `estimated_cycles` weighs them: a static, deliberately coarse estimate of the cycles the
statements of some nests take on a nominal CPU (ESTIMATE: 256-bit vectors, two cores), from the work
per execution (a transcendental call and a division weigh more than an add), the vector lanes the
innermost loop runs in (a `V` loop, or a plain innermost loop that the compiler vectorises by
itself: contiguous, no carried dependence, no call; a `V` loop over a statement with a call gains no
lanes: the target has no vector form of the call, so the lanes are unpacked into one scalar call
each and packed again around it, and the loop costs what the scalar loop does), the latency of a
dependence the innermost loop carries, the cost of entering an innermost loop (innermost loops of a
few iterations are unrolled: the loop around them is the one entered), the cache lines each access
touches per execution at the cache level its data (or its reuse distance) fits in (a strided access
whose lines stay in L1 for the next iterations of the loop around pays a line once per line, unless
its stride is a power of two that crowds them into a few of L1's sets), and the cores and start-up
cost of a parallel loop. It predicts no microseconds: the chain of thought compares two estimates of
the same program, never quotes them as times."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from leir.analysis import (
    access_strides,
    element_bytes,
    is_update,
    lhs_vars,
    partial_strides,
    statement_sites,
    tensor_boxes,
)
from leir.ast import Access, BinOp, Call, Compare, Loop, Neg, Program, Select, Var, accesses, children, walk_expr
from leir.object_cache import MISSING, ObjectCache

TRANSCENDENTAL = ("exp", "log", "erf", "sqrt", "fast_exp", "fast_log", "fast_erf")



@dataclass(frozen=True)
class Reuse:
    """A read whose elements are read `times` times each, again across `loops`; `distance` bytes are
    touched in between (None: not known, e.g. through a gather)."""

    tensor: str
    times: int
    loops: tuple[str, ...]
    distance: int | None


@dataclass(frozen=True)
class StatementCost:
    tensor: str                       # the tensor it writes
    loops: tuple[Loop, ...]
    executions: int
    ops: int                          # arithmetic operations per execution
    calls: int                        # transcendental calls per execution
    loaded: int                       # bytes loaded from memory per execution
    stored: int                       # bytes stored to memory per execution
    reduction: tuple[str, ...]        # reduction axes of an update
    parallel: int                     # parallel extent on the target
    parallel_loops: tuple[str, ...]
    vector: int                       # vector width on the target (1: scalar)
    unrolled: int
    chain: bool                       # the innermost loop carries the reduction or a scan (serial dependence)
    strides: tuple[tuple[str, int | None], ...]   # (tensor, stride along the innermost loop) per access
    reuse: tuple[Reuse, ...]

    @property
    def weight(self) -> int:
        return self.executions * (self.ops + self.calls + 1)

    @property
    def strided(self) -> int:
        """Accesses that do not walk the innermost loop contiguously (stride > 1 or a gather)."""
        return sum(1 for _, s in self.strides if s is None or s > 1)


@dataclass(frozen=True)
class Figures:
    """The figures of the statements of some nests; `main` is the heaviest statement (most work)."""

    nests: int
    statements: tuple[StatementCost, ...]

    def total(self, attr: str) -> int:
        return sum(getattr(s, attr) * s.executions for s in self.statements)

    @property
    def ops(self) -> int:
        return self.total("ops")

    @property
    def calls(self) -> int:
        return self.total("calls")

    @property
    def traffic(self) -> int:
        return self.total("loaded") + self.total("stored")

    @property
    def main(self) -> StatementCost | None:
        return max(self.statements, key=lambda s: s.weight, default=None)


def _value_nodes(expr):
    """The nodes that compute values (subscripts excluded), explicit stack."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, Access):
            stack.extend(children(node))


def operation_counts(expr) -> tuple[int, int]:
    """(arithmetic operations, transcendental calls) of one evaluation of `expr`."""
    ops = calls = 0
    for n in _value_nodes(expr):
        if isinstance(n, Call) and n.fn in TRANSCENDENTAL:
            calls += 1
        elif isinstance(n, BinOp | Neg | Select | Compare | Call):
            ops += 1
    return ops, calls


def _parallel(loops: tuple[Loop, ...], target: str) -> tuple[int, tuple[str, ...]]:
    if target == "cuda":
        bound = tuple(lp for lp in loops if lp.kind == "B")
        return math.prod(lp.extent for lp in bound), tuple(lp.var for lp in bound)
    first = next((lp for lp in loops if lp.kind == "P"), None)
    return (first.extent, (first.var,)) if first else (1, ())


def _footprint(accs, strides_of, shapes, loops) -> int:
    """Bytes the accesses touch while `loops` run."""
    total = 0
    for acc, st in zip(accs, strides_of, strict=True):
        vary = [lp for lp in loops if st is None or st.get(lp.var, 0)]
        total += math.prod(lp.extent for lp in vary) * element_bytes(acc.dtype)
    return total


def in_memory(acc: Access, target: str) -> bool:
    """Whether the target moves `acc` through memory (see the module's docstring)."""
    if target == "cuda":
        return acc.scope == "g"
    return not (acc.scope == "l" and not acc.indices)


def statement_cost(site, shapes, target: str) -> StatementCost:
    stmt, loops = site.stmt, site.loops
    executions = math.prod(lp.extent for lp in loops)
    reads = list(dict.fromkeys(accesses(stmt.rhs)))
    accs = list(dict.fromkeys([stmt.lhs, *reads]))
    strides_of = [access_strides(shapes.get(a.tensor), a) for a in accs]
    ops, calls = operation_counts(stmt.rhs)
    spatial = set(lhs_vars(stmt))
    reduction = tuple(lp.var for lp in loops if lp.var not in spatial) if is_update(stmt) else ()
    inner = loops[-1] if loops else None
    scan = inner is not None and carries_scan(stmt, inner.var)
    parallel, parallel_loops = _parallel(loops, target)
    vector = inner.extent if inner is not None and inner.kind == "V" and target == "llvm" else 1
    along = tuple((a.tensor, None if st is None else abs(st.get(inner.var, 0)) if inner else 0)
                  for a, st in zip(accs, strides_of, strict=True))
    reuse = []
    for acc, st in zip(accs, strides_of, strict=True):
        if acc not in reads or acc.tensor == stmt.lhs.tensor or not in_memory(acc, target):
            continue  # the accumulator's re-reads are the dependence chain, not reuse
        used = {n.name for ix in acc.indices for n in walk_expr(ix) if isinstance(n, Var)}
        across = tuple(lp.var for lp in loops if lp.var not in used)
        times = math.prod(lp.extent for lp in loops if lp.var not in used)
        if times > 1 and st is not None:
            k = max(i for i, lp in enumerate(loops) if lp.var in across)
            reuse.append(Reuse(acc.tensor, times, across, _footprint(accs, strides_of, shapes, loops[k + 1:])))
    return StatementCost(
        stmt.lhs.tensor, loops, executions, ops, calls,
        sum(element_bytes(a.dtype) for a in reads if in_memory(a, target)),
        element_bytes(stmt.lhs.dtype) if in_memory(stmt.lhs, target) else 0,
        reduction, parallel, parallel_loops, vector,
        math.prod(lp.extent for lp in loops if lp.kind == "U") if any(lp.kind == "U" for lp in loops) else 1,
        bool(inner is not None and (inner.var in reduction or scan) and not (inner.kind == "V" and target == "llvm")),
        along, tuple(reuse))


def carries_scan(stmt, var: str) -> bool:
    """Whether `stmt` reads the tensor it writes at another element along loop `var` (a prefix scan:
    each iteration waits for the one before, as a reduction's updates do)."""
    lhs = stmt.lhs
    for acc in accesses(stmt.rhs):
        if acc.tensor == lhs.tensor and acc != lhs and any(
                isinstance(n, Var) and n.name == var for ix in acc.indices for n in walk_expr(ix)):
            return True
    return False


def figures(program: Program, nests: range, target: str = "llvm") -> Figures:
    """The figures of the statements of `program`'s top-level nests in `nests` on `target`."""
    shapes = tensor_boxes(program)
    costs = tuple(statement_cost(s, shapes, target) for s in statement_sites(program) if s.nest_index in nests)
    return Figures(len(nests), costs)


# --- weighing the figures: a static estimate of cycles (see the module docstring) -------------------

@dataclass(frozen=True)
class Estimate:
    """The nominal CPU the estimate weighs figures for (cycles; bytes). Only ratios of two estimates of
    one program are ever read, so the weights matter relative to each other; they were chosen among
    plausible values by how often the claims they give agree with the default build's measured
    effects (docs/pipeline.md, "Decisions by measurement")."""

    vector_bytes: int = 32        # 256-bit vectors
    call: float = 20.0            # a transcendental call (exp, log, erf, sqrt; the `fast_*` forms vectorise: 1)
    division: float = 8.0         # a division or remainder
    latency: float = 2.0          # one update of a dependence the innermost loop carries, beyond its work
    issue: float = 1.0            # independent operations a core completes per cycle
    loop_entry: float = 4.0       # entering an innermost loop (its set-up, the branch out of it)
    unrolled_extent: int = 4      # innermost loops this short are unrolled entirely: no entry of their own
    unroll_budget: float = 300.0  # instructions of an innermost loop the compiler unrolls entirely
    registers: int = 16           # accumulators an unrolled loop keeps in registers
    l1: float = 0.25              # a cache line from L1 (at most l1_bytes of data or reuse distance)
    l2: float = 2.0               # from L2 (at most l2_bytes)
    memory: float = 8.0           # from memory
    l1_bytes: int = 32 * 1024
    l1_ways: int = 8
    l2_bytes: int = 1024 * 1024
    line_bytes: int = 64
    cores: int = 2
    parallel_start: float = 12000.0  # starting and joining a parallel loop once (a few µs on a small VM)
    nest: float = 100.0           # running a top-level nest at all (its loops' set-up, its pointers)


ESTIMATE = Estimate()


def estimated_cycles(program: Program, nests: range, target: str = "llvm", e: Estimate = ESTIMATE) -> float:
    """The estimate of the statements of `program`'s top-level nests in `nests` (CPU model; on a GPU
    target the same weighing, a coarse proxy)."""
    return estimated_cycles_each(program, nests, target, (e,))[0]


def estimated_cycles_each(program: Program, nests: range, target: str, estimates: tuple[Estimate, ...]
                          ) -> tuple[float, ...]:
    """`estimated_cycles` under each of `estimates` (the figures of each statement computed once)."""
    shapes = tensor_boxes(program)
    by_nest: dict[int, list] = {}
    for site in statement_sites(program):
        if site.nest_index in nests:
            by_nest.setdefault(site.nest_index, []).append(site)
    totals = [0.0] * len(estimates)
    for index, sites in by_nest.items():
        for each in _nest_statement_cycles(program.nests[index], sites, shapes, target, estimates):
            for k, cycles in enumerate(each):
                totals[k] += cycles  # statement by statement in program order, as without the cache
    count = len(range(len(program.nests))[nests.start:nests.stop])
    return tuple(t + e.nest * count for t, e in zip(totals, estimates, strict=True))


# Each top-level nest's statement cycles, kept by nest: the states of one program share most of their
# nests (a step rewrites one or two, and the others are the very same objects), and a search or the
# transform stage estimates hundreds of states of one program. A nest's figures depend on the nest and
# on the shapes of the tensors it accesses (`tensor_boxes` of the whole program: another nest may widen
# a tensor), so those shapes guard the entry.
_NEST_CYCLES = ObjectCache(8192)


_NEST_COSTS = ObjectCache(8192)


def accessed_boxes(sites: list, shapes: dict) -> tuple:
    """The shapes of the tensors the statements at `sites` access, in order of first access: what
    their figures depend on beyond the statements themselves (the guard of the caches kept by nest)."""
    return tuple((name, shapes.get(name)) for name in dict.fromkeys(
        a.tensor for site in sites for a in (*accesses(site.stmt.lhs), *accesses(site.stmt.rhs))))


def nest_statement_costs(nest, sites: list, shapes: dict, target: str) -> tuple[StatementCost, ...]:
    """`statement_cost` of each statement of `nest` (its `sites`, in order), kept by nest: the static
    estimate and the cost model's figure features both read them."""
    boxes = accessed_boxes(sites, shapes)
    kept = _NEST_COSTS.get(nest, boxes, target)
    if kept is MISSING:
        kept = tuple(statement_cost(site, shapes, target) for site in sites)
        _NEST_COSTS.put(nest, kept, boxes, target)
    return kept


def _nest_statement_cycles(nest, sites: list, shapes: dict, target: str, estimates: tuple[Estimate, ...]
                           ) -> tuple[tuple[float, ...], ...]:
    """Per statement of `nest` (its `sites`, in order), its cycles under each of `estimates`."""
    boxes = accessed_boxes(sites, shapes)
    kept = _NEST_CYCLES.get(nest, boxes, (target, estimates))
    if kept is not MISSING:
        return kept
    out, written = [], set()
    for site, cost in zip(sites, nest_statement_costs(nest, sites, shapes, target), strict=True):
        out.append(tuple(_statement_cycles(site, shapes, written, target, e, cost) for e in estimates))
        written.add(site.stmt.lhs.tensor)
    result = tuple(out)
    _NEST_CYCLES.put(nest, result, boxes, (target, estimates))
    return result


def _weighted_work(expr, e: Estimate, var: str) -> tuple[float, float, int]:
    """(work per execution, work per entry of the innermost loop `var`, transcendental calls per
    execution): a call or a division whose operands do not change along `var` is computed once
    before the loop (the compiler hoists it)."""
    per, hoisted, calls = 0.0, 0.0, 0
    stack = [expr]
    while stack:
        n = stack.pop()
        if isinstance(n, Access):
            continue
        weight = 1.0
        if isinstance(n, Call):
            weight = 1.0 if n.fn not in TRANSCENDENTAL or n.fn.startswith("fast_") else e.call
        elif isinstance(n, BinOp):
            weight = e.division if n.op in ("/", "%", "//") else 1.0
        elif not isinstance(n, Neg | Select | Compare):
            weight = 0.0
        if weight > 1.0 and not _depends_on(n, var):
            hoisted += weight
            continue  # the whole subtree is computed before the loop
        per += weight
        calls += isinstance(n, Call) and weight > 1.0
        stack.extend(children(n))
    return per, hoisted, calls


def _depends_on(expr, var: str) -> bool:
    return any(isinstance(n, Var) and n.name == var for n in walk_expr(expr))


def _lanes(site, inner, chain: bool, contiguous: bool, calls: int, e: Estimate) -> int:
    lanes = max(1, e.vector_bytes // element_bytes(site.stmt.lhs.dtype))
    if inner.kind == "V":
        if calls:
            return 1  # no vector form of the call: the lanes are unpacked around each call and packed again
        width = min(inner.extent, lanes)
        return width if contiguous else max(1, width // 2)       # gathers and scatters
    if inner.kind == "L" and not chain and not calls and contiguous and inner.extent >= lanes:
        return lanes                                             # the compiler vectorises it by itself
    return 1


def _level(e: Estimate, nbytes: float) -> float:
    return e.l1 if nbytes <= e.l1_bytes else e.l2 if nbytes <= e.l2_bytes else e.memory


def _statement_cycles(site, shapes, written_here: set[str], target: str, e: Estimate,
                      cost: StatementCost | None = None) -> float:
    cost = cost or statement_cost(site, shapes, target)
    if not site.loops:
        return 1.0
    # the innermost loop that is a loop: the lowering drops loops of one iteration
    loops = [lp for lp in site.loops if lp.extent > 1] or [site.loops[-1]]
    inner = loops[-1]
    strides = {a: _known_strides(shapes.get(a.tensor), a) for a in dict.fromkeys([site.stmt.lhs,
                                                                                   *accesses(site.stmt.rhs)])}
    along = {a: _stride_along(st, inner.var) for a, st in strides.items()}
    chain = _carries(site, cost, inner)
    work, hoisted, calls = _weighted_work(site.stmt.rhs, e, inner.var)
    lanes = _lanes(site, inner, chain, all(v is not None and v <= 1 for v in along.values()), calls, e)
    serial = calls * e.call  # a call runs lane by lane (and then so does the rest of the statement)
    around = _unrolled_into(loops, chain, lanes, work, len(strides), e) if target != "cuda" or inner.kind != "B" \
        else None  # a thread-bound loop is not a loop of the kernel
    copies = inner.extent if around else 1
    per = (serial + (work - serial + 1.0 / copies) / lanes) / e.issue
    if chain and lanes == 1:
        per = max(per, e.latency)
    elif around and _carries(site, cost, around):
        per = max(per, e.latency / copies)  # `copies` independent chains along the loop around
    entry = 0.0 if inner.kind == "U" or around else e.loop_entry
    cycles = (cost.executions * per + cost.executions / inner.extent * hoisted
              + cost.executions / _entered_every(site.loops, e) * entry)
    if around:
        cycles += cost.executions / (copies * around.extent) * e.loop_entry
    reuse = {r.tensor: r.distance for r in cost.reuse}
    sharing = _set_sharing(along, copies, around, strides, e)
    for acc, step in along.items():
        if step == 0:
            continue  # the same element all along the innermost loop: a register
        if _held_in_registers(acc, around, copies, strides, e):
            continue  # the unrolled copies' elements stay in registers all along the loop around
        shape = shapes.get(acc.tensor)
        nbytes = element_bytes(acc.dtype)
        level = _level(e, math.prod(shape) * nbytes if shape else math.inf)
        if reuse.get(acc.tensor) is not None:
            level = min(level, _level(e, reuse[acc.tensor]))
        if acc.tensor in written_here and acc != site.stmt.lhs:
            level = e.l1  # written by a statement before it in the same nest: still in cache
        lines = 1.0 if step is None or step * nbytes >= e.line_bytes else step * nbytes / e.line_bytes
        uses = 1
        if lines == 1.0 and step:
            if inner.extent * sharing.get(acc, 1) > _l1_lines(step * nbytes, e):
                level = max(level, e.l2)  # its lines evict each other before the loop around reads them again
            else:
                uses = _line_uses(site, inner, strides[acc], nbytes, e)
        if uses > 1:  # the innermost loop's lines stay in L1 for the next iterations of the loop around it
            cycles += cost.executions * (e.l1 + level / uses)
            continue
        cycles += cost.executions * lines * level
    if cost.parallel > 1 and target == "llvm":
        first = next(i for i, lp in enumerate(site.loops) if lp.kind == "P")
        starts = math.prod(lp.extent for lp in site.loops[:first])
        cycles = cycles / min(cost.parallel, e.cores) + starts * e.parallel_start
    return cycles


def _stride_along(strides: dict | None, var: str) -> int | None:
    if strides is None or strides.get(var, 0) is None:
        return None
    return abs(strides.get(var, 0))


def _carries(site, cost: StatementCost, loop: Loop) -> bool:
    """Whether `loop` carries a serial dependence of the statement (its reduction, or a scan)."""
    return (loop.var in cost.reduction or carries_scan(site.stmt, loop.var)) and loop.kind != "V"


def _unrolled_into(loops: list[Loop], chain: bool, lanes: int, work: float, n_accesses: int,
                   e: Estimate) -> Loop | None:
    """The loop around the innermost one when the compiler unrolls the innermost entirely (a serial
    loop that neither vectorises nor carries a chain, whose unrolled body stays within
    `e.unroll_budget` instructions): its copies then run side by side in each iteration of the loop
    around, an accumulator that loop does not move stays in a register, and a chain that loop carries
    is `extent` independent chains. None when it is not unrolled."""
    inner = loops[-1]
    if len(loops) < 2 or inner.kind in ("V", "P", "U") or chain or lanes > 1:
        return None
    if inner.extent * (work + 2 * n_accesses + 2) > e.unroll_budget:
        return None
    return loops[-2]


def _entered_every(loops: tuple[Loop, ...], e: Estimate) -> int:
    """Executions per entry of a loop: the compiler unrolls innermost loops of at most
    `e.unrolled_extent` iterations entirely, so the loop entered is the first one around them."""
    n = 1
    for lp in reversed(loops):
        n *= lp.extent
        if lp.extent > e.unrolled_extent:
            break
    return max(n, 1)


def _known_strides(shape, acc: Access) -> dict[str, int | None] | None:
    """The element strides of `acc` per loop variable, None for a variable that only appears in a
    subscript that is not affine (a packed layout's `a//4`, `a%4`: unknown along `a`, but the access
    still walks its affine subscripts with known strides); None for an unknown shape."""
    found = partial_strides(shape, acc)
    if found is None:
        return None
    known, opaque = found
    return {**known, **dict.fromkeys(sorted(opaque))}


def _held_in_registers(acc, around, copies: int, strides: dict, e: Estimate) -> bool:
    """Whether the unrolled copies of an innermost loop keep `acc`'s elements in registers all along
    `around`, the loop they are unrolled into: the access does not move with it, and the copies fit."""
    return bool(around) and _stride_along(strides[acc], around.var) == 0 and copies <= e.registers


def _set_sharing(along: dict, copies: int, around, strides: dict, e: Estimate) -> dict:
    """Per access strided by a line or more along the innermost loop: how many such accesses of the
    statement walk the same few L1 sets (the same stride: tensors allocated page-aligned start in the
    same set), so that their lines evict each other."""
    key = {}
    for acc, step in along.items():
        if step and not _held_in_registers(acc, around, copies, strides, e):
            nbytes = element_bytes(acc.dtype)
            if step * nbytes >= e.line_bytes:
                key[acc] = step * nbytes
    counts = Counter(key.values())
    return {acc: counts[k] for acc, k in key.items()}


def _line_uses(site, inner: Loop, strides: dict | None, nbytes: int, e: Estimate) -> float:
    """For an access strided by a line or more along the innermost loop `inner` whose lines fit in L1
    together: how many iterations of the loop around `inner` use each line it brings in (a
    reorder that puts a short loop innermost over a strided access pays a line once per line, not once
    per element, as long as the loop around it walks along the line). 1: no such reuse."""
    loops = [lp for lp in site.loops if lp.extent > 1]
    k = next((i for i, lp in enumerate(loops) if lp is inner), 0)
    if strides is None or not k:
        return 1
    outer = loops[k - 1]
    if strides.get(outer.var, 0) is None:
        return 1
    along = abs(strides.get(outer.var, 0)) * nbytes
    if along >= e.line_bytes:
        return 1
    return outer.extent if along == 0 else min(outer.extent, e.line_bytes / along)


def _l1_lines(stride: int, e: Estimate) -> int:
    """How many lines `stride` bytes apart L1 holds at once: a stride of a power-of-two number of lines
    maps them to a few of its sets (1 KB apart: 4 of 64 sets, 32 lines of a 32 KB cache), and the
    loop around evicts them before it reads them again (packing such a tensor pays)."""
    sets = e.l1_bytes // (e.line_bytes * e.l1_ways)
    used = sets // math.gcd(stride // e.line_bytes, sets) if stride % e.line_bytes == 0 else sets
    return used * e.l1_ways
