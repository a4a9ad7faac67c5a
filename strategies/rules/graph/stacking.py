"""tensor_concat_to_fuse_operators and tensor_split_to_decouple_operators: independent operators of
one input computed into one stacked tensor, and a stacked tensor split back into one tensor per part
(the patterns: `strategies.analysis.stacked`).

Both rewrites keep every statement's expression, so every element is computed by the same
operations in the same order; only where the values are stored changes. Both are bitwise exact.

- tensor_concat_to_fuse_operators: either (`stacked_operands`) one nest with a new leading loop over
  the parts computes the stacked result from stacked (concatenated) copies of the operands that
  differ, e.g. QKV = X @ [Wq;Wk;Wv]; or (`stacked_results`, plain stores only) one nest computes
  every part's statement into its slice of the stacked result. Readers of part k read slice k.
- tensor_split_to_decouple_operators: an intermediate whose writes and reads all use a literal
  leading index becomes one tensor per part (`literal`); a single-statement nest whose leading
  write subscript is a loop over the parts becomes one nest per part first (`loop`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from leir.analysis import tensor_table
from leir.ast import Access, Loop, Nest, Num, Program, Stmt, Var
from strategies.analysis import recognition as rec
from strategies.analysis.gates import init_profile
from strategies.analysis.legality import body_statements, iterations, loop_carries_dependence
from strategies.analysis.stacked import (
    MAX_PARTS,
    OUT,
    aligned_part,
    all_accesses,
    concat_groups,
    copy_nest,
    fill_slots,
    forms,
    independent,
    literal_index,
    literal_parts,
    loop_split_site,
    part_output,
    same_loops,
    shared_reads,
    single_statement,
    skeleton,
    stacked,
    template,
    unroll_parts,
    value_uses,
)
from strategies.analysis.tree import fresh_indices, fresh_tensors, map_accesses, replace_nests
from strategies.base import Context, Match, Nests, Params, Rewrite, Site, Strategy, params_dataclass
from strategies.registry import register

# --- tensor_concat_to_fuse_operators ------------------------------------------------------------------


@params_dataclass
class StackParams(Params):
    form: str   # stacked_operands or stacked_results (strategies.analysis.stacked.forms)


def _new_tensors(ctx: Context, program: Program) -> set[str]:
    """The tensors of `program` that the context's program does not have."""
    return set(tensor_table(program, ctx.signature)) - set(ctx.tensors)


