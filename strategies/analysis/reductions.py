"""Reduction nests and the softmax dataflow patterns over them, as typed matches (`Site.match`).

Patterns are dataflow, not token sequences: a *max-reduction nest* (one statement `M=max(M,x)` with
implicit initialisation, one serial reduction loop) feeding a *sum-of-exp nest* (`S=S+exp(y)` with
`y = x - M` as a symbolic identity, after aligning loop variables by position and looking through
pure copy nests), feeding a *normalise nest* and a P·V product, through whatever tensor names, with
any unrelated nests in between as long as they do not touch the tensors involved.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from leir.analysis import lhs_vars, nest_access_sets
from leir.ast import Access, BinOp, Call, Compare, Loop, Nest, Num, Stmt, Var, accesses, map_expr, walk_expr
from strategies.analysis.algebra import algebra_target, is_element_index, is_plain_index
from strategies.analysis.sympy_bridge import Bridge, Untranslatable
from strategies.analysis.tree import substitute_vars
from strategies.base import Context, Match, Site

# --- reductions ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reduction(Match):
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

    def to_json(self) -> dict:
        return {}  # the site's statement names the reduction

    def site(self) -> Site:
        return Site(self.index, loops=(self.var,), stmts=(self.order,), tensors=(self.acc.tensor,), match=self)


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
    """`var-1<0`: the first iteration of a scan over `var` (docs/leir.md §4.4)."""
    return Compare((BinOp("-", Var(var), Num(1)), Num(0)), ("<",))


def with_index(acc: Access, name: str, extra) -> Access:
    """`acc` renamed to `name`, with one more subscript `extra` at the end."""
    return Access(name, acc.dtype, acc.scope, acc.indices + (extra,))


def depends_on(expr, var: str) -> bool:
    return any(isinstance(n, Var) and n.name == var for n in walk_expr(expr))


def tensors_read(expr) -> set[str]:
    return {a.tensor for a in accesses(expr)}


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


# --- softmax: a max pass and a sum of exp(x - max) ---------------------------------------------------------

@dataclass(frozen=True)
class SoftmaxPair(Match):
    """A max nest M=max(M,x) followed (maybe later) by S=S+exp(x-M) over the same loops; `renaming`
    maps the sum nest's loop variables to the max nest's."""

    mx: Reduction
    sm: Reduction
    renaming: tuple[tuple[str, Var], ...]

    @property
    def rename(self) -> dict[str, Var]:
        return dict(self.renaming)

    def sum_acc(self) -> Access:
        return substitute_vars(self.sm.acc, self.rename)

    def to_json(self) -> dict:
        return {"nests": [self.mx.index, self.sm.index]}

    def site(self) -> Site:
        mx, sm = self.mx, self.sm
        return Site(mx.index, loops=(mx.var,), stmts=(mx.order, sm.order), tensors=(mx.acc.tensor, sm.acc.tensor),
                    match=self)


def softmax_pairs(ctx: Context) -> list[SoftmaxPair]:
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
                out.append(SoftmaxPair(mx, sm, tuple(rename.items())))
    return out


# --- attention: the softmax normalised into P, then O = O + P*V ------------------------------------------

@dataclass(frozen=True)
class Attention(Match):
    pair: SoftmaxPair
    norm: int           # nest index of P = exp(x-M)/S
    prob: Access        # P's left-hand side (normalise-nest variables)
    mm: int             # nest index of O = O + P*V
    mm_stmt: Stmt
    value: object       # V (the other factor), matmul variables
    p_read: Access      # P as the matmul reads it

    def to_json(self) -> dict:
        return {"nests": [self.pair.mx.index, self.pair.sm.index, self.norm, self.mm]}

    def site(self) -> Site:
        mx, sm = self.pair.mx, self.pair.sm
        return Site(mx.index, loops=(mx.var,), stmts=(mx.order, sm.order),
                    tensors=(mx.acc.tensor, sm.acc.tensor, self.prob.tensor, self.mm_stmt.lhs.tensor), match=self)


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
