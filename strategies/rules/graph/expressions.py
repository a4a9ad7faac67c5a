"""expression_splitting and expression_reorder: the same operations in two statements, and the same
work in another order (operands of + and *, independent nests or body items)."""
from __future__ import annotations

from dataclasses import dataclass

from leir.analysis import is_product, reduction_op
from leir.ast import Access, BinOp, Call, Neg, Nest, Num, Program, Stmt, Var, accesses
from leir.printer import format_expr
from strategies.analysis import recognition as rec
from strategies.analysis.gates import inits_problem
from strategies.analysis.legality import body_statements, dependence_names, product_rounds
from strategies.analysis.tree import bands, enclosing_loops, get_item, replace_item, replace_stmt
from strategies.base import Match, Rewrite, Site, Strategy
from strategies.registry import register

SPLIT_OPS = ("+", "-", "*", "/")
COMMUTATIVE = ("+", "*")


def _leaf(e) -> bool:
    return isinstance(e, Access | Var | Num)


@register
class ExpressionSplitting(Strategy):
    name = "expression_splitting"
    level = "graph"
    exactness = "exact"
    description = "Split `X = a op b` into `X = a; X = X op b` (the same operations, in two statements)."
    enables = ("operator_fission", "common_subexpression_elimination", "compute_inline")

    def recognizes(self, before, after, signature):
        """More statements in as many nests."""
        return len(after.nests) == len(before.nests) and len(rec.statements(after)) > len(rec.statements(before))

    def sites(self, ctx):
        for s in ctx.sites:
            rhs = s.stmt.rhs
            if (isinstance(rhs, BinOp) and rhs.op in SPLIT_OPS and rhs.lhs != s.stmt.lhs
                    and not (_leaf(rhs.lhs) and _leaf(rhs.rhs))):
                yield Site(s.nest_index, s.path, stmts=(s.order,), tensors=(s.stmt.lhs.tensor,))

    def check(self, ctx, site, params):
        s = ctx.sites[site.stmts[0]]
        x, rhs = s.stmt.lhs, s.stmt.rhs
        if any(a.tensor == x.tensor for a in accesses(rhs.rhs)):
            return f"the right operand reads {x.tensor}"
        if rhs.op in ("+", "-") and any(is_product(o) and product_rounds(o, x.dtype) for o in (rhs.lhs, rhs.rhs)):
            return "splitting a product from a sum would prevent a fused multiply-add and round differently"
        return None

    def gate(self, ctx, site, params, rewrite):
        order = site.stmts[0]
        return inits_problem(ctx, rewrite.program, {k: k + (1 if k > order else 0) for k in range(len(ctx.sites))})

    def build(self, ctx, site, params):
        s = ctx.sites[site.stmts[0]]
        x, rhs = s.stmt.lhs, s.stmt.rhs
        program = replace_stmt(ctx.program, s, Stmt(x, rhs.lhs), Stmt(x, BinOp(rhs.op, x, rhs.rhs)))
        facts = (f"{x.tensor} holds {format_expr(rhs.lhs)} only between the two statements of one iteration; "
                 "no other statement runs in between",
                 f"the right operand {format_expr(rhs.rhs)} does not read {x.tensor}",
                 "the operations and their order are unchanged, and the stored value has the dtype it is "
                 "computed in, so the result is the same")
        summary = (f"Statement {s.order + 1} is split at its top-level '{rhs.op}': each part is a smaller "
                   "expression that later steps (fission, caching, scheduling) can treat separately.")
        return Rewrite(program, facts, summary)


# --- expression_reorder ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Swap(Match):
    """What is swapped: `operands` of the site's statement, the `nests` at site.nest and the next one,
    or the body `items` at site.path and the next one."""

    swap: str


def value_part(stmt: Stmt):
    """The part of the right-hand side that a reduction folds in (`e` of `X op e`), or the whole."""
    op = reduction_op(stmt)
    if op in ("max", "min"):
        return stmt.rhs.args[1], lambda e: Call(op, (stmt.rhs.args[0], e))
    if op is not None and isinstance(stmt.rhs, BinOp) and stmt.rhs.lhs == stmt.lhs:
        return stmt.rhs.rhs, lambda e: BinOp(stmt.rhs.op, stmt.lhs, e)
    return stmt.rhs, lambda e: e


def _swappable(e) -> bool:
    """Only + and *: max/min are not bitwise commutative (max(-0.0, 0.0) and max(0.0, -0.0) differ, and
    so do NaN operands), so swapping them would not be an `exact` step."""
    return isinstance(e, BinOp) and e.op in COMMUTATIVE and e.lhs != e.rhs


def _item_stmts(item, outer):
    if isinstance(item, Stmt):
        return [(item, outer)]
    return body_statements(item, outer)


