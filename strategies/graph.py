"""Graph-level strategies: which statements and nests exist, what they compute and in which order.

Every rewrite keeps the order in which each tensor element is written and read (true, anti and
output dependences) and the implicit initialisation of every reduction (LEIR.md §4.4).
"""
from __future__ import annotations

from leir.analysis import StmtSite, contraction_contexts, implicit_inits, is_product, reduction_op
from leir.ast import Access, BinOp, Call, Neg, Nest, Program, Select, Stmt, Var, accesses, children, map_stmt
from leir.printer import format_expr
from strategies.base import Context, Illegal, Rewrite, Site, Strategy
from strategies.legality import (
    body_statements,
    conflicts,
    dependence_names,
    iterations,
    misaligned,
    stmt_reads,
)
from strategies.loops import bands, common_depth, contracted_products, fuse_nests
from strategies.registry import register
from strategies.tree import enclosing_loops, fresh_tensors, get_item, replace_item, substitute_vars, vars_in

MAX_CSE = 8


def site_key(site: StmtSite) -> tuple[int, tuple[int, ...]]:
    return site.nest_index, site.path


def remove_items(program: Program, keys: list[tuple[int, tuple[int, ...]]]) -> Program:
    """The program without the items at (nest, path); nests left without a body disappear."""
    def prune(nest: Nest, path: tuple[int, ...], doomed) -> Nest | None:
        body = []
        for i, item in enumerate(nest.body):
            if path + (i,) in doomed:
                continue
            if isinstance(item, Nest):
                item = prune(item, path + (i,), doomed)
                if item is None:
                    continue
            body.append(item)
        return Nest(nest.loops, tuple(body)) if body else None

    nests = []
    for top, nest in enumerate(program.nests):
        pruned = prune(nest, (), {p for t, p in keys if t == top})
        if pruned is not None:
            nests.append(pruned)
    return Program(tuple(nests))


def readers(ctx: Context, tensor: str) -> list[StmtSite]:
    return [s for s in ctx.sites if any(a.tensor == tensor for a in stmt_reads(s.stmt))]


def writers(ctx: Context, tensor: str) -> list[StmtSite]:
    return [s for s in ctx.sites if s.stmt.lhs.tensor == tensor]


def map_stmt_at(program: Program, site: StmtSite, fn) -> Program:
    return replace_item(program, site.nest_index, site.path, (fn(site.stmt),))


def check_inits(ctx: Context, program: Program, order_map: dict[int, int] | None = None) -> None:
    """Raise Illegal when a reduction gains or loses its implicit initialisation (LEIR.md §4.4).
    `order_map` maps old statement positions to new ones (identity when absent)."""
    old, new = ctx.inits, implicit_inits(program, ctx.signature)
    moved = {(order_map or {}).get(k, k): v for k, v in old.items()}
    if moved != new:
        raise Illegal("a reduction would gain or lose its implicit initialisation")


# --- compute_inline ---------------------------------------------------------------------------------

def inline_candidate(ctx: Context, tensor: str) -> tuple[StmtSite, list[StmtSite]]:
    """(the single producer, its readers) of an intermediate that can be inlined, else Illegal."""
    info = ctx.tensors.get(tensor)
    if info is None or info.known:
        raise Illegal(f"{tensor} is a known tensor")
    ws = writers(ctx, tensor)
    if len(ws) != 1:
        raise Illegal(f"{tensor} is written by {len(ws)} statements")
    w = ws[0]
    lhs = w.stmt.lhs
    ix_vars = [ix.name for ix in lhs.indices if isinstance(ix, Var)]
    if len(ix_vars) != len(lhs.indices) or len(set(ix_vars)) != len(ix_vars):
        raise Illegal(f"{tensor} is not written at plain, distinct loop indices")
    if set(ix_vars) != {lp.var for lp in w.loops}:
        raise Illegal(f"{tensor} is written repeatedly (a loop of its producer is not in its subscript)")
    if any(a.tensor == tensor for a in stmt_reads(w.stmt)):
        raise Illegal(f"{tensor} is an update, not a pure function of its indices")
    rs = readers(ctx, tensor)
    if not rs:
        raise Illegal(f"nothing reads {tensor}")
    for r in rs:
        if is_product(w.stmt.rhs) and any(contraction_contexts(r.stmt.rhs, a) for a in stmt_reads(r.stmt)
                                          if a.tensor == tensor):
            raise Illegal(f"inlining the product {tensor} into a sum would let the compiler fuse a "
                          "multiply-add and round differently")
        if r.nest_index <= w.nest_index:
            raise Illegal(f"statement {r.order + 1} reads {tensor} inside its producer's nest")
        if r.stmt.lhs.dtype != lhs.dtype:
            raise Illegal(f"statement {r.order + 1} computes in {r.stmt.lhs.dtype}, {tensor} is {lhs.dtype}")
    for a in stmt_reads(w.stmt):
        for other in writers(ctx, a.tensor):
            if other.nest_index >= w.nest_index:
                raise Illegal(f"{a.tensor}, an operand of {tensor}, is written in or after the producer's nest")
    return w, rs


