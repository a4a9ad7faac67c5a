"""Mathematical strategies over nests: the softmax family and the splits that derive it.

Patterns are dataflow, not token sequences: a *max-reduction nest* (one statement `M=max(M,x)` with
implicit initialisation, one serial reduction loop) feeding a *sum-of-exp nest* (`S=S+exp(y)` with
`y = x - M` as a symbolic identity, after aligning loop variables by position and looking through
pure copy nests), feeding a *normalise nest* and a P·V product, through whatever tensor names, with
any unrelated nests in between as long as they do not touch the tensors involved.

Scans use explicit boundaries (LEIR.md §4.4): `H_{tx,a}=max(if_then_else(a-1<0,-inf,H_{tx,a-1}),x)`.
The running forms keep the original accumulator names (so every consumer stays as it is) and read
the previous value only behind `if_then_else(a-1<0, boundary, ...)`.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from leir.analysis import lhs_vars, nest_access_sets
from leir.ast import (
    Access,
    BinOp,
    Call,
    Compare,
    Loop,
    Neg,
    Nest,
    Num,
    Program,
    Select,
    Stmt,
    Var,
    accesses,
    map_expr,
    walk_expr,
)
from leir.names import IndexNames, TensorNames
from strategies.algebra_common import algebra_target, finish, is_element_index, is_plain_index, plural, text
from strategies.base import Context, Illegal, Rewrite, Site, Strategy
from strategies.numerics import sum_drift_problem
from strategies.registry import register
from strategies.sympy_bridge import Bridge, Untranslatable
from strategies.tree import replace_item, substitute_vars

NEG_INF = Neg(Num(float("inf")))


# --- recognising reductions ------------------------------------------------------------------------

@dataclass(frozen=True)
class Reduction:
    """A top-level nest holding one reduction statement `X op e` with implicit initialisation, whose
    left-hand subscripts are the other loops' variables (or integer literals: `M_{tx,0}` for a sum
    over a kept dimension) and whose one reduction loop is serial."""

    index: int
    nest: Nest
    order: int
    op: str
    acc: Access
    elem: object
    red: int  # position of the reduction loop

    @property
    def red_loop(self) -> Loop:
        return self.nest.loops[self.red]

    @property
    def var(self) -> str:
        return self.red_loop.var

    @property
    def spatial(self) -> tuple[Loop, ...]:
        return tuple(lp for i, lp in enumerate(self.nest.loops) if i != self.red)

    def site(self, *others: Reduction) -> Site:
        rs = (self, *others)
        return Site(self.index, loops=(self.var,), stmts=tuple(r.order for r in rs),
                    tensors=tuple(r.acc.tensor for r in rs),
                    extra=(("nests", [r.index for r in rs]),) if others else ())


def reductions(ctx: Context) -> list[Reduction]:
    out = []
    for st in ctx.sites:
        nest = ctx.program.nests[st.nest_index]
        if st.path != (0,) or len(nest.body) != 1 or st.order not in ctx.inits:
            continue
        target = algebra_target(st.stmt)
        if target is None or target.op not in ("+", "max") or not is_element_index(st.stmt.lhs):
            continue
        used = set(lhs_vars(st.stmt))
        red = [i for i, lp in enumerate(nest.loops) if lp.var not in used]
        if len(red) != 1 or nest.loops[red[0]].kind not in ("L", "U") or nest.loops[red[0]].start != 0:
            continue
        if any(a.tensor == st.stmt.lhs.tensor for a in accesses(target.expr)):
            continue
        out.append(Reduction(st.nest_index, nest, st.order, target.op, st.stmt.lhs, target.expr, red[0]))
    return out


def first(var: str):
    """`var-1<0`: the first iteration of a scan over `var` (LEIR.md §4.4)."""
    return Compare((BinOp("-", Var(var), Num(1)), Num(0)), ("<",))


def with_index(acc: Access, name: str, extra) -> Access:
    return Access(name, acc.dtype, acc.scope, acc.indices + (extra,))


def fresh_tensors(ctx: Context) -> TensorNames:
    return TensorNames(list(ctx.tensors) + list(ctx.signature.names))


def depends_on(expr, var: str) -> bool:
    return any(isinstance(n, Var) and n.name == var for n in walk_expr(expr))


def untouched_between(ctx: Context, lo: int, hi: int, reads_ok: set[str], no_access: set[str]) -> str | None:
    """Why nests strictly between `lo` and `hi` interfere, or None: none of them reads or writes a
    tensor of `no_access`, nor writes a tensor of `reads_ok`."""
    for k in range(lo + 1, hi):
        sets = nest_access_sets(ctx.program.nests[k])
        for name in no_access:
            if name in sets.reads or name in sets.writes:
                return f"nest {k + 1} uses {name} between the nests involved"
        for name in reads_ok:
            if name in sets.writes:
                return f"nest {k + 1} writes {name} between the nests involved"
    return None


# --- value equality through copies ------------------------------------------------------------------

def copy_sources(ctx: Context) -> dict[str, Stmt]:
    """Tensors written by exactly one statement, a plain copy of an access (a cache or CSE copy)."""
    writers: dict[str, list] = {}
    for st in ctx.sites:
        writers.setdefault(st.stmt.lhs.tensor, []).append(st.stmt)
    return {name: ws[0] for name, ws in writers.items()
            if len(ws) == 1 and isinstance(ws[0].rhs, Access) and is_plain_index(ws[0].lhs)
            and ws[0].rhs.tensor != name and not ctx.tensors[name].known}


def resolve(expr, copies: dict[str, Stmt], depth: int = 4):
    """`expr` with reads of copy tensors replaced by what they copy."""
    for _ in range(depth):
        def fn(n):
            if isinstance(n, Access) and n.tensor in copies:
                stmt = copies[n.tensor]
                return substitute_vars(stmt.rhs, {v.name: i for v, i in zip(stmt.lhs.indices, n.indices,
                                                                             strict=True)})
            return n
        new = map_expr(expr, fn)
        if new == expr:
            break
        expr = new
    return expr


def same_value(a, b, copies) -> bool:
    """`a == b` as a symbolic identity with one symbol per distinct access, through copies."""
    bridge = Bridge()
    try:
        diff = bridge.to_sympy(resolve(a, copies)) - bridge.to_sympy(resolve(b, copies))
    except Untranslatable:
        return False
    return sympy.expand(diff) == 0


def align(inner: Reduction, outer: Reduction) -> dict[str, Var] | None:
    """Loop variables of `inner` renamed to `outer`'s by position, when the loop structure matches."""
    a, b = inner.nest.loops, outer.nest.loops
    if inner.red != outer.red or [lp.extent for lp in a] != [lp.extent for lp in b]:
        return None
    return {x.var: Var(y.var) for x, y in zip(a, b, strict=True)}


