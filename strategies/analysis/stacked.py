"""Stacked tensors: the patterns the two stacked-tensor rules match (rules/graph/stacking.py).

A *stacked* tensor carries its parts on a leading literal index (docs/leir.md §5: that is how the
translator writes tuple results such as split, chunk or a QKV projection).

- concat: nests p0 < p1 < ... with the same loops, one statement each, that share an input and write
  separate intermediates of one shape and dtype, independent of each other and of every nest between
  them (`concat_groups`), in the forms they can be stacked in (`forms`): `stacked_operands` when the
  statements are one template up to the tensors they read, `stacked_results` for plain stores;
- split: an intermediate whose writes and reads all use a literal leading index (`literal_parts`),
  or a single-statement nest whose leading write subscript is a loop over the parts
  (`loop_split_site`).
"""
from __future__ import annotations

from leir.ast import Access, Loop, Nest, Num, Stmt, Var, map_expr
from leir.names import IndexNames
from leir.printer import format_expr
from strategies.analysis.legality import body_statements, conflicts, stmt_reads
from strategies.analysis.tree import rename_vars_in_nest, substitute_in_nest, tensor_accesses, vars_in
from strategies.base import Context

MAX_PARTS = 8  # at most this many parts stacked or split in one step
OUT = "\0out"  # stands for a part's own output in a statement template
SLOT = Var("\0slot")


def single_statement(nest: Nest) -> Stmt | None:
    """The statement of a perfect one-statement nest, else None."""
    return nest.body[0] if len(nest.body) == 1 and isinstance(nest.body[0], Stmt) else None


def literal_index(e) -> int | None:
    return e.value if isinstance(e, Num) and isinstance(e.value, int) else None


def map_values(e, leaf):
    """`e` rebuilt with `leaf(n)` for every access, variable and literal in a value position (subscripts
    are left alone: an access is a leaf)."""
    return map_expr(e, lambda n: leaf(n) if isinstance(n, Access | Var | Num) else n, subscripts=False)


def skeleton(e, slots: list):
    """`e` with every access in a value position replaced by SLOT (appended to `slots`, in order)."""
    def leaf(n):
        if isinstance(n, Access):
            slots.append(n)
            return SLOT
        return n
    return map_values(e, leaf)


def fill_slots(e, values: list):
    """Inverse of `skeleton`: the SLOTs replaced by `values` in order."""
    it = iter(values)
    return map_values(e, lambda n: next(it) if n == SLOT else n)


# --- tensor_concat_to_fuse_operators ------------------------------------------------------------------

def same_loops(a: Nest, b: Nest) -> bool:
    return len(a.loops) == len(b.loops) and all(
        (x.kind, x.extent, x.start) == (y.kind, y.extent, y.start) for x, y in zip(a.loops, b.loops, strict=True))


def aligned_part(anchor: Nest, nest: Nest) -> Stmt:
    """The statement of `nest` with its loop variables renamed to the anchor's, position by position."""
    mapping = {y.var: x.var for x, y in zip(anchor.loops, nest.loops, strict=True)}
    return single_statement(rename_vars_in_nest(nest, mapping))


def part_output(ctx: Context, nest: Nest) -> str | None:
    """The intermediate a candidate part writes (its only writer), else None."""
    s = single_statement(nest)
    if s is None:
        return None
    name = s.lhs.tensor
    info = ctx.tensors.get(name)
    if info is None or info.known or info.shape is None:
        return None
    if sum(1 for site in ctx.sites if site.stmt.lhs.tensor == name) != 1:
        return None
    return name


def template(stmt: Stmt) -> tuple[object, list[Access]]:
    """(skeleton of the right-hand side, its access slots) with the statement's own output as OUT."""
    slots: list[Access] = []
    shape = skeleton(stmt.rhs, slots)
    own = [Access(OUT, a.dtype, a.scope, a.indices) if a.tensor == stmt.lhs.tensor else a for a in slots]
    return shape, own


def operand_slots(stmts: list[Stmt]) -> list[int] | None:
    """For `stacked_operands`: the slots where the parts read different tensors, or None when the
    statements are not one template (same expression, same subscripts, same dtypes; they may differ
    only in which tensor a slot reads)."""
    base_shape, base = template(stmts[0])
    differing: set[int] = set()
    for s in stmts[1:]:
        if s.lhs.indices != stmts[0].lhs.indices:
            return None
        shape, slots = template(s)
        if shape != base_shape or len(slots) != len(base):
            return None
        for i, (a, b) in enumerate(zip(base, slots, strict=True)):
            if (a.dtype, a.scope, a.indices) != (b.dtype, b.scope, b.indices) or (a.tensor == OUT) != (b.tensor == OUT):
                return None
            if a.tensor != b.tensor:
                differing.add(i)
    return sorted(differing)


def shared_reads(stmts: list[Stmt]) -> list[str]:
    """Tensors every part reads (its own output excluded), first occurrence order."""
    sets = [{a.tensor for a in stmt_reads(s) if a.tensor != s.lhs.tensor} for s in stmts]
    first = [a.tensor for a in stmt_reads(stmts[0])]
    return [t for t in dict.fromkeys(first) if all(t in st for st in sets)]


def forms(ctx: Context, stmts: list[Stmt]) -> list[str]:
    """The concat forms that can express these parts (empty: not a site)."""
    if not shared_reads(stmts) or len({format_expr(s.rhs) for s in stmts}) < len(stmts):
        return []
    out = []
    slots = operand_slots(stmts)
    if slots:
        shapes = [ctx.tensors.get(template(s)[1][i].tensor) for s in stmts for i in slots]
        if all(info is not None and info.shape is not None for info in shapes):
            out.append("stacked_operands")
    if not any(a.tensor == s.lhs.tensor for s in stmts for a in stmt_reads(s)):
        out.append("stacked_results")
    return out


