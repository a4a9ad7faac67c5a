"""set_storage_scope: an intermediate placed in global, shared or local memory.

Known tensors (the signature) are never touched: they keep their names, shapes, dtypes and global
scope, and the program output never moves to shared or local memory.
"""
from __future__ import annotations

import math
from typing import Literal

from leir.ast import Access
from strategies.analysis import recognition as rec
from strategies.analysis.legality import aligned, stmt_reads
from strategies.analysis.tree import map_accesses, tensor_accesses
from strategies.base import Context, Params, Rewrite, Site, Strategy, params_dataclass
from strategies.registry import register

SCOPE_NAMES = {"g": "global", "s": "shared", "l": "local"}


@params_dataclass
class ScopeParams(Params):
    scope: Literal["g", "s", "l"]   # global, shared or local memory


def _written_first(uses, tensor: str) -> bool:
    """The first statement that touches `tensor` writes it without reading it."""
    first = uses[0][1].stmt
    return first.lhs.tensor == tensor and not any(a.tensor == tensor for a in stmt_reads(first))


def scope_problem(ctx: Context, tensor: str, scope: str) -> str | None:
    """Why `tensor` cannot live in `scope` (None when it can)."""
    info = ctx.tensors[tensor]
    if info.known:
        return f"{tensor} is a known tensor: it stays in global memory"
    uses = tensor_accesses(ctx, tensor)
    nests = {s.nest_index for _, s in uses}
    if len(nests) > 1 and scope == "g":
        return None
    if len(nests) > 1:
        return (f"{tensor} is used in nests {', '.join(str(n + 1) for n in sorted(nests))}: its value crosses "
                f"kernels, which {SCOPE_NAMES[scope]} memory does not survive")
    # Loops whose iterations share one copy of the tensor (parallel loops on the CPU; on CUDA, threads
    # share shared and global memory, blocks share global memory) must each touch their own elements;
    # where each iteration has a private copy, the iteration must write before it reads.
    top = ctx.program.nests[next(iter(nests))] if nests else None
    for lp in top.loops if top else ():
        shared = lp.kind == "P" or (lp.kind == "B" and (scope == "g" or (scope == "s" and lp.var[0] == "t")))
        if lp.kind not in ("P", "B"):
            continue
        if shared:
            for a, s in uses:
                for b, r in uses:
                    if not aligned(a, s.loops, b, r.loops, lp.var):
                        return (f"different iterations of {lp.var} touch the same element of {tensor}, but "
                                f"{SCOPE_NAMES[scope]} memory is shared between them")
        elif not _written_first(uses, tensor):
            return f"a private copy per {lp.var} would be read before this iteration writes it"
    return None


@register
class SetStorageScope(Strategy):
    name = "set_storage_scope"
    level = "memory"
    exactness = "exact"
    description = "Place an intermediate in global, shared or local memory."
    search_prior = 1.5
    params_type = ScopeParams

    def recognizes(self, before, after, signature):
        """An intermediate in another scope."""
        old, new = rec.intermediates(before, signature), rec.intermediates(after, signature)
        return any(name in old and old[name].scope != info.scope for name, info in new.items())

    def sites(self, ctx):
        for name, info in ctx.tensors.items():
            if not info.known:
                yield Site(tensor_accesses(ctx, name)[0][1].nest_index, tensors=(name,))

    def parameters(self, ctx, site):
        current = ctx.tensors[site.tensors[0]].scope
        for scope in ("g", "s", "l"):
            if scope != current:
                yield {"scope": scope}

    def check(self, ctx, site, params):
        return scope_problem(ctx, site.tensors[0], params.scope)

    def build(self, ctx, site, params):
        tensor, scope = site.tensors[0], params.scope
        program = map_accesses(ctx.program, {tensor: lambda a: Access(a.tensor, a.dtype, scope, a.indices)})
        return Rewrite(program, self._facts(tensor, scope), self._summary(ctx, tensor, scope))

    def _facts(self, tensor: str, scope: str) -> tuple[str, ...]:
        facts = (f"{tensor} is an intermediate (not in the signature); known tensors stay global",)
        if scope != "g":
            facts += (f"every access of {tensor} lies in one nest, so its value never crosses a kernel",
                      f"each {'thread' if scope == 'l' else 'block'} only touches its own elements of {tensor}")
        return facts

    def _summary(self, ctx: Context, tensor: str, scope: str) -> str:
        info = ctx.tensors[tensor]
        where = {"g": "global memory, visible to every kernel", "s": "shared memory, on chip, shared by a block",
                 "l": "local memory (registers), private to a thread"}[scope]
        size = math.prod(info.shape or ())
        if ctx.gpu:
            return f"The {size} elements of {tensor} ({info.dtype}) move from {SCOPE_NAMES[info.scope]} to {where}."
        if scope == "l" and not info.shape:
            return (f"{tensor} ({info.dtype}, one element) becomes local: on the CPU a local scalar is kept in a "
                    "register instead of a memory buffer.")
        return (f"The {size} elements of {tensor} ({info.dtype}) are marked {SCOPE_NAMES[scope]} instead of "
                f"{SCOPE_NAMES[info.scope]}: a CPU has no separate shared or local memory, the buffer stays behind "
                "the same caches, so the step brings no memory benefit there; it fixes where "
                f"{tensor} lives when the program is compiled for a GPU.")
