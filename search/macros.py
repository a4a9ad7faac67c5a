"""Composite proposals recorded as atomic steps: a macro action is a short sequence of the
registered strategies' own transformations, each applied to the previous one's result, offered to
the search as one proposal. The search verifies every step against the original and records every
step as a state of the trajectory (`search.drivers.Search.evaluate`), so a 64-state search can reach
a schedule that needs six moves in a row and the data stays step-level.

The micro-kernel and the row kernel's schedule of a nest are recipes (`search.recipes`): data, each
step a strategy on loops named by their role (the tile's rows, columns and reductions; a nest's
unit-stride, innermost and parallel loops), which the recipe's runner follows through renames and
splits.

- `micro_kernel`: the schedule of a fast CPU contraction (matmul, batched and convolution-like
  accumulations `X += a*b`): an optional re-laid copy of the reused operand (`layout_transformation`,
  packed along the output's unit-stride axis, or transposed when that operand walks it with a
  stride), the outer spatial loop made parallel (`loop_parallelization`; a bound loop of the
  published form becomes one), a register tile of `rows x cols` accumulators (`loop_tiling`, or
  `loop_split` where the two axes are not adjacent), the reduction loops hoisted above the tile's point
  loops (`loop_reorder` moves), the tile's rows unrolled (`loop_unrolling`) and its columns vectorised
  (`loop_vectorization`). Tile shapes come from the machine's vector registers (`tile_shapes`).
- `row_kernel`: for programs without a contraction (norms, softmax, elementwise chains): each
  elementwise intermediate read by one statement over the same elements computed where it is read
  (`compute_inline`), then every heavy nest's outer spatial loop made parallel and its innermost loop
  vectorised (split to a vector width, through partial results where it is a reduction axis).
- `program_kernel`: both in one proposal, the micro-kernels first (every heavy contraction's), then
  the row kernel of every other heavy nest on their result; where that is longer than a 16-state
  search, a second one with the row kernel of as many of the heaviest nests as fit in 16 steps.

Pure tree rewrites through `strategies` (never TVM); the choice of sites and parameters comes from
the program's own analysis (`search.analysis`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from leir.analysis import access_strides, is_update, lhs_vars, partial_strides, reduction_op, tensor_boxes
from leir.ast import Call, Nest, Program, Stmt, Var, accesses, walk_expr
from search.analysis import DEFAULT_MACHINE, Machine
from search.recipes import Arrange, Plan, Step, run
from strategies.analysis.legality import body_statements, iterations, read_tensors, stmt_reads, written_tensors
from strategies.analysis.loops import common_depth
from strategies.base import Context, Site, Transformation
from strategies.registry import get

MACROS = ("micro_kernel", "row_kernel", "program_kernel")
MAX_MACRO_STEPS = 12
# A nest below this share of the program's static cost gets no kernel of a macro that covers several
# nests: in a transformer layer, the micro-kernels of two 3% projections took 12 of the search's 48
# states, and left none for the softmax and the activations.
HEAVY_SHARE = 0.05
# The row kernel's fusions stop at this many steps: the search's 48 states must hold it and more.
MAX_ROW_KERNEL_STEPS = 32
MAX_PROGRAM_KERNEL_STEPS = 40   # the micro-kernels and the row kernel (fused when it fits) together
# A second program kernel fits a search of this many states (`steptp search`'s default budget): a macro
# longer than the states left is never started, and on KernelBench's GEMM + activation problems the
# whole program kernel (micro-kernel and a row kernel over six tail nests: 20-26 steps) never ran in 16.
COMPACT_STEPS = 16


@dataclass(frozen=True)
class Macro:
    """A composite proposal: its name, its parameters and its atomic steps (in order)."""

    name: str
    params: dict
    steps: tuple[Transformation, ...]

    @property
    def after(self) -> Program:
        return self.steps[-1].after


class _Builder:
    """Applies strategies one after the other, finding each site by what it names."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.steps: list[Transformation] = []

    @property
    def program(self) -> Program:
        return self.ctx.program

    def apply(self, strategy: str, params: dict, where: Callable[[Site], bool]) -> bool:
        s = get(strategy)
        return any(self.apply_at(s, site, params) for site in s.sites(self.ctx) if where(site))

    def apply_at(self, strategy, site: Site, params: dict) -> bool:
        """One step of `strategy` at `site` of the current program (False where it is not legal)."""
        t = strategy.apply(self.ctx, site, params)
        if t is None:
            return False
        self.steps.append(t)
        self.ctx = self.ctx.with_program(t.after)
        return True


def _at(nest: int, loops: tuple[str, ...] | None = None, path: tuple[int, ...] = ()) -> Callable[[Site], bool]:
    return lambda s: s.nest == nest and s.path == path and (loops is None or tuple(s.loops) == loops)