@dataclass(frozen=True)
class SoftmaxPair:
    mx: Reduction
    sm: Reduction
    rename: dict

    def sum_acc(self) -> Access:
        return substitute_vars(self.sm.acc, self.rename)


def softmax_pairs(ctx: Context) -> list[SoftmaxPair]:
    """Max nest M=max(M,x) followed (maybe later) by S=S+exp(x-M) over the same loops."""
    rs = reductions(ctx)
    copies = copy_sources(ctx)
    out = []
    for mx in (r for r in rs if r.op == "max"):
        for sm in (r for r in rs if r.op == "+" and r.index > mx.index):
            rename = align(sm, mx)
            if rename is None or not isinstance(sm.elem, Call) or sm.elem.fn != "exp":
                continue
            acc = substitute_vars(sm.acc, rename)
            if [i for i in acc.indices] != [i for i in mx.acc.indices]:
                continue
            arg = substitute_vars(sm.elem.args[0], rename)
            if same_value(arg, BinOp("-", mx.elem, mx.acc), copies):
                out.append(SoftmaxPair(mx, sm, rename))
    return out


# --- prefix (scan) forms ---------------------------------------------------------------------------

class _PrefixScan(Strategy):
    level = "mathematical"
    exactness = "exact"
    op: str
    boundary: object

    def matches(self, ctx: Context, r: Reduction) -> bool:
        raise NotImplementedError

    def sites(self, ctx):
        for r in reductions(ctx):
            if r.op == self.op and self.matches(ctx, r):
                yield r.site()

    def rewrite(self, ctx, site, params):
        r = next((r for r in reductions(ctx) if r.order == site.stmts[0]), None)
        if r is None:
            raise Illegal("the nest is no longer a reduction with implicit initialisation")
        h = fresh_tensors(ctx).fresh()
        cur = with_index(r.acc, h, Var(r.var))
        prev = with_index(r.acc, h, BinOp("-", Var(r.var), Num(1)))
        carried = Select(first(r.var), self.boundary, prev)
        scan = Stmt(cur, Call("max", (carried, r.elem)) if self.op == "max" else BinOp("+", carried, r.elem))
        nest = Nest(r.nest.loops, (scan, Stmt(r.acc, cur)))
        program = finish(ctx, replace_item(ctx.program, r.index, (), (nest,)), same_inits=False)
        n = r.red_loop.extent
        facts = (f"{r.acc.tensor} is a {self.op}-reduction over {r.var} (extent {n}) with implicit "
                 f"initialisation; the scan starts from the explicit boundary {text(self.boundary)} at "
                 f"{r.var}=0, so each prefix applies the same operations in the same order",
                 f"{r.acc.tensor} receives the last prefix {h}_{{...,{n - 1}}} (the last of the repeated stores), "
                 "so every reader of it sees the same value",
                 f"{h} is a fresh intermediate; {r.var} stays a serial loop (the scan carries a dependence)")
        spatial = 1
        for lp in r.spatial:
            spatial *= lp.extent
        effect = (f"Every prefix {self.what} is kept in {h} ({spatial}x{n} values), which the "
                  "online-softmax derivation needs: later steps can rescale by the running value instead "
                  f"of waiting for the full pass; it costs {spatial * n} extra stores.")
        return Rewrite(program, facts, effect)


