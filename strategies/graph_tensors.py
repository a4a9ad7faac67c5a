"""Graph-level strategies on stacked tensors: concatenate independent operators of one input into one
operator over a stacked tensor, and split a stacked tensor back into independent parts.

A *stacked* tensor carries its parts on a leading literal index (LEIR.md §5: that is how the
translator writes tuple results such as split, chunk or a QKV projection). Both rewrites keep every
statement's expression, so every element is computed by the same operations in the same order; only
where the values are stored changes. Both are therefore bitwise exact.

- tensor_concat_to_fuse_operators: nests p0 < p1 < ... with the same loops, one statement each,
  that share an input and write separate intermediates of one shape and dtype, independent of each
  other and of every nest between them. Either (`stacked_operands`) the statements are one template
  up to the tensors they read: one nest with a new leading loop over the parts computes the stacked
  result from stacked (concatenated) copies of the operands that differ, e.g. QKV = X @ [Wq;Wk;Wv];
  or (`stacked_results`, plain stores only) one nest computes every part's statement into its slice
  of the stacked result. Readers of part k read slice k of the stacked result.
- tensor_split_to_decouple_operators: an intermediate whose writes and reads all use a literal
  leading index becomes one tensor per part (`literal`); a single-statement nest whose leading
  write subscript is a loop over the parts becomes one nest per part first (`loop`).
"""
from __future__ import annotations

from leir.analysis import implicit_inits, statement_sites
from leir.ast import (
    Access,
    And,
    BinOp,
    Call,
    Compare,
    Loop,
    Neg,
    Nest,
    Num,
    Or,
    Program,
    Select,
    Stmt,
    Var,
    accesses,
    map_stmt,
)
from leir.names import IndexNames
from leir.printer import format_expr
from strategies.base import Context, Illegal, Rewrite, Site, Strategy
from strategies.legality import body_statements, conflicts, iterations, loop_carries_dependence, stmt_reads
from strategies.registry import register
from strategies.tree import fresh_indices, fresh_tensors, map_program_stmts, rename_vars_in_nest, vars_in

MAX_PARTS = 8  # at most this many parts stacked or split in one step
OUT = "\0out"  # stands for a part's own output in a statement template
SLOT = Var("\0slot")


# --- shared helpers -----------------------------------------------------------------------------------

def single_statement(nest: Nest) -> Stmt | None:
    """The statement of a perfect one-statement nest, else None."""
    return nest.body[0] if len(nest.body) == 1 and isinstance(nest.body[0], Stmt) else None


def rename_slices(program: Program, mapping) -> Program:
    """Every access of a tensor in `mapping` rewritten by `mapping[tensor](access)` (reads and writes,
    subscripts included)."""
    def fn(n):
        if isinstance(n, Access) and n.tensor in mapping:
            return mapping[n.tensor](n)
        return n
    return map_program_stmts(program, lambda s: map_stmt(s, fn))


def init_profile(program: Program, ctx: Context, tensors: set[str]) -> tuple[list, list]:
    """(identities of the statements writing other tensors, identities of those writing `tensors`),
    each in program order (None: no implicit initialisation)."""
    inits = implicit_inits(program, ctx.signature)
    others, own = [], []
    for s in statement_sites(program):
        (own if s.stmt.lhs.tensor in tensors else others).append(inits.get(s.order))
    return others, own


def literal_index(e) -> int | None:
    return e.value if isinstance(e, Num) and isinstance(e.value, int) else None


def map_values(e, leaf):
    """`e` rebuilt with `leaf(n)` for every access, variable and literal in a value position (subscripts
    are left alone: an access is a leaf)."""
    match e:
        case BinOp(op=op, lhs=a, rhs=b):
            return BinOp(op, map_values(a, leaf), map_values(b, leaf))
        case Neg(operand=a):
            return Neg(map_values(a, leaf))
        case Call(fn=f, args=args):
            return Call(f, tuple(map_values(a, leaf) for a in args))
        case Select(cond=c, then=t, otherwise=o):
            return Select(map_values(c, leaf), map_values(t, leaf), map_values(o, leaf))
        case Compare(operands=ops, ops=rels):
            return Compare(tuple(map_values(a, leaf) for a in ops), rels)
        case And(terms=ts) | Or(terms=ts):
            return type(e)(tuple(map_values(a, leaf) for a in ts))
    return leaf(e)


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