def inline_reads(expr, tensor: str, w: StmtSite):
    """`expr` with every read of `tensor` replaced by the producer's right-hand side."""
    names = [ix.name for ix in w.stmt.lhs.indices]

    def fn(n):
        if isinstance(n, Access) and n.tensor == tensor:
            return substitute_vars(w.stmt.rhs, dict(zip(names, n.indices, strict=True)))
        return n
    from leir.ast import map_expr
    return map_expr(expr, fn)


@register
class ComputeInline(Strategy):
    name = "compute_inline"
    level = "graph"
    exactness = "exact"
    description = "Replace reads of an elementwise intermediate by the expression that computes it."

    def sites(self, ctx):
        for name, info in ctx.tensors.items():
            if info.known:
                continue
            try:
                w, rs = inline_candidate(ctx, name)
            except Illegal:
                continue
            yield Site(w.nest_index, tensors=(name,), stmts=(w.order,) + tuple(dict.fromkeys(r.order for r in rs)))

    def parameters(self, ctx, site):
        yield {"into": "all"}
        for order in site.stmts[1:]:
            yield {"into": order + 1}

    def rewrite(self, ctx, site, params):
        tensor = site.tensors[0]
        w, rs = inline_candidate(ctx, tensor)
        into = params["into"]
        chosen = rs if into == "all" else [r for r in rs if r.order + 1 == into]
        if not chosen:
            raise Illegal(f"statement {into} does not read {tensor}")
        program = ctx.program
        for r in chosen:
            program = map_stmt_at(program, r, lambda s: Stmt(
                Access(s.lhs.tensor, s.lhs.dtype, s.lhs.scope,
                       tuple(inline_reads(ix, tensor, w) for ix in s.lhs.indices)),
                inline_reads(s.rhs, tensor, w)))
        removed = into == "all"
        if removed:
            program = remove_items(program, [site_key(w)])
        check_inits(ctx.with_program(ctx.program), program, _shift(ctx, [w.order] if removed else []))
        targets = ", ".join(str(r.order + 1) for r in chosen)
        facts = (f"{tensor} is written once per element by statement {w.order + 1}, as a pure function of its "
                 f"indices: {format_expr(w.stmt.rhs)}",
                 f"its operands are final before that nest runs, so recomputing it in statement"
                 f"{'s' if len(chosen) > 1 else ''} {targets} gives the same values, in the same dtype "
                 f"({w.stmt.lhs.dtype})")
        size = iterations(w.loops)
        tail = (f"the producer nest and the {size}-element intermediate disappear" if removed else
                "the producer stays for its other readers until it is dead")
        plural = len(chosen) > 1
        effect = (f"Statement{'s' if plural else ''} {targets} compute{'' if plural else 's'} {tensor} where needed "
                  f"instead of reading it from memory; {tail}.")
        return Rewrite(program, facts, effect)


def _shift(ctx: Context, removed: list[int]) -> dict[int, int]:
    """Old statement positions -> new ones after removing statements."""
    out, k = {}, 0
    for s in ctx.sites:
        if s.order in removed:
            continue
        out[s.order] = k
        k += 1
    return out


