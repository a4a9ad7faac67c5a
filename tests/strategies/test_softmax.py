"""Golden and legality tests of the softmax family and the splits (dataflow patterns over nests)."""
from __future__ import annotations

import pytest
from strategy_cases import assert_golden, ctx, results, sig

from strategies.base import Illegal
from strategies.registry import get

SIG = sig(("A", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"))
MAX = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
SUM = "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];"
NORM = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx})/E^{f64,g}_{tx};];"
SOFTMAX = MAX + SUM + NORM
# the sum nest after exponential_split: exp(A-D) = exp(A)/exp(D)
SUM_SPLIT = "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a})/exp(D^{f64,g}_{tx});];"
RUNNING = ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx}=if_then_else(a-1<0,-inf,D^{f64,g}_{tx});"
           "D^{f64,g}_{tx}=max(F^{f64,g}_{tx},A^{f64,g}_{tx,a});"
           "E^{f64,g}_{tx}=if_then_else(a-1<0,0,E^{f64,g}_{tx}*exp(F^{f64,g}_{tx}-D^{f64,g}_{tx}))"
           "+exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];")


def test_prefix_max_scan_with_explicit_boundary():
    scan = ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx,a}=max(if_then_else(a-1<0,-inf,F^{f64,g}_{tx,a-1}),"
            "A^{f64,g}_{tx,a});D^{f64,g}_{tx}=F^{f64,g}_{tx,a};];")
    assert_golden("normal_loop_max_to_prefix_max", SOFTMAX, [scan + SUM + NORM], SIG)
    assert get("normal_loop_max_to_prefix_max").exactness == "exact"


def test_prefix_sum_of_exp_scan():
    scan = ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx,a}=if_then_else(a-1<0,0,F^{f64,g}_{tx,a-1})"
            "+exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});E^{f64,g}_{tx}=F^{f64,g}_{tx,a};];")
    assert_golden("normal_loop_summation_on_exp_to_prefix_summation_on_exp", SOFTMAX, [MAX + scan + NORM], SIG)


def test_prefix_sum_needs_an_exp_and_prefix_max_one_reduction_loop():
    plain_sum = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx}=C^{f64,g}_{tx}+A^{f64,g}_{tx,a};];"
    s = sig(("A", [4, 8], "float64", "input"), ("C", [4], "float64", "output"))
    assert results("normal_loop_summation_on_exp_to_prefix_summation_on_exp", plain_sum, s) == []
    two = "B^{4}_{tx=0}L^{2}_{a=0}L^{4}_{c=0}[C^{f64,g}_{tx}=max(C^{f64,g}_{tx},A^{f64,g}_{tx,a*4+c});];"
    assert results("normal_loop_max_to_prefix_max", two, s) == []


def test_online_softmax():
    assert_golden("online_softmax", SOFTMAX, [RUNNING + NORM], SIG)


def test_online_softmax_is_a_dataflow_pattern():
    # Other names, an unrelated nest in between, the max reading a cached copy of A; the fresh name
    # continues past the largest in use (S -> W).
    s = sig(("A", [4, 8], "float64", "input"), ("Q", [4, 8], "float64", "input"),
            ("C", [4, 8], "float64", "output"), ("K", [4, 8], "float64", "output"))
    cache = "B^{4}_{tx=0}L^{8}_{a=0}[G^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];"
    mx = "B^{4}_{tx=0}L^{8}_{c=0}[M^{f64,g}_{tx}=max(M^{f64,g}_{tx},G^{f64,g}_{tx,c});];"
    other = "B^{4}_{tx=0}L^{8}_{a=0}[K^{f64,g}_{tx,a}=Q^{f64,g}_{tx,a}*2;];"
    sm = "B^{4}_{tx=0}L^{8}_{d=0}[S^{f64,g}_{tx}=S^{f64,g}_{tx}+exp(-M^{f64,g}_{tx}+A^{f64,g}_{tx,d});];"
    norm = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-M^{f64,g}_{tx})/S^{f64,g}_{tx};];"
    fused = ("B^{4}_{tx=0}L^{8}_{c=0}[W^{f64,g}_{tx}=if_then_else(c-1<0,-inf,M^{f64,g}_{tx});"
             "M^{f64,g}_{tx}=max(W^{f64,g}_{tx},G^{f64,g}_{tx,c});"
             "S^{f64,g}_{tx}=if_then_else(c-1<0,0,S^{f64,g}_{tx}*exp(W^{f64,g}_{tx}-M^{f64,g}_{tx}))"
             "+exp(G^{f64,g}_{tx,c}-M^{f64,g}_{tx});];")
    assert_golden("online_softmax", cache + mx + other + sm + norm, [cache + other + fused + norm], s)