@register
class TensorConcatToFuseOperators(Strategy):
    name = "tensor_concat_to_fuse_operators"
    level = "graph"
    exactness = "exact"
    description = ("Compute independent operators of one input that have the same loops in one nest, "
                   "into one stacked tensor (from concatenated operands, e.g. QKV = X @ [Wq;Wk;Wv]).")

    def sites(self, ctx):
        for parts in concat_groups(ctx):
            nests = ctx.program.nests
            outs = tuple(single_statement(nests[p]).lhs.tensor for p in parts)
            yield Site(parts[0], loops=tuple(lp.var for lp in nests[parts[0]].loops),
                       stmts=tuple(next(s.order for s in ctx.sites if s.nest_index == p) for p in parts),
                       tensors=outs, extra=(("nests", list(parts)),))

    def parameters(self, ctx, site):
        parts = dict(site.extra)["nests"]
        anchor = ctx.program.nests[parts[0]]
        for form in forms(ctx, [aligned_part(anchor, ctx.program.nests[p]) for p in parts]):
            yield {"form": form}

    def rewrite(self, ctx, site, params):
        parts = list(dict(site.extra)["nests"])
        nests = ctx.program.nests
        if len(parts) < 2 or len(parts) > MAX_PARTS or any(part_output(ctx, nests[p]) is None for p in parts):
            raise Illegal("each part must be a one-statement nest writing its own intermediate")
        anchor = nests[parts[0]]
        if not all(same_loops(anchor, nests[p]) for p in parts):
            raise Illegal("the parts do not run the same loops")
        stmts = [aligned_part(anchor, nests[p]) for p in parts]
        outs = [s.lhs.tensor for s in stmts]
        infos = [ctx.tensors[o] for o in outs]
        if len({(i.shape, i.dtype, i.scope) for i in infos}) != 1:
            raise Illegal("the parts' results differ in shape, dtype or scope")
        form = params["form"]
        if form not in forms(ctx, stmts):
            raise Illegal(f"the parts cannot be stacked as {form}")
        reason = independent(ctx, parts)
        if reason:
            raise Illegal(reason)
        names = fresh_tensors(ctx.program, ctx.signature)
        result = names.fresh()
        if form == "stacked_operands":
            new, operands = self._operands(ctx, anchor, stmts, result, names)
        else:
            new, operands = (Nest(anchor.loops, tuple(Stmt(stacked(result, s.lhs, Num(k)), s.rhs)
                                                     for k, s in enumerate(stmts))),), []
        kept = [n for i, n in enumerate(nests) if i not in parts[1:]]
        first = parts[0]  # the later parts were after it, so it keeps its position
        program = Program(tuple(kept[:first]) + new + tuple(kept[first + 1:]))
        # No part reads another's result, so the old results occur only in their readers now.
        program = rename_slices(program, {o: (lambda a, k=k: stacked(result, a, Num(k))) for k, o in enumerate(outs)})
        self._check_inits(ctx, program, outs, result, operands, form)
        return Rewrite(program, self._facts(ctx, parts, outs, result, operands, form),
                       self._effect(ctx, anchor, parts, outs, result, form))

    def _operands(self, ctx, anchor, stmts, result, names):
        """(copy nests + the stacked nest, [(stacked operand, its sources)]) for `stacked_operands`."""
        g = fresh_indices(ctx.program).fresh()
        _, base = template(stmts[0])
        per_part = [template(s)[1] for s in stmts]
        values, copies, operands = [], [], []
        for i, a in enumerate(base):
            column = [slots[i] for slots in per_part]
            if a.tensor == OUT:
                values.append(stacked(result, Access(result, a.dtype, a.scope, a.indices), Var(g)))
            elif len({c.tensor for c in column}) == 1:
                values.append(a)
            else:
                shapes = {ctx.tensors[c.tensor].shape for c in column}
                if len(shapes) != 1:
                    raise Illegal(f"the operands {', '.join(c.tensor for c in column)} differ in shape")
                name = names.fresh()
                copies.append(copy_nest(ctx, name, column))
                operands.append((name, [c.tensor for c in column]))
                values.append(Access(name, a.dtype, "g", (Var(g),) + a.indices))
        lhs = stacked(result, stmts[0].lhs, Var(g))
        body = Stmt(lhs, fill_slots(skeleton(stmts[0].rhs, []), values))
        merged = Nest((Loop("L", len(stmts), g),) + anchor.loops, (body,))
        return tuple(copies) + (merged,), operands

    def _check_inits(self, ctx, program, outs, result, operands, form):
        old_others, old_own = init_profile(ctx.program, ctx, set(outs))
        new_others, new_own = init_profile(program, ctx, {result} | {name for name, _ in operands})
        new_own = [v for v in new_own if v is not None] if form == "stacked_operands" else new_own
        want = ([old_own[0]] if old_own[0] is not None else []) if form == "stacked_operands" else old_own
        if old_others != new_others or new_own != want or len(set(old_own)) != 1:
            raise Illegal("a reduction would gain or lose its implicit initialisation")

    def _facts(self, ctx, parts, outs, result, operands, form):
        nests = ", ".join(str(p + 1) for p in parts)
        shared = ", ".join(shared_reads([single_statement(ctx.program.nests[p]) for p in parts]))
        shape = ctx.tensors[outs[0]].shape
        facts = [f"nests {nests} run the same loops and each computes one intermediate ({', '.join(outs)}) of "
                 f"shape {list(shape)}, written nowhere else; all of them read {shared}",
                 "no part reads another part's result, and no nest between the first part and a later one "
                 "writes what that part reads or touches what it writes, so every part can run at the "
                 "first part's place",
                 f"slice k of {result} (leading index k) holds what the k-th part's result held ({', '.join(outs)} "
                 "in order), and every reader of a part now reads its slice"]
        if form == "stacked_operands":
            for name, sources in operands:
                facts.append(f"{name} is the concatenation of {', '.join(sources)} on a new leading axis, copied "
                             "before the stacked nest while they hold the values the parts read")
            facts.append("the stacked nest evaluates the same expression per element, in the same order, so "
                         "reductions accumulate as before (each slice starts from its implicit initial value)")
        else:
            facts.append("each part's statement is unchanged but for where it stores, and the statements are "
                         "plain stores, so interleaving them per iteration changes no value")
        return tuple(facts)

    def _effect(self, ctx, anchor, parts, outs, result, form):
        work = iterations(anchor.loops)
        k = len(parts)
        if form == "stacked_operands":
            how = (f"one nest with a leading loop over the {k} parts (one larger operator, e.g. one GEMM over "
                   "concatenated weights)")
        else:
            how = f"one nest whose body computes the {k} parts in each iteration, reading the shared input once"
        return (f"{k} operators of {work} iterations each ({', '.join(outs)}) become {how}, writing the stacked "
                f"tensor {result}: fewer kernel launches and passes over the shared input, and a larger "
                "operator to parallelize.")


