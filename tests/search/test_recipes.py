"""Recipes as data (search.recipes): a role follows its loop through renames and splits, an
arrangement orders loops by role, and the micro-kernel recipe makes the steps the search relies on."""
from __future__ import annotations

from leir.parse import parse_program
from search.macros import MICRO_KERNEL, ROW_NEST, contractions, micro_kernels, row_kernels
from search.recipes import Arrange, Plan, Step, run
from strategies.base import Context
from tests.search.test_macros import AVX512, MM_B, MM_SIG, MM_T, MM_T_SIG, SOFTMAX, SOFTMAX_SIG


def plan(program, signature, roles, **facts) -> Plan:
    return Plan(Context(program, signature), 0, dict(roles), facts)


def test_a_role_follows_its_loop_when_a_bound_loop_becomes_parallel_and_when_it_is_split():
    p = plan(MM_B, MM_SIG, {"rows": "tx", "cols": "a", "red.0": "c"})
    assert Step("loop_parallelization", ("rows",)).run(p)
    assert p.kind("rows") == "P" and p.var("rows") != "tx" and p.var("rows") in p.names()  # renamed, followed
    assert Step("loop_split", ("cols",), {"factor": 16}).run(p)
    names = p.names()
    assert p.var("cols") == "a" and names.index(p.var("cols.outer")) == names.index("a") - 1


def test_after_a_tiling_each_outer_loop_is_named_for_the_loop_it_was_split_from():
    program = parse_program("L^{128}_{d=0}L^{128}_{a=0}L^{128}_{c=0}"
                            "[D^{f32,g}_{d,a}=D^{f32,g}_{d,a}+A^{f32,g}_{d,c}*C^{f32,g}_{c,a};];")
    p = plan(program, MM_SIG, {"rows": "d", "cols": "a", "red.0": "c"})
    assert Step("loop_tiling", ("rows", "cols"), {"factors": [4, 64]}).run(p)
    extents = {lp.var: lp.extent for lp in p.loops()}
    assert (extents[p.var("rows.outer")], extents[p.var("cols.outer")]) == (32, 2)
    assert (extents[p.var("rows")], extents[p.var("cols")]) == (4, 64)


def test_an_arrangement_puts_unnamed_loops_first_then_the_roles_in_order():
    p = plan(MM_B, MM_SIG, {"rows": "tx", "cols": "a", "red.0": "c"})
    assert Arrange(("*", "red", "rows", "cols")).target(p) == ["c", "tx", "a"]
    assert Arrange(("*", "red", "rows", "cols")).run(p)
    assert p.names() == ["c", "tx", "a"] and [t.strategy for t in p.steps] == ["loop_reorder"]


def test_a_step_with_no_legal_site_ends_the_recipe():
    p = plan(MM_B, MM_SIG, {"rows": "tx", "cols": "a", "red.0": "c"})
    assert not run((Step("loop_split", ("cols",), {"factor": 7}),), p)  # 7 does not divide 128
    assert run((Step("loop_split", ("cols",), {"factor": 7}, when=lambda _: False),), p) and not p.steps


def test_the_micro_kernel_recipe_on_the_matmul():
    """The B-form matmul 128^3 on AVX-512: the five steps of docs/search.md, in order."""
    (macro, *_) = micro_kernels(Context(MM_B, MM_SIG), AVX512)
    assert [(t.strategy, t.params) for t in macro.steps] == [
        ("loop_parallelization", {}), ("loop_tiling", {"factors": [4, 64]}), ("loop_reorder", {"move": "c", "to": 2}),
        ("loop_unrolling", {}), ("loop_vectorization", {})]
    assert len(MICRO_KERNEL) >= len(macro.steps)


def test_a_strided_operand_is_transposed_first_and_the_kernel_works_on_the_nest_after_the_copy():
    (con,) = contractions(MM_T)
    assert con.reused_stride != 1
    (macro, *_) = micro_kernels(Context(MM_T, MM_T_SIG), AVX512)
    assert macro.steps[0].strategy == "layout_transformation" and macro.steps[0].params["copy"] == "transposed"
    assert all(t.site.nest == 1 for t in macro.steps[1:] if t.strategy.startswith("loop_"))


def test_a_step_tries_its_variants_in_order_and_an_optional_one_does_not_end_the_recipe():
    p = plan(MM_B, MM_SIG, {"rows": "tx", "cols": "a", "red.0": "c"})
    tried = []

    def variants(plan):
        for factor in (7, 5, 16, 8):   # 7 and 5 do not divide 128: the first legal one, 16, is made
            tried.append(factor)
            yield {"factor": factor}
    assert Step("loop_split", ("cols",), variants=variants).run(p)
    assert tried == [7, 5, 16] and [t.params for t in p.steps] == [{"factor": 16}]
    assert not Step("loop_split", ("cols",), {"factor": 7}).run(p)
    assert Step("loop_split", ("cols",), {"factor": 7}, optional=True).run(p)
    assert Step("loop_split", ("nowhere",), {"factor": 2}, optional=True).run(p) and len(p.steps) == 1


def test_the_plan_keeps_its_nest_when_partial_results_add_a_nest_after_it_and_moves_past_a_copy():
    softmax = plan(SOFTMAX, SOFTMAX_SIG, {})
    nests = len(softmax.program.nests)
    assert Step("loop_vectorization", variants=lambda _: [{"width": 16, "partials": True}]).run(softmax)
    assert len(softmax.program.nests) == nests + 1 and softmax.nest == 0   # the combining nest is after it
    assert softmax.loops()[-1].kind == "V"
    strided = plan(MM_T, MM_T_SIG, {"rows": "tx", "cols": "a", "red.0": "c"})
    assert strided.apply("layout_transformation", {"copy": "transposed", "order": [1, 0]},
                         lambda s: tuple(s.tensors) == ("C",))
    assert strided.nest == 1 and strided.names() == ["tx", "a", "c"]   # the copy stands before it


def test_the_row_kernel_recipe_on_the_softmax():
    """Every heavy nest of the softmax vectorised and its rows made parallel, each as its own steps."""
    (macro, *_) = row_kernels(Context(SOFTMAX, SOFTMAX_SIG), AVX512)
    kinds = [(t.strategy, t.site.nest) for t in macro.steps]
    assert ("loop_vectorization", 0) in kinds and ("loop_parallelization", 0) in kinds
    assert len(ROW_NEST) >= 4