def test_online_softmax_not_when_a_nest_in_between_touches_the_max():
    s = sig(("A", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"))
    meddle = "B^{4}_{tx=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}*2;];"
    assert results("online_softmax", MAX + meddle + SUM + NORM, s) == []
    wrong = "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(A^{f64,g}_{tx,7-a}*2-D^{f64,g}_{tx});];"
    assert results("online_softmax", MAX + wrong + NORM, s) == []


def test_flashattention_without_tiling():
    s = sig(("A", [4, 3], "float64", "input"), ("C", [6, 3], "float64", "input"),
            ("D", [6, 5], "float64", "input"), ("I", [4, 5], "float64", "output"))
    scores = "B^{4}_{tx=0}L^{6}_{a=0}L^{3}_{c=0}[E^{f64,g}_{tx,a}=E^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{a,c};];"
    before = (scores + "B^{4}_{tx=0}L^{6}_{a=0}[F^{f64,g}_{tx}=max(F^{f64,g}_{tx},E^{f64,g}_{tx,a});];"
              "B^{4}_{tx=0}L^{6}_{a=0}[G^{f64,g}_{tx}=G^{f64,g}_{tx}+exp(E^{f64,g}_{tx,a}-F^{f64,g}_{tx});];"
              "B^{4}_{tx=0}L^{6}_{a=0}[H^{f64,g}_{tx,a}=exp(E^{f64,g}_{tx,a}-F^{f64,g}_{tx})/G^{f64,g}_{tx};];"
              "B^{4}_{tx=0}L^{5}_{c=0}L^{6}_{a=0}[I^{f64,g}_{tx,c}=I^{f64,g}_{tx,c}+H^{f64,g}_{tx,a}*D^{f64,g}_{a,c};];")
    after = (scores + "B^{4}_{tx=0}L^{6}_{a=0}[J^{f64,g}_{tx}=if_then_else(a-1<0,-inf,F^{f64,g}_{tx});"
             "F^{f64,g}_{tx}=max(J^{f64,g}_{tx},E^{f64,g}_{tx,a});"
             "G^{f64,g}_{tx}=if_then_else(a-1<0,0,G^{f64,g}_{tx}*exp(J^{f64,g}_{tx}-F^{f64,g}_{tx}))"
             "+exp(E^{f64,g}_{tx,a}-F^{f64,g}_{tx});"
             "L^{5}_{d=0}[K^{f64,g}_{tx,d}=if_then_else(a-1<0,0,K^{f64,g}_{tx,d}*exp(J^{f64,g}_{tx}-F^{f64,g}_{tx}))"
             "+exp(E^{f64,g}_{tx,a}-F^{f64,g}_{tx})*D^{f64,g}_{a,d};];];"
             "B^{4}_{tx=0}L^{5}_{c=0}[I^{f64,g}_{tx,c}=K^{f64,g}_{tx,c}/G^{f64,g}_{tx};];")
    assert_golden("flashattention_wo_tiling", before, [after], s)
    # P is an output: it must stay stored, so nothing is folded.
    s_p = sig(("A", [4, 3], "float64", "input"), ("C", [6, 3], "float64", "input"),
              ("D", [6, 5], "float64", "input"), ("H", [4, 6], "float64", "output"), ("I", [4, 5], "float64", "output"))
    assert results("flashattention_wo_tiling", before, s_p) == []


def test_exponential_split_splits_off_the_term_with_fewer_loops():
    norm = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a})/exp(D^{f64,g}_{tx})/E^{f64,g}_{tx};];"
    assert_golden("exponential_split", SOFTMAX, [MAX + SUM_SPLIT + NORM, MAX + SUM + norm], SIG)


