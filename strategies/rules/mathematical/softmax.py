"""online_softmax and flashattention_wo_tiling: the passes of a softmax (and of the P·V product that
reads it) folded into one loop with a running max, a rescaled running sum and, for attention, a
rescaled running output (the patterns: `strategies.analysis.reductions`).

The running forms keep the original accumulator names (so every consumer stays as it is) and read
the previous value only behind `if_then_else(a-1<0, boundary, ...)` (docs/leir.md §4.4).
"""
from __future__ import annotations

from leir.analysis import lhs_vars
from leir.ast import Access, BinOp, Call, Loop, Neg, Nest, Num, Program, Select, Stmt, Var, accesses, walk_expr
from leir.names import IndexNames
from leir.printer import format_expr
from strategies.analysis import recognition as rec
from strategies.analysis.algebra import is_plain_index
from strategies.analysis.gates import finish_problem
from strategies.analysis.legality import iterations
from strategies.analysis.numerics import sum_drift_problem
from strategies.analysis.prose import plural
from strategies.analysis.reductions import (
    Attention,
    SoftmaxPair,
    attentions,
    first,
    softmax_pairs,
    tensors_read,
    untouched_between,
)
from strategies.analysis.tree import fresh_tensors, substitute_vars
from strategies.base import Rewrite, Strategy
from strategies.registry import register

NEG_INF = Neg(Num(float("inf")))


def running_stmts(pair: SoftmaxPair, h: str) -> tuple[Stmt, Stmt, Stmt, Access, object]:
    """`H=old max; M=max(H,x); S=S*exp(H-M)+exp(x-M)` with boundaries; returns them, H, and the
    rescale factor exp(H-M)."""
    mx, a = pair.mx, pair.mx.var
    m, s = mx.acc, pair.sum_acc()
    old = Access(h, m.dtype, m.scope, m.indices)
    scale = Call("exp", (BinOp("-", old, m),))
    e = Call("exp", (BinOp("-", mx.elem, m),))
    return (Stmt(old, Select(first(a), NEG_INF, m)), Stmt(m, Call("max", (old, mx.elem))),
            Stmt(s, BinOp("+", Select(first(a), Num(0), BinOp("*", s, scale)), e)), old, scale)


@register
class OnlineSoftmax(Strategy):
    name = "online_softmax"
    level = "mathematical"
    exactness = "reassociating"
    description = ("Fuse a max pass and a sum-of-exp pass into one loop with a running max and a "
                   "rescaled running sum.")
    search_prior = 6.0

    def recognizes(self, before, after, signature):
        """A running max and a sum of exponentials rescaled by exp of a difference with that max,
        computed in one nest (in the original, separate passes)."""
        return _one_pass_count(after) > _one_pass_count(before)

    def sites(self, ctx):
        for pair in softmax_pairs(ctx):
            yield pair.site()

    def check(self, ctx, site, params):
        pair = site.match
        mx, sm = pair.mx, pair.sm
        return (untouched_between(ctx, mx.index, sm.index, tensors_read(mx.elem), {mx.acc.tensor, sm.acc.tensor})
                or sum_drift_problem(mx.red_loop.extent, sm.acc.dtype, sm.acc.tensor, ctx.result_code))

    def build(self, ctx, site, params):
        pair = site.match
        mx, sm = pair.mx, pair.sm
        h = fresh_tensors(ctx.program, ctx.signature).fresh()
        old_max, new_max, new_sum, _, _ = running_stmts(pair, h)
        nests = list(ctx.program.nests)
        nests[sm.index] = Nest(mx.nest.loops, (old_max, new_max, new_sum))
        del nests[mx.index]
        return Rewrite(Program(tuple(nests)), self._facts(pair, h), self._summary(pair))

    def gate(self, ctx, site, params, rewrite):
        return finish_problem(ctx, rewrite.program, same_inits=False)

    def _facts(self, pair: SoftmaxPair, h: str) -> tuple[str, ...]:
        mx, sm = pair.mx, pair.sm
        return (f"nest {mx.index + 1} is a max-reduction of x = {format_expr(mx.elem)} into {mx.acc.tensor} and nest "
                f"{sm.index + 1} sums exp(x-{mx.acc.tensor}) into {sm.acc.tensor} over the same loops "
                "(checked as a symbolic identity, looking through copies)",
                f"{h} holds the previous maximum, -inf at {mx.var}=0; the sum is rescaled by "
                f"exp({h}-{mx.acc.tensor}) whenever the maximum grows, so after the loop {sm.acc.tensor} = "
                f"sum exp(x-max) and {mx.acc.tensor} = max, as before",
                "no nest in between reads or writes them or writes what x reads",
                f"{mx.var} stays serial: the running values carry a dependence")

    def _summary(self, pair: SoftmaxPair) -> str:
        return (f"One pass over the {pair.mx.red_loop.extent} inputs per row instead of two: x is read and exp "
                "evaluated in the same loop that finds the maximum, at the cost of one extra exp and multiply per "
                "element.")