# --- micro_kernel ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Contraction:
    """A top-level nest of one accumulation `X += a*b` and the roles of its loops."""

    nest: int
    rows: str              # spatial loop the reused operand does not depend on (the tile's rows)
    cols: str              # spatial loop of the output's unit stride (the tile's columns, vector lanes)
    reductions: tuple[str, ...]
    reused: str            # the operand every row of the tile reads (packed or transposed first)
    reused_dim: int        # its dimension indexed by `cols`
    reused_stride: int | None  # its stride along `cols`
    work: int


def contractions(program: Program) -> list[Contraction]:
    """Accumulation nests a micro-kernel applies to, heaviest first."""
    shapes = tensor_boxes(program)
    out = []
    for n, nest in enumerate(program.nests):
        if len(nest.body) != 1 or not isinstance(nest.body[0], Stmt):
            continue
        stmt = nest.body[0]
        if not is_update(stmt) or reduction_op(stmt) != "+" or any(lp.kind in ("V", "U") for lp in nest.loops):
            continue
        spatial = set(lhs_vars(stmt))
        reductions = tuple(lp.var for lp in nest.loops if lp.var not in spatial)
        if not reductions or not stmt.lhs.indices or not isinstance(stmt.lhs.indices[-1], Var):
            continue
        cols = stmt.lhs.indices[-1].name
        if cols not in [lp.var for lp in nest.loops]:
            continue
        reads = [a for a in dict.fromkeys(accesses(stmt.rhs)) if a.tensor != stmt.lhs.tensor]
        best = None
        names = [lp.var for lp in nest.loops]
        for lp in nest.loops:
            if lp.var not in spatial or lp.var == cols:
                continue
            for acc in reads:
                known = partial_strides(shapes.get(acc.tensor), acc)
                if known is None:
                    continue
                st, opaque = known
                if lp.var in opaque or cols in opaque or st.get(lp.var, 0) != 0 or st.get(cols, 0) == 0:
                    continue
                dim = next((d for d, ix in enumerate(acc.indices) if cols in _vars(ix)), None)
                adjacent = names.index(lp.var) + 1 == names.index(cols)
                # the longest; of equal ones, the loop beside the columns (one tiling step, fewer moves)
                if dim is not None and (best is None or (lp.extent, adjacent) > (best[0].extent, best[4])):
                    best = (lp, acc, dim, abs(st[cols]), adjacent)
        if best is None:
            continue
        lp, acc, dim, stride, _ = best
        out.append(Contraction(n, lp.var, cols, reductions, acc.tensor, dim, stride,
                               math.prod(x.extent for x in nest.loops)))
    return sorted(out, key=lambda c: (-c.work, c.nest))


def _vars(ix) -> set[str]:
    from leir.ast import walk_expr

    return {n.name for n in walk_expr(ix) if isinstance(n, Var)}