@register
class ExpressionReorder(Strategy):
    name = "expression_reorder"
    level = "graph"
    exactness = "exact"
    description = ("Reorder the operands of a commutative operation, or two adjacent independent "
                   "statements or nests.")
    enables = ("common_subexpression_elimination", "factorization", "collect")
    search_prior = 0.0

    def recognizes(self, before, after, signature):
        """The same program up to the order of the operands of + and * (a chain of them, `-` read as
        adding a negation) and the order of nests and body items, and not equal."""
        return before != after and _unordered_program(before) == _unordered_program(after)

    def sites(self, ctx):
        for s in ctx.sites:
            e, _ = value_part(s.stmt)
            if _swappable(e):
                yield Site(s.nest_index, s.path, stmts=(s.order,), match=Swap("operands"))
        for i in range(len(ctx.program.nests) - 1):
            yield Site(i, match=Swap("nests"))
        for top, path, nest, _ in bands(ctx.program):
            for i in range(len(nest.body) - 1):
                yield Site(top, path + (i,), match=Swap("items"))

    def check(self, ctx, site, params):
        if site.match.swap == "operands":
            e, _ = value_part(ctx.sites[site.stmts[0]].stmt)
            return None if _swappable(e) else "no commutative operation with distinct operands"
        _, first, second, where = self._nests(ctx, site) if site.match.swap == "nests" else self._items(ctx, site)
        deps = dependence_names(first, second)
        return f"{where} are not independent: {'; '.join(deps)}" if deps else None

    def gate(self, ctx, site, params, rewrite):
        return inits_problem(ctx, rewrite.program) if site.match.swap == "operands" else None

    def build(self, ctx, site, params):
        if site.match.swap == "operands":
            return self._operands(ctx, site)
        program, _, _, where = self._nests(ctx, site) if site.match.swap == "nests" else self._items(ctx, site)
        facts = (f"{where} share no tensor that either writes: no true, anti or output dependence between them",
                 "so neither can observe the other's effects, in any order")
        summary = (f"Swapping {where} changes the order of independent work, which can bring a producer and "
                   "its consumer together for a later fusion.")
        return Rewrite(program, facts, summary)

    def _nests(self, ctx, site):
        a, b = ctx.program.nests[site.nest], ctx.program.nests[site.nest + 1]
        program = Program(ctx.program.nests[:site.nest] + (b, a) + ctx.program.nests[site.nest + 2:])
        return program, body_statements(a), body_statements(b), f"nests {site.nest + 1} and {site.nest + 2}"

    def _items(self, ctx, site):
        parent_path, i = site.path[:-1], site.path[-1]
        parent = get_item(ctx.program, site.nest, parent_path)
        outer = enclosing_loops(ctx.program, site.nest, parent_path) + parent.loops
        a, b = parent.body[i], parent.body[i + 1]
        body = parent.body[:i] + (b, a) + parent.body[i + 2:]
        program = replace_item(ctx.program, site.nest, parent_path, (Nest(parent.loops, body),))
        return (program, _item_stmts(a, outer), _item_stmts(b, outer),
                f"body items {i + 1} and {i + 2} of nest {site.nest + 1}")

    def _operands(self, ctx, site):
        s = ctx.sites[site.stmts[0]]
        e, rebuild = value_part(s.stmt)
        swapped = BinOp(e.op, e.rhs, e.lhs) if isinstance(e, BinOp) else Call(e.fn, (e.args[1], e.args[0]))
        program = replace_stmt(ctx.program, s, Stmt(s.stmt.lhs, rebuild(swapped)))
        facts = (f"'{e.op if isinstance(e, BinOp) else e.fn}' is commutative in floating point (IEEE 754 "
                 "results do not depend on the operand order)",
                 "the accumulator form of the statement is unchanged, so its initialisation is too")
        summary = (f"Statement {s.order + 1} evaluates {format_expr(swapped)} instead of {format_expr(e)}: a "
                   "canonical operand order exposes common sub-expressions and matching patterns.")
        return Rewrite(program, facts, summary)


# --- what expression_reorder recognises: a program up to the order of operands and items ----------

def _unordered_program(program) -> list:
    return sorted((_unordered(n) for n in program.nests), key=repr)


def _unordered(item) -> tuple:
    if isinstance(item, Stmt):
        return ("stmt", item.lhs, _ac(item.rhs))
    return ("nest", item.loops, tuple(sorted((_unordered(x) for x in item.body), key=repr)))


def _ac(e) -> tuple:
    """`e` up to the order of the operands of chains of + (with - as adding a negation) and *."""
    if isinstance(e, BinOp) and e.op in ("+", "-"):
        return ("+",) + tuple(sorted((_ac(t) for t in _terms(e)), key=repr))
    if isinstance(e, BinOp) and e.op == "*":
        return ("*",) + tuple(sorted((_ac(f) for f in _factors(e)), key=repr))
    if isinstance(e, BinOp):
        return (e.op, _ac(e.lhs), _ac(e.rhs))
    if isinstance(e, Neg):
        return ("neg", _ac(e.operand))
    if isinstance(e, Call):
        return (e.fn,) + tuple(_ac(x) for x in e.args)
    return ("leaf", e)


def _terms(e) -> list:
    if isinstance(e, BinOp) and e.op == "+":
        return _terms(e.lhs) + _terms(e.rhs)
    if isinstance(e, BinOp) and e.op == "-":
        return _terms(e.lhs) + [Neg(e.rhs)]
    return [e]


def _factors(e) -> list:
    if isinstance(e, BinOp) and e.op == "*":
        return _factors(e.lhs) + _factors(e.rhs)
    return [e]
