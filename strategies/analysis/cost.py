"""What a program costs where a step acts, read from the LEIR tree alone (issue 25: the chain of
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

Shapes are the bounding box of every access (reads included), so no signature is needed. The model
is static and deliberately simple: it states what changes, it does not predict microseconds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from leir.analysis import access_strides, element_bytes, is_update, lhs_vars, statement_sites, tensor_boxes
from leir.ast import Access, BinOp, Call, Compare, Loop, Neg, Program, Select, Var, accesses, children, walk_expr

TRANSCENDENTAL = ("exp", "log", "erf", "sqrt", "fast_exp")



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
    chain: bool                       # the innermost loop carries the reduction (serial dependence)
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
        bool(inner is not None and inner.var in reduction and not (inner.kind == "V" and target == "llvm")),
        along, tuple(reuse))


def figures(program: Program, nests: range, target: str = "llvm") -> Figures:
    """The figures of the statements of `program`'s top-level nests in `nests` on `target`."""
    shapes = tensor_boxes(program)
    costs = tuple(statement_cost(s, shapes, target) for s in statement_sites(program) if s.nest_index in nests)
    return Figures(len(nests), costs)
