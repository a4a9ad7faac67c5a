"""The last checks on a rewritten program, before it becomes a step (a rule's `gate`, after its check
and its build). A rewrite must not change which statements are reductions with implicit initialisation
(docs/leir.md §4.4) nor start from a clean program and end with validation errors. The levels state the
first in the form that fits what they move:

- `finish_problem` (the mathematical rules): validates clean when the input did, and, unless the
  rewrite restructures reductions on purpose (`same_inits=False`), the same statements start from the
  same identities;
- `inits_problem` (the graph rules that remove, split or move statements): the identities follow the
  statements to their new positions (`order_map`);
- `init_profile` (the stacked-tensor rules, which also merge or split the written tensors): the
  identities of the statements writing some tensors, apart from those of the others.

The loop and memory rules keep every statement and its accumulator form, so their own legality says
why the initialisations cannot change.
"""
from __future__ import annotations

from functools import lru_cache

from leir.analysis import implicit_inits, statement_sites
from leir.ast import Program
from leir.validate import validate
from strategies.base import Context


def finish_problem(ctx: Context, program: Program, same_inits: bool = True) -> str | None:
    """The last legality gate for every mathematical rewrite: why the result is refused (it does not
    validate although the input did, or a statement gains or loses an implicit initialisation), or
    None."""
    if _valid(ctx.program, ctx.signature):
        problems = validate(program, ctx.signature)
        if problems:
            return f"the result does not validate: {problems[0]}"
    if same_inits and implicit_inits(program, ctx.signature) != ctx.inits:
        return "the rewrite would change which statements get an implicit initialisation"
    return None


@lru_cache(maxsize=256)
def _valid(program: Program, signature) -> bool:
    return not validate(program, signature)


def inits_problem(ctx: Context, program: Program, order_map: dict[int, int] | None = None) -> str | None:
    """Why the result is refused when a reduction gains or loses its implicit initialisation
    (docs/leir.md §4.4), or None. `order_map` maps old statement positions to new ones (identity when
    absent)."""
    old, new = ctx.inits, implicit_inits(program, ctx.signature)
    moved = {(order_map or {}).get(k, k): v for k, v in old.items()}
    return None if moved == new else "a reduction would gain or lose its implicit initialisation"


def positions_without(ctx: Context, removed: list[int]) -> dict[int, int]:
    """Old statement positions -> new ones after removing the statements at `removed`."""
    out, k = {}, 0
    for s in ctx.sites:
        if s.order in removed:
            continue
        out[s.order] = k
        k += 1
    return out


def init_profile(program: Program, ctx: Context, tensors: set[str]) -> tuple[list, list]:
    """(identities of the statements writing other tensors, identities of those writing `tensors`),
    each in program order (None: no implicit initialisation)."""
    inits = implicit_inits(program, ctx.signature)
    others, own = [], []
    for s in statement_sites(program):
        (own if s.stmt.lhs.tensor in tensors else others).append(inits.get(s.order))
    return others, own
