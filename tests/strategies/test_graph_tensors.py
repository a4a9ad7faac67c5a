"""tensor_concat_to_fuse_operators and tensor_split_to_decouple_operators: golden before/expected tests,
refusals where illegal, sites on the catalogue's attention workloads, and a semantic test (every
application verifies bitwise exact through TVM)."""
from __future__ import annotations

from functools import cache

import pytest
from strategy_cases import assert_golden, ctx, results, sig

from leir.validate import validate
from strategies.base import Context
from strategies.registry import get

CONCAT, SPLIT = "tensor_concat_to_fuse_operators", "tensor_split_to_decouple_operators"

MM = sig(("A", [4, 6], "float64", "input"), ("R", [5, 6], "float64", "input"), ("W", [5, 6], "float64", "input"),
         ("C", [4, 5], "float64", "output"))
# Two projections of one input (Q = A @ R^T, K = A @ W^T), then a consumer of both.
PROJ = ("B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*R^{f64,g}_{a,c};];"
        "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[E^{f64,g}_{tx,a}=E^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*W^{f64,g}_{a,c};];"
        "B^{4}_{tx=0}L^{5}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*E^{f64,g}_{tx,a};];")
PROJ_CONCAT = (
    "B^{5}_{tx=0}L^{6}_{a=0}[Y^{f64,g}_{0,tx,a}=R^{f64,g}_{tx,a};Y^{f64,g}_{1,tx,a}=W^{f64,g}_{tx,a};];"
    "L^{2}_{d=0}B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}"
    "[X^{f64,g}_{d,tx,a}=X^{f64,g}_{d,tx,a}+A^{f64,g}_{tx,c}*Y^{f64,g}_{d,a,c};];"
    "B^{4}_{tx=0}L^{5}_{a=0}[C^{f64,g}_{tx,a}=X^{f64,g}_{0,tx,a}*X^{f64,g}_{1,tx,a};];")

S2 = sig(("A", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"))
# Two elementwise operators of one input.
EW = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
      "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a};];"
      "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}-E^{f64,g}_{tx,a};];")
EW_CONCAT = ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{0,tx,a}=exp(A^{f64,g}_{tx,a});"
             "F^{f64,g}_{1,tx,a}=A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a};];"
             "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=F^{f64,g}_{0,tx,a}-F^{f64,g}_{1,tx,a};];")

SPL = sig(("A", [3, 16], "float64", "input"), ("E", [3, 8], "float64", "output"))
# A split (chunk) result stacked on a leading literal index, as the translator writes it.
CHUNK = ("B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{0,tx,a}=A^{f64,g}_{tx,a};];"
         "B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{1,tx,a}=A^{f64,g}_{tx,a+8};];"
         "B^{3}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=C^{f64,g}_{0,tx,a}*C^{f64,g}_{1,tx,a};];")


# --- tensor_concat_to_fuse_operators --------------------------------------------------------------------

def test_concat_golden_projections_share_one_operator_over_concatenated_weights():
    assert_golden(CONCAT, PROJ, [PROJ_CONCAT], MM)


def test_concat_golden_elementwise_operators_write_slices_of_one_stacked_result():
    assert_golden(CONCAT, EW, [EW_CONCAT], S2)


