"""Planning the lowering of a LEIR program, without TVM (docs/leir.md §4).

The plan is a small tree of `PLoop`s and `PStore`s, in execution order, that `leir.lower.emit` turns
into TIR one for one. Everything that needs a decision is decided here, deterministically:
checks (`check`), loop kinds and the places of initialisation fills (`rules`), and where
intermediates are allocated (`plan_allocations`). The plan also lists, as `notes`, every loop whose
LEIR kind was lowered differently and why.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from leir.analysis import StmtSite, TensorInfo, implicit_inits, statement_sites
from leir.ast import Access, Loop, Nest, Program, Stmt, accesses
from leir.lower.check import LoweringError, check_site, checked_table, describe_sites
from leir.lower.rules import LoopContext, fill_depth, fill_loops, loop_kind
from leir.signature import Signature

TARGET_KINDS = ("llvm", "cuda")
__all__ = ["LoweringError", "PLoop", "PStore", "Plan", "TARGET_KINDS", "plan_program"]


@dataclass(frozen=True, slots=True)
class PStore:
    """One element assignment. A fill (`identity` set, no `rhs`) stores a reduction's identity."""

    lhs: Access
    rhs: object          # a LEIR expression; None for a fill
    where: str           # "nest 2, statement 1 `D=...`", for error messages
    identity: int | float | None = None
    order: int = -1      # the statement's position in program order (a fill: its reduction's)

    @property
    def is_fill(self) -> bool:
        return self.rhs is None


@dataclass(frozen=True, slots=True)
class PLoop:
    var: str
    start: int
    extent: int
    kind: str                    # serial | parallel | vectorized | unroll | thread
    thread: str = ""             # threadIdx.x ... when kind == "thread"
    leir_kind: str = "L"
    note: str = ""               # why the LEIR kind was lowered differently
    body: tuple = ()
    allocs: tuple[str, ...] = ()  # CUDA: intermediates allocated at the top of this loop's body
    uid: int = 0
    wrapper: bool = False         # CUDA: the unit loop of a one-thread kernel, not a LEIR loop


@dataclass(frozen=True, slots=True)
class Plan:
    target: str
    tensors: dict[str, TensorInfo]            # signature order, then intermediates
    scopes: dict[str, str]                    # storage scope of each intermediate on the target
    top_allocs: tuple[str, ...]               # intermediates allocated at function level
    items: tuple = ()                         # PLoop | PStore, in execution order
    notes: tuple[str, ...] = field(default=())


def plan_program(program: Program, signature: Signature, target: str = "llvm") -> Plan:
    if target not in TARGET_KINDS:
        raise LoweringError(f"unknown target kind {target!r}; expected one of {', '.join(TARGET_KINDS)}")
    sites = statement_sites(program)
    table = checked_table(program, signature, sites)
    where = describe_sites(sites)
    for site in sites:
        check_site(site, where[site.order], table, signature)
    builder = _TreeBuilder(program, signature, target, sites, where)
    scopes, top_allocs, items = plan_allocations(table, builder.build(), target)
    return Plan(target, table, scopes, top_allocs, items, tuple(dict.fromkeys(builder.notes)))


