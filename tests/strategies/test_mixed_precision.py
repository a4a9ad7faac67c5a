"""Strategies that know the accumulator (issue 26, item 4): reassociation judged by what the result
is verified to, exp overflow by the dtype the exp is computed in, FMA contraction only where a
product rounds, and no step that changes a tensor's dtype."""
from __future__ import annotations

import pytest
from strategy_cases import ctx, results, sig

from leir.ast import Access, map_stmt
from strategies.analysis.legality import product_rounds
from strategies.analysis.numerics import sum_drift_problem
from strategies.analysis.tree import map_program_stmts
from strategies.base import Rewrite, Site, Strategy, dtype_changed

LONG = 1 << 20  # a float32 accumulator of a million float16 products


def test_a_float32_accumulator_is_held_to_what_its_float16_result_is_verified_to():
    assert sum_drift_problem(LONG, "f32", "S") is not None          # a float32 result: 2.4e-4 > 1e-5
    assert sum_drift_problem(LONG, "f32", "S", held_to="f16") is None  # a float16 result: within 1.25e-3
    assert "a float32 result" in sum_drift_problem(LONG, "f32", "S", held_to="f32")
    assert sum_drift_problem(LONG, "f16", "S", held_to="f16") is not None  # a float16 accumulator drifts anyway


MIXED_SIG = sig(("A", [4, 4096], "float16", "input"), ("S", [4], "float16", "output"))
MIXED = ("B^{4}_{tx=0}L^{4096}_{a=0}[E^{f32,l}_{tx}=E^{f32,l}_{tx}+A^{f16,g}_{tx,a}*A^{f16,g}_{tx,a};];"
         "B^{4}_{tx=0}[S^{f16,g}_{tx}=E^{f32,l}_{tx};];")


def test_reduction_splits_of_a_float32_accumulator_in_a_float16_program_are_proposed():
    partials = [r for r in results("loop_vectorization", MIXED, MIXED_SIG) if "V^{16}" in r]
    assert partials  # 4096 terms: refused for a float16 accumulator, fine for float32 in a float16 program
    one_dtype = MIXED.replace("E^{f32,l}", "E^{f16,l}")
    assert not [r for r in results("loop_vectorization", one_dtype, MIXED_SIG) if "V^{16}" in r]


@pytest.mark.parametrize("product, code, rounds", [
    ("A^{f16,g}_{a}*C^{f16,g}_{a}", "f32", False),   # 11 + 11 significand bits fit float32's 24
    ("A^{bf16,g}_{a}*C^{f16,g}_{a}", "f32", False),
    ("A^{f16,g}_{a}**2", "f32", False),
    ("A^{f32,g}_{a}*C^{f32,g}_{a}", "f32", True),    # a float32 product rounds: an FMA changes it
    ("A^{f32,g}_{a}*C^{f32,g}_{a}", "f64", False),   # 24 + 24 fit float64's 53
    ("A^{f16,g}_{a}*0.5", "f16", False),             # a power of two only scales
    ("A^{f16,g}_{a}*0.1", "f32", True),              # 0.1 has a 52-bit significand
    ("A^{f16,g}_{a}*C^{f16,g}_{a}*D^{f16,g}_{a}", "f32", True),  # 33 bits
    ("A^{bf16,g}_{a}*C^{bf16,g}_{a}", "bf16", False),  # bfloat16 statements round explicitly: no FMA forms
])
def test_a_product_rounds_only_where_its_factors_do_not_fit(product, code, rounds):
    from leir.parse import parse_program

    rhs = parse_program(f"L^{{4}}_{{a=0}}[X^{{{code},g}}_{{a}}={product};];").nests[0].body[0].rhs
    assert product_rounds(rhs, code) is rounds


PROD_SIG = sig(("A", [8], "float16", "input"), ("C", [8], "float16", "input"), ("S", [8], "float32", "output"))
PRODUCT_THEN_SUM = ("L^{8}_{a=0}[E^{f32,g}_{a}=A^{f16,g}_{a}*C^{f16,g}_{a};];"
                    "L^{8}_{a=0}[S^{f32,g}_{a}=E^{f32,g}_{a}+A^{f16,g}_{a};];")


def test_an_exact_product_is_inlined_into_a_sum_and_a_rounded_one_is_not():
    inlined = results("compute_inline", PRODUCT_THEN_SUM, PROD_SIG)
    assert inlined and all("[S^{f32,g}_{a}=A^{f16,g}_{a}*C^{f16,g}_{a}+A^{f16,g}_{a};]" in r for r in inlined)
    f32_sig = sig(("A", [8], "float32", "input"), ("C", [8], "float32", "input"), ("S", [8], "float32", "output"))
    rounded = PRODUCT_THEN_SUM.replace("f16", "f32")
    assert results("compute_inline", rounded, f32_sig) == []   # issue 18's FMA rule still holds


class Retyping(Strategy):
    """A deliberately wrong rule: it turns the float32 accumulator into float16."""

    name, level, exactness, description = "retyping", "memory", "exact", "test only"

    def sites(self, c):
        yield Site(0)

    def rewrite(self, c, site, params):
        def retype(n):
            return Access(n.tensor, "f16", n.scope, n.indices) if isinstance(n, Access) and n.tensor == "E" else n
        return Rewrite(map_program_stmts(c.program, lambda s: map_stmt(s, retype)))


def test_no_step_changes_a_tensors_dtype():
    c = ctx(MIXED, MIXED_SIG)
    bad = Retyping().rewrite(c, Site(0), {}).program
    assert dtype_changed(c, bad) == ["E"]
    assert list(Retyping().transformations(c)) == []
