"""Golden and legality tests of the 12 sympy-based mathematical strategies (one statement each)."""
from __future__ import annotations

import pytest
import sympy
from strategy_cases import assert_golden, ctx, results, sig

from strategies.analysis.algebra import identity_problem
from strategies.analysis.sympy_bridge import Bridge, new_divisions
from strategies.base import Illegal
from strategies.registry import get

SIG = sig(("A", [4, 8], "float64", "input"), ("C", [4, 7], "float64", "input"), ("D", [4, 7], "float64", "output"))
A, B, C = "A^{f64,g}_{tx,a}", "A^{f64,g}_{tx,a+1}", "C^{f64,g}_{tx,a}"


def prog(rhs: str) -> str:
    """D_{tx,a} = rhs, with A, B, C standing for A_{tx,a}, A_{tx,a+1}, C_{tx,a}."""
    rhs = "".join({"A": A, "B": B, "C": C}.get(ch, ch) for ch in rhs)
    return "B^{4}_{tx=0}L^{7}_{a=0}[D^{f64,g}_{tx,a}=" + rhs + ";];"


def test_factorization():
    assert_golden("factorization", prog("A*A+A*C"), [prog("A*(A+C)")], SIG)
    assert_golden("factorization", prog("A*A-C*C"), [prog("(A+C)*(A-C)")], SIG)


def test_expand_factorization_keeps_neighbouring_accesses_distinct():
    # The published implementation merged A_{tx,a} and A_{tx,a+1} into one symbol: (A+C)*(A-C) = A**2-C**2.
    assert_golden("expand_factorization", prog("(A+C)*(B-C)"), [prog("B*A+B*C-A*C-C**2")], SIG)


def test_cancellation_and_expand_cancellation():
    assert_golden("cancellation", prog("(A*A-C*C)/(A+C)"), [prog("A-C")], SIG)
    assert_golden("expand_cancellation", prog("(A+C)/(1+C*C)"), [prog("A/(C**2+1)+C/(C**2+1)")], SIG)


def test_apart_is_real_partial_fractions():
    assert_golden("apart", prog("(A*A+1)/(A*A+3)"), [prog("1-2/(A**2+3)")], SIG)
    assert_golden("apart", prog("A/(A+C)"), [prog("1-C/(A+C)")], SIG)


def test_together():
    assert_golden("together", prog("A/C+C/A"), [prog("(A**2+C**2)/(A*C)")], SIG)


def test_powsimp_pair():
    assert_golden("powsimp", prog("exp(A)*exp(C)+A**2*A**3"), [prog("A**5+exp(A+C)")], SIG)
    assert_golden("expand_powsimp", prog("exp(A+C)"), [prog("exp(A)*exp(C)")], SIG)


def test_log_pair_directions():
    assert_golden("expand_log", prog("log(exp(A)*(C*C+1))"), [prog("A+log(C**2+1)")], SIG)
    assert_golden("logsimp", prog("log(A*A+1)+log(C*C+1)"), [prog("log((A**2+1)*(C**2+1))")], SIG)
    assert results("logsimp", prog("log(exp(A)*(C*C+1))"), SIG) == []


def test_expand_log_needs_provably_positive_factors():
    assert results("expand_log", prog("log(A*C)"), SIG) == []
    assert results("expand_log", prog("log(A*A*C)"), SIG) == []


def test_collect_pair_one_variant_per_symbol():
    assert_golden("collect", prog("A*C+A*B+C*B"),
                  [prog("B*C+A*(B+C)"), prog("B*A+C*(B+A)"), prog("B*(A+C)+A*C")], SIG)
    assert_golden("expand_collect", prog("A*(C+B)+C"), [prog("B*A+A*C+C")], SIG)


def test_a_reprint_is_not_a_step():
    for name in ("factorization", "powsimp", "cancellation", "together", "collect"):
        assert results(name, prog("A*A"), SIG) == [], name


def test_accumulator_form_is_kept():
    text = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}+(A^{f64,g}_{tx,a}+1)**2;];"
    want = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}+(A^{f64,g}_{tx,a}**2+2*A^{f64,g}_{tx,a}+1);];"
    s = sig(("A", [4, 8], "float64", "input"), ("D", [4], "float64", "output"))
    assert_golden("expand_factorization", text, [want], s)


def test_integer_statements_are_left_alone():
    s = sig(("A", [4], "int64", "input"), ("D", [4], "int64", "output"))
    text = "B^{4}_{tx=0}[D^{i64,g}_{tx}=A^{i64,g}_{tx}*A^{i64,g}_{tx}+A^{i64,g}_{tx}*2;];"
    assert results("factorization", text, s) == []