@register
class TensorConcatToFuseOperators(Strategy):
    name = "tensor_concat_to_fuse_operators"
    level = "graph"
    exactness = "exact"
    description = ("Compute independent operators of one input that have the same loops in one nest, "
                   "into one stacked tensor (from concatenated operands, e.g. QKV = X @ [Wq;Wk;Wv]).")
    params_type = StackParams

    def recognizes(self, before, after, signature):
        """Two or more intermediates of one shape are gone and a new intermediate has that shape
        with one more axis (the parts stacked, on any axis)."""
        old, new = rec.shaped_intermediates(before, signature), rec.shaped_intermediates(after, signature)
        gone = Counter((tuple(i.shape), i.dtype) for n, i in old.items() if n not in new)
        return any(count >= 2 and _stacks(tuple(info.shape), shape) and info.dtype == dtype
                   for name, info in new.items() if name not in old for (shape, dtype), count in gone.items())

    def sites(self, ctx):
        for parts in concat_groups(ctx):
            nests = ctx.program.nests
            outs = tuple(single_statement(nests[p]).lhs.tensor for p in parts)
            yield Site(parts[0], loops=tuple(lp.var for lp in nests[parts[0]].loops),
                       stmts=tuple(next(s.order for s in ctx.sites if s.nest_index == p) for p in parts),
                       tensors=outs, match=Nests(tuple(parts)))

    def parameters(self, ctx, site):
        parts = site.match.nests
        anchor = ctx.program.nests[parts[0]]
        for form in forms(ctx, [aligned_part(anchor, ctx.program.nests[p]) for p in parts]):
            yield {"form": form}

    def check(self, ctx, site, params):
        parts = list(site.match.nests)
        problem = self._parts_problem(ctx, parts, params.form)
        if problem or params.form != "stacked_operands":
            return problem
        return self._operands_problem(ctx, self._stmts(ctx, parts))

    def gate(self, ctx, site, params, rewrite):
        outs = [s.lhs.tensor for s in self._stmts(ctx, list(site.match.nests))]
        return self._inits_problem(ctx, rewrite.program, outs, _new_tensors(ctx, rewrite.program), params.form)

    def build(self, ctx, site, params):
        parts, form = list(site.match.nests), params.form
        stmts = self._stmts(ctx, parts)
        anchor = ctx.program.nests[parts[0]]
        outs = [s.lhs.tensor for s in stmts]
        names = fresh_tensors(ctx.program, ctx.signature)
        result = names.fresh()
        if form == "stacked_operands":
            new, operands = self._operands(ctx, anchor, stmts, result, names)
        else:
            new, operands = (Nest(anchor.loops, tuple(Stmt(stacked(result, s.lhs, Num(k)), s.rhs)
                                                     for k, s in enumerate(stmts))),), []
        kept = [n for i, n in enumerate(ctx.program.nests) if i not in parts[1:]]
        first = parts[0]  # the later parts were after it, so it keeps its position
        program = replace_nests(Program(tuple(kept)), first, 1, new)
        # No part reads another's result, so the old results occur only in their readers now.
        program = map_accesses(program, {o: (lambda a, k=k: stacked(result, a, Num(k))) for k, o in enumerate(outs)})
        return Rewrite(program, self._facts(ctx, parts, outs, result, operands, form),
                       self._summary(anchor, parts, outs, result, form))

    def _stmts(self, ctx: Context, parts: list[int]) -> list[Stmt]:
        """The parts' statements in the first part's loop variables."""
        anchor = ctx.program.nests[parts[0]]
        return [aligned_part(anchor, ctx.program.nests[p]) for p in parts]

    def _parts_problem(self, ctx: Context, parts: list[int], form: str) -> str | None:
        """Why the parts cannot be stacked in `form`, or None."""
        nests = ctx.program.nests
        if len(parts) < 2 or len(parts) > MAX_PARTS or any(part_output(ctx, nests[p]) is None for p in parts):
            return "each part must be a one-statement nest writing its own intermediate"
        anchor = nests[parts[0]]
        if not all(same_loops(anchor, nests[p]) for p in parts):
            return "the parts do not run the same loops"
        stmts = self._stmts(ctx, parts)
        infos = [ctx.tensors[s.lhs.tensor] for s in stmts]
        if len({(i.shape, i.dtype, i.scope) for i in infos}) != 1:
            return "the parts' results differ in shape, dtype or scope"
        if form not in forms(ctx, stmts):
            return f"the parts cannot be stacked as {form}"
        return independent(ctx, parts)

    def _operands_problem(self, ctx, stmts) -> str | None:
        """Why the operands that differ between the parts cannot be stacked (they differ in shape)."""
        _, base = template(stmts[0])
        per_part = [template(s)[1] for s in stmts]
        for i, a in enumerate(base):
            column = [slots[i] for slots in per_part]
            if a.tensor != OUT and len({c.tensor for c in column}) > 1 \
                    and len({ctx.tensors[c.tensor].shape for c in column}) != 1:
                return f"the operands {', '.join(c.tensor for c in column)} differ in shape"
        return None

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
                name = names.fresh()
                copies.append(copy_nest(ctx, name, column))
                operands.append((name, [c.tensor for c in column]))
                values.append(Access(name, a.dtype, "g", (Var(g),) + a.indices))
        lhs = stacked(result, stmts[0].lhs, Var(g))
        body = Stmt(lhs, fill_slots(skeleton(stmts[0].rhs, []), values))
        merged = Nest((Loop("L", len(stmts), g),) + anchor.loops, (body,))
        return tuple(copies) + (merged,), operands

    def _inits_problem(self, ctx, program, outs, new, form) -> str | None:
        """Why the stacked program changes an implicit initialisation (`new`: the stacked result and
        operands), or None."""
        old_others, old_own = init_profile(ctx.program, ctx, set(outs))
        new_others, new_own = init_profile(program, ctx, new)
        new_own = [v for v in new_own if v is not None] if form == "stacked_operands" else new_own
        want = ([old_own[0]] if old_own[0] is not None else []) if form == "stacked_operands" else old_own
        if old_others != new_others or new_own != want or len(set(old_own)) != 1:
            return "a reduction would gain or lose its implicit initialisation"
        return None

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

    def _summary(self, anchor, parts, outs, result, form):
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