@register
class NormalLoopMaxToPrefixMax(_PrefixScan):
    name = "normal_loop_max_to_prefix_max"
    description = "Turn a max-reduction loop into a prefix-max scan with an explicit -inf boundary."
    op = "max"
    boundary = NEG_INF
    what = "maximum"

    def matches(self, ctx, r):
        return True


@register
class NormalLoopSummationOnExpToPrefixSummationOnExp(_PrefixScan):
    name = "normal_loop_summation_on_exp_to_prefix_summation_on_exp"
    description = "Turn a sum-of-exp reduction loop into a prefix-sum scan with an explicit 0 boundary."
    op = "+"
    boundary = Num(0)
    what = "sum of exponentials"

    def matches(self, ctx, r):
        return any(isinstance(n, Call) and n.fn == "exp" for n in walk_expr(r.elem))


# --- online softmax and flash attention ------------------------------------------------------------

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

    def sites(self, ctx):
        for pair in softmax_pairs(ctx):
            yield pair.mx.site(pair.sm)

    def rewrite(self, ctx, site, params):
        pair = _find_pair(ctx, site)
        mx, sm = pair.mx, pair.sm
        why = untouched_between(ctx, mx.index, sm.index, _reads(mx.elem), {mx.acc.tensor, sm.acc.tensor})
        why = why or sum_drift_problem(mx.red_loop.extent, sm.acc.dtype, sm.acc.tensor)
        if why:
            raise Illegal(why)
        h = fresh_tensors(ctx).fresh()
        old_max, new_max, new_sum, _, _ = running_stmts(pair, h)
        fused = Nest(mx.nest.loops, (old_max, new_max, new_sum))
        nests = list(ctx.program.nests)
        nests[sm.index] = fused
        del nests[mx.index]
        program = finish(ctx, Program(tuple(nests)), same_inits=False)
        n = mx.red_loop.extent
        facts = (f"nest {mx.index + 1} is a max-reduction of x = {text(mx.elem)} into {mx.acc.tensor} and nest "
                 f"{sm.index + 1} sums exp(x-{mx.acc.tensor}) into {sm.acc.tensor} over the same loops "
                 "(checked as a symbolic identity, looking through copies)",
                 f"{h} holds the previous maximum, -inf at {mx.var}=0; the sum is rescaled by "
                 f"exp({h}-{mx.acc.tensor}) whenever the maximum grows, so after the loop {sm.acc.tensor} = "
                 f"sum exp(x-max) and {mx.acc.tensor} = max, as before",
                 "no nest in between reads or writes them or writes what x reads",
                 f"{mx.var} stays serial: the running values carry a dependence")
        effect = (f"One pass over the {n} inputs per row instead of two: x is read and exp evaluated in the "
                  "same loop that finds the maximum, at the cost of one extra exp and multiply per element.")
        return Rewrite(program, facts, effect)