def test_concat_offers_both_forms_for_same_template_plain_stores():
    same = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*R^{f64,g}_{tx,a};];"
            "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*W^{f64,g}_{tx,a};];"
            "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}-E^{f64,g}_{tx,a};];")
    two = sig(("A", [4, 8], "float64", "input"), ("R", [4, 8], "float64", "input"),
              ("W", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"))
    got = [t.params["form"] for t in get(CONCAT).transformations(ctx(same, two))]
    assert got == ["stacked_operands", "stacked_results"]


def test_concat_groups_three_projections_and_every_pair():
    d_and_e = ("B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*R^{f64,g}_{a,c};];"
               "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[E^{f64,g}_{tx,a}=E^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*W^{f64,g}_{a,c};];")
    product = "B^{4}_{tx=0}L^{5}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*E^{f64,g}_{tx,a}*F^{f64,g}_{tx,a};];"
    other = "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[F^{f64,g}_{tx,a}=F^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*R^{f64,g}_{c%5,c};];"
    ts = list(get(CONCAT).transformations(ctx(d_and_e + other + product, MM)))
    assert [t.site.tensors for t in ts] == [("D", "E")]  # F reads R at other subscripts: not one template
    same = "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[F^{f64,g}_{tx,a}=F^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*M^{f64,g}_{a,c};];"
    m3 = sig(("A", [4, 6], "float64", "input"), ("R", [5, 6], "float64", "input"),
             ("W", [5, 6], "float64", "input"), ("M", [5, 6], "float64", "input"), ("C", [4, 5], "float64", "output"))
    ts = list(get(CONCAT).transformations(ctx(d_and_e + same + product, m3)))
    assert [t.site.tensors for t in ts] == [("D", "E"), ("D", "F"), ("D", "E", "F"), ("E", "F")]
    assert ts[2].after_text == (
        "B^{5}_{tx=0}L^{6}_{a=0}[Y^{f64,g}_{0,tx,a}=R^{f64,g}_{tx,a};Y^{f64,g}_{1,tx,a}=W^{f64,g}_{tx,a};"
        "Y^{f64,g}_{2,tx,a}=M^{f64,g}_{tx,a};];"
        "L^{3}_{d=0}B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[X^{f64,g}_{d,tx,a}=X^{f64,g}_{d,tx,a}+A^{f64,g}_{tx,c}*Y^{f64,g}_{d,a,c};];"
        "B^{4}_{tx=0}L^{5}_{a=0}[C^{f64,g}_{tx,a}=X^{f64,g}_{0,tx,a}*X^{f64,g}_{1,tx,a}*X^{f64,g}_{2,tx,a};];")


def test_concat_refuses_dependent_parts_and_moves_across_writers():
    dependent = ("B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*R^{f64,g}_{a,c};];"
                 "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[E^{f64,g}_{tx,a}=E^{f64,g}_{tx,a}+D^{f64,g}_{tx,a}*W^{f64,g}_{a,c};];"
                 "B^{4}_{tx=0}L^{5}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*E^{f64,g}_{tx,a};];")
    assert results(CONCAT, dependent, MM) == []          # the second part reads the first part's result
    between = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
               "B^{4}_{tx=0}L^{8}_{a=0}[G^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+1;];"
               "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*G^{f64,g}_{tx,a};];"
               "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=G^{f64,g}_{tx,a}-E^{f64,g}_{tx,a};];")
    assert results(CONCAT, between, S2) == []            # E reads G, written after D: E cannot move up


def test_concat_refuses_known_tensors_other_shapes_and_unshared_inputs():
    outputs = sig(("A", [4, 8], "float64", "input"), ("D", [4, 8], "float64", "output"),
                  ("E", [4, 8], "float64", "output"))
    known = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
             "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a};];")
    assert results(CONCAT, known, outputs) == []    # known tensors keep their names
    wider = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
             "B^{4}_{tx=0}L^{4}_{a=0}[E^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a};];"
             "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}-E^{f64,g}_{tx,a};];")
    assert results(CONCAT, wider, S2) == []
    two_inputs = sig(("A", [4, 8], "float64", "input"), ("H", [4, 8], "float64", "input"),
                     ("C", [4, 8], "float64", "output"))
    unshared = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
                "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=H^{f64,g}_{tx,a}*H^{f64,g}_{tx,a};];"
                "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}-E^{f64,g}_{tx,a};];")
    assert results(CONCAT, unshared, two_inputs) == []


def test_concat_refuses_stacking_reductions_as_separate_statements():
    # Two reductions in one body: the second would lose its implicit initialisation (docs/leir.md §4.4),
    # so only the single-statement form over a loop of parts is offered, and here the templates differ.
    sums = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}+A^{f64,g}_{tx,a};];"
            "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=max(E^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
            "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-D^{f64,g}_{tx}*E^{f64,g}_{tx};];")
    assert results(CONCAT, sums, S2) == []


# --- tensor_split_to_decouple_operators ------------------------------------------------------------------

def test_split_golden_literal_parts_become_tensors():
    assert_golden(SPLIT, CHUNK, [
        "B^{3}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];"
        "B^{3}_{tx=0}L^{8}_{a=0}[G^{f64,g}_{tx,a}=A^{f64,g}_{tx,a+8};];"
        "B^{3}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=F^{f64,g}_{tx,a}*G^{f64,g}_{tx,a};];"], SPL)


def test_split_golden_loop_over_parts_becomes_one_nest_per_part():
    assert_golden(SPLIT, PROJ_CONCAT, [
        "B^{5}_{tx=0}L^{6}_{a=0}[Y^{f64,g}_{0,tx,a}=R^{f64,g}_{tx,a};Y^{f64,g}_{1,tx,a}=W^{f64,g}_{tx,a};];"
        "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[Z^{f64,g}_{tx,a}=Z^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*Y^{f64,g}_{0,a,c};];"
        "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[Aa^{f64,g}_{tx,a}=Aa^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*Y^{f64,g}_{1,a,c};];"
        "B^{4}_{tx=0}L^{5}_{a=0}[C^{f64,g}_{tx,a}=Z^{f64,g}_{tx,a}*Aa^{f64,g}_{tx,a};];"], MM)


def test_split_undoes_the_elementwise_concat_and_offers_single_parts_from_three():
    assert results(SPLIT, EW_CONCAT, S2) == [
        "B^{4}_{tx=0}L^{8}_{a=0}[G^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});H^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a};];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=G^{f64,g}_{tx,a}-H^{f64,g}_{tx,a};];"]
    three = ("B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{0,tx,a}=A^{f64,g}_{tx,a};];"
             "B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{1,tx,a}=A^{f64,g}_{tx,a+8};];"
             "B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{2,tx,a}=A^{f64,g}_{tx,a}*2;];"
             "B^{3}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=C^{f64,g}_{0,tx,a}*C^{f64,g}_{1,tx,a}-C^{f64,g}_{2,tx,a};];")
    params = [t.params for t in get(SPLIT).transformations(ctx(three, SPL))]
    assert params == [{"parts": "all"}, {"part": 0}, {"part": 1}, {"part": 2}]


