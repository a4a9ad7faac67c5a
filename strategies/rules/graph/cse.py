"""common_subexpression_elimination: a value computed in several statements is computed once into a
new tensor and read where it recurs."""
from __future__ import annotations

from dataclasses import dataclass

from leir.analysis import StmtSite, contraction_contexts, is_product
from leir.ast import Access, BinOp, Call, Neg, Select, Stmt, Var, accesses, children, replace_expr
from leir.printer import format_expr
from strategies.analysis import recognition as rec
from strategies.analysis.legality import product_rounds
from strategies.analysis.tree import fresh_tensors, replace_stmt, vars_in
from strategies.base import Context, Match, Rewrite, Site, Strategy
from strategies.registry import register

MAX_CSE = 8


@dataclass(frozen=True)
class Repeated(Match):
    """A value sub-expression and the statements it occurs in (program order)."""

    expr: object
    stmts: tuple[StmtSite, ...]

    def to_json(self) -> dict:
        return {"expression": format_expr(self.expr)}


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
    return replace_expr(expr, lambda n: new if n == old else None, subscripts=False)


def _subexprs_not_reading(expr, tensor: str) -> list:
    """`value_subexprs(expr)` (in its order) that do not read `tensor`, in one pass: each node's facts
    from its children's. Walking every sub-expression's accesses again was quadratic in the depth (a
    sum of 10,000 terms, a chain 10,000 deep: 72 s)."""
    order, stack = [], [expr]
    while stack:
        n = stack.pop()
        order.append(n)
        if not isinstance(n, Access):
            stack.extend(reversed(children(n)))
    has: dict[int, bool] = {}        # id(node) -> it reads some tensor
    reads: dict[int, bool] = {}      # id(node) -> it reads `tensor`
    for n in reversed(order):        # children before their parent
        if isinstance(n, Access):
            found = [a.tensor for a in accesses(n)]
            has[id(n)], reads[id(n)] = True, tensor in found
        else:
            kids = children(n)
            has[id(n)] = any(has[id(k)] for k in kids)
            reads[id(n)] = any(reads[id(k)] for k in kids)
    return [n for n in order if isinstance(n, BinOp | Call | Neg | Select) and has[id(n)] and not reads[id(n)]]


def cse_candidates(ctx: Context) -> list[Repeated]:
    found: dict[object, list[StmtSite]] = {}
    for s in ctx.sites:
        for e in _subexprs_not_reading(s.stmt.rhs, s.stmt.lhs.tensor):
            found.setdefault(e, []).append(s)
    multi = {e: occ for e, occ in found.items() if len(occ) >= 2}
    # Keep the largest: drop a candidate that only occurs inside occurrences of a bigger one.
    out = []
    for e, occ in multi.items():
        covered = any(e != big and len(big_occ) == len(occ) and any(n == e for n in value_subexprs(big))
                      for big, big_occ in multi.items())
        if not covered:
            out.append(Repeated(e, tuple(dict.fromkeys(occ))))
    return out[:MAX_CSE]


@register
class CommonSubexpressionElimination(Strategy):
    name = "common_subexpression_elimination"
    level = "graph"
    exactness = "exact"
    description = "Compute a repeated sub-expression once into a new tensor and read it where it recurs."
    search_prior = 3.0

    def recognizes(self, before, after, signature):
        """A new intermediate (the shared value, computed once)."""
        return bool(rec.new_intermediates(before, after, signature))

    def sites(self, ctx):
        for found in cse_candidates(ctx):
            yield Site(found.stmts[0].nest_index, stmts=tuple(s.order for s in found.stmts), match=found)

    def check(self, ctx, site, params):
        e, stmts = site.match.expr, site.match.stmts
        return self._range_problem(e, stmts) or self._reuse_problem(ctx, e, stmts)

    def build(self, ctx, site, params):
        e, stmts = site.match.expr, site.match.stmts
        index = self._shared_index(e, stmts)
        first = stmts[0]
        t = Access(fresh_tensors(ctx.program, ctx.signature).fresh(), first.stmt.lhs.dtype, "g",
                   tuple(Var(v) for v in index))
        program = ctx.program
        for s in reversed(stmts):
            new_stmt = Stmt(s.stmt.lhs, replace_value(s.stmt.rhs, e, t))
            program = replace_stmt(program, s, *((Stmt(t, e), new_stmt) if s is first else (new_stmt,)))
        count = sum(sum(1 for n in value_subexprs(s.stmt.rhs) if n == e) for s in stmts)
        return Rewrite(program, self._facts(e, stmts, index, t, count), self._summary(e, t, count))

    def _shared_index(self, e, stmts: tuple[StmtSite, ...]) -> list[str]:
        """The loops the stored value is indexed by (those it uses, and the non-serial ones)."""
        first = stmts[0]
        used = set(vars_in(e)) | {lp.var for lp in first.loops if lp.kind != "L"}
        return [lp.var for lp in first.loops if lp.var in used]

    def _range_problem(self, e, stmts: tuple[StmtSite, ...]) -> str | None:
        """Why one stored value cannot serve every use: a use that runs the shared index loops over
        other ranges, sits in another body of the same nest, or computes in another dtype."""
        first = stmts[0]
        kinds = {lp.var: lp for lp in first.loops}
        index = self._shared_index(e, stmts)
        for s in stmts[1:]:
            theirs = {lp.var: lp for lp in s.loops}
            for v in index:
                if v not in theirs or (theirs[v].extent, theirs[v].start) != (kinds[v].extent, kinds[v].start):
                    return f"statement {s.order + 1} does not run loop {v} over the same range"
            same_body = (s.nest_index, s.path[:-1]) == (first.nest_index, first.path[:-1])
            if not (s.nest_index > first.nest_index or same_body):
                return f"statement {s.order + 1} is in the same nest but another body"
            if s.stmt.lhs.dtype != first.stmt.lhs.dtype:
                return "the statements compute in different dtypes"
        return None

    def _reuse_problem(self, ctx, e, stmts) -> str | None:
        """Why storing the value would change a result: a product whose fused multiply-add it would
        prevent, or an operand written between the uses."""
        if is_product(e) and product_rounds(e, stmts[0].stmt.lhs.dtype) and any(
                contraction_contexts(s.stmt.rhs, e) for s in stmts):
            return ("the product is an operand of a sum: storing it would prevent a fused multiply-add "
                    "and round differently")
        first, last = stmts[0].nest_index, stmts[-1].nest_index
        operands = {a.tensor for a in accesses(e)}
        for s in ctx.sites:
            if s.stmt.lhs.tensor in operands and first <= s.nest_index <= last:
                return f"{s.stmt.lhs.tensor}, an operand, is written while the value is reused"
        return None

    def _facts(self, e, stmts, index, t, count) -> tuple[str, ...]:
        operands = {a.tensor for a in accesses(e)}
        return (f"{format_expr(e)} occurs {count} times, in statements {', '.join(str(s.order + 1) for s in stmts)}",
                f"its operands ({', '.join(sorted(operands))}) are not written between its first and last use",
                f"every use runs the loops {', '.join(index) or '(none)'} over the same ranges, so "
                f"{t.tensor}{'_{' + ','.join(index) + '}' if index else ''} holds the value each use needs",
                f"the value is stored in its own dtype ({stmts[0].stmt.lhs.dtype}), as it was computed before")

    def _summary(self, e, t, count) -> str:
        return (f"{format_expr(e)} is computed once per element into {t.tensor} and read {count} times, "
                f"saving {count - 1} recomputation{'s' if count > 2 else ''} per element.")