def tile_shapes(rows: int, cols: int, lanes: int, registers: int, cores: int) -> list[tuple[int, int, int]]:
    """(rows, cols, vector width) register tiles, best first: the accumulators leave four vector
    registers for the loads and broadcasts, the columns are a whole number of vectors (or the whole
    axis when it is short), there are enough row tiles for every core; ranked by multiply-adds per
    load (rows*cols / (rows + cols/width)), then more rows. Where no whole register divides the
    columns, both kinds of narrower vector are offered (`vector_widths`)."""
    options = [(c, lanes) for c in (4 * lanes, 2 * lanes, lanes) if c < cols and cols % c == 0]
    for w in vector_widths(cols, lanes):
        if w == lanes or w <= lanes // 2:   # whole, half or quarter registers: the whole axis when short
            options += [(cols, w)] if cols <= 4 * lanes else []
        else:                               # a masked register: tiles of 1, 2 or 4 of its vectors
            options += [(k * w, w) for k in (4, 2, 1) if k * w <= cols and cols % (k * w) == 0]
    row_options = [r for r in (8, 6, 4, 3, 2) if r < rows and rows % r == 0 and rows // r >= cores]
    out = []
    for r in row_options:
        for c, w in dict.fromkeys(options):
            acc = r * (c // w)
            if acc <= registers - 4 and r * c <= 512:
                out.append((r, c, w))
    return sorted(out, key=lambda t: (-(t[0] * t[1]) / (t[0] + t[1] / t[2]), -t[0], -t[1], -t[2]))


# A vector of at least this share of a register's lanes is computed as one register with its last
# lanes masked off (14 of 16 lanes for 56 columns). On a core whose FMA units are a whole AVX-512
# register wide (AMD Zen 5, 2026-12-02), conv2d 64x56's tile of 8 x 28 in vectors of 14 timed 626 us
# against 1015 us in vectors of 8 (1.63x; MetaSchedule's 14-lane schedule: 654 us).
MASKED_SHARE = 0.75


def vector_widths(cols: int, lanes: int) -> list[int]:
    """The vector widths a tile of `cols` columns can be computed in, best first: a whole register
    where it divides them; else a masked register (the largest divisor of `cols` with at least
    `MASKED_SHARE` of the lanes), then the widest half or quarter register that divides them; an axis
    too short for either (6 or 7 columns on 16 lanes: a 3D convolution's output rows) is one half
    register with its last lanes masked off (KernelBench level 2's 47_Conv3d_Mish_Tanh: 4.3x over the
    naive program without a micro-kernel, 20.9x with one in vectors of 6). Half
    registers run as fast per lane on a core whose FMA units are half a register wide (Zen 4), so
    both are offered and the search measures which is faster here. A vector loop wider than a
    register and ragged (56 floats on 16 lanes) compiles to code six times slower than the serial
    loop (conv2d 64x56, measured): never offered."""
    if cols % lanes == 0:
        return [lanes]
    masked = [w for w in range(lanes - 1, 0, -1) if w >= MASKED_SHARE * lanes and w >= 4 and cols % w == 0]
    narrower = vector_width(cols, lanes)
    if not masked and not narrower and 4 <= cols < lanes // 2 and cols >= MASKED_SHARE * lanes // 2:
        masked = [cols]   # a short axis in one masked half register: a 3D convolution's 6 columns
    return masked[:1] + ([narrower] if narrower else [])


def vector_width(cols: int, lanes: int) -> int:
    """The whole register where it divides `cols`, else the widest half or quarter register that
    divides them (0: none)."""
    for w in (lanes, lanes // 2, lanes // 4):
        if w >= 4 and cols % w == 0:
            return w
    return lanes if cols % lanes == 0 else 0


def micro_kernels(ctx: Context, machine: Machine = DEFAULT_MACHINE, variants: int = 3) -> list[Macro]:
    """Micro-kernel proposals for the heaviest contraction: the best tile shapes, with and without
    a packed copy of the reused operand, and the best tile of another vector width where there is
    one (a masked register and a half register); where the program has several contractions
    (attention, an MLP), also one macro that gives each of them its best tile, heaviest first."""
    found = contractions(ctx.program)
    if not found:
        return []
    shapes = _shapes_for(ctx.program, found[0], machine)
    other = [t for t in shapes if t[2] != shapes[0][2]][:1]
    plans = [(t, False) for t in shapes[:2] + other] + [(t, True) for t in shapes[:1]]
    out = []
    for (r, c, w), pack in plans:
        macro = _micro_kernel(ctx, found[0], r, c, pack, machine, w)
        if macro is not None and all(m.after != macro.after for m in out):
            out.append(macro)
        if len(out) >= variants + len(other):
            break
    if len(found) > 1:
        macro = _every_contraction(ctx, machine)
        if macro is not None and all(m.after != macro.after for m in out):
            out.append(macro)
    return out


def _shapes_for(program: Program, con: Contraction, machine: Machine) -> list[tuple[int, int, int]]:
    nest = program.nests[con.nest]
    extents = {lp.var: lp.extent for lp in nest.loops}
    lanes = machine.lanes(nest.body[0].lhs.dtype)
    return tile_shapes(extents[con.rows], extents[con.cols], lanes, machine.vector_registers, machine.cores)


def _micro_kernel(ctx: Context, con: Contraction, rows: int, cols: int, pack: bool,
                  machine: Machine = DEFAULT_MACHINE, width: int | None = None) -> Macro | None:
    b = _Builder(ctx)
    if not _micro_kernel_steps(b, con, rows, cols, pack, machine, width):
        return None
    params = {"tile": [rows, cols], "pack": bool(con.reused_stride != 1 or pack)}
    lanes = machine.lanes(ctx.program.nests[con.nest].body[0].lhs.dtype)
    if width and width != lanes:
        params["vector"] = width
    return Macro("micro_kernel", params, tuple(b.steps))


def _every_contraction(ctx: Context, machine: Machine, max_steps: int = 4 * MAX_MACRO_STEPS) -> Macro | None:
    """Each contraction its best tile (no packed copy), heaviest first; one that cannot be tiled is
    left as it is."""
    b = _Builder(ctx)
    done, skipped = 0, set()   # skipped: the accumulators (output tensors) of contractions left as they are
    costs = nest_costs(ctx.program, machine)
    total = sum(costs.values()) or 1.0
    skipped |= {_output(ctx.program, c) for c in contractions(ctx.program)
                if costs.get(c.nest, 0.0) < HEAVY_SHARE * total}
    while True:
        left = [c for c in contractions(b.program) if _output(b.program, c) not in skipped]
        if not left:
            break
        con = left[0]
        shapes = _shapes_for(b.program, con, machine)
        saved = (b.ctx, len(b.steps))
        r, c, w = shapes[0] if shapes else (0, 0, 0)
        if shapes and _micro_kernel_steps(b, con, r, c, False, machine, w) and len(b.steps) <= max_steps:
            done += 1
        else:
            skipped.add(_output(saved[0].program, con))
            b.ctx, b.steps = saved[0], b.steps[:saved[1]]
    if done < 2:
        return None
    return Macro("micro_kernel", {"nests": done}, tuple(b.steps))


def _output(program: Program, con: Contraction) -> str:
    return program.nests[con.nest].body[0].lhs.tensor


def _micro_kernel_steps(b: _Builder, con: Contraction, rows: int, cols: int, pack: bool,
                        machine: Machine = DEFAULT_MACHINE, width: int | None = None) -> bool:
    """The micro-kernel's steps for `con` appended to `b` (False, with `b` part-way, when a step is
    not legal): the recipe MICRO_KERNEL on the contraction's loops by role."""
    nest = b.program.nests[con.nest]
    col_extent = next(lp.extent for lp in nest.loops if lp.var == con.cols)
    roles = {"rows": con.rows, "cols": con.cols, **{f"red.{k}": v for k, v in enumerate(con.reductions)}}
    lanes = machine.lanes(nest.body[0].lhs.dtype)
    names = [lp.var for lp in nest.loops]
    facts = {"reused": con.reused, "reused_dim": con.reused_dim, "strided": con.reused_stride != 1,
             "rows": rows, "cols": cols, "split_cols": cols < col_extent, "pack": pack, "cores": machine.cores,
             "width": width or vector_width(cols, lanes), "lanes": lanes,
             "adjacent": names.index(con.cols) == names.index(con.rows) + 1}
    plan = Plan(b.ctx, con.nest, roles, facts)
    done = run(MICRO_KERNEL, plan)
    b.ctx, b.steps = plan.ctx, b.steps + plan.steps
    return done


def _transposed(plan: Plan) -> dict | None:
    """A transposed copy of the reused operand that makes the columns' dimension its contiguous one
    (None where it is already: no copy can help)."""
    rank = len(tensor_boxes(plan.program).get(plan.facts["reused"]) or ())
    dim = plan.facts["reused_dim"]
    if not rank or dim == rank - 1:
        return None
    return {"copy": "transposed", "order": [d for d in range(rank) if d != dim] + [dim]}


def _tiled(plan: Plan) -> bool:
    """Both axes split in one tiling step (they are adjacent loops)."""
    return plan.facts["split_cols"] and plan.facts["adjacent"]


def _transposed_first(plan: Plan) -> bool:
    """Where the reused operand walks the columns with a stride, a transposed copy first (the later
    splits then read it through affine subscripts); its nest stands before ours."""
    if not plan.facts["strided"]:
        return True
    params = _transposed(plan)
    return params is not None and _relay(plan, params)


def _relay(plan: Plan, params: dict) -> bool:
    """A re-laid copy (`params`) of the reused operand."""
    name = plan.facts["reused"]
    return plan.apply("layout_transformation", params, lambda s: tuple(s.tensors) == (name,))


def _narrow(plan: Plan) -> bool:
    w = plan.facts["width"]
    return bool(w) and w < plan.facts["lanes"] and w < plan.facts["cols"]


def _outer_spatial(plan: Plan) -> str | None:
    """The outermost loop above the reductions and the tile with work for every core (None where the
    nest has a parallel loop already, or no such loop)."""
    loops = plan.loops()
    if any(lp.kind == "P" for lp in loops):
        return None
    for lp in loops:
        role = plan.role_of(lp.var) or ""
        if role.startswith("red.") or role in ("rows", "cols"):
            return None
        if lp.extent >= plan.facts["cores"] and lp.kind in ("L", "B"):
            return lp.var
    return None


def _packed_or_transposed(plan: Plan) -> bool:
    """The packed copy last, once the columns read the reused operand as `block*cols + lane`; a
    transposed copy where a packed one is not legal."""
    if tensor_boxes(plan.program).get(plan.facts["reused"]) is None:
        return False
    if _relay(plan, {"copy": "packed", "dim": plan.facts["reused_dim"], "factor": plan.facts["cols"]}):
        return True
    params = _transposed(plan)
    return params is not None and _relay(plan, params)


def _parallel_outer(plan: Plan) -> bool:
    var = _outer_spatial(plan)
    if var is None:
        return True
    plan.roles["parallel"] = var
    return Step("loop_parallelization", ("parallel",)).run(plan)


# The micro-kernel as data: each step a strategy on loops named by their role in the tile.
MICRO_KERNEL = (
    _transposed_first,
    # the columns cannot be a bound loop (a bound loop's split keeps its point loop bound)
    lambda plan: plan.kind("cols") != "B",
    # the rows made parallel first when they are a bound loop (the published form's thread loop)
    Step("loop_parallelization", ("rows",), when=lambda plan: plan.kind("rows") == "B"),
    # the tile: both axes split, in one tiling step when they are adjacent
    Step("loop_tiling", ("rows", "cols"), lambda plan: {"factors": [plan.facts["rows"], plan.facts["cols"]]},
         when=_tiled),
    Step("loop_split", ("rows",), lambda plan: {"factor": plan.facts["rows"]}, when=lambda plan: not _tiled(plan)),
    Step("loop_split", ("cols",), lambda plan: {"factor": plan.facts["cols"]},
         when=lambda plan: plan.facts["split_cols"] and not _tiled(plan)),
    # everything else in its order, then the reduction loops, then the tile's rows and columns
    Arrange(("*", "red", "rows", "cols")),
    Step("loop_unrolling", ("rows",)),
    # narrower vectors than a register where the tile is not a whole number of them: their blocks unrolled
    Step("loop_split", ("cols",), lambda plan: {"factor": plan.facts["width"]}, when=_narrow),
    Step("loop_unrolling", ("cols.outer",), when=_narrow),
    Step("loop_vectorization", ("cols",)),
    # else the outermost loop with work for every core made parallel (a batch loop of extent 1 is not)
    _parallel_outer,
    # a packed copy last, once the columns read it as `block*cols + lane` (its block and lane)
    lambda plan: not plan.facts["pack"] or plan.facts["strided"]
    or (plan.facts["split_cols"] and _packed_or_transposed(plan)),
)


# --- row_kernel ------------------------------------------------------------------------------------

def nest_costs(program: Program, machine: Machine = DEFAULT_MACHINE) -> dict[int, float]:
    """The static cost model's cycles per top-level nest (`search.analysis.statement_cost`)."""
    from leir.analysis import statement_sites
    from search.analysis import statement_cost

    shapes = tensor_boxes(program)
    costs: dict[int, float] = {}
    for site in statement_sites(program):
        c = statement_cost(site, shapes, machine)
        costs[site.nest_index] = costs.get(site.nest_index, 0.0) + c.iterations * c.cycles_per_iteration
    return costs


def row_kernels(ctx: Context, machine: Machine = DEFAULT_MACHINE) -> list[Macro]:
    """Elementwise chains inlined (`_inline_chains`), then every top-level nest of enough work: its
    outer loop parallel, its innermost loop vectorised."""
    b = _Builder(ctx)
    dead = _drop_dead(b)
    inlined = _inline_chains(b)
    prepared = dead + inlined
    # last nest first: a reduction vectorised through partial results adds its combining nest after
    # it, which leaves the indices of the nests before it as they were
    for n in sorted(_heavy_row_nests(b.program, machine), reverse=True):
        _row_nest_steps(b, n, machine)
    if len(b.steps) - prepared < 2:
        return []
    scheduled = b.steps[prepared:]
    params = {"nests": len({t.site.nest for t in scheduled}), **_prepared_params(dead, inlined)}
    plain = Macro("row_kernel", params, tuple(b.steps))
    fusions = _fuse_parallel_nests(b, MAX_ROW_KERNEL_STEPS)
    if not fusions:
        return [plain]
    return [Macro("row_kernel", {**plain.params, "fused": fusions}, tuple(b.steps)), plain]


def _prepared_params(dead: int, inlined: int) -> dict:
    return {**({"dead": dead} if dead else {}), **({"inlined": inlined} if inlined else {})}


def _heavy_row_nests(program: Program, machine: Machine) -> dict[int, float]:
    """The static cost of each nest the row kernel schedules: not a contraction nor a nest a
    micro-kernel already scheduled (`_scheduled`), and at
    least HEAVY_SHARE of the other nests' cost. Measured on KernelBench level 2's convolutions with
    tails: counted in, a scheduled convolution (1.1M cycles against 150k for five tail nests) left
    every tail under the share, so no program kernel was offered after the micro-kernel and the tails
    stayed serial and scalar."""
    kernels = {c.nest for c in contractions(program)}
    kernels |= {n for n, nest in enumerate(program.nests) if _scheduled(nest)}
    costs = {n: c for n, c in nest_costs(program, machine).items() if n not in kernels}
    total = sum(costs.values()) or 1.0
    return {n: c for n, c in costs.items() if c >= HEAVY_SHARE * total}


def compact_row_kernel(ctx: Context, max_steps: int, machine: Machine = DEFAULT_MACHINE) -> Macro | None:
    """The row kernel of the heaviest nests whose steps fit in `max_steps` (the chains inlined first),
    heaviest first, as many as fit; None when not even the heaviest nest's kernel fits."""
    b = _Builder(ctx)
    dead = _drop_dead(b)
    inlined = _inline_chains(b)
    costs = _heavy_row_nests(b.program, machine)
    heavy = sorted(costs, key=lambda n: (-costs[n], n))
    chosen: list[int] = []
    best: list[Transformation] = []
    for n in heavy:
        trial = _Builder(b.ctx)
        for m in sorted(chosen + [n], reverse=True):   # last nest first, as `row_kernels`
            _row_nest_steps(trial, m, machine)
        if len(b.steps) + len(trial.steps) > max_steps:
            break
        chosen, best = chosen + [n], trial.steps
    if len(best) < 2:
        return None
    params = {"nests": len({t.site.nest for t in best}), "compact": True, **_prepared_params(dead, inlined)}
    return Macro("row_kernel", params, tuple(b.steps + best))


def _scheduled(nest: Nest) -> bool:
    """What a micro-kernel leaves: a parallel loop and a vector or unrolled loop. A nest vectorised by
    a single step, still serial, is not: the row kernel still has its parallel loop to give."""
    return any(lp.kind == "P" for lp in nest.loops) and _vector_or_unrolled(nest)


def _vector_or_unrolled(nest: Nest) -> bool:
    return any(lp.kind in ("V", "U") for lp in nest.loops) or any(
        isinstance(item, Nest) and _vector_or_unrolled(item) for item in nest.body)


def _drop_dead(b: _Builder) -> int:
    """Every intermediate nothing live reads removed in one step (`dead_code_elimination`), as a
    compiler removes dead code before it schedules: a translation of `torch.min(x, 1)[0]` computes the
    indices too, two passes over the input the program never reads. Returns the steps taken (0 or 1)."""
    strategy = get("dead_code_elimination")
    sites = list(strategy.sites(b.ctx))
    most = max((len(s.tensors) for s in sites), default=0)
    return int(any(b.apply_at(strategy, site, {}) for site in sites if len(site.tensors) == most))


def _inline_chains(b: _Builder) -> int:
    """Every elementwise intermediate whose one reader runs over as many iterations as its producer
    (a norm's normalised value read only by its affine scale and shift) computed where it is read
    (`compute_inline`), as a tuner's auto-inline does: the chain becomes one nest, one pass over
    memory and one vector loop, instead of a stored intermediate and a light nest left scalar. Never
    one read by several statements or twice by one, nor one a larger nest would recompute (a per-row
    statistic read per element). Returns how many it inlined. Measured on layernorm 64x768 (AMD EPYC,
    2 cores): the row kernel 1.08-1.28x faster than the search's best state without it."""
    inline, count = get("compute_inline"), 0
    while True:
        chains = [s.tensors for s in inline.sites(b.ctx) if _read_once_per_element(s.match, s.tensors[0])]
        if not any(b.apply("compute_inline", {"into": "all"}, lambda s, t=t: s.tensors == t) for t in chains):
            return count
        count += 1


def _read_once_per_element(match, tensor: str) -> bool:
    """One statement reads `tensor`, once, over as many iterations as its producer writes it: inlined,
    nothing is computed twice."""
    if len(match.readers) != 1:
        return False
    reader = match.readers[0]
    reads = [a for a in stmt_reads(reader.stmt) if a.tensor == tensor]
    return len(reads) == 1 and iterations(reader.loops) == iterations(match.producer.loops)


def _row_nest_steps(b: _Builder, n: int, machine: Machine) -> None:
    """The steps of the recipe ROW_NEST on nest n appended to `b` (what it made, wherever it stopped)."""
    nest = b.program.nests[n]
    if not all(isinstance(i, Stmt) for i in nest.body) or not nest.loops:
        return
    stmt = nest.body[0]
    names = [lp.var for lp in nest.loops]
    facts = {"names": names, "single": len(nest.body) == 1, "lanes": machine.lanes(stmt.lhs.dtype),
             "cores": machine.cores,
             "spatial": set(lhs_vars(stmt)) if len(nest.body) == 1 else set(names)}
    plan = Plan(b.ctx, n, {}, facts)
    run(ROW_NEST, plan)
    b.ctx, b.steps = plan.ctx, b.steps + plan.steps


def _unit_stride_below_reduction(plan: Plan) -> bool:
    """Names the role `unit`: the loop of the statement's unit-stride subscript, where it is a spatial
    loop standing above a reduction loop that is innermost (a pooling window) and every access walks
    it contiguously; always goes on."""
    names, spatial = plan.names(), plan.facts["spatial"]
    stmt = plan.program.nests[plan.nest].body[0]
    unit = stmt.lhs.indices[-1].name if stmt.lhs.indices and isinstance(stmt.lhs.indices[-1], Var) else None
    if plan.facts["single"] and names[-1] not in spatial and unit in names[:-1] \
            and all(v not in spatial for v in names[names.index(unit) + 1:]) \
            and _walks_contiguously(plan.program, stmt, unit):
        plan.roles["unit"] = unit
    return True


def _sunk(plan: Plan) -> dict:
    """The reorder that makes the `unit` loop innermost: a swap with its neighbour, else a move."""
    names, unit = plan.names(), plan.var("unit")
    k = names.index(unit)
    return {"swap": [unit, names[-1]]} if k == len(names) - 2 else {"move": unit, "to": len(names) - 1}


def _innermost(plan: Plan) -> bool:
    """Names the role `inner`: the nest's innermost loop now; always goes on."""
    plan.roles["inner"] = plan.names()[-1]
    return True


def _vector_variants(plan: Plan) -> Iterator[dict]:
    return _vector_params(plan.loops()[-1].extent, plan.facts["lanes"], _fast_forms(plan.program.nests[plan.nest]))


def _fast_forms(nest: Nest) -> dict:
    """The fast-math parameter of the row kernel's vector loop over `nest`: `math: fast` (exp, log and
    erf as polynomials) where the nest calls erf or log; else `exp: fast`. One scalar library call per
    element costs, per float32 element on one core (AMD EPYC Zen 4, 128x128, cycles at 3.5 GHz): erf
    29, log 12, exp 7; their fast forms 1-2 in vector code (a GELU tail behind a 128^3 matmul: 239 us
    with erf, 14 us with fast_erf). Mish's nest in a vector loop (256x768, one core, AMD EPYC Zen 4): 2,008 us with
    the library's exp and log, 904 us with fast_exp around the library's log, 571 us with fast_log
    nested in fast_exp, now that a nested fast form's operand is kept in a cell (718 us and 3.6 s to
    build before; benchmarks/bench_fast_forms.py)."""
    called = {n.fn for s in body_statements(nest) for n in walk_expr(s[0].rhs) if isinstance(n, Call)}
    return {"math": "fast"} if called & {"erf", "log"} else {"exp": "fast"}


def _parallel_spatial(plan: Plan) -> bool:
    """The outermost spatial loop (or one split off a spatial loop) with work for every core made
    parallel, moved outside the reduction loops first where it stands inside them (one fork/join per
    reduction step otherwise); the next candidate where that move is not legal. Nothing where a loop
    is parallel already."""
    loops = plan.loops()
    if any(lp.kind == "P" for lp in loops):
        return True
    spatial = plan.facts["spatial"] | {lp.var for lp in loops if lp.var not in plan.facts["names"]}
    for k, lp in enumerate(loops[:-1]):
        if lp.var not in spatial or lp.extent < plan.facts["cores"] or lp.kind not in ("L", "B"):
            continue
        first_reduction = next((j for j, x in enumerate(loops) if x.var not in spatial), len(loops))
        plan.roles["parallel"] = lp.var
        if k > first_reduction and not plan.apply(
                "loop_reorder", {"swap": [loops[first_reduction].var, lp.var]} if k - first_reduction == 1
                else {"move": lp.var, "to": first_reduction}, lambda s: s.nest == plan.nest and s.path == ()):
            continue
        Step("loop_parallelization", ("parallel",), optional=True).run(plan)
        return True
    return True


# The row kernel's schedule of one heavy nest as data: a unit-stride spatial loop sunk innermost when a
# reduction loop is (a pooling window), the innermost loop vectorised (the widest legal variant: a split
# to a vector width, partial results on a reduction axis, fast exp), the outermost spatial loop with
# work for every core made parallel. Each step optional: a nest gets what is legal of it.
ROW_NEST = (
    _unit_stride_below_reduction,
    Step("loop_reorder", params=_sunk, when=lambda plan: plan.var("unit") is not None, optional=True),
    _innermost,
    Step("loop_vectorization", ("inner",), variants=_vector_variants,
         when=lambda plan: plan.loops()[-1].kind == "L" and len(plan.facts["names"]) > 1, optional=True),
    _parallel_spatial,
)


def _fuse_parallel_nests(b: _Builder, max_steps: int) -> int:
    """Adjacent nests that share their loops down to a parallel one, the second reading what the first
    writes, fused over them (`loop_fusion`), a light neighbour's matching serial loop made parallel
    first: one fork/join per row instead of one per nest, and each row's data still in cache for the
    next nest (a softmax's max, sum of exponentials, their partial results' combining nests and the
    division become one parallel loop). Fused as deep as the nests share loops, never into a vector
    loop, else shallower; a fusion that is not legal is left out. Stops before the builder holds more
    than `max_steps` steps (a longer macro than the search's budget is never taken). Returns how many
    fusions it made. Measured against the row kernel without them (AMD EPYC, 2 cores, release shapes):
    layer_norm 1.43x faster, group_norm 1.40x, softmax 64x512 1.12x; no gain on nll_loss and augmix."""
    i, fusions = 0, 0
    while i + 1 < len(b.program.nests) and len(b.steps) + 2 <= max_steps:
        first, second = b.program.nests[i], b.program.nests[i + 1]
        k = next((j for j, lp in enumerate(first.loops) if lp.kind == "P"), None)
        other = second.loops[k] if k is not None and k < len(second.loops) else None
        if other is None or common_depth(first, second) < k or not _shares_data(first, second) \
                or (other.extent, other.start) != (first.loops[k].extent, first.loops[k].start) \
                or other.kind not in ("L", "B", "P"):
            i += 1
            continue
        saved = (b.ctx, len(b.steps))
        if other.kind != "P" and not b.apply("loop_parallelization", {}, _at(i + 1, (other.var,))):
            i += 1
            continue
        first, second = b.program.nests[i], b.program.nests[i + 1]
        deepest = k + 1
        while deepest < common_depth(first, second) and first.loops[deepest].kind != "V":
            deepest += 1
        if any(b.apply("loop_fusion", {"depth": d}, _at(i)) for d in range(deepest, k, -1)):
            fusions += 1
        else:
            b.ctx, b.steps = saved[0], b.steps[:saved[1]]
            i += 1
    return fusions


def _shares_data(first: Nest, second: Nest) -> bool:
    """The second nest reads what the first writes (a producer and its consumer)."""
    return bool(set(written_tensors(body_statements(first))) & set(read_tensors(body_statements(second))))


def _walks_contiguously(program: Program, stmt: Stmt, var: str) -> bool:
    """Every access of the statement has stride 0 or 1 along `var` (vector lanes without gathers)."""
    shapes = tensor_boxes(program)
    for acc in (stmt.lhs, *accesses(stmt.rhs)):
        st = access_strides(shapes.get(acc.tensor), acc)
        if st is None or abs(st.get(var, 0)) > 1:
            return False
    return True


def _vector_params(extent: int, lanes: int, fast: dict | None = None) -> Iterator[dict]:
    """Vectorisation variants, widest useful first: the whole loop when short, else a split by a
    multiple of the lanes; each also as partial results (a reduction axis), and first with the fast
    math of `fast` (`_fast_forms`; default `exp: fast`), then without."""
    fast = fast or {"exp": "fast"}
    widths = [w for w in (2 * lanes, lanes) if extent % w == 0 and w < extent]
    base = ([{}] if extent <= 4 * lanes else []) + [{"width": w} for w in widths]
    for p in base:
        yield {**p, **fast}
        yield p
    # a reduction axis: partial results one register wide, whose combining nest (a serial chain as
    # long as the width) is then half as long as with two registers
    for w in sorted(widths):
        yield {"width": w, "partials": True, **fast}
        yield {"width": w, "partials": True}


# --- program_kernel --------------------------------------------------------------------------------

def program_kernel(ctx: Context, micro: list[Macro], machine: Machine = DEFAULT_MACHINE) -> Macro | None:
    """The widest micro-kernel proposal (every heavy contraction's, else the heaviest one's), then
    the row kernel of every other heavy nest on its result: what a tuner does to a whole program, in
    one proposal. A transformer layer's projections took 35 of 48 states as one macro, and the search
    had no states left to reach its softmax and activations as a second."""
    if not micro:
        return None
    first = _widest(micro)
    rows = [r for r in row_kernels(ctx.with_program(first.after), machine)
            if len(first.steps) + len(r.steps) <= MAX_PROGRAM_KERNEL_STEPS]
    if not rows:
        return None
    return Macro("program_kernel", {**first.params, "row_nests": rows[0].params["nests"]},
                 first.steps + rows[0].steps)


def compact_program_kernel(ctx: Context, micro: list[Macro], whole: Macro | None,
                           machine: Machine = DEFAULT_MACHINE) -> Macro | None:
    """The widest micro-kernel, then the row kernel of as many of the heaviest other nests as fit in
    `COMPACT_STEPS` in all (`compact_row_kernel`): the program kernel of a 16-state search. None when
    the whole program kernel fits anyway, or when no row kernel fits beside the micro-kernel."""
    if not micro or (whole is not None and len(whole.steps) <= COMPACT_STEPS):
        return None
    first = _widest(micro)
    rows = compact_row_kernel(ctx.with_program(first.after), COMPACT_STEPS - len(first.steps), machine)
    if rows is None:
        return None
    return Macro("program_kernel", {**first.params, "row_nests": rows.params["nests"], "compact": True},
                 first.steps + rows.steps)


def _widest(micro: list[Macro]) -> Macro:
    return max(micro, key=lambda m: (len(m.steps), -micro.index(m)))


def macro_proposals(ctx: Context, machine: Machine = DEFAULT_MACHINE) -> list[Macro]:
    """Every macro this state admits (possibly none), in a fixed order."""
    if ctx.gpu:
        return []
    micro = micro_kernels(ctx, machine)
    whole = program_kernel(ctx, micro, machine)
    compact = compact_program_kernel(ctx, micro, whole, machine)
    return micro + row_kernels(ctx, machine) + [m for m in (whole, compact) if m is not None]