# --- dead_code_elimination --------------------------------------------------------------------------

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

    def sites(self, ctx):
        live = live_tensors(ctx)
        dead = [n for n, info in ctx.tensors.items() if not info.known and n not in live]
        for name in dead:
            yield Site(writers(ctx, name)[0].nest_index if writers(ctx, name) else 0, tensors=(name,),
                       stmts=tuple(s.order for s in writers(ctx, name)))
        if len(dead) > 1:
            yield Site(0, tensors=tuple(dead), extra=(("all", True),))

    def rewrite(self, ctx, site, params):
        live = live_tensors(ctx)
        doomed = set(site.tensors)
        if doomed & live or any(ctx.tensors[t].known for t in doomed):
            raise Illegal("a tensor of the site is live")
        for s in ctx.sites:
            if s.stmt.lhs.tensor not in doomed and any(a.tensor in doomed for a in stmt_reads(s.stmt)):
                raise Illegal(f"statement {s.order + 1} still reads {', '.join(sorted(doomed))}")
        gone = [s for s in ctx.sites if s.stmt.lhs.tensor in doomed]
        if not gone:
            raise Illegal("nothing to remove")
        program = remove_items(ctx.program, [site_key(s) for s in gone])
        work = sum(iterations(s.loops) for s in gone)
        names = ", ".join(sorted(doomed, key=list(ctx.tensors).index))
        facts = (f"{names} {'is' if len(doomed) == 1 else 'are'} not known tensors (not in the signature)",
                 f"no statement that contributes to the output reads {names}",
                 "the removed statements write nothing else, so every remaining statement sees the same values")
        orders = ", ".join(str(s.order + 1) for s in gone)
        effect = (f"Removing {len(gone)} statement{'s' if len(gone) > 1 else ''} ({orders}) "
                  f"saves {work} element computations and the storage of {names}.")
        return Rewrite(program, facts, effect)


# --- common_subexpression_elimination ---------------------------------------------------------------

def value_subexprs(expr):
    """Non-trivial value sub-expressions (operations over at least one access), outside subscripts."""
    stack = [expr]
    while stack:
        n = stack.pop()
        if isinstance(n, Access):
            continue
        if isinstance(n, BinOp | Call | Neg | Select) and any(True for _ in accesses(n)):
            yield n
        stack.extend(reversed(children(n)))


def replace_value(expr, old, new):
    """Replace `old` by `new` in value positions (not inside subscripts)."""
    if expr == old:
        return new
    match expr:
        case Access():
            return expr
        case BinOp(op=op, lhs=a, rhs=b):
            return BinOp(op, replace_value(a, old, new), replace_value(b, old, new))
        case Neg(operand=a):
            return Neg(replace_value(a, old, new))
        case Call(fn=f, args=args):
            return Call(f, tuple(replace_value(a, old, new) for a in args))
        case Select(cond=c, then=t, otherwise=o):
            return Select(replace_value(c, old, new), replace_value(t, old, new), replace_value(o, old, new))
    from leir.ast import And, Compare, Or
    match expr:
        case Compare(operands=ops, ops=rels):
            return Compare(tuple(replace_value(a, old, new) for a in ops), rels)
        case And(terms=ts):
            return And(tuple(replace_value(a, old, new) for a in ts))
        case Or(terms=ts):
            return Or(tuple(replace_value(a, old, new) for a in ts))
    return expr


def count_value(expr, sub) -> int:
    return sum(1 for n in value_subexprs(expr) if n == sub)


def cse_candidates(ctx: Context) -> list[tuple[object, list[StmtSite]]]:
    found: dict[object, list[StmtSite]] = {}
    for s in ctx.sites:
        for e in value_subexprs(s.stmt.rhs):
            if not any(a.tensor == s.stmt.lhs.tensor for a in accesses(e)):
                found.setdefault(e, []).append(s)
    multi = {e: occ for e, occ in found.items() if len(occ) >= 2}
    # Keep the largest: drop a candidate that only occurs inside occurrences of a bigger one.
    out = []
    for e, occ in multi.items():
        covered = any(e != big and len(big_occ) == len(occ) and any(n == e for n in value_subexprs(big))
                      for big, big_occ in multi.items())
        if not covered:
            out.append((e, occ))
    return out[:MAX_CSE]


