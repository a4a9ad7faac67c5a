"""Recipes as data (search.recipes): a role follows its loop through renames and splits, an
arrangement orders loops by role, and the micro-kernel recipe makes the steps the search relies on."""
from __future__ import annotations

from leir.parse import parse_program
from search.macros import MICRO_KERNEL, contractions, micro_kernels
from search.recipes import Arrange, Plan, Step, run
from strategies.base import Context
from tests.search.test_macros import AVX512, MM_B, MM_SIG, MM_T, MM_T_SIG


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