@register
class FlashattentionWoTiling(Strategy):
    name = "flashattention_wo_tiling"
    level = "mathematical"
    exactness = "reassociating"
    description = ("Fold softmax(x)·V into one loop over keys: running max, rescaled running sum, and a "
                   "rescaled running output in a nested nest, normalised once at the end.")
    search_prior = 6.0

    def recognizes(self, before, after, signature):
        """The online softmax's one pass, plus an output accumulator rescaled in the same nest."""
        def outputs(p) -> int:  # the sum and the output accumulator, both rescaled in one pass
            return sum(len({s.lhs.tensor for s in rescaled}) >= 2 for _, rescaled in _one_pass_nests(p))
        return outputs(after) > outputs(before)

    def sites(self, ctx):
        for att in attentions(ctx):
            yield att.site()

    def check(self, ctx, site, params):
        att = site.match
        pair, mx, o = att.pair, att.pair.mx, att.mm_stmt.lhs
        if not is_plain_index(o):
            return "the product's output is not indexed by plain loop variables"
        involved = {mx.acc.tensor, pair.sm.acc.tensor, att.prob.tensor, o.tensor}
        for lo, hi in ((mx.index, pair.sm.index), (pair.sm.index, att.norm), (att.norm, att.mm)):
            problem = untouched_between(ctx, lo, hi, tensors_read(mx.elem) | tensors_read(att.value), involved)
            if problem:
                return problem
        return sum_drift_problem(mx.red_loop.extent, o.dtype, o.tensor, ctx.result_code)

    def build(self, ctx, site, params):
        att = site.match
        pair, mx = att.pair, att.pair.mx
        names = fresh_tensors(ctx.program, ctx.signature)
        h, acc_name = names.fresh(), names.fresh()
        fused, final, inner = self._fold(ctx, att, h, acc_name)
        nests = list(ctx.program.nests)
        nests[att.mm] = final
        nests[att.norm] = fused
        for k in sorted((mx.index, pair.sm.index), reverse=True):
            del nests[k]
        return Rewrite(Program(tuple(nests)), self._facts(att, h, acc_name, iterations(inner)), self._summary(att))

    def gate(self, ctx, site, params, rewrite):
        return finish_problem(ctx, rewrite.program, same_inits=False)

    def _fold(self, ctx, att: Attention, h: str, acc_name: str) -> tuple[Nest, Nest, list[Loop]]:
        """(the one loop over keys with the running max, sum and output, the final normalisation, the
        value loops nested in the first)."""
        pair, mx, o = att.pair, att.pair.mx, att.mm_stmt.lhs
        mm_nest = ctx.program.nests[att.mm]
        mm_red = next(i for i, lp in enumerate(mm_nest.loops) if lp.var not in lhs_vars(att.mm_stmt))
        old_max, new_max, new_sum, _, scale = running_stmts(pair, h)
        # Matmul variables -> fused ones: P's spatial subscripts and the key loop map onto the max
        # nest's; the other (value-dimension) loops get fresh names in a nested nest.
        to_fused = {m.name: f for m, f in zip(att.p_read.indices, att.prob.indices, strict=True)}
        # the top-level nests' loop names are avoided (the fused nest holds no nested nest of the program's)
        fresh_idx = IndexNames({lp.var for n in ctx.program.nests for lp in n.loops})
        inner = [lp for i, lp in enumerate(mm_nest.loops) if i != mm_red and lp.var not in to_fused]
        inner_names = {lp.var: fresh_idx.fresh() for lp in inner}
        rename = {**to_fused, **{k: Var(v) for k, v in inner_names.items()}}
        o_acc = Access(acc_name, o.dtype, o.scope, o.indices)
        o_run = substitute_vars(o_acc, rename)
        weight = Call("exp", (BinOp("-", mx.elem, mx.acc),))
        update = Stmt(o_run, BinOp("+", Select(first(mx.var), Num(0), BinOp("*", o_run, scale)),
                                   BinOp("*", weight, substitute_vars(att.value, rename))))
        inner_nest = Nest(tuple(Loop("L", lp.extent, inner_names[lp.var]) for lp in inner), (update,))
        fused = Nest(mx.nest.loops, (old_max, new_max, new_sum, inner_nest))
        to_mm = {f.name: m for m, f in zip(att.p_read.indices, att.prob.indices, strict=True)}
        out_loops = tuple(lp for i, lp in enumerate(mm_nest.loops) if i != mm_red)
        final = Nest(out_loops, (Stmt(o, BinOp("/", o_acc, substitute_vars(pair.sum_acc(), to_mm))),))
        return fused, final, inner

    def _facts(self, att: Attention, h: str, acc_name: str, columns: int) -> tuple[str, ...]:
        pair, mx, o = att.pair, att.pair.mx, att.mm_stmt.lhs
        return (f"nests {mx.index + 1}-{att.mm + 1} compute softmax over {mx.var} into {att.prob.tensor} "
                f"(max {mx.acc.tensor}, sum {pair.sm.acc.tensor}) and {o.tensor} = {att.prob.tensor}·V; "
                f"{att.prob.tensor} is read by the product only, so it need not be stored",
                f"the running output {acc_name} is rescaled by exp({h}-{mx.acc.tensor}) exactly when the "
                f"running sum is, so {acc_name}/{pair.sm.acc.tensor} after the last key equals the product "
                "with the normalised probabilities",
                "no nest in between touches the tensors involved",
                f"{mx.var} stays serial (running values); the {plural(columns, 'value column')} loop is nested inside")

    def _summary(self, att: Attention) -> str:
        n = att.pair.mx.red_loop.extent
        return (f"The probabilities ({n} per row) are never written to memory and the four passes "
                f"become one loop over the {n} keys plus a final normalisation: three passes over "
                "the scores are saved.")