@dataclass(frozen=True)
class LoopParts(Match):
    """The site's nest writes the parts in a loop over the leading index (split per part first)."""

    def to_json(self) -> dict:
        return {"form": "loop"}


@dataclass(frozen=True)
class LiteralParts(Match):
    """The site's tensor is accessed only at these literal leading indices (the written parts)."""

    parts: tuple[int, ...]

    def to_json(self) -> dict:
        return {"form": "literal", "parts": list(self.parts)}


@params_dataclass
class SplitPartsParams(Params):
    """`parts: all` splits every part off; `part: k` only part k (of three or more)."""

    parts: Literal["all"] | None = None
    part: int | None = None


@register
class TensorSplitToDecoupleOperators(Strategy):
    name = "tensor_split_to_decouple_operators"
    level = "graph"
    exactness = "exact"
    description = ("Split a tensor stacked on a leading index into one tensor per part (and a nest that "
                   "loops over the parts into one nest per part), so each consumer depends only on its part.")
    enables = ("compute_inline", "dead_code_elimination", "operator_fusion")
    params_type = SplitPartsParams

    def recognizes(self, before, after, signature):
        """New intermediates of a shape that a stacked intermediate has with one more axis, which is
        gone or accessed less."""
        old, new = rec.shaped_intermediates(before, signature), rec.shaped_intermediates(after, signature)
        added = [i for n, i in new.items() if n not in old]
        for name, info in old.items():
            if name in new and rec.uses(after, name) >= rec.uses(before, name):
                continue
            parts = [i for i in added if _stacks(tuple(info.shape), tuple(i.shape)) and i.dtype == info.dtype]
            if len(parts) >= 2 or (parts and name in new):  # all parts split off, or one of them
                return True
        return False

    def sites(self, ctx):
        for top in range(len(ctx.program.nests)):
            found = loop_split_site(ctx, top)
            if found:
                stmt, loop = found
                order = next(s.order for s in ctx.sites if s.nest_index == top)
                yield Site(top, loops=(loop.var,), stmts=(order,), tensors=(stmt.lhs.tensor,), match=LoopParts())
        for name in ctx.tensors:
            parts = literal_parts(ctx, name)
            if parts is None or len(parts) < 2:
                continue
            writes = [o for o, _, w in all_accesses(ctx, name) if w]
            yield Site(ctx.sites[writes[0]].nest_index, stmts=tuple(writes), tensors=(name,),
                       match=LiteralParts(tuple(parts)))

    def parameters(self, ctx, site):
        yield {"parts": "all"}
        if isinstance(site.match, LiteralParts) and len(site.match.parts) > 2:
            for k in site.match.parts:
                yield {"part": k}

    def check(self, ctx, site, params):
        tensor = site.tensors[0]
        if (params.parts is None) == (params.part is None):
            return "a split names every part (parts: all) or one part (part: k)"
        if isinstance(site.match, LoopParts):
            problem = self._loop_problem(ctx, site, tensor)
            if problem:
                return problem
        work = self._unroll(ctx, site, tensor)[0] if isinstance(site.match, LoopParts) else ctx
        parts = literal_parts(work, tensor)
        if parts is None or len(parts) < 2:
            return f"{tensor} is not accessed only at literal leading indices"
        chosen = self._chosen(parts, params)
        if any(k not in parts for k in chosen):
            return f"{tensor} has no part {chosen}"
        read_parts = {literal_index(a.indices[0]) for _, a, w in all_accesses(work, tensor) if not w}
        if not read_parts <= set(parts):
            return f"{tensor} is read at a part that is never written"
        return None

    def _chosen(self, parts: list[int], params: SplitPartsParams) -> list[int]:
        return parts if params.parts == "all" else [params.part]

    def gate(self, ctx, site, params, rewrite):
        tensor = site.tensors[0]
        pieces = self._unroll(ctx, site, tensor)[2] if isinstance(site.match, LoopParts) else 1
        old_others, old_own = init_profile(ctx.program, ctx, {tensor})
        new_others, new_own = init_profile(rewrite.program, ctx, {tensor, *_new_tensors(ctx, rewrite.program)})
        if old_others != new_others or new_own != old_own * pieces:  # the loop form: one writer per part now
            return "a reduction would gain or lose its implicit initialisation"
        return None

    def build(self, ctx, site, params):
        tensor = site.tensors[0]
        loop_form = isinstance(site.match, LoopParts)
        work, facts, _ = self._unroll(ctx, site, tensor) if loop_form else (ctx, [], 1)
        chosen = self._chosen(literal_parts(work, tensor), params)
        names = fresh_tensors(work.program, ctx.signature)
        new = {k: names.fresh() for k in chosen}

        def split(a: Access) -> Access:
            k = literal_index(a.indices[0])
            return Access(new[k], a.dtype, a.scope, a.indices[1:]) if k in new else a

        program = map_accesses(work.program, {tensor: split})
        readers = sorted({o for o, a, w in all_accesses(work, tensor) if not w})
        return Rewrite(program, tuple(facts + self._facts(tensor, new)), self._summary(tensor, new, readers, loop_form))

    def _loop_problem(self, ctx, site, tensor) -> str | None:
        """Why the nest's loop over the parts cannot become one nest per part, or None."""
        found = loop_split_site(ctx, site.nest)
        if found is None or found[0].lhs.tensor != tensor:
            return f"{tensor} is not written by a loop over its leading index read only by literal parts"
        stmt, loop = found
        carried = loop_carries_dependence(body_statements(ctx.program.nests[site.nest]), loop.var)
        if carried:
            return f"iterations of {loop.var} interact: {carried}"
        if value_uses(stmt, loop.var):
            return f"{loop.var} is used as a value, not only as a subscript"
        return None

    def _unroll(self, ctx, site, tensor) -> tuple[Context, list[str], int]:
        """The program with the loop over the parts replaced by one nest per part (literal leading
        subscripts), the facts checked, and the number of parts (a loop `_loop_problem` passed)."""
        stmt, loop = loop_split_site(ctx, site.nest)
        pieces = unroll_parts(ctx.program.nests[site.nest], loop)
        facts = [f"loop {loop.var} ({loop.extent} iterations) runs over the leading index of {tensor}, and its "
                 f"iterations do not interact (each writes and reads only its own slice of {tensor})",
                 f"{loop.var} appears only in subscripts, so one nest per value of {loop.var}, in order, computes "
                 "the same elements with the same operations"]
        return ctx.with_program(replace_nests(ctx.program, site.nest, 1, pieces)), facts, len(pieces)

    def _facts(self, tensor: str, new: dict[int, str]) -> list[str]:
        listed = ", ".join(f"{tensor}[{k}] -> {name}" for k, name in new.items())
        return [f"{tensor} is an intermediate whose every write and read names its part by a literal leading index, "
                f"so each part can live in a tensor of its own: {listed}",
                "no access changes its element, only the tensor that holds it; reductions keep their "
                "implicit initialisation"]

    def _summary(self, tensor: str, new: dict[int, str], readers: list[int], loop_form: bool) -> str:
        also = "one nest per part and " if loop_form else ""
        plural = "s" if len(readers) != 1 else ""
        return (f"{tensor} is split into {also}{len(new)} separate tensor{'s' if len(new) > 1 else ''} "
                f"({', '.join(new.values())}): the {len(readers)} reading statement{plural} "
                "now depend only on the part they use, so a part can be inlined, fused with its consumer or "
                "scheduled on its own.")


def _stacks(stacked: tuple[int, ...], part: tuple[int, ...]) -> bool:
    """`stacked` is `part` with one more axis (of two or more parts) somewhere."""
    return len(stacked) == len(part) + 1 and any(
        stacked[:i] + stacked[i + 1:] == part and stacked[i] >= 2 for i in range(len(stacked)))
