"""Dependence facts the loop strategies check (conservative: when unsure, the answer is 'carried')."""
from __future__ import annotations

from leir.analysis import affine_form, index_range, loop_bounds
from leir.ast import Access, Loop, Nest, Stmt, Var, accesses, walk_expr


def body_statements(nest: Nest, outer: tuple[Loop, ...] = ()) -> list[tuple[Stmt, tuple[Loop, ...]]]:
    """Statements of a nest with all loops that enclose them (outer ones given), in order."""
    loops = outer + nest.loops
    out = []
    for item in nest.body:
        if isinstance(item, Stmt):
            out.append((item, loops))
        else:
            out.extend(body_statements(item, loops))
    return out


def separating_dim(acc: Access, var: str, loops: tuple[Loop, ...]) -> int | None:
    """A subscript dimension in which different values of `var` always give different elements:
    affine, `var` with coefficient c != 0, and every other term spanning less than |c|."""
    bounds = loop_bounds(loops)
    for d, ix in enumerate(acc.indices):
        form = affine_form(ix)
        if form is None or form[0].get(var, 0) == 0:
            continue
        c = abs(form[0][var])
        rest_span = 0
        for other, k in form[0].items():
            if other == var:
                continue
            if other not in bounds:
                break
            lo, hi = bounds[other]
            rest_span += abs(k) * (hi - lo)
        else:
            if rest_span < c:
                return d
    return None


def loop_carries_dependence(stmts: list[tuple[Stmt, tuple[Loop, ...]]], var: str) -> str | None:
    """Why iterations of loop `var` may interact, or None when they are independent: each write
    separates iterations in some dimension, and every read of a tensor written under the loop uses
    the same subscript as the write in that dimension."""
    written: dict[str, tuple[int, object]] = {}
    for stmt, loops in stmts:
        d = separating_dim(stmt.lhs, var, loops)
        if d is None:
            return (f"{stmt.lhs.tensor} is written at the same element by several iterations of {var} "
                    f"({var} is a reduction axis of it or does not separate its writes)")
        prev = written.get(stmt.lhs.tensor)
        if prev is not None and prev != (d, stmt.lhs.indices[d]):
            return f"{stmt.lhs.tensor} is written with different subscripts in dimension {d + 1}"
        written[stmt.lhs.tensor] = (d, stmt.lhs.indices[d])
    for stmt, _ in stmts:
        for acc in _reads(stmt):
            if acc.tensor in written:
                d, ix = written[acc.tensor]
                if len(acc.indices) <= d or acc.indices[d] != ix:
                    return f"{acc.tensor} is read at another iteration's element than the one written"
    return None


def _reads(stmt: Stmt):
    for ix in stmt.lhs.indices:
        yield from accesses(ix)
    yield from accesses(stmt.rhs)


def uses_var(stmts: list[tuple[Stmt, tuple[Loop, ...]]], var: str) -> bool:
    return any(isinstance(n, Var) and n.name == var
               for stmt, _ in stmts for n in (*walk_expr(stmt.lhs), *walk_expr(stmt.rhs)))


def iterations(loops: tuple[Loop, ...]) -> int:
    total = 1
    for lp in loops:
        total *= lp.extent
    return total


__all__ = ["body_statements", "separating_dim", "loop_carries_dependence", "uses_var", "iterations",
           "index_range"]