class _TreeBuilder:
    """Builds the plan's items nest by nest: the nest's loops with their lowered kinds, and the fills
    of its reductions, before the nest or inside the loops that partition what they write."""

    def __init__(self, program: Program, signature: Signature, target: str, sites: list[StmtSite],
                 where: dict[int, str]):
        self.program, self.target, self.sites, self.where = program, target, sites, where
        self.inits = implicit_inits(program, signature)
        self.by_key = {(s.nest_index, s.path): s for s in sites}
        self.notes: list[str] = []
        self.uid = 0

    def build(self) -> tuple:
        items: list = []
        for top, nest in enumerate(self.program.nests):
            kinds = self._kinds(nest)
            before, inside = self._fills(top, kinds)
            items.extend(self._top_fill(site, loops) for site, loops in before)
            context = f"nest {top + 1}, "
            items.extend(self._kernel_wrap(it) for it in self._nest(nest, top, (), kinds, inside, context))
        return tuple(items)

    def _kinds(self, nest: Nest, path=(), ctx: LoopContext | None = None, out=None) -> dict:
        """{(path of a nest, loop index): (kind, tag, note)} for the nest and the nests inside it."""
        out, ctx = {} if out is None else out, ctx or LoopContext()
        below = [(s.stmt, s.loops) for s in statement_sites(Program((nest,)))]
        nested = any(isinstance(item, Nest) for item in nest.body)
        for i, lp in enumerate(nest.loops):
            under = [(stmt, loops[i + 1:]) for stmt, loops in below]
            innermost = i == len(nest.loops) - 1 and not nested
            out[(path, i)] = kind = loop_kind(lp, under, innermost, self.target, ctx)
            ctx = ctx.enter(kind[0], kind[1], lp.extent)
        for j, item in enumerate(nest.body):
            if isinstance(item, Nest):
                self._kinds(item, path + (j,), ctx, out)
        return out

    def _site_kinds(self, site: StmtSite, kinds: dict) -> list[str]:
        """The lowered kinds of the statement's loops, outermost first."""
        out, path = [], ()
        nest = self.program.nests[site.nest_index]
        for step in site.path:
            out.extend(kinds[(path, i)][0] for i in range(len(nest.loops)))
            if isinstance(nest.body[step], Nest):
                nest, path = nest.body[step], path + (step,)
        return out

    def _fills(self, top: int, kinds: dict):
        """Fills before the top-level nest, and {(nest path, position): fills} inside it, where position
        i is 'inside loop i-1, before loop i' and ('item', j) is 'before body item j'."""
        before, inside = [], {}
        for site in self.sites:
            if site.nest_index != top or site.order not in self.inits:
                continue
            depth = fill_depth(site, self._site_kinds(site, kinds), self.target)
            loops = fill_loops(site, depth)
            if depth == 0:
                before.append((site, loops))
            else:
                inside.setdefault(self._place(site, depth), []).append((site, loops))
        return before, inside

    def _place(self, site: StmtSite, depth: int):
        """The position, inside the nest structure, below the statement's first `depth` loops."""
        nest, path, seen = self.program.nests[site.nest_index], (), 0
        for step in site.path:
            if depth < seen + len(nest.loops):
                return (path, depth - seen)
            seen += len(nest.loops)
            if depth == seen:
                return (path, ("item", step))
            nest, path = nest.body[step], path + (step,)
        raise AssertionError("fill depth beyond the statement's loops")

    def _fill_store(self, site: StmtSite) -> PStore:
        return PStore(site.stmt.lhs, None, "initialisation of " + self.where[site.order], self.inits[site.order],
                      site.order)

    def _top_fill(self, site: StmtSite, loops: tuple[Loop, ...]):
        """A fill before the top-level nest: a nest of its own, whose loop kinds follow the same rules."""
        kinds = self._kinds(Nest(loops, (Stmt(site.stmt.lhs, site.stmt.lhs),)))
        item = self._fill_store(site)
        context = f"initialisation before nest {site.nest_index + 1}, "
        for i in reversed(range(len(loops))):
            item = self._loop(loops[i], kinds[((), i)], (item,), context)
        return self._kernel_wrap(item)

    def _inner_fill(self, site: StmtSite, loops: tuple[Loop, ...]):
        item = self._fill_store(site)
        for lp in reversed(loops):  # inside loops that already partition the work: serial
            item = self._loop(lp, ("serial", "", ""), (item,), "")
        return item

    def _nest(self, nest: Nest, top: int, path, kinds, inside, context: str, i: int = 0) -> tuple:
        """The items of loops i.. of the nest at `path` (its body when i == len(loops)), with the
        fills that belong inside them."""
        if i == len(nest.loops):
            body = []
            for j, item in enumerate(nest.body):
                body.extend(self._inner_fill(s, lps) for s, lps in inside.get((path, ("item", j)), []))
                if isinstance(item, Stmt):
                    site = self.by_key[(top, path + (j,))]
                    body.append(PStore(item.lhs, item.rhs, self.where[site.order], order=site.order))
                else:
                    body.extend(self._nest(item, top, path + (j,), kinds, inside, context))
            return tuple(body)
        fills = tuple(self._inner_fill(s, lps) for s, lps in inside.get((path, i), [])) if i else ()
        inner = self._nest(nest, top, path, kinds, inside, context, i + 1)
        return fills + (self._loop(nest.loops[i], kinds[(path, i)], inner, context),)

    def _loop(self, lp: Loop, kind: tuple[str, str, str], body: tuple, context: str) -> PLoop:
        self.uid += 1
        k, tag, note = kind
        if note:
            self.notes.append(f"{context}{lp.kind}^{{{lp.extent}}}_{{{lp.var}}}: {note}")
        return PLoop(lp.var, lp.start, lp.extent, k, tag, lp.kind, note, body, (), self.uid)

    def _kernel_wrap(self, item):
        """On CUDA every statement must run inside a kernel: a top-level item whose statements are not
        all under a thread-bound loop runs in one block of one thread (a unit `blockIdx` loop)."""
        if self.target != "cuda" or _all_under_thread(item):
            return item
        used = {lp.thread for lp in _loops(item) if lp.kind == "thread"}
        free = [a for a in ("blockIdx.x", "blockIdx.y", "blockIdx.z") if a not in used]
        if not free:
            raise LoweringError("a nest binds blockIdx.x, .y and .z but has statements outside them")
        self.uid += 1
        return PLoop("kernel", 0, 1, "thread", free[0], "L", "one-thread kernel", (item,), (), self.uid, True)


