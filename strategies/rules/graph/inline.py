"""compute_inline and dead_code_elimination: statements that disappear because what they compute is
recomputed where it is read, or read nowhere live."""
from __future__ import annotations

from dataclasses import dataclass

from leir.analysis import StmtSite, contraction_contexts, is_product
from leir.ast import Access, Var, map_stmt
from leir.printer import format_expr
from strategies.analysis import recognition as rec
from strategies.analysis.gates import inits_problem, positions_without
from strategies.analysis.legality import iterations, product_rounds, stmt_reads
from strategies.analysis.tree import remove_items, replace_stmt, substitute_vars
from strategies.base import Context, Match, Params, Rewrite, Site, Strategy, params_dataclass
from strategies.registry import register


def readers(ctx: Context, tensor: str) -> list[StmtSite]:
    return [s for s in ctx.sites if any(a.tensor == tensor for a in stmt_reads(s.stmt))]


def writers(ctx: Context, tensor: str) -> list[StmtSite]:
    return [s for s in ctx.sites if s.stmt.lhs.tensor == tensor]


def site_key(site: StmtSite) -> tuple[int, tuple[int, ...]]:
    return site.nest_index, site.path


# --- compute_inline ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Inlinable(Match):
    """An intermediate's single producer and the statements that read it."""

    producer: StmtSite
    readers: tuple[StmtSite, ...]

    def to_json(self) -> dict:
        return {}  # the site's statements are the producer and its readers


def inline_problem(ctx: Context, tensor: str) -> str | None:
    """Why the intermediate cannot be inlined (no single pure producer, a reader that would compute
    otherwise), or None."""
    info = ctx.tensors.get(tensor)
    if info is None or info.known:
        return f"{tensor} is a known tensor"
    ws = writers(ctx, tensor)
    if len(ws) != 1:
        return f"{tensor} is written by {len(ws)} statements"
    w = ws[0]
    problem = _producer_problem(tensor, w)
    if problem:
        return problem
    rs = readers(ctx, tensor)
    if not rs:
        return f"nothing reads {tensor}"
    problem = next((p for r in rs if (p := _reader_problem(tensor, w, r))), None)
    if problem:
        return problem
    for a in stmt_reads(w.stmt):
        for other in writers(ctx, a.tensor):
            if other.nest_index >= w.nest_index:
                return f"{a.tensor}, an operand of {tensor}, is written in or after the producer's nest"
    return None


def inline_candidate(ctx: Context, tensor: str) -> Inlinable:
    """The single producer and the readers of an intermediate that `inline_problem` passed."""
    return Inlinable(writers(ctx, tensor)[0], tuple(readers(ctx, tensor)))


def _producer_problem(tensor: str, w: StmtSite) -> str | None:
    lhs = w.stmt.lhs
    ix_vars = [ix.name for ix in lhs.indices if isinstance(ix, Var)]
    if len(ix_vars) != len(lhs.indices) or len(set(ix_vars)) != len(ix_vars):
        return f"{tensor} is not written at plain, distinct loop indices"
    if set(ix_vars) != {lp.var for lp in w.loops}:
        return f"{tensor} is written repeatedly (a loop of its producer is not in its subscript)"
    if any(a.tensor == tensor for a in stmt_reads(w.stmt)):
        return f"{tensor} is an update, not a pure function of its indices"
    return None


def _reader_problem(tensor: str, w: StmtSite, r: StmtSite) -> str | None:
    if is_product(w.stmt.rhs) and product_rounds(w.stmt.rhs, w.stmt.lhs.dtype) and any(
            contraction_contexts(r.stmt.rhs, a) for a in stmt_reads(r.stmt) if a.tensor == tensor):
        return (f"inlining the product {tensor} into a sum would let the compiler fuse a "
                "multiply-add and round differently")
    if r.nest_index <= w.nest_index:
        return f"statement {r.order + 1} reads {tensor} inside its producer's nest"
    if r.stmt.lhs.dtype != w.stmt.lhs.dtype:
        return f"statement {r.order + 1} computes in {r.stmt.lhs.dtype}, {tensor} is {w.stmt.lhs.dtype}"
    return None


def inliner(tensor: str, w: StmtSite):
    """A node map (for `map_stmt`) that replaces every read of `tensor` by the producer's right-hand
    side at the subscripts read."""
    names = [ix.name for ix in w.stmt.lhs.indices]

    def fn(n):
        if isinstance(n, Access) and n.tensor == tensor:
            return substitute_vars(w.stmt.rhs, dict(zip(names, n.indices, strict=True)))
        return n
    return fn


@params_dataclass
class InlineParams(Params):
    into: int | str   # "all" (every reader; the producer goes), or one reading statement (1-based)