def _find_pair(ctx: Context, site: Site) -> SoftmaxPair:
    for pair in softmax_pairs(ctx):
        if (pair.mx.order, pair.sm.order) == site.stmts[:2]:
            return pair
    raise Illegal("no max / sum-of-exp pair here")


def _reads(expr) -> set[str]:
    return {a.tensor for a in accesses(expr)}


@dataclass(frozen=True)
class Attention:
    pair: SoftmaxPair
    norm: int           # nest index of P = exp(x-M)/S
    prob: Access        # P's left-hand side (normalise-nest variables)
    mm: int             # nest index of O = O + P*V
    mm_stmt: Stmt
    value: object       # V (the other factor), matmul variables
    p_read: Access      # P as the matmul reads it


def attentions(ctx: Context) -> list[Attention]:
    copies = copy_sources(ctx)
    rs = {r.index: r for r in reductions(ctx)}
    readers: dict[str, list[int]] = {}
    for k, nest in enumerate(ctx.program.nests):
        for name in nest_access_sets(nest).reads:
            readers.setdefault(name, []).append(k)
    out = []
    for pair in softmax_pairs(ctx):
        for k in range(pair.sm.index + 1, len(ctx.program.nests)):
            att = _attention(ctx, pair, k, rs, readers, copies)
            if att is not None:
                out.append(att)
    return out


def _attention(ctx, pair, k, rs, readers, copies) -> Attention | None:
    nest = ctx.program.nests[k]
    if len(nest.body) != 1 or not isinstance(nest.body[0], Stmt):
        return None
    stmt = nest.body[0]
    p = stmt.lhs
    mx = pair.mx
    if ctx.tensors[p.tensor].known or not is_plain_index(p) or any(a.tensor == p.tensor for a in accesses(stmt.rhs)):
        return None
    if [lp.extent for lp in nest.loops] != [lp.extent for lp in mx.nest.loops]:
        return None
    rename = {x.var: Var(y.var) for x, y in zip(nest.loops, mx.nest.loops, strict=True)}
    want = BinOp("/", Call("exp", (BinOp("-", mx.elem, mx.acc),)), pair.sum_acc())
    if not same_value(substitute_vars(stmt.rhs, rename), want, copies):
        return None
    p_mx = substitute_vars(p, rename)  # P in the max nest's variables: must be (spatial..., a)
    if p_mx.indices[-1] != Var(mx.var) or list(p_mx.indices[:-1]) != list(mx.acc.indices):
        return None
    users = readers.get(p.tensor, [])
    if len(users) != 1 or users[0] not in rs or rs[users[0]].op != "+":
        return None
    mm = rs[users[0]]
    reads = [a for a in accesses(mm.elem) if a.tensor == p.tensor]
    if len(reads) != 1 or not isinstance(mm.elem, BinOp) or mm.elem.op != "*":
        return None
    p_read = reads[0]
    other = mm.elem.rhs if mm.elem.lhs == p_read else mm.elem.lhs if mm.elem.rhs == p_read else None
    if other is None or not is_plain_index(p_read) or p_read.indices[-1] != Var(mm.var):
        return None
    if mm.red_loop.extent != mx.red_loop.extent or depends_on(other, p.tensor):
        return None
    return Attention(pair, k, p_mx, mm.index, mm.nest.body[0], other, p_read)