def independent(ctx: Context, parts: list[int]) -> str | None:
    """Why the parts cannot all run at the first one's place, or None: no part may depend on, or be
    depended on by, any nest from the first part up to it (the other parts included)."""
    nests = ctx.program.nests
    for p in parts[1:]:
        mine = body_statements(nests[p])
        for m in range(parts[0], p):
            found = conflicts(body_statements(nests[m]), mine)
            if found:
                kind, acc, _, _, _ = found[0]
                return f"nest {p + 1} cannot move before nest {m + 1}: {kind} dependence on {acc.tensor}"
    return None


def concat_groups(ctx: Context) -> list[list[int]]:
    """Candidate part lists (top-level nest positions), program order: for each first nest, every
    compatible legal partner, then the whole group when it has more than two parts."""
    nests = ctx.program.nests
    outputs = [part_output(ctx, n) for n in nests]
    shapes = [ctx.tensors[o].shape if o else None for o in outputs]
    groups = []
    for i, anchor in enumerate(nests):
        if outputs[i] is None:
            continue
        info = ctx.tensors[outputs[i]]
        partners = []
        for j in range(i + 1, len(nests)):
            if outputs[j] is None or shapes[j] != shapes[i] or not same_loops(anchor, nests[j]):
                continue
            other = ctx.tensors[outputs[j]]
            if (other.dtype, other.scope) != (info.dtype, info.scope):
                continue
            stmts = [single_statement(anchor), aligned_part(anchor, nests[j])]
            if forms(ctx, stmts) and independent(ctx, [i, j]) is None:
                partners.append(j)
        for j in partners:
            groups.append([i, j])
        whole = [i] + partners[:MAX_PARTS - 1]
        if (len(whole) > 2 and independent(ctx, whole) is None
                and forms(ctx, [aligned_part(anchor, nests[p]) for p in whole])):
            groups.append(whole)
    return groups


def stacked(name: str, like: Access, lead) -> Access:
    return Access(name, like.dtype, like.scope, (lead,) + like.indices)


def copy_nest(ctx: Context, name: str, sources: list[Access]) -> Nest:
    """One nest that copies each source tensor whole into slice k of the stacked `name`, translator
    style (a B loop over the first dimension, L loops over the others)."""
    shape = ctx.tensors[sources[0].tensor].shape
    names = IndexNames([])
    if shape:
        loops = (Loop("B", shape[0], "tx"),) + tuple(Loop("L", n, names.fresh()) for n in shape[1:])
    else:
        loops = (Loop("B", 1, "tx"),)
    idx = tuple(Var(lp.var) for lp in loops) if shape else ()
    body = tuple(Stmt(Access(name, s.dtype, "g", (Num(k),) + idx), Access(s.tensor, s.dtype, s.scope, idx))
                 for k, s in enumerate(sources))
    return Nest(loops, body)


# --- tensor_split_to_decouple_operators ---------------------------------------------------------------

def all_accesses(ctx: Context, tensor: str) -> list[tuple[int, Access, bool]]:
    """(statement order, access, is the write) for every access of `tensor`, subscripts included."""
    return [(s.order, a, a is s.stmt.lhs) for a, s in tensor_accesses(ctx, tensor)]


def literal_parts(ctx: Context, tensor: str) -> list[int] | None:
    """The parts of an intermediate whose every access has a literal leading index (written parts,
    ascending), else None."""
    info = ctx.tensors.get(tensor)
    if info is None or info.known or not info.shape:
        return None
    written = set()
    for _, a, is_write in all_accesses(ctx, tensor):
        k = literal_index(a.indices[0]) if a.indices else None
        if k is None:
            return None
        if is_write:
            written.add(k)
    return sorted(written)


def loop_split_site(ctx: Context, top: int) -> tuple[Stmt, Loop] | None:
    """(statement, loop over the parts) of a one-statement nest whose leading write subscript is one
    of its loops (2..MAX_PARTS iterations), the only writer of its intermediate, which is read elsewhere
    only at literal leading indices; else None."""
    nest = ctx.program.nests[top]
    stmt = single_statement(nest)
    if stmt is None or not stmt.lhs.indices or not isinstance(stmt.lhs.indices[0], Var) or len(nest.loops) < 2:
        return None
    info = ctx.tensors.get(stmt.lhs.tensor)
    if info is None or info.known:
        return None
    loop = next((lp for lp in nest.loops if lp.var == stmt.lhs.indices[0].name), None)
    if loop is None or not 2 <= loop.extent <= MAX_PARTS:
        return None
    for order, a, is_write in all_accesses(ctx, stmt.lhs.tensor):
        site = ctx.sites[order]
        if site.nest_index == top:
            continue
        if is_write:
            return None  # the loop's statement must be the only writer
        k = literal_index(a.indices[0]) if a.indices else None
        if k is None or not loop.start <= k < loop.start + loop.extent:
            return None
    return stmt, loop


def unroll_parts(nest: Nest, loop: Loop) -> tuple[Nest, ...]:
    """One nest per iteration of `loop`, the loop removed and its variable replaced by the literal."""
    rest = Nest(tuple(lp for lp in nest.loops if lp.var != loop.var), nest.body)
    return tuple(substitute_in_nest(rest, {loop.var: Num(loop.start + i)}) for i in range(loop.extent))


def value_uses(stmt: Stmt, var: str) -> bool:
    """Whether `var` is used as a value (outside every subscript) in the statement."""
    slots: list = []
    return var in vars_in(skeleton(stmt.rhs, slots))