def test_multiplicative_split_then_applies_after_exponential_split():
    hoisted = ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx}=F^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a});];"
               "B^{4}_{tx=0}[E^{f64,g}_{tx}=F^{f64,g}_{tx}*exp(-D^{f64,g}_{tx});];")
    assert_golden("multiplicative_split", MAX + SUM_SPLIT + NORM, [MAX + hoisted + NORM], SIG)
    assert results("multiplicative_split", SOFTMAX, SIG) == []  # exp(A-D) is not a product


def test_additive_split_closed_form_for_invariant_terms():
    s = sig(("A", [4, 8], "float64", "input"), ("C", [4], "float64", "input"), ("E", [4], "float64", "output"))
    before = "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+(A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a}+C^{f64,g}_{tx});];"
    closed = ("B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+A^{f64,g}_{tx,a}**2;];"
              "B^{4}_{tx=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+8*C^{f64,g}_{tx};];")
    # the other split (term A**2) would leave the invariant C summed 8 times: refused (issue 26)
    assert_golden("additive_split", before, [closed], s)
    site = next(iter(get("additive_split").sites(ctx(before, s))))
    with pytest.raises(Illegal, match=r"what remains, C\^\{f64,g\}_\{tx\}, does not depend on a: it would be added 8 times"):
        get("additive_split").rewrite(ctx(before, s), site, {"term": "A^{f64,g}_{tx,a}**2"})


def test_partially_equivalent_then_correct():
    partial = "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a}-A^{f64,g}_{tx,0});];"
    fix = "B^{4}_{tx=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}*exp(A^{f64,g}_{tx,0}-D^{f64,g}_{tx});];"
    assert_golden("partially_equivalent_then_correct", SOFTMAX, [MAX + partial + fix + NORM], SIG)


def test_records_are_complete():
    c = ctx(SOFTMAX, SIG)
    for name in ("online_softmax", "normal_loop_max_to_prefix_max", "partially_equivalent_then_correct"):
        t = next(get(name).transformations(c))
        assert t.facts and t.summary and t.level == "mathematical"


def test_the_max_shift_of_a_softmax_over_a_matmul_is_never_dropped():
    """Over logits that come out of a sum reduction (attention scores), exp(x) without the max shift
    overflows (the strategy survey found NaN on wide-range draws): the splits are refused there,
    and still offered over bounded inputs (see the golden tests above)."""
    s = sig(("A", [4, 6], "float64", "input"), ("W", [6, 8], "float64", "input"), ("C", [4, 8], "float64", "output"))
    logits = "B^{4}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}[Q^{f64,g}_{tx,a}=Q^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*W^{f64,g}_{c,a};];"
    over_logits = (logits + "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},Q^{f64,g}_{tx,a});];"
                   "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(Q^{f64,g}_{tx,a}-D^{f64,g}_{tx});];"
                   "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(Q^{f64,g}_{tx,a}-D^{f64,g}_{tx})/E^{f64,g}_{tx};];")
    for name in ("exponential_split", "expand_powsimp", "partially_equivalent_then_correct"):
        assert results(name, over_logits, s) == [], name
    assert results("exponential_split", SOFTMAX, SIG)  # bounded inputs: still applies


# Reductions over a kept dimension, as the translator writes x.sum(dim=1) and logsumexp: M_{tx,0}.
KEPT_SIG = sig(("A", [4, 8], "float64", "input"), ("C", [4], "float64", "output"))
KL_SUM = ("B^{4}_{tx=0}L^{8}_{a=0}[M^{f64,g}_{tx,0}=M^{f64,g}_{tx,0}+(1+A^{f64,g}_{tx,a}-exp(A^{f64,g}_{tx,a}));];"
          "B^{4}_{tx=0}[C^{f64,g}_{tx}=-0.5*M^{f64,g}_{tx,0};];")
LSE = ("B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,0}=max(E^{f64,g}_{tx,0},A^{f64,g}_{tx,a});];"
       "B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx,0}=F^{f64,g}_{tx,0}+exp(A^{f64,g}_{tx,a}-E^{f64,g}_{tx,0});];"
       "B^{4}_{tx=0}[C^{f64,g}_{tx}=log(F^{f64,g}_{tx,0})+E^{f64,g}_{tx,0};];")