# --- tensor_split_to_decouple_operators ---------------------------------------------------------------

def all_accesses(ctx: Context, tensor: str) -> list[tuple[int, Access, bool]]:
    """(statement order, access, is the write) for every access of `tensor`, subscripts included."""
    out = []
    for s in ctx.sites:
        for a in [s.stmt.lhs, *(x for ix in s.stmt.lhs.indices for x in accesses(ix)), *accesses(s.stmt.rhs)]:
            if a.tensor == tensor:
                out.append((s.order, a, a is s.stmt.lhs))
    return out


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
    from strategies.loops import substitute_in_nest
    rest = Nest(tuple(lp for lp in nest.loops if lp.var != loop.var), nest.body)
    return tuple(substitute_in_nest(rest, {loop.var: Num(loop.start + i)}) for i in range(loop.extent))


def value_uses(stmt: Stmt, var: str) -> bool:
    """Whether `var` is used as a value (outside every subscript) in the statement."""
    slots: list = []
    return var in vars_in(skeleton(stmt.rhs, slots))


@register
class TensorSplitToDecoupleOperators(Strategy):
    name = "tensor_split_to_decouple_operators"
    level = "graph"
    exactness = "exact"
    description = ("Split a tensor stacked on a leading index into one tensor per part (and a nest that "
                   "loops over the parts into one nest per part), so each consumer depends only on its part.")

    def sites(self, ctx):
        for top in range(len(ctx.program.nests)):
            found = loop_split_site(ctx, top)
            if found:
                stmt, loop = found
                order = next(s.order for s in ctx.sites if s.nest_index == top)
                yield Site(top, loops=(loop.var,), stmts=(order,), tensors=(stmt.lhs.tensor,),
                           extra=(("form", "loop"),))
        for name in ctx.tensors:
            parts = literal_parts(ctx, name)
            if parts is None or len(parts) < 2:
                continue
            writes = [o for o, _, w in all_accesses(ctx, name) if w]
            yield Site(ctx.sites[writes[0]].nest_index, stmts=tuple(writes), tensors=(name,),
                       extra=(("form", "literal"), ("parts", parts)))

    def parameters(self, ctx, site):
        yield {"parts": "all"}
        extra = dict(site.extra)
        if extra["form"] == "literal" and len(extra["parts"]) > 2:
            for k in extra["parts"]:
                yield {"part": k}

    def rewrite(self, ctx, site, params):
        extra = dict(site.extra)
        tensor = site.tensors[0]
        loop_form = extra["form"] == "loop"
        work, facts, pieces = self._unroll(ctx, site, tensor) if loop_form else (ctx, [], 1)
        parts = literal_parts(work, tensor)
        if parts is None or len(parts) < 2:
            raise Illegal(f"{tensor} is not accessed only at literal leading indices")
        chosen = parts if params.get("parts") == "all" else [params["part"]]
        if any(k not in parts for k in chosen):
            raise Illegal(f"{tensor} has no part {chosen}")
        read_parts = {literal_index(a.indices[0]) for _, a, w in all_accesses(work, tensor) if not w}
        if not read_parts <= set(parts):
            raise Illegal(f"{tensor} is read at a part that is never written")
        names = fresh_tensors(work.program, ctx.signature)
        new = {k: names.fresh() for k in chosen}

        def split(a: Access) -> Access:
            k = literal_index(a.indices[0])
            return Access(new[k], a.dtype, a.scope, a.indices[1:]) if k in new else a

        program = rename_slices(work.program, {tensor: split})
        old_others, old_own = init_profile(ctx.program, ctx, {tensor})
        new_others, new_own = init_profile(program, ctx, {tensor, *new.values()})
        expected = old_own * pieces  # the loop form had one writer, now one per part
        if old_others != new_others or new_own != expected:
            raise Illegal("a reduction would gain or lose its implicit initialisation")
        listed = ", ".join(f"{tensor}[{k}] -> {new[k]}" for k in chosen)
        facts += [f"{tensor} is an intermediate whose every write and read names its part by a literal leading index, "
                  f"so each part can live in a tensor of its own: {listed}",
                  "no access changes its element, only the tensor that holds it; reductions keep their "
                  "implicit initialisation"]
        readers = sorted({o for o, a, w in all_accesses(work, tensor) if not w})
        also = "one nest per part and " if loop_form else ""
        plural = "s" if len(readers) != 1 else ""
        effect = (f"{tensor} is split into {also}{len(chosen)} separate tensor{'s' if len(chosen) > 1 else ''} "
                  f"({', '.join(new.values())}): the {len(readers)} reading statement{plural} "
                  "now depend only on the part they use, so a part can be inlined, fused with its consumer or "
                  "scheduled on its own.")
        return Rewrite(program, tuple(facts), effect)

    def _unroll(self, ctx, site, tensor) -> tuple[Context, list[str], int]:
        """The program with the loop over the parts replaced by one nest per part (literal leading
        subscripts), the facts checked, and the number of parts."""
        found = loop_split_site(ctx, site.nest)
        if found is None or found[0].lhs.tensor != tensor:
            raise Illegal(f"{tensor} is not written by a loop over its leading index read only by literal parts")
        stmt, loop = found
        carried = loop_carries_dependence(body_statements(ctx.program.nests[site.nest]), loop.var)
        if carried:
            raise Illegal(f"iterations of {loop.var} interact: {carried}")
        if value_uses(stmt, loop.var):
            raise Illegal(f"{loop.var} is used as a value, not only as a subscript")
        nests = ctx.program.nests
        pieces = unroll_parts(nests[site.nest], loop)
        facts = [f"loop {loop.var} ({loop.extent} iterations) runs over the leading index of {tensor}, and its "
                 f"iterations do not interact (each writes and reads only its own slice of {tensor})",
                 f"{loop.var} appears only in subscripts, so one nest per value of {loop.var}, in order, computes "
                 "the same elements with the same operations"]
        return ctx.with_program(Program(nests[:site.nest] + pieces + nests[site.nest + 1:])), facts, len(pieces)
