"""The decisions of the lowering, as small pure functions (no TVM):

- `loop_kind`: what a LEIR loop becomes on a target. A `P`, `V` or (on CUDA) `B` loop runs its
  iterations at once only when distinct iterations write distinct elements of every statement below
  it (`writes_apart`); otherwise a reduction or a repeated store across it would race, so it stays a
  serial loop, and the plan records why. LEIR allows such loops (an accumulator update across a
  parallel loop is legal, docs/leir.md §4.1), so this is the lowering's job, not the program's fault.
- `fill_depth` / `fill_loops`: where the explicit initialisation of a reduction goes (§4.4).
"""
from __future__ import annotations

from dataclasses import dataclass

from leir.analysis import StmtSite, affine_form, lhs_vars
from leir.ast import Access, Loop, Stmt
from leir.lower.check import LoweringError

# An unrolled loop nest is copied out in full; beyond this many copies of a body, the remaining `U`
# loops stay serial so that a build cannot take minutes.
MAX_UNROLLED_COPIES = 1024
THREAD_AXES = {"t": "threadIdx", "b": "blockIdx"}
RACY = "distinct iterations write the same element (a reduction or repeated store across it)"


def writes_apart(var: str, lhs: Access, inner: tuple[Loop, ...]) -> bool:
    """Whether distinct values of `var` make `lhs` name distinct elements whatever the loops in
    `inner` do (outer indices fixed): some affine subscript moves by more per step of `var` than all
    inner loops together can move it (`g*4+h` with h < 4 is apart in g; `a//2` is not in a)."""
    for ix in lhs.indices:
        form = affine_form(ix)
        if form is None:
            continue
        coeffs = form[0]
        step = abs(coeffs.get(var, 0))
        spread = sum(abs(coeffs.get(lp.var, 0)) * (lp.extent - 1) for lp in inner if lp.var != var)
        if step and step > spread:
            return True
    return False


def thread_tag(binding: str) -> str:
    """`tx` -> `threadIdx.x`, `bya` -> `blockIdx.y` (suffix letters only make names unique)."""
    return f"{THREAD_AXES[binding[0]]}.{binding[1]}"


@dataclass(frozen=True, slots=True)
class LoopContext:
    """What the enclosing (already lowered) loops imply for a loop."""

    parallel: bool = False       # inside a loop that runs in parallel on the CPU
    tags: tuple[str, ...] = ()   # CUDA thread tags bound by enclosing loops
    unrolled: int = 1            # copies of the body made by enclosing unrolled loops

    def enter(self, kind: str, tag: str, extent: int) -> LoopContext:
        return LoopContext(self.parallel or kind == "parallel", self.tags + ((tag,) if tag else ()),
                           self.unrolled * (extent if kind == "unroll" else 1))


def loop_kind(loop: Loop, below: list[tuple[Stmt, tuple[Loop, ...]]], innermost: bool, target: str,
              ctx: LoopContext) -> tuple[str, str, str]:
    """(kind, thread tag, note) of `loop`; `below` pairs each statement under it with the loops between
    it and the statement; `innermost`: nothing but statements below it."""
    apart = all(writes_apart(loop.var, stmt.lhs, inner) for stmt, inner in below)
    if loop.kind == "U":
        if ctx.unrolled * loop.extent > MAX_UNROLLED_COPIES:
            return "serial", "", f"not unrolled: it would copy the body more than {MAX_UNROLLED_COPIES} times"
        return "unroll", "", ""
    if target == "cuda":
        return _cuda_kind(loop, apart, ctx)
    if loop.kind == "P":
        if not apart:
            return "serial", "", f"not parallel: {RACY}"
        if ctx.parallel:  # TVM's CPU backend has no nested parallelism
            return "serial", "", "not parallel: nested inside a parallel loop"
        return "parallel", "", ""
    if loop.kind == "V":
        if not apart:
            return "serial", "", f"not vectorized: {RACY}"
        if not innermost:
            return "serial", "", "not vectorized: it is not the innermost loop of its statements"
        return "vectorized", "", ""
    return "serial", "", ""  # L, and B: thread bindings do not build for the CPU


def _cuda_kind(loop: Loop, apart: bool, ctx: LoopContext) -> tuple[str, str, str]:
    if loop.kind != "B":
        return "serial", "", "" if loop.kind == "L" else f"{loop.kind} has no meaning inside a CUDA kernel"
    if not apart:
        return "serial", "", f"not bound to a thread: {RACY}"
    tag = thread_tag(loop.var)
    if tag in ctx.tags:
        raise LoweringError(f"binding {loop.var} ({tag}) is nested inside another loop bound to {tag}")
    return "thread", tag, ""


def fill_depth(site: StmtSite, kinds: list[str], target: str) -> int:
    """How many of the statement's loops (outermost first) enclose the initialisation of its
    reduction (0: the fill runs before the top-level nest).

    Inside a prefix of loops whose indices are spatial and partition the written elements
    (`writes_apart`), one iteration's fill covers exactly what that iteration then updates, so the
    fill can sit there (TVM's `decompose_reduction`, for any subscripts). Deeper is impossible: the
    next loop revisits elements, or is a reduction axis. On CUDA every thread-bound loop must be in
    the prefix: a fill above a thread binding would run in every thread, racing with the updates of
    the others; without that, the fill is a kernel of its own before the nest."""
    spatial = set(lhs_vars(site.stmt))
    depth = 0
    for i, lp in enumerate(site.loops):
        if lp.var not in spatial or not writes_apart(lp.var, site.stmt.lhs, site.loops[i + 1:]):
            break
        depth = i + 1
    if target == "cuda":
        threads = [i for i, k in enumerate(kinds) if k == "thread"]
        if not threads or threads[-1] >= depth:
            return 0
    return depth


def fill_loops(site: StmtSite, depth: int) -> tuple[Loop, ...]:
    """The loops a fill runs below its place: the statement's remaining spatial loops (the elements
    it writes are the image of those indices; reduction loops would only repeat the fill)."""
    spatial = set(lhs_vars(site.stmt))
    return tuple(lp for lp in site.loops[depth:] if lp.var in spatial)