def test_split_refuses_variable_reads_value_uses_carried_loops_and_init_changes():
    summed = ("B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{0,tx,a}=A^{f64,g}_{tx,a};];"
              "B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{1,tx,a}=A^{f64,g}_{tx,a+8};];"
              "B^{3}_{tx=0}L^{8}_{a=0}L^{2}_{c=0}[E^{f64,g}_{tx,a}=E^{f64,g}_{tx,a}+C^{f64,g}_{c,tx,a};];")
    assert results(SPLIT, summed, SPL) == []               # a reader needs every part at once
    as_value = ("B^{5}_{tx=0}L^{6}_{a=0}[Y^{f64,g}_{0,tx,a}=R^{f64,g}_{tx,a};Y^{f64,g}_{1,tx,a}=W^{f64,g}_{tx,a};];"
                "L^{2}_{d=0}B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}"
                "[X^{f64,g}_{d,tx,a}=X^{f64,g}_{d,tx,a}+A^{f64,g}_{tx,c}*Y^{f64,g}_{d,a,c}*d;];"
                "B^{4}_{tx=0}L^{5}_{a=0}[C^{f64,g}_{tx,a}=X^{f64,g}_{0,tx,a}*X^{f64,g}_{1,tx,a};];")
    assert results(SPLIT, as_value, MM) == []              # d is a value, not only a subscript
    carried = ("L^{2}_{d=0}B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{d,tx,a}=if_then_else(d<1,A^{f64,g}_{tx,a},"
               "F^{f64,g}_{d-1,tx,a}*2);];B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=F^{f64,g}_{1,tx,a};];")
    assert results(SPLIT, carried, S2) == []               # part 1 reads part 0: iterations of d interact
    regains = ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{0,tx}=F^{f64,g}_{0,tx}+A^{f64,g}_{tx,a};];"
               "B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{1,tx}=F^{f64,g}_{1,tx}+A^{f64,g}_{tx,a};];"
               "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=F^{f64,g}_{0,tx}-F^{f64,g}_{1,tx};];")
    assert results(SPLIT, regains, S2) == []               # F[1] has no implicit init; its own tensor would


def test_split_refuses_known_tensors():
    stacked_out = sig(("A", [3, 16], "float64", "input"), ("C", [2, 3, 8], "float64", "output"))
    parts_only = ("B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{0,tx,a}=A^{f64,g}_{tx,a};];"
                  "B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{1,tx,a}=A^{f64,g}_{tx,a+8};];")
    assert results(SPLIT, parts_only, stacked_out) == []


# --- the catalogue ----------------------------------------------------------------------------------------

@cache
def catalogue(name: str) -> Context:
    pytest.importorskip("torch")
    from leir.frontend import translate
    from workloads.registry import get_workload
    from workloads.sampling import build, sample_instance

    w = get_workload(name)
    inst = sample_instance(w, 0, 0, "default")
    module, inputs = build(w, inst)
    tr = translate(module, inputs, dtype=inst.dtype)
    return Context(tr.program, tr.signature)


@pytest.mark.parametrize("name", ["self_attention_mha_projected", "self_attention_gqa_projected",
                                  "self_attention_mqa_projected", "transformer_llama_causal"])
def test_concat_finds_the_qkv_projections_of_attention_workloads_and_split_undoes_it(name):
    c = catalogue(name)
    ts = list(get(CONCAT).transformations(c))
    assert ts, f"no concat site on {name}"
    t = ts[-1]
    assert not validate(t.after, c.signature)
    assert list(get(SPLIT).transformations(c.with_program(t.after)))


def test_split_finds_the_parts_of_a_catalogue_split():
    assert list(get(SPLIT).transformations(catalogue("split_sum")))


# --- semantics -----------------------------------------------------------------------------------------------

def cases() -> list[tuple[str, Context]]:
    own = [("proj", ctx(PROJ, MM)), ("proj_concat", ctx(PROJ_CONCAT, MM)), ("ew", ctx(EW, S2)),
           ("ew_concat", ctx(EW_CONCAT, S2)), ("chunk", ctx(CHUNK, SPL))]
    return own + [(n, catalogue(n)) for n in ("mlp_swiglu", "self_attention_gqa_projected", "split_sum")]


@pytest.mark.parametrize("strategy", [CONCAT, SPLIT])
def test_every_application_verifies_exact(strategy):
    pytest.importorskip("tvm")
    from gpu_tasks.verify import verify_pair

    bad, done = [], 0
    for name, c in cases():
        for t in get(strategy).transformations(c):
            assert t.facts and t.summary
            problems = validate(t.after, c.signature)
            status = "invalid" if problems else verify_pair(t.before, t.after, c.signature).status
            if status != "exact":
                bad.append(f"{name} {t.site.to_json()} {t.params}: {status} {problems[:1]}")
            done += 1
    assert done >= 3 and not bad, "\n".join(bad)