def test_splits_see_a_sum_over_a_kept_dimension():
    """The VAE's KL term sums 1 + logvar - exp(logvar) into M_{tx,0}: one split per term."""
    tail = "B^{4}_{tx=0}[C^{f64,g}_{tx}=-0.5*M^{f64,g}_{tx,0};];"
    first = ("B^{4}_{tx=0}L^{8}_{a=0}[M^{f64,g}_{tx,0}=M^{f64,g}_{tx,0}+(1-exp(A^{f64,g}_{tx,a}));];"
             "B^{4}_{tx=0}L^{8}_{a=0}[M^{f64,g}_{tx,0}=M^{f64,g}_{tx,0}+A^{f64,g}_{tx,a};];")
    second = ("B^{4}_{tx=0}L^{8}_{a=0}[M^{f64,g}_{tx,0}=M^{f64,g}_{tx,0}+(A^{f64,g}_{tx,a}+1);];"
              "B^{4}_{tx=0}L^{8}_{a=0}[M^{f64,g}_{tx,0}=M^{f64,g}_{tx,0}-exp(A^{f64,g}_{tx,a});];")
    third = ("B^{4}_{tx=0}L^{8}_{a=0}[M^{f64,g}_{tx,0}=M^{f64,g}_{tx,0}+(A^{f64,g}_{tx,a}-exp(A^{f64,g}_{tx,a}));];"
             "B^{4}_{tx=0}[M^{f64,g}_{tx,0}=M^{f64,g}_{tx,0}+8;];")
    assert_golden("additive_split", KL_SUM, [first + tail, second + tail, third + tail], KEPT_SIG)


def test_softmax_family_sees_logsumexp_over_a_kept_dimension():
    running = ("B^{4}_{tx=0}L^{8}_{a=0}[G^{f64,g}_{tx,0}=if_then_else(a-1<0,-inf,E^{f64,g}_{tx,0});"
               "E^{f64,g}_{tx,0}=max(G^{f64,g}_{tx,0},A^{f64,g}_{tx,a});"
               "F^{f64,g}_{tx,0}=if_then_else(a-1<0,0,F^{f64,g}_{tx,0}*exp(G^{f64,g}_{tx,0}-E^{f64,g}_{tx,0}))"
               "+exp(A^{f64,g}_{tx,a}-E^{f64,g}_{tx,0});];")
    final = "B^{4}_{tx=0}[C^{f64,g}_{tx}=log(F^{f64,g}_{tx,0})+E^{f64,g}_{tx,0};];"
    assert_golden("online_softmax", LSE, [running + final], KEPT_SIG)
    assert_golden("partially_equivalent_then_correct", LSE, [
        "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,0}=max(E^{f64,g}_{tx,0},A^{f64,g}_{tx,a});];"
        "B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx,0}=F^{f64,g}_{tx,0}+exp(A^{f64,g}_{tx,a}-A^{f64,g}_{tx,0});];"
        "B^{4}_{tx=0}[F^{f64,g}_{tx,0}=F^{f64,g}_{tx,0}*exp(A^{f64,g}_{tx,0}-E^{f64,g}_{tx,0});];"
        "B^{4}_{tx=0}[C^{f64,g}_{tx}=log(F^{f64,g}_{tx,0})+E^{f64,g}_{tx,0};];"], KEPT_SIG)


def test_a_subscript_expression_is_no_kept_dimension():
    """Only bare variables and integer literals: D_{tx+1} or D_{a//2} are not reductions the splits
    understand."""
    shifted = ("B^{4}_{tx=0}L^{8}_{a=0}[M^{f64,g}_{tx+1,0}=M^{f64,g}_{tx+1,0}+(1+A^{f64,g}_{tx,a}-exp(A^{f64,g}_{tx,a}));];"
               "B^{4}_{tx=0}[C^{f64,g}_{tx}=-0.5*M^{f64,g}_{tx+1,0};];")
    s = sig(("A", [4, 8], "float64", "input"), ("C", [4], "float64", "output"))
    assert results("additive_split", shifted, s) == []