def test_new_division_guard():
    x, y = sympy.symbols("x y", real=True)
    after = sympy.Mul(x**2 - y**2, sympy.Pow(x - y, -1, evaluate=False), evaluate=False)
    assert new_divisions(x + y, after) == [x - y]
    assert new_divisions(x / y + 1, (x + y) / y) == []
    assert new_divisions(sympy.log(x) - sympy.log(y), sympy.log(x / y)) == []
    assert new_divisions(x, x * sympy.exp(y) / sympy.exp(y) + 1 / (y**2 + 1)) == []


def test_one_symbol_per_distinct_access():
    from leir.parse import parse_expr

    bridge = Bridge()
    e = bridge.to_sympy(parse_expr(f"{A}*{B}-{B}*{A}+{A}-{B}"))
    assert len(e.free_symbols) == 2 and e != 0


def test_records_carry_facts_and_numbers():
    t = next(get("factorization").transformations(ctx(prog("A*A+A*C"), SIG)))
    assert t.exactness == "reassociating" and t.level == "mathematical"
    assert any("one symbol per distinct access" in f for f in t.facts)
    assert "3 operations" in t.summary and "28 times" in t.summary


def test_the_spot_check_refuses_an_identity_it_could_not_evaluate_anywhere():
    """exp(exp(100*A)) is infinite at every sample point of the numeric spot check (A >= 1/8 there),
    so the check confirms nothing. Before issue 23 it counted the points it evaluated, never read the
    count, and passed: factorization stepped to (A+C)*exp(exp(100*A)) untested. Now it is refused,
    with the reason."""
    big = f"exp(exp({A}*100))"
    text = "B^{4}_{tx=0}L^{7}_{a=0}[D^{f64,g}_{tx,a}=" + f"{big}*{A}+{big}*{C}" + ";];"
    st, c = get("factorization"), ctx(text, SIG)
    (site,) = st.sites(c)
    with pytest.raises(Illegal, match="the numeric spot check evaluated none of its 6 sample points"):
        st.rewrite(c, site, {})
    assert results("factorization", text, SIG) == []


def test_the_spot_check_tries_probabilities_where_logs_of_one_minus_p_are_complex():
    """A binary cross-entropy term reads log(1-D) of a sigmoid output D: at the first sample points
    (D >= 3/8 up to 29/8, here all above 1) it is complex and max(.., -100) cannot compare it, so none
    evaluates; the points in (0, 1) do, and confirm the identity (the default profile's BCE loss keeps
    its cancellation, together, apart and expand_factorization steps; sympy's factor only brings it
    over one denominator, which is together's step, and is refused as a factorization)."""
    s = sig(("C", [4, 8], "float32", "input"), ("D", [4, 8], "float32", "input"), ("F", [], "float32", "output"))
    bce = ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f32,g}=F^{f32,g}+-(1/(1+exp(-C^{f32,g}_{tx,a}))*max(log(D^{f32,g}_{tx,a}),-100)"
           "+(1-1/(1+exp(-C^{f32,g}_{tx,a})))*max(log(1-D^{f32,g}_{tx,a}),-100))/512;];")
    assert results("together", bce, s) == [
        "B^{4}_{tx=0}L^{8}_{a=0}[F^{f32,g}=F^{f32,g}+(-max(log(D^{f32,g}_{tx,a}),-100)-max(log(1-D^{f32,g}_{tx,a}),"
        "-100)*exp(-C^{f32,g}_{tx,a}))/(512*(1+exp(-C^{f32,g}_{tx,a})));];"]
    assert results("factorization", bce, s) == []


def test_the_spot_check_passes_identities_and_refuses_wrong_ones():
    x, y = sympy.symbols("x y", real=True)
    assert identity_problem(x * x + x * y, x * (x + y)) is None
    assert identity_problem(x * x + x * y, x * (x - y)) == "numeric spot check of the identity failed"
    untested = sympy.exp(sympy.exp(100 * x))
    assert "evaluated none" in identity_problem(untested * (x + y), untested * x + untested * y)
    # exp(exp(exp(x))) is finite at the first sample point (x = 11/8) only: the other two are skipped,
    # and the one evaluated decides
    partly = sympy.exp(sympy.exp(sympy.exp(x)))
    assert identity_problem(partly * (x + y), partly * x + partly * y) is None
    assert identity_problem(partly * (x + y), partly * (x - y)) == "numeric spot check of the identity failed"
    # max(log(1-p), -100) cannot be compared where p > 1 (log(1-p) is complex): so at every first
    # point of this pair (D = 3/2, 2, 11/4); the points in (0, 1) judge it
    from leir.parse import parse_expr

    bridge = Bridge()
    clipped = bridge.to_sympy(parse_expr("max(log(1-D^{f32,g}_{tx,a}),-100)"))
    (p,) = clipped.free_symbols
    q = bridge.to_sympy(parse_expr("C^{f32,g}_{tx,a}"))
    assert identity_problem(clipped * (p + q), clipped * p + clipped * q) is None
    assert identity_problem(clipped * (p + q), clipped * p) == "numeric spot check of the identity failed"
