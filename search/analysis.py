"""What the program's own structure says about its speed on a CPU: an analytic estimate of
a state's time that ranks proposals beside the cost model learned from the lake.

The estimate is a small roofline over the LEIR tree, statement by statement (`estimate_cycles`):

- **parallel extent**: the outermost parallel loop above a statement divides its work by
  min(extent, cores) (with the imbalance of a last partial round); every launch of a parallel region
  costs a fixed overhead, so a parallel loop under serial loops pays it once per outer iteration;
- **stride of the innermost loop**: each access costs by its stride along the innermost loop (zero:
  kept in a register; one: a cache line serves `line / element` iterations; larger: a line per
  element), and the innermost loop runs as SIMD lanes when it is vectorised (`V`) or when LLVM can
  vectorise it itself (a spatial axis every access walks with stride 0 or 1, no scalar calls);
  a reduction axis innermost is a chain of dependent additions (latency-bound) unless its lanes
  keep partial results;
- **reuse**: what an access costs depends on where its data is when it is reused: the footprint of
  the loops inside the innermost loop it does not depend on (its reuse distance) against the L1 and
  L2 sizes; a local-scope (register) tile costs nothing.

It is deliberately simple: its job is to order proposals (reorder the reduction out of the innermost
position before vectorising it through partial sums, parallelise the outer spatial loop, tile when
the reused data falls out of cache), not to predict microseconds. `log2_speedup(root, state)` is what
the ranking uses. Pure Python over the tree; no TVM.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from leir.analysis import access_strides, element_bytes, is_update, lhs_vars, statement_sites, tensor_boxes
from leir.ast import Access, BinOp, Call, Compare, Neg, Program, Select, accesses, children, walk_expr


@dataclass(frozen=True)
class Machine:
    """What the estimate assumes about the CPU (defaults: the project's 2-core AVX-512 machine)."""

    cores: int = 2
    vector_bits: int = 512
    line_bytes: int = 64
    l1_bytes: int = 48 << 10
    l2_bytes: int = 2 << 20
    parallel_launch_cycles: float = 4000.0   # one fork/join of TVM's thread pool
    add_latency: float = 4.0                 # cycles between dependent floating-point additions
    vector_registers: int = 32

    def lanes(self, dtype: str) -> int:
        """SIMD lanes of one vector register for a LEIR dtype code."""
        return max(self.vector_bits // (8 * element_bytes(dtype)), 1)

    @classmethod
    def detect(cls) -> Machine:
        """This machine: its logical CPUs and, from /proc/cpuinfo's flags, AVX-512 (32 registers of
        512 bits), AVX2 (16 of 256) or SSE (16 of 128); the defaults where the file is missing."""
        import os

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
        except OSError:
            return cls(cores=cores)
        if "avx512f" in flags:
            return cls(cores=cores, vector_bits=512, vector_registers=32)
        if "avx2" in flags:
            return cls(cores=cores, vector_bits=256, vector_registers=16)
        return cls(cores=cores, vector_bits=128, vector_registers=16) if flags else cls(cores=cores)


DEFAULT_MACHINE = Machine()
CALL_COST = {"exp": 20.0, "log": 20.0, "erf": 24.0, "sqrt": 6.0, "abs": 1.0, "max": 1.0, "min": 1.0,
             "fast_exp": 10.0, "fast_log": 12.0, "fast_erf": 12.0}
SCALAR_CALLS = ("exp", "log", "erf")        # scalar library calls: LLVM does not vectorise them
LEVEL_CYCLES = (0.5, 3.0, 10.0)            # a cache line from L1, L2, beyond


def _value_nodes(expr):
    """The nodes of an expression that compute values (not the subscripts of its accesses)."""
    yield expr
    if isinstance(expr, Access):
        return
    for child in children(expr):
        yield from _value_nodes(child)


def _ops(expr) -> float:
    cost = 0.0
    for n in _value_nodes(expr):
        if isinstance(n, Call):
            cost += CALL_COST.get(n.fn, 4.0)
        elif isinstance(n, BinOp):
            cost += 4.0 if n.op in ("/", "//", "%") else 1.0
        elif isinstance(n, Neg | Select | Compare):
            cost += 1.0
    return max(cost, 1.0)


def _footprint(strides, loops, itemsize) -> float:
    """Bytes the accesses (their strides per loop variable) touch while `loops` run."""
    total = 0.0
    for st, size in zip(strides, itemsize, strict=True):
        if st is None:
            total += math.prod(lp.extent for lp in loops) * size
        else:
            total += math.prod(lp.extent for lp in loops if st.get(lp.var, 0)) * size
    return total


@dataclass(frozen=True)
class StatementCost:
    iterations: int
    cycles_per_iteration: float
    parallel: float            # work divided by this
    launches: int              # parallel regions started (fork/join overheads)
    lanes: float               # SIMD lanes the innermost loop runs as
    innermost: str             # "unit", "reduction", "strided", "scalar" (no loop), "gather"


def statement_cost(site, shapes, machine: Machine = DEFAULT_MACHINE) -> StatementCost:
    stmt, loops = site.stmt, site.loops
    iters = math.prod(lp.extent for lp in loops) if loops else 1
    accs = [*accesses(stmt.lhs), *accesses(stmt.rhs)]
    accs = list(dict.fromkeys(accs))
    strides = [access_strides(shapes.get(a.tensor), a) for a in accs]
    itemsize = [element_bytes(a.dtype) for a in accs]
    ops = _ops(stmt.rhs)
    spatial = set(lhs_vars(stmt))
    if not loops:
        return StatementCost(1, ops + len(accs), 1.0, 0, 1.0, "scalar")
    inner = loops[-1]
    inner_strides = [None if st is None else abs(st.get(inner.var, 0)) for st in strides]
    lhs_stride = inner_strides[0]
    reduction_inner = is_update(stmt) and inner.var not in spatial
    calls = {n.fn for n in walk_expr(stmt.rhs) if isinstance(n, Call)}
    lanes_max = machine.lanes(stmt.lhs.dtype)
    contiguous = all(s is not None and s <= 1 for s in inner_strides)
    if inner.kind == "V":
        width = min(inner.extent, lanes_max)
        lanes = width if contiguous else max(width / 4, 1.0)     # gathers and scatters
        if calls & set(SCALAR_CALLS):
            lanes = 1.0                                           # one scalar call per lane
    elif inner.kind in ("L", "U", "P", "B") and not reduction_inner and contiguous and lhs_stride == 1 \
            and inner.extent >= 4 and not calls & set(SCALAR_CALLS):
        lanes = max(min(inner.extent, lanes_max) / 2, 1.0)       # LLVM's own vectoriser, less sure
    else:
        lanes = 1.0
    compute = ops / lanes
    # memory: each access by its stride along the innermost loop and the level its data is reused from
    memory = 0.0
    for acc, st, size, s_inner in zip(accs, strides, itemsize, inner_strides, strict=True):
        if acc.scope == "l" and st is not None:
            continue                                              # a register tile
        if s_inner == 0:
            continue                                              # hoisted out of the innermost loop
        level = _reuse_level(st, loops, strides, itemsize, machine)
        per_line = machine.line_bytes / size
        cost = LEVEL_CYCLES[level]
        memory += cost / per_line if s_inner == 1 else cost
    memory /= max(lanes / 2, 1.0) if contiguous else 1.0
    latency = machine.add_latency if reduction_inner and inner.kind != "V" else 0.0
    unroll = math.prod(lp.extent for lp in loops if lp.kind == "U")
    overhead = 1.0 / max(unroll, 1) / lanes
    cpi = max(compute, memory, latency) + overhead
    parallel, launches = _parallelism(loops, machine)
    kind = ("reduction" if reduction_inner else "unit" if lhs_stride == 1 and contiguous else
            "gather" if any(s is None for s in inner_strides) else "strided")
    return StatementCost(iters, cpi, parallel, launches, lanes, kind)


def _reuse_level(st, loops, strides, itemsize, machine: Machine) -> int:
    """Where the access's data is when it is touched again: the footprint of the loops inside the
    innermost loop the access does not depend on (its reuse distance), against the cache sizes."""
    if st is None:
        return 2
    for k in range(len(loops) - 1, -1, -1):
        if st.get(loops[k].var, 0) == 0:
            fp = _footprint(strides, loops[k + 1:], itemsize)
            return 0 if fp <= machine.l1_bytes else 1 if fp <= machine.l2_bytes else 2
    return 2  # never reused: streamed from memory


def _parallelism(loops, machine: Machine) -> tuple[float, int]:
    for k, lp in enumerate(loops):
        if lp.kind == "P":
            rounds = math.ceil(lp.extent / machine.cores)
            speed = lp.extent / rounds if rounds else 1.0
            return min(speed, float(machine.cores)), math.prod(x.extent for x in loops[:k])
    return 1.0, 0


def estimate_cycles(program: Program, machine: Machine = DEFAULT_MACHINE) -> float:
    """Estimated cycles of one run of `program` (see the module's docstring)."""
    shapes = tensor_boxes(program)
    total = 0.0
    regions: dict[tuple, int] = {}
    for site in statement_sites(program):
        c = statement_cost(site, shapes, machine)
        total += c.iterations * c.cycles_per_iteration / c.parallel
        if c.launches:
            p = next(k for k, lp in enumerate(site.loops) if lp.kind == "P")
            regions[(site.nest_index, site.loops[:p + 1])] = c.launches
    return total + machine.parallel_launch_cycles * sum(regions.values())


@lru_cache(maxsize=4096)
def _log2_cycles(program: Program, machine: Machine) -> float:
    return math.log2(max(estimate_cycles(program, machine), 1.0))


def log2_cycles(program: Program, machine: Machine = DEFAULT_MACHINE) -> float:
    return _log2_cycles(program, machine)


def log2_speedup(root: Program, state: Program, machine: Machine = DEFAULT_MACHINE) -> float:
    """The estimate's speedup of `state` over `root`, as log2 (positive: predicted faster)."""
    return log2_cycles(root, machine) - log2_cycles(state, machine)
