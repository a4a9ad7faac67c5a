"""The two prefix (scan) rules: a max-reduction loop, or a sum-of-exp reduction loop, written as a scan
that keeps every prefix, with an explicit boundary (docs/leir.md §4.4):
`H_{tx,a}=max(if_then_else(a-1<0,-inf,H_{tx,a-1}),x)`. The original accumulator receives the last
prefix, so every consumer stays as it is. `PrefixScan` is their shape; each states its operator,
boundary and which reductions it takes."""
from __future__ import annotations

from leir.ast import Access, BinOp, Call, Neg, Nest, Num, Program, Select, Stmt, Var, walk_expr
from leir.printer import format_expr
from strategies.analysis import recognition as rec
from strategies.analysis.gates import finish_problem
from strategies.analysis.legality import iterations
from strategies.analysis.reductions import Reduction, first, reductions, with_index
from strategies.analysis.tree import fresh_tensors, replace_item
from strategies.base import Context, Rewrite, Strategy
from strategies.registry import register

NEG_INF = Neg(Num(float("inf")))


class PrefixScan(Strategy):
    level = "mathematical"
    exactness = "exact"
    op: str
    boundary: object
    what: str

    def matches(self, ctx: Context, r: Reduction) -> bool:
        raise NotImplementedError

    def sites(self, ctx):
        for r in reductions(ctx):
            if r.op == self.op and self.matches(ctx, r):
                yield r.site()

    def check(self, ctx, site, params):
        """Legal wherever the reduction matches: the scan applies the same operations in the same
        order (the gate checks that the result validates)."""
        return None

    def build(self, ctx, site, params):
        r = site.match
        h = fresh_tensors(ctx.program, ctx.signature).fresh()
        cur = with_index(r.acc, h, Var(r.var))
        carried = Select(first(r.var), self.boundary, with_index(r.acc, h, BinOp("-", Var(r.var), Num(1))))
        scan = Stmt(cur, Call("max", (carried, r.elem)) if self.op == "max" else BinOp("+", carried, r.elem))
        nest = Nest(r.nest.loops, (scan, Stmt(r.acc, cur)))
        program = replace_item(ctx.program, r.index, (), (nest,))
        return Rewrite(program, self._facts(r, h), self._summary(r, h))

    def gate(self, ctx, site, params, rewrite):
        return finish_problem(ctx, rewrite.program, same_inits=False)

    def _facts(self, r: Reduction, h: str) -> tuple[str, ...]:
        n = r.red_loop.extent
        return (f"{r.acc.tensor} is a {self.op}-reduction over {r.var} (extent {n}) with implicit "
                f"initialisation; the scan starts from the explicit boundary {format_expr(self.boundary)} at "
                f"{r.var}=0, so each prefix applies the same operations in the same order",
                f"{r.acc.tensor} receives the last prefix {h}_{{...,{n - 1}}} (the last of the repeated stores), "
                "so every reader of it sees the same value",
                f"{h} is a fresh intermediate; {r.var} stays a serial loop (the scan carries a dependence)")

    def _summary(self, r: Reduction, h: str) -> str:
        n, spatial = r.red_loop.extent, iterations(r.spatial)
        return (f"Every prefix {self.what} is kept in {h} ({spatial}x{n} values), which the "
                "online-softmax derivation needs: later steps can rescale by the running value instead "
                f"of waiting for the full pass; it costs {spatial * n} extra stores.")


@register
class NormalLoopMaxToPrefixMax(PrefixScan):
    name = "normal_loop_max_to_prefix_max"
    description = "Turn a max-reduction loop into a prefix-max scan with an explicit -inf boundary."
    op = "max"
    boundary = NEG_INF
    what = "maximum"
    enables = ("online_softmax", "partially_equivalent_then_correct")

    def recognizes(self, before, after, signature):
        """More max statements written as a scan that reads its own previous element."""
        return _scans(after, "max") > _scans(before, "max")

    def matches(self, ctx, r):
        return True


@register
class NormalLoopSummationOnExpToPrefixSummationOnExp(PrefixScan):
    name = "normal_loop_summation_on_exp_to_prefix_summation_on_exp"
    description = "Turn a sum-of-exp reduction loop into a prefix-sum scan with an explicit 0 boundary."
    op = "+"
    boundary = Num(0)
    what = "sum of exponentials"
    enables = ("online_softmax",)

    def recognizes(self, before, after, signature):
        """More sums of exponentials written as a scan that reads its own previous element."""
        return _scans(after, "exp") > _scans(before, "exp")

    def matches(self, ctx, r):
        return any(isinstance(n, Call) and n.fn == "exp" for n in walk_expr(r.elem))


def _scans(program: Program, fn: str) -> int:
    """Statements that compute a `fn` (max, exp) and read their own tensor's previous element behind
    a boundary (`if_then_else(a-1<0, boundary, X_{a-1})`)."""
    count = 0
    for stmt in rec.statements(program):
        nodes = list(walk_expr(stmt.rhs))
        if any(isinstance(n, Call) and n.fn == fn for n in nodes) and any(
                isinstance(n, Select) and any(isinstance(x, Access) and x.tensor == stmt.lhs.tensor
                                              for x in walk_expr(n.otherwise)) for n in nodes):
            count += 1
    return count
