"""The tree rebuilds of leir/ast.py: bottom-up (`map_expr`) and top-down (`replace_expr`), with or
without the expressions inside subscripts."""
from __future__ import annotations

from leir.ast import Access, Call, Num, Var, map_expr, replace_expr
from leir.parse import parse_expr
from leir.printer import format_expr

EXPR = parse_expr("exp(A^{f64,g}_{tx,c+1})*exp(exp(A^{f64,g}_{tx,c+1}))+C^{f64,g}_{G^{i64,g}_{c+1}}")


def test_map_expr_reaches_subscripts_unless_told_not_to():
    def bump(n):
        return Num(2) if n == Num(1) else n

    assert format_expr(map_expr(EXPR, bump)) == \
        "exp(A^{f64,g}_{tx,c+2})*exp(exp(A^{f64,g}_{tx,c+2}))+C^{f64,g}_{G^{i64,g}_{c+2}}"
    assert map_expr(EXPR, bump, subscripts=False) == EXPR   # the only literals are in subscripts
    seen = []
    map_expr(EXPR, lambda n: seen.append(n) or n, subscripts=False)
    assert [format_expr(n) for n in seen if isinstance(n, Access | Var)] == [
        "A^{f64,g}_{tx,c+1}", "A^{f64,g}_{tx,c+1}", "C^{f64,g}_{G^{i64,g}_{c+1}}"]   # accesses are leaves, in order


def test_replace_expr_is_top_down_and_stops_at_a_replacement():
    x = Access("X", "f64", "g", ())
    outer_first = replace_expr(EXPR, lambda n: x if isinstance(n, Call) and n.fn == "exp" else None)
    assert format_expr(outer_first) == "X^{f64,g}*X^{f64,g}+C^{f64,g}_{G^{i64,g}_{c+1}}"   # exp(exp(..)) whole
    count = [0]

    def second_exp(n):  # the second exp in pre-order: the outer one of exp(exp(..))
        if isinstance(n, Call) and n.fn == "exp":
            count[0] += 1
            return x if count[0] == 2 else None
        return None
    assert format_expr(replace_expr(EXPR, second_exp)) == \
        "exp(A^{f64,g}_{tx,c+1})*X^{f64,g}+C^{f64,g}_{G^{i64,g}_{c+1}}"
    inner = parse_expr("c+1")
    assert replace_expr(EXPR, lambda n: Var("d") if n == inner else None, subscripts=False) == EXPR