@register
class CommonSubexpressionElimination(Strategy):
    name = "common_subexpression_elimination"
    level = "graph"
    exactness = "exact"
    description = "Compute a repeated sub-expression once into a new tensor and read it where it recurs."

    def sites(self, ctx):
        for e, occ in cse_candidates(ctx):
            yield Site(occ[0].nest_index, stmts=tuple(dict.fromkeys(s.order for s in occ)),
                       extra=(("expression", format_expr(e)),))

    def rewrite(self, ctx, site, params):
        expr = dict(site.extra)["expression"]
        match = [(e, occ) for e, occ in cse_candidates(ctx) if format_expr(e) == expr]
        if not match:
            raise Illegal("the expression no longer recurs")
        e, occ = match[0]
        stmts = list(dict.fromkeys(occ, None))
        first = stmts[0]
        kinds = {lp.var: lp for lp in first.loops}
        used = set(vars_in(e)) | {lp.var for lp in first.loops if lp.kind != "L"}
        index = [lp.var for lp in first.loops if lp.var in used]
        for s in stmts[1:]:
            theirs = {lp.var: lp for lp in s.loops}
            for v in index:
                if v not in theirs or (theirs[v].extent, theirs[v].start) != (kinds[v].extent, kinds[v].start):
                    raise Illegal(f"statement {s.order + 1} does not run loop {v} over the same range")
            same_body = (s.nest_index, s.path[:-1]) == (first.nest_index, first.path[:-1])
            if not (s.nest_index > first.nest_index or same_body):
                raise Illegal(f"statement {s.order + 1} is in the same nest but another body")
            if s.stmt.lhs.dtype != first.stmt.lhs.dtype:
                raise Illegal("the statements compute in different dtypes")
        if is_product(e) and any(contraction_contexts(s.stmt.rhs, e) for s in stmts):
            raise Illegal("the product is an operand of a sum: storing it would prevent a fused multiply-add "
                          "and round differently")
        last = stmts[-1].nest_index
        operands = {a.tensor for a in accesses(e)}
        for s in ctx.sites:
            if s.stmt.lhs.tensor in operands and first.nest_index <= s.nest_index <= last:
                raise Illegal(f"{s.stmt.lhs.tensor}, an operand, is written while the value is reused")
        dtype = first.stmt.lhs.dtype
        t = Access(fresh_tensors(ctx.program, ctx.signature).fresh(), dtype, "g", tuple(Var(v) for v in index))
        program = ctx.program
        for s in reversed(stmts):
            new_stmt = Stmt(s.stmt.lhs, replace_value(s.stmt.rhs, e, t))
            items = (Stmt(t, e), new_stmt) if s is first else (new_stmt,)
            program = replace_item(program, s.nest_index, s.path, items)
        count = sum(count_value(s.stmt.rhs, e) for s in stmts)
        facts = (f"{format_expr(e)} occurs {count} times, in statements {', '.join(str(s.order + 1) for s in stmts)}",
                 f"its operands ({', '.join(sorted(operands))}) are not written between its first and last use",
                 f"every use runs the loops {', '.join(index) or '(none)'} over the same ranges, so "
                 f"{t.tensor}{'_{' + ','.join(index) + '}' if index else ''} holds the value each use needs",
                 f"the value is stored in its own dtype ({dtype}), as it was computed before")
        effect = (f"{format_expr(e)} is computed once per element into {t.tensor} and read {count} times, "
                  f"saving {count - 1} recomputation{'s' if count > 2 else ''} per element.")
        return Rewrite(program, facts, effect)


# --- operator fusion / fission -----------------------------------------------------------------------

@register
class OperatorFusion(Strategy):
    name = "operator_fusion"
    level = "graph"
    exactness = "exact"
    description = "Fuse a consumer nest into its producer's loops as deeply as dependences allow."

    def sites(self, ctx):
        nests = ctx.program.nests
        for i in range(len(nests) - 1):
            made = set(_written(nests[i]))
            used = [t for t in _read(nests[i + 1]) if t in made]
            if used and common_depth(nests[i], nests[i + 1]):
                yield Site(i, tensors=tuple(used), extra=(("nests", [i, i + 1]),))

    def rewrite(self, ctx, site, params):
        a, b = ctx.program.nests[site.nest], ctx.program.nests[site.nest + 1]
        for depth in range(common_depth(a, b), 0, -1):
            try:
                fused, facts, effect, exactness = fuse_nests(ctx.program, site.nest, depth)
            except Illegal:
                continue
            program = Program(ctx.program.nests[:site.nest] + (fused,) + ctx.program.nests[site.nest + 2:])
            produced = ", ".join(site.tensors)
            effect = (f"The producer of {produced} and its consumer run in one loop nest over "
                      f"{depth} shared loop{'s' if depth > 1 else ''}: {produced} is consumed right after it is "
                      "produced, while it is still in cache, and one pass over memory disappears.")
            facts = facts + (f"{depth} is the deepest fusion the dependences on {produced} allow",)
            return Rewrite(program, facts, effect, exactness)
        raise Illegal(f"every fusion depth would reverse a dependence on {', '.join(site.tensors)}")


def _written(nest: Nest) -> list[str]:
    return list(dict.fromkeys(s.lhs.tensor for s, _ in body_statements(nest)))


def _read(nest: Nest) -> list[str]:
    return list(dict.fromkeys(a.tensor for s, _ in body_statements(nest) for a in stmt_reads(s)))


