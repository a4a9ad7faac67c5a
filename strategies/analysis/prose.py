"""Small helpers for the facts and effects a rule states (kept apart from its tree surgery)."""
from __future__ import annotations

from leir.ast import Nest


def plural(n: int, word: str) -> str:
    """`1 operation`, `3 operations`: the count, then the word with an `s` unless n is 1."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def loops_text(nest: Nest) -> str:
    """The loops of a nest as `var(extent)...`, outermost first (`tx(4)a(8)c(6)`)."""
    return "".join(f"{lp.var}({lp.extent})" for lp in nest.loops)