# --- what the softmax rules recognise: a running max and the sums rescaled by it, in one nest -----

def _one_pass_count(program: Program) -> int:
    return sum(bool(rescaled) for _, rescaled in _one_pass_nests(program))


def _one_pass_nests(program: Program) -> list[tuple[set[str], list[Stmt]]]:
    """Per top-level nest: the running maxima it writes, and its statements rescaled by them."""
    out = []
    for nest in program.nests:
        stmts = rec.statements(Program((nest,)))
        read = {acc.tensor for s in stmts for acc in accesses(s.rhs)}
        # a running max: written by a max and read again in the nest (directly, or through a copy
        # of its previous value that feeds the max)
        maxima = {s.lhs.tensor for s in stmts if _computes_max(s) and s.lhs.tensor in read}
        rescaled = [s for s in stmts if maxima and s.lhs.tensor not in maxima and _reads_itself(s)
                    and _rescaled_by(s, maxima)]
        out.append((maxima, rescaled))
    return out


def _computes_max(stmt: Stmt) -> bool:
    return any(isinstance(n, Call) and n.fn == "max" for n in walk_expr(stmt.rhs))


def _reads_itself(stmt: Stmt) -> bool:
    return any(acc.tensor == stmt.lhs.tensor for acc in accesses(stmt.rhs))


def _rescaled_by(stmt: Stmt, maxima: set[str]) -> bool:
    """The statement multiplies by exp(...) of a difference that reads one of `maxima`."""
    return any(isinstance(n, Call) and n.fn == "exp" and isinstance(n.args[0], BinOp) and n.args[0].op == "-"
               and any(acc.tensor in maxima for acc in accesses(n.args[0])) for n in walk_expr(stmt.rhs))