@register
class OperatorFission(Strategy):
    name = "operator_fission"
    level = "graph"
    exactness = "exact"
    description = "Split a nest whose body does several things into two nests with the same loops."

    def sites(self, ctx):
        for top, path, nest, _ in bands(ctx.program):
            if len(nest.body) >= 2 and nest.loops:
                yield Site(top, path, loops=tuple(lp.var for lp in nest.loops))

    def parameters(self, ctx, site):
        nest = get_item(ctx.program, site.nest, site.path)
        for i in range(1, len(nest.body)):
            yield {"at": i}

    def rewrite(self, ctx, site, params):
        nest = get_item(ctx.program, site.nest, site.path)
        i = params["at"]
        outer = enclosing_loops(ctx.program, site.nest, site.path)
        head, tail = Nest(nest.loops, nest.body[:i]), Nest(nest.loops, nest.body[i:])
        first, second = body_statements(head, outer), body_statements(tail, outer)
        reason = misaligned(first, second, [lp.var for lp in nest.loops])
        if reason:
            raise Illegal(reason)
        program = replace_item(ctx.program, site.nest, site.path, (head, tail))
        deps = dependence_names(first, second)
        facts = ((f"the two parts meet only at the same iteration ({'; '.join(deps)}), and the first part "
                  "still runs first" if deps else "the two parts access no common tensor that either writes"),
                 "statement order is unchanged, so implicit initialisations stay as they were")
        effect = (f"The nest over {', '.join(f'{lp.var}:{lp.extent}' for lp in nest.loops)} is distributed into "
                  f"two nests ({i} and {len(nest.body) - i} body item{'s' if len(nest.body) - i > 1 else ''}): each "
                  "is simpler to vectorize, parallelize or schedule on its own.")
        contracted = contracted_products(first, second)
        if contracted:  # the fused multiply-add the compiler formed in one iteration is gone
            facts = facts + (f"{', '.join(contracted)} is a product added to another value in the same iteration: "
                             "in one nest the compiler fused that multiply-add (one rounding), in two it rounds "
                             "twice, so the results agree within rounding, not bit for bit",)
        return Rewrite(program, facts, effect, "reassociating" if contracted else None)


# --- expression_splitting / expression_reorder -------------------------------------------------------

SPLIT_OPS = ("+", "-", "*", "/")


@register
class ExpressionSplitting(Strategy):
    name = "expression_splitting"
    level = "graph"
    exactness = "exact"
    description = "Split `X = a op b` into `X = a; X = X op b` (the same operations, in two statements)."

    def sites(self, ctx):
        for s in ctx.sites:
            rhs = s.stmt.rhs
            if (isinstance(rhs, BinOp) and rhs.op in SPLIT_OPS and rhs.lhs != s.stmt.lhs
                    and not (_leaf(rhs.lhs) and _leaf(rhs.rhs))):
                yield Site(s.nest_index, s.path, stmts=(s.order,), tensors=(s.stmt.lhs.tensor,))

    def rewrite(self, ctx, site, params):
        s = ctx.sites[site.stmts[0]]
        x, rhs = s.stmt.lhs, s.stmt.rhs
        if any(a.tensor == x.tensor for a in accesses(rhs.rhs)):
            raise Illegal(f"the right operand reads {x.tensor}")
        if rhs.op in ("+", "-") and (is_product(rhs.lhs) or is_product(rhs.rhs)):
            raise Illegal("splitting a product from a sum would prevent a fused multiply-add and round "
                          "differently")
        program = replace_item(ctx.program, s.nest_index, s.path,
                               (Stmt(x, rhs.lhs), Stmt(x, BinOp(rhs.op, x, rhs.rhs))))
        shift = {k: k + (1 if k > s.order else 0) for k in range(len(ctx.sites))}
        check_inits(ctx, program, shift)
        facts = (f"{x.tensor} holds {format_expr(rhs.lhs)} only between the two statements of one iteration; "
                 "no other statement runs in between",
                 f"the right operand {format_expr(rhs.rhs)} does not read {x.tensor}",
                 "the operations and their order are unchanged, and the stored value has the dtype it is "
                 "computed in, so the result is the same")
        effect = (f"Statement {s.order + 1} is split at its top-level '{rhs.op}': each part is a smaller "
                  "expression that later steps (fission, caching, scheduling) can treat separately.")
        return Rewrite(program, facts, effect)


def _leaf(e) -> bool:
    return isinstance(e, Access | Var) or type(e).__name__ == "Num"


COMMUTATIVE = ("+", "*")


