"""Graph-level strategies: golden before/expected tests and refusals where illegal."""
from __future__ import annotations

from strategy_cases import assert_golden, results, sig

S2 = sig(("A", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"))
EW = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1;];"
      "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+exp(D^{f64,g}_{tx,a});];")
SOFT = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
        "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx})/E^{f64,g}_{tx};];")
INLINED = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1+exp(A^{f64,g}_{tx,a}-1);];"


def test_compute_inline_golden_all_readers_or_one():
    assert_golden("compute_inline", EW, [
        INLINED,
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1;];" + INLINED,  # producer kept (dead now)
    ], S2)


def test_compute_inline_refuses_reductions_and_fma_changes():
    assert results("compute_inline", SOFT, S2) == []  # D and E are reductions, not functions of indices
    fma = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a};];"
           "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+exp(D^{f64,g}_{tx,a});];")
    assert results("compute_inline", fma, S2) == []   # a product inlined into a sum would become an FMA


def test_dead_code_elimination_removes_what_nothing_live_reads():
    dead = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1;];" + INLINED
    assert_golden("dead_code_elimination", dead, [INLINED], S2)
    assert results("dead_code_elimination", EW, S2) == []


def test_dead_code_elimination_has_a_chain_of_thought():
    from strategy_cases import ctx

    from strategies.cot import answer
    from strategies.registry import get
    dead = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1;];" + INLINED
    t = next(get("dead_code_elimination").transformations(ctx(dead, S2)))
    text = answer(t)
    assert "no statement that contributes to the output reads D" in text and "Removing 1 statement" in text


def test_cse_golden_reuses_exp_across_nests():
    assert_golden("common_subexpression_elimination", SOFT, [
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
        "B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});"
        "E^{f64,g}_{tx}=E^{f64,g}_{tx}+F^{f64,g}_{tx,a};];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=F^{f64,g}_{tx,a}/E^{f64,g}_{tx};];"], S2)


def test_cse_refuses_when_an_operand_changes_in_between():
    changing = ("B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
                "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=C^{f64,g}_{tx,a}*exp(A^{f64,g}_{tx,a});"
                "C^{f64,g}_{tx,a}=exp(C^{f64,g}_{tx,a});];")
    got = results("common_subexpression_elimination", changing, S2)
    assert all("exp(C" in r for r in got)


def test_operator_fusion_golden_fuses_as_deep_as_legal():
    ew = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1;];"
          "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,a};];")
    assert_golden("operator_fusion", ew, [
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1;C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,a};];"],
        S2)
    got = results("operator_fusion", SOFT, S2)
    assert got[0].startswith("B^{4}_{tx=0}[L^{8}_{a=0}[D")  # depth 1 only: D is complete after the a loop


def test_operator_fission_golden_and_refusal():
    two = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];"
    assert_golden("operator_fission", two, [
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];"],
        sig(("A", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"), ("D", [4], "float64", "output")))
    # C reads the running maximum: after fission it would see the final one (a true dependence).
    running = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});C^{f64,g}_{tx,a}=D^{f64,g}_{tx};];"
    assert results("operator_fission", running, S2) == []


def test_expression_splitting_golden_and_fma_refusal():
    assert_golden("expression_splitting", EW, [
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1;];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a};C^{f64,g}_{tx,a}=C^{f64,g}_{tx,a}+exp(D^{f64,g}_{tx,a});];"],
        S2)
    fma = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*3+A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a};];"
    assert results("expression_splitting", fma, S2) == []


def test_expression_reorder_operands_and_independent_nests_only():
    two = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];"
           "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
           "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*E^{f64,g}_{tx,a};];")
    got = results("expression_reorder", two, S2)
    assert got == [
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];"
        "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=E^{f64,g}_{tx,a}*D^{f64,g}_{tx,a};];",
        "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*E^{f64,g}_{tx,a};];",
    ]  # nests 2 and 3 are not swapped (true dependence on E); the accumulator X+e keeps its form


def test_expression_reorder_respects_anti_and_output_dependences():
    anti = ("B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a};D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];")
    out = ("B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];")
    assert results("expression_reorder", anti, S2) == []
    assert results("expression_reorder", out, S2) == []
    assert results("expression_reorder", SOFT, S2) == []  # D=max(D,..) and E=E+.. keep their accumulator form


def test_expression_reorder_never_swaps_max_or_min():
    """max(D,0) -> max(0,D) is not bitwise equal for signed zeros: found by the strategy survey."""
    relu_sig = sig(("A", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"))
    relu = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=max(A^{f64,g}_{tx,a},0);];"
    assert results("expression_reorder", relu, relu_sig) == []


# l2_distance's shape: a square stored in one nest and summed in the next (issue 18). LLVM lowers
# D**2 to D*D; inlined into the sum, or fused into its nest, the multiply and the add become one FMA.
SQ = sig(("A", [4, 8], "float32", "input"), ("C", [4], "float32", "output"))
SQUARES = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}**2;];"
           "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx}=C^{f32,g}_{tx}+D^{f32,g}_{tx,a};];")
PRODUCT_THEN_SUM = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*0.044715*A^{f32,g}_{tx,a};];"
                    "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=1+D^{f32,g}_{tx,a};];")
S2_F32 = sig(("A", [4, 8], "float32", "input"), ("C", [4, 8], "float32", "output"))


def test_compute_inline_refuses_a_square_inlined_into_a_sum():
    assert results("compute_inline", SQUARES, SQ) == []
    root = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}**0.5;];"   # a square root: no multiply to fuse
            "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx}=C^{f32,g}_{tx}+D^{f32,g}_{tx,a};];")
    assert results("compute_inline", root, SQ)[0] == \
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx}=C^{f32,g}_{tx}+A^{f32,g}_{tx,a}**0.5;];"


def test_fusion_that_lets_the_compiler_form_an_fma_is_declared_reassociating():
    from strategy_cases import ctx

    from gpu_tasks.verify import verify_pair
    from strategies.registry import get

    for name in ("operator_fusion", "loop_fusion"):
        found = list(get(name).transformations(ctx(PRODUCT_THEN_SUM, S2_F32)))
        assert found, name
        for t in found:
            assert t.exactness == "reassociating", name
            assert any("multiply-add" in f for f in t.facts)
            assert verify_pair(t.before, t.after, S2_F32).status in ("exact", "close")
    # the same fusion where nothing multiplies stays exact, and is bitwise equal
    plain = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}-0.5;];"
             "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=1+D^{f32,g}_{tx,a};];")
    (t,) = get("operator_fusion").transformations(ctx(plain, S2_F32))
    assert t.exactness == "exact"
    assert verify_pair(t.before, t.after, S2_F32).status == "exact"


def test_fission_that_separates_an_fma_is_declared_reassociating():
    from strategy_cases import ctx

    from strategies.registry import get

    one = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*A^{f32,g}_{tx,a};"
           "C^{f32,g}_{tx,a}=1+D^{f32,g}_{tx,a};];")
    (t,) = get("operator_fission").transformations(ctx(one, S2_F32))
    assert t.exactness == "reassociating"