def _loops(item):
    if isinstance(item, PLoop):
        yield item
        for b in item.body:
            yield from _loops(b)


def _all_under_thread(item) -> bool:
    if isinstance(item, PStore):
        return False
    return item.kind == "thread" or all(_all_under_thread(b) for b in item.body)


# --- allocations -----------------------------------------------------------------------------------

def plan_allocations(table: dict[str, TensorInfo], items: tuple, target: str):
    """(scopes, function-level allocations, items with in-kernel allocations) of the intermediates.

    CPU: every intermediate is allocated once at function level with its own scope (the scope does
    not change the result there). CUDA: `g` intermediates are allocated at function level (the host
    allocates a device workspace and passes it to the kernels); an `s` or `l` intermediate whose
    accesses all lie in one kernel is allocated at the top of that kernel; one whose value crosses
    kernels cannot live in shared or local memory (it would not survive the launch), so it is
    promoted to global memory."""
    names = [n for n, info in table.items() if not info.known]
    scopes = {n: {"g": "global", "s": "shared", "l": "local"}[table[n].scope] for n in names}
    if target != "cuda":
        return scopes, tuple(names), items
    kernels = _kernels_of_accesses(items)
    top, inside = [], {}
    for n in names:
        ks = list(dict.fromkeys(kernels.get(n, [])))
        if table[n].scope != "g" and len(ks) == 1 and ks[0]:
            inside.setdefault(ks[0], []).append(n)
        else:
            scopes[n] = "global"
            top.append(n)
    return scopes, tuple(top), tuple(_with_allocs(it, inside) for it in items)


def _kernels_of_accesses(items) -> dict[str, list[int]]:
    """{tensor: [uid of the outermost thread loop around each access]} (0: outside any kernel)."""
    out: dict[str, list[int]] = {}

    def visit(item, kernel: int):
        if isinstance(item, PLoop):
            inner = kernel or (item.uid if item.kind == "thread" else 0)
            for b in item.body:
                visit(b, inner)
            return
        found = list(accesses(item.lhs)) + (list(accesses(item.rhs)) if item.rhs is not None else [])
        for acc in found:
            out.setdefault(acc.tensor, []).append(kernel)

    for it in items:
        visit(it, 0)
    return out


def _with_allocs(item, inside: dict[int, list[str]]):
    if isinstance(item, PStore):
        return item
    body = tuple(_with_allocs(b, inside) for b in item.body)
    return replace(item, body=body, allocs=tuple(inside.get(item.uid, ())))