def value_part(stmt: Stmt):
    """The part of the right-hand side that a reduction folds in (`e` of `X op e`), or the whole."""
    op = reduction_op(stmt)
    if op in ("max", "min"):
        return stmt.rhs.args[1], lambda e: Call(op, (stmt.rhs.args[0], e))
    if op is not None and isinstance(stmt.rhs, BinOp) and stmt.rhs.lhs == stmt.lhs:
        return stmt.rhs.rhs, lambda e: BinOp(stmt.rhs.op, stmt.lhs, e)
    return stmt.rhs, lambda e: e


@register
class ExpressionReorder(Strategy):
    name = "expression_reorder"
    level = "graph"
    exactness = "exact"
    description = ("Reorder the operands of a commutative operation, or two adjacent independent "
                   "statements or nests.")

    def sites(self, ctx):
        for s in ctx.sites:
            e, _ = value_part(s.stmt)
            if _swappable(e):
                yield Site(s.nest_index, s.path, stmts=(s.order,), extra=(("swap", "operands"),))
        nests = ctx.program.nests
        for i in range(len(nests) - 1):
            yield Site(i, extra=(("swap", "nests"),))
        for top, path, nest, _ in bands(ctx.program):
            for i in range(len(nest.body) - 1):
                yield Site(top, path + (i,), extra=(("swap", "items"),))

    def rewrite(self, ctx, site, params):
        kind = dict(site.extra)["swap"]
        if kind == "operands":
            return self._operands(ctx, site)
        if kind == "nests":
            a, b = ctx.program.nests[site.nest], ctx.program.nests[site.nest + 1]
            first, second = body_statements(a), body_statements(b)
            program = Program(ctx.program.nests[:site.nest] + (b, a) + ctx.program.nests[site.nest + 2:])
            where = f"nests {site.nest + 1} and {site.nest + 2}"
        else:
            parent_path, i = site.path[:-1], site.path[-1]
            parent = get_item(ctx.program, site.nest, parent_path)
            outer = enclosing_loops(ctx.program, site.nest, parent_path) + parent.loops
            a, b = parent.body[i], parent.body[i + 1]
            first, second = _item_stmts(a, outer), _item_stmts(b, outer)
            body = parent.body[:i] + (b, a) + parent.body[i + 2:]
            program = replace_item(ctx.program, site.nest, parent_path, (Nest(parent.loops, body),))
            where = f"body items {i + 1} and {i + 2} of nest {site.nest + 1}"
        deps = dependence_names(first, second)
        if deps:
            raise Illegal(f"{where} are not independent: {'; '.join(deps)}")
        facts = (f"{where} share no tensor that either writes: no true, anti or output dependence between them",
                 "so neither can observe the other's effects, in any order")
        effect = (f"Swapping {where} changes the order of independent work, which can bring a producer and "
                  "its consumer together for a later fusion.")
        return Rewrite(program, facts, effect)

    def _operands(self, ctx, site):
        s = ctx.sites[site.stmts[0]]
        e, rebuild = value_part(s.stmt)
        if not _swappable(e):
            raise Illegal("no commutative operation with distinct operands")
        swapped = BinOp(e.op, e.rhs, e.lhs) if isinstance(e, BinOp) else Call(e.fn, (e.args[1], e.args[0]))
        program = replace_item(ctx.program, s.nest_index, s.path, (Stmt(s.stmt.lhs, rebuild(swapped)),))
        check_inits(ctx, program)
        facts = (f"'{e.op if isinstance(e, BinOp) else e.fn}' is commutative in floating point (IEEE 754 "
                 "results do not depend on the operand order)",
                 "the accumulator form of the statement is unchanged, so its initialisation is too")
        effect = (f"Statement {s.order + 1} evaluates {format_expr(swapped)} instead of {format_expr(e)}: a "
                  "canonical operand order exposes common sub-expressions and matching patterns.")
        return Rewrite(program, facts, effect)


def _swappable(e) -> bool:
    """Only + and *: max/min are not bitwise commutative (max(-0.0, 0.0) and max(0.0, -0.0) differ, and
    so do NaN operands), so swapping them would not be an `exact` step."""
    return isinstance(e, BinOp) and e.op in COMMUTATIVE and e.lhs != e.rhs


def _item_stmts(item, outer):
    if isinstance(item, Stmt):
        return [(item, outer)]
    return body_statements(item, outer)


__all__ = ["remove_items", "inline_reads", "live_tensors", "conflicts", "map_stmt", "substitute_vars"]
