"""What the mathematical strategies share: the part of a statement algebra may touch, the final
legality gate on a rewritten program, and the effect numbers."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from leir.analysis import StmtSite, implicit_inits, reduction_op
from leir.ast import Access, BinOp, Call, Program, Stmt
from leir.printer import format_expr
from leir.validate import validate
from strategies.base import Context, Illegal
from strategies.legality import iterations
from strategies.numerics import unshifted_exp_problem
from strategies.sympy_bridge import FLOAT_CODES


@dataclass(frozen=True)
class Target:
    """The expression of a statement that an algebraic rewrite may change: the whole right-hand side
    of a plain store, or `e` of an accumulation `X op e` / `max(X,e)` (the accumulator form must stay
    as it is, or the implicit initialisation of LEIR.md §4.4 would change)."""

    stmt: Stmt
    expr: object
    op: str | None  # the accumulation operator kept around `expr`, None for a plain store

    def rebuild(self, expr) -> Stmt:
        x = self.stmt.lhs
        if self.op is None:
            return Stmt(x, expr)
        if self.op in ("max", "min"):
            return Stmt(x, Call(self.op, (x, expr)))
        return Stmt(x, BinOp(self.op, x, expr))


def algebra_target(stmt: Stmt) -> Target | None:
    """None for statements algebra must not touch: non-float results, accumulations of other shapes."""
    if stmt.lhs.dtype not in FLOAT_CODES:
        return None
    rhs, x = stmt.rhs, stmt.lhs
    op = reduction_op(stmt)
    if op in ("max", "min") and isinstance(rhs, Call) and rhs.args[0] == x:
        return Target(stmt, rhs.args[1], op)
    if op is not None and isinstance(rhs, BinOp) and rhs.lhs == x:
        return Target(stmt, rhs.rhs, op)
    if op is not None:
        return None  # `X+e1+e2`: the accumulator sits deeper in a chain; leave it
    return Target(stmt, rhs, None)


def finish(ctx: Context, program: Program, same_inits: bool = True) -> Program:
    """The last legality gate for every mathematical rewrite: the result validates clean (when the
    input did) and no statement gains or loses an implicit initialisation."""
    if _valid(ctx.program, ctx.signature):
        problems = validate(program, ctx.signature)
        if problems:
            raise Illegal(f"the result does not validate: {problems[0]}")
    if same_inits and implicit_inits(program, ctx.signature) != ctx.inits:
        raise Illegal("the rewrite would change which statements get an implicit initialisation")
    return program


@lru_cache(maxsize=256)
def _valid(program: Program, signature) -> bool:
    return not validate(program, signature)


def executions(site: StmtSite) -> int:
    return iterations(site.loops)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def text(node) -> str:
    return format_expr(node)


def is_plain_index(access: Access) -> bool:
    """Every subscript is a bare loop variable, all different (`D_{tx,a}`)."""
    names = [getattr(i, "name", None) for i in access.indices]
    return all(type(i).__name__ == "Var" for i in access.indices) and len(set(names)) == len(names)


def is_element_index(access: Access) -> bool:
    """Every subscript is a bare loop variable or an integer literal, the variables all different
    (`D_{tx,a}`, and `M_{tx,0}` as the translator writes a sum over a kept dimension)."""
    names = [i.name for i in access.indices if type(i).__name__ == "Var"]
    literal = [i for i in access.indices if type(i).__name__ == "Num" and isinstance(i.value, int)]
    return len(names) + len(literal) == len(access.indices) and len(set(names)) == len(names)


def contraction_values(ctx) -> set[str]:
    """Tensors whose values can grow with a reduction length: written by a sum reduction (`X=X+e`,
    `X=X-e`) or computed from such a tensor (attention logits, matmul outputs and what is derived
    from them). Raw inputs stay bounded by how they were drawn; these do not."""
    from leir.analysis import reduction_op
    from leir.ast import accesses

    grown: set[str] = set()
    for s in ctx.sites:
        lhs = s.stmt.lhs.tensor
        if reduction_op(s.stmt) in ("+", "-") or any(a.tensor in grown and a.tensor != lhs
                                                      for a in accesses(s.stmt.rhs)):
            grown.add(lhs)
    return grown


def unguarded_exp(ctx, shifted, shift) -> str | None:
    """Why exp(`shifted`) without the shift `shift` may overflow, or None: dropping or replacing the
    max shift of a softmax is only safe when the shifted values cannot grow (exp(x) is inf for
    x > 88 in float32), so it is refused for values that come out of a sum reduction, and always in
    a dtype whose exp overflows within the range of ordinary data (float16: above 11)."""
    from leir.analysis import reduction_op
    from leir.ast import accesses

    shifts = {s.stmt.lhs.tensor for s in ctx.sites if reduction_op(s.stmt) == "max"}
    if shift is not None and not any(a.tensor in shifts for a in accesses(shift)):
        return None
    codes = [a.dtype for a in (*accesses(shift if shift is not None else shifted), *accesses(shifted))]
    dtype_problem = unshifted_exp_problem(codes[0]) if codes else None
    if dtype_problem:
        return dtype_problem
    grown = contraction_values(ctx)
    hit = sorted({a.tensor for a in accesses(shifted) if a.tensor in grown})
    if hit:
        return (f"{', '.join(hit)} come{'s' if len(hit) == 1 else ''} out of a sum reduction, so without the max "
                "shift exp can overflow")
    return None