@register
class FlashattentionWoTiling(Strategy):
    name = "flashattention_wo_tiling"
    level = "mathematical"
    exactness = "reassociating"
    description = ("Fold softmax(x)·V into one loop over keys: running max, rescaled running sum, and a "
                   "rescaled running output in a nested nest, normalised once at the end.")

    def sites(self, ctx):
        for att in attentions(ctx):
            pair = att.pair
            yield Site(pair.mx.index, loops=(pair.mx.var,), stmts=(pair.mx.order, pair.sm.order),
                       tensors=(pair.mx.acc.tensor, pair.sm.acc.tensor, att.prob.tensor, att.mm_stmt.lhs.tensor),
                       extra=(("nests", [pair.mx.index, pair.sm.index, att.norm, att.mm]),))

    def rewrite(self, ctx, site, params):
        att = next((a for a in attentions(ctx) if [a.pair.mx.index, a.pair.sm.index, a.norm, a.mm]
                    == dict(site.extra)["nests"]), None)
        if att is None:
            raise Illegal("no attention pattern here")
        pair, mx = att.pair, att.pair.mx
        mm_nest = ctx.program.nests[att.mm]
        mm_red = next(i for i, lp in enumerate(mm_nest.loops) if lp.var not in lhs_vars(att.mm_stmt))
        o = att.mm_stmt.lhs
        if not is_plain_index(o):
            raise Illegal("the product's output is not indexed by plain loop variables")
        involved = {mx.acc.tensor, pair.sm.acc.tensor, att.prob.tensor, o.tensor}
        why = None
        for lo, hi in ((mx.index, pair.sm.index), (pair.sm.index, att.norm), (att.norm, att.mm)):
            why = why or untouched_between(ctx, lo, hi, _reads(mx.elem) | _reads(att.value), involved)
        why = why or sum_drift_problem(mx.red_loop.extent, o.dtype, o.tensor)
        if why:
            raise Illegal(why)
        names = fresh_tensors(ctx)
        h, acc_name = names.fresh(), names.fresh()
        old_max, new_max, new_sum, _, scale = running_stmts(pair, h)
        # Matmul variables -> fused ones: P's spatial subscripts and the key loop map onto the max
        # nest's; the other (value-dimension) loops get fresh names in a nested nest.
        to_fused = {m.name: f for m, f in zip(att.p_read.indices, att.prob.indices, strict=True)}
        used = {lp.var for n in ctx.program.nests for lp in n.loops}
        fresh_idx = IndexNames(used)
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
        s_mm = substitute_vars(pair.sum_acc(), to_mm)
        out_loops = tuple(lp for i, lp in enumerate(mm_nest.loops) if i != mm_red)
        final = Nest(out_loops, (Stmt(o, BinOp("/", o_acc, s_mm)),))
        nests = list(ctx.program.nests)
        nests[att.mm] = final
        nests[att.norm] = fused
        for k in sorted((mx.index, pair.sm.index), reverse=True):
            del nests[k]
        program = finish(ctx, Program(tuple(nests)), same_inits=False)
        n, d = mx.red_loop.extent, 1
        for lp in inner:
            d *= lp.extent
        facts = (f"nests {mx.index + 1}-{att.mm + 1} compute softmax over {mx.var} into {att.prob.tensor} "
                 f"(max {mx.acc.tensor}, sum {pair.sm.acc.tensor}) and {o.tensor} = {att.prob.tensor}·V; "
                 f"{att.prob.tensor} is read by the product only, so it need not be stored",
                 f"the running output {acc_name} is rescaled by exp({h}-{mx.acc.tensor}) exactly when the "
                 f"running sum is, so {acc_name}/{pair.sm.acc.tensor} after the last key equals the product "
                 "with the normalised probabilities",
                 "no nest in between touches the tensors involved",
                 f"{mx.var} stays serial (running values); the {plural(d, 'value column')} loop is nested inside")
        effect = (f"The probabilities ({n} per row) are never written to memory and the four passes "
                  f"become one loop over the {n} keys plus a final normalisation: {plural(3, 'pass')} over "
                  "the scores are saved.")
        return Rewrite(program, facts, effect)