@register
class ComputeInline(Strategy):
    name = "compute_inline"
    level = "graph"
    exactness = "exact"
    description = "Replace reads of an elementwise intermediate by the expression that computes it."
    search_prior = 6.5
    params_type = InlineParams

    def recognizes(self, before, after, signature):
        """An intermediate no longer written and fewer statements (inlined into every reader), or
        an intermediate read by fewer statements and none added (inlined into one reader; the producer
        stays for the others)."""
        gone = set(rec.intermediates(before, signature)) - set(rec.intermediates(after, signature))
        fewer = len(rec.statements(after)) < len(rec.statements(before))
        if gone and fewer:
            return True
        reads_before, reads_after = rec.readers(before), rec.readers(after)
        reread = any(reads_after[name] < reads_before[name] for name in rec.intermediates(before, signature))
        return reread and len(rec.statements(after)) <= len(rec.statements(before))

    def sites(self, ctx):
        for name, info in ctx.tensors.items():
            if info.known:
                continue
            if inline_problem(ctx, name):
                continue
            found = inline_candidate(ctx, name)
            yield Site(found.producer.nest_index, tensors=(name,), match=found,
                       stmts=(found.producer.order,) + tuple(dict.fromkeys(r.order for r in found.readers)))

    def parameters(self, ctx, site):
        yield {"into": "all"}
        for order in site.stmts[1:]:
            yield {"into": order + 1}

    def _chosen(self, site, into) -> list[StmtSite]:
        return list(site.match.readers) if into == "all" else [r for r in site.match.readers if r.order + 1 == into]

    def check(self, ctx, site, params):
        if isinstance(params.into, str) and params.into != "all":
            return f"into is \"all\" or a statement number, got {params.into!r}"
        if not self._chosen(site, params.into):
            return f"statement {params.into} does not read {site.tensors[0]}"
        return None

    def build(self, ctx, site, params):
        tensor, w, into = site.tensors[0], site.match.producer, params.into
        chosen = self._chosen(site, into)
        program = ctx.program
        for r in chosen:
            program = replace_stmt(program, r, map_stmt(r.stmt, inliner(tensor, w)))
        removed = into == "all"
        if removed:
            program = remove_items(program, [site_key(w)])
        return Rewrite(program, self._facts(tensor, w, chosen), self._summary(tensor, w, chosen, removed))

    def gate(self, ctx, site, params, rewrite):
        removed = [site.match.producer.order] if params.into == "all" else []
        return inits_problem(ctx, rewrite.program, positions_without(ctx, removed))

    def _facts(self, tensor, w, chosen) -> tuple[str, ...]:
        targets = ", ".join(str(r.order + 1) for r in chosen)
        return (f"{tensor} is written once per element by statement {w.order + 1}, as a pure function of its "
                f"indices: {format_expr(w.stmt.rhs)}",
                f"its operands are final before that nest runs, so recomputing it in statement"
                f"{'s' if len(chosen) > 1 else ''} {targets} gives the same values, in the same dtype "
                f"({w.stmt.lhs.dtype})")

    def _summary(self, tensor, w, chosen, removed) -> str:
        targets = ", ".join(str(r.order + 1) for r in chosen)
        tail = (f"the producer nest and the {iterations(w.loops)}-element intermediate disappear" if removed else
                "the producer stays for its other readers until it is dead")
        plural = len(chosen) > 1
        return (f"Statement{'s' if plural else ''} {targets} compute{'' if plural else 's'} {tensor} where needed "
                f"instead of reading it from memory; {tail}.")


# --- dead_code_elimination --------------------------------------------------------------------------

@dataclass(frozen=True)
class AllDead(Match):
    """Every dead intermediate at once (the site's tensors)."""

    def to_json(self) -> dict:
        return {"all": True}


def live_tensors(ctx: Context) -> set[str]:
    live = {t.name for t in ctx.signature.outputs}
    changed = True
    while changed:
        changed = False
        for s in ctx.sites:
            if s.stmt.lhs.tensor in live:
                for a in stmt_reads(s.stmt):
                    if a.tensor not in live:
                        live.add(a.tensor)
                        changed = True
    return live


@register
class DeadCodeElimination(Strategy):
    name = "dead_code_elimination"
    level = "graph"
    exactness = "exact"
    description = "Remove the statements that compute an intermediate nothing live reads."
    search_prior = 3.0

    def recognizes(self, before, after, signature):
        """Fewer statements and no new tensor."""
        return (len(rec.statements(after)) < len(rec.statements(before))
                and not rec.new_intermediates(before, after, signature))

    def sites(self, ctx):
        live = live_tensors(ctx)
        dead = [n for n, info in ctx.tensors.items() if not info.known and n not in live]
        for name in dead:
            ws = writers(ctx, name)
            yield Site(ws[0].nest_index if ws else 0, tensors=(name,), stmts=tuple(s.order for s in ws))
        if len(dead) > 1:
            yield Site(0, tensors=tuple(dead), match=AllDead())

    def check(self, ctx, site, params):
        live = live_tensors(ctx)
        doomed = set(site.tensors)
        if doomed & live or any(ctx.tensors[t].known for t in doomed):
            return "a tensor of the site is live"
        for s in ctx.sites:
            if s.stmt.lhs.tensor not in doomed and any(a.tensor in doomed for a in stmt_reads(s.stmt)):
                return f"statement {s.order + 1} still reads {', '.join(sorted(doomed))}"
        if not any(s.stmt.lhs.tensor in doomed for s in ctx.sites):
            return "nothing to remove"
        return None

    def build(self, ctx, site, params):
        doomed = set(site.tensors)
        gone = [s for s in ctx.sites if s.stmt.lhs.tensor in doomed]
        program = remove_items(ctx.program, [site_key(s) for s in gone])
        names = ", ".join(sorted(doomed, key=list(ctx.tensors).index))
        return Rewrite(program, self._facts(names, len(doomed)), self._summary(names, gone))

    def _facts(self, names: str, count: int) -> tuple[str, ...]:
        return (f"{names} {'is' if count == 1 else 'are'} not known tensors (not in the signature)",
                f"no statement that contributes to the output reads {names}",
                "the removed statements write nothing else, so every remaining statement sees the same values")

    def _summary(self, names: str, gone: list[StmtSite]) -> str:
        work = sum(iterations(s.loops) for s in gone)
        orders = ", ".join(str(s.order + 1) for s in gone)
        return (f"Removing {len(gone)} statement{'s' if len(gone) > 1 else ''} ({orders}) "
                f"saves {work} element computations and the storage of {names}.")
