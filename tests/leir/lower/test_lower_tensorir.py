"""The TensorIR (block) form: the TIR TVM itself writes, which its scheduler accepts and which computes
what the plain form computes (bitwise, float64). Semantics against the oracle for both forms:
test_lower_semantics.py; the forms on every golden program and strategy golden: test_lower_forms.py."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from forms_check import block_names, forms_disagree, schedule_rejects
from test_lower_oracle import interpret, random_inputs
from test_lower_semantics import sig

from leir.lower import LoweringError, blocks, build, lower_to_primfunc, lower_to_script, plan, run_executable

MAT = sig({"A": ((4, 6), "float64"), "C": ((6, 5), "float64")}, {"D": ((4, 5), "float64")})
MATMUL = "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"
SCAN_SIG = sig({"A": ((3, 6), "float64")}, {"C": ((3, 6), "float64")})
# H carries the running sum from one iteration of `a` to the next, and every access of H is inside `a`.
SCAN = ("P^{3}_{i=0}L^{6}_{a=0}[H^{f64,l}_{i,a}=if_then_else(a<1,A^{f64,g}_{i,a},H^{f64,l}_{i,a-1}+A^{f64,g}_{i,a});"
        "C^{f64,g}_{i,a}=H^{f64,l}_{i,a};];")


def test_matmul_is_the_function_tvm_writes_for_the_same_computation():
    from tvm import te

    a = te.placeholder((4, 6), "float64", name="A")
    c = te.placeholder((6, 5), "float64", name="C")
    k = te.reduce_axis((0, 6), name="c")
    d = te.compute((4, 5), lambda i, j: te.sum(a[i, k] * c[k, j], axis=k), name="D")
    tvm.ir.assert_structural_equal(lower_to_primfunc(MATMUL, MAT, form="tensorir"), te.create_prim_func([a, c, d]))


def test_script_has_blocks_iterator_kinds_regions_and_init():
    text = lower_to_script(MATMUL, MAT, form="tensorir")
    assert "@T.prim_func(s_tir=True)" in text
    for line in ('with T.sblock("D"):', 'v_tx, v_a, v_c = T.axis.remap("SSR", [tx, a, c])',
                 "T.reads(A[v_tx, v_c], C[v_c, v_a])", "T.writes(D[v_tx, v_a])", "with T.init():"):
        assert line in text, line
    assert text == lower_to_script(MATMUL, MAT, form="tensorir")  # deterministic


def test_script_parses_schedules_and_builds_to_the_same_results():
    text = lower_to_script(SCAN, SCAN_SIG, form="tensorir")
    func = tvm.script.from_source(text)
    tvm.ir.assert_structural_equal(func, lower_to_primfunc(SCAN, SCAN_SIG, form="tensorir"))
    assert schedule_rejects(func) == ""
    assert block_names(func) == ["H", "C"]
    ex = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    inputs = random_inputs(SCAN_SIG, 0)
    np.testing.assert_array_equal(run_executable(ex, SCAN_SIG, inputs)["C"], np.cumsum(inputs["A"], axis=1))


def test_intermediates_are_allocated_in_the_root_block_with_their_scope():
    text = lower_to_script(SCAN, SCAN_SIG, form="tensorir")
    assert 'H = T.sblock_alloc_buffer((3, 6), "float64", scope="local")' in text
    assert text.index("sblock_alloc_buffer") < text.index("for i in T.parallel(3):")


def test_a_scan_through_an_intermediate_iterates_as_a_scan():
    text = lower_to_script(SCAN, SCAN_SIG, form="tensorir")
    assert "v_a = T.axis.scan(6, a)" in text  # in H's block, the writer
    assert 'v_i, v_a = T.axis.remap("SS", [i, a])' in text  # C's block has nothing to carry
    assert any("scan" in n for n in plan(SCAN, SCAN_SIG, form="tensorir").notes)
    assert forms_disagree(SCAN, SCAN_SIG) == ""


def test_without_the_scan_iterator_tvm_would_lose_the_carried_value(monkeypatch):
    """Why the mark exists: as a spatial iterator, TVM allocates H inside loop `a` and keeps only what
    one iteration touches, so H[i, a-1] is gone when iteration a reads it."""
    monkeypatch.setattr(blocks, "_allocation_marks", lambda placed, plan, notes: {})
    inputs = random_inputs(SCAN_SIG, 0)
    got = run_executable(build(SCAN, SCAN_SIG, form="tensorir"), SCAN_SIG, inputs)["C"]
    assert not np.allclose(got, np.cumsum(inputs["A"], axis=1))


@pytest.mark.parametrize("program", [
    # a running maximum read inside the loop that accumulates it (a reduction iterator carries it)
    "L^{3}_{i=0}L^{6}_{a=0}[M^{f64,g}_{i}=max(M^{f64,g}_{i},A^{f64,g}_{i,a});C^{f64,g}_{i,a}=M^{f64,g}_{i};];",
    # a 0-d accumulator across an outer loop: initialised once, before the first update (docs/leir.md §4.4)
    "B^{3}_{tx=0}[L^{6}_{a=0}[S^{f64,l}=S^{f64,l}+A^{f64,g}_{tx,a};];L^{6}_{a=0}[C^{f64,g}_{tx,a}=S^{f64,l};];];",
    # a scan over a tiled loop pair
    "L^{3}_{i=0}L^{2}_{g=0}L^{3}_{a=0}[H^{f64,g}_{i,g*3+a}=if_then_else(g*3+a<1,A^{f64,g}_{i,g*3+a},"
    "H^{f64,g}_{i,g*3+a-1}+A^{f64,g}_{i,g*3+a});C^{f64,g}_{i,g*3+a}=H^{f64,g}_{i,g*3+a};];",
])
def test_values_carried_across_iterations_survive(program):
    inputs = random_inputs(SCAN_SIG, 1)
    got = run_executable(build(program, SCAN_SIG, form="tensorir"), SCAN_SIG, inputs)["C"]
    np.testing.assert_array_equal(got, interpret(program, SCAN_SIG, inputs)["C"])
    assert forms_disagree(program, SCAN_SIG) == ""


def test_init_where_each_element_has_one_spatial_point_else_an_init_block():
    s = sig({"A": ((8,), "float64")}, {"C": ((4,), "float64")})
    pairs = "L^{8}_{a=0}[C^{f64,g}_{a//2}=C^{f64,g}_{a//2}+A^{f64,g}_{a};];"  # a is spatial, not injective
    text = lower_to_script(pairs, s, form="tensorir")
    assert "T.init()" not in text and 'T.sblock("C_init")' in text
    assert any("explicit initialisation" in n for n in plan(pairs, s, form="tensorir").notes)
    tiled = "L^{2}_{d=0}L^{2}_{a=0}L^{2}_{c=0}[C^{f64,g}_{d*2+a}=C^{f64,g}_{d*2+a}+A^{f64,g}_{(d*2+a)*2+c};];"
    text = lower_to_script(tiled, s, form="tensorir")
    assert "T.init()" in text and "C_init" not in text
    for program in (pairs, tiled):
        inputs = random_inputs(s, 0)
        got = run_executable(build(program, s, form="tensorir"), s, inputs)["C"]
        np.testing.assert_allclose(got, inputs["A"].reshape(4, 2).sum(axis=1), rtol=1e-15)


@pytest.mark.parametrize("lhs, loops, expected", [
    ("C^{f64,g}_{a,c}", [("a", 4), ("c", 5)], True),
    ("C^{f64,g}_{c,a}", [("a", 4), ("c", 5)], True),
    ("C^{f64,g}_{d*2+a}", [("d", 3), ("a", 2)], True),
    ("C^{f64,g}_{d*2+a}", [("d", 3), ("a", 3)], False),  # d=1,a=0 and d=0,a=2 meet
    ("C^{f64,g}_{a+c,c}", [("a", 5), ("c", 5)], True),   # only the exact enumeration shows it
    ("C^{f64,g}_{a//2}", [("a", 4)], False),
    ("C^{f64,g}_{I^{i64,g}_{a}}", [("a", 4)], False),    # a scatter: unknown before run time
    ("C^{f64,g}_{0}", [("a", 1)], True),
])
def test_injective(lhs, loops, expected):
    from leir import parse_program
    from leir.lower.planner import PLoop

    stmt = parse_program(f"L^{{1}}_{{a=0}}[{lhs}=1;];").nests[0].body[0]
    assert blocks.injective(stmt.lhs, [PLoop(v, 0, n, "serial") for v, n in loops]) is expected


def test_loop_kinds_are_kept():
    s = sig({"A": ((4, 8), "float64")}, {"C": ((4, 8), "float64")})
    text = lower_to_script("P^{4}_{a=0}V^{8}_{c=0}[C^{f64,g}_{a,c}=A^{f64,g}_{a,c}*2;];", s, form="tensorir")
    assert "for a in T.parallel(4):" in text and "for c in T.vectorized(8):" in text
    text = lower_to_script("U^{4}_{a=0}L^{8}_{c=0}[C^{f64,g}_{a,c}=A^{f64,g}_{a,c}*2;];", s, form="tensorir")
    assert "for a in T.unroll(4):" in text


def test_cuda_binds_threads_and_builds():
    from leir.lower import cuda_source

    text = lower_to_script(MATMUL, MAT, "cuda", form="tensorir")
    assert 'for tx in T.thread_binding(4, thread="threadIdx.x"):' in text
    assert "__global__" in cuda_source(MATMUL, MAT, form="tensorir")
    softmax = sig({"A": ((4, 8), "float32")}, {"C": ((4, 8), "float32")})
    program = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,l}_{tx}=max(D^{f32,l}_{tx},A^{f32,g}_{tx,a});];"
               "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}-D^{f32,l}_{tx});];")
    assert "__global__" in cuda_source(program, softmax, form="tensorir")


def test_unknown_form_is_a_clear_error():
    with pytest.raises(LoweringError, match="unknown form 'blocks'; expected one of plain, tensorir"):
        lower_to_primfunc(MATMUL, MAT, form="blocks")


def test_an_intermediate_inside_a_vectorized_loop_keeps_one_element_per_lane(monkeypatch):
    """TVM 0.27 hoists an allocation out of a vectorized loop without widening it; the opaque iterator
    keeps D's allocation above the loop. Without it, every lane would share one element."""
    s = sig({"A": ((5, 6), "float64")}, {"C": ((5, 6), "float64")})
    program = "B^{5}_{tx=0}V^{6}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-D^{f64,g}_{tx,a};];"
    text = lower_to_script(program, s, form="tensorir")
    assert "v_a = T.axis.opaque(6, a)" in text and "for a in T.vectorized(6):" in text
    inputs = random_inputs(s, 0)
    want = inputs["A"] - np.exp(inputs["A"])
    np.testing.assert_allclose(run_executable(build(program, s, form="tensorir"), s, inputs)["C"], want, rtol=1e-14)
    assert forms_disagree(program, s) == ""
    monkeypatch.setattr(blocks, "_allocation_marks", lambda placed, plan, notes: {})
    assert not np.allclose(run_executable(build(program, s, form="tensorir"), s, inputs)["C"], want)


@pytest.mark.parametrize("lhs, loops, expected", [
    ("C^{f64,g}_{a,c}", [("a", 4), ("c", 5)], ["a", "c"]),
    ("C^{f64,g}_{a//2,c}", [("a", 4), ("c", 5)], ["c"]),      # a//2: distinct a, same element
    ("C^{f64,g}_{a+c}", [("a", 4), ("c", 5)], ["a"]),         # either alone is data parallel
    ("C^{f64,g}_{I^{i64,g}_{a},c}", [("a", 4), ("c", 5)], ["c"]),
])
def test_data_parallel_indices(lhs, loops, expected):
    from leir import parse_program
    from leir.lower.planner import PLoop

    stmt = parse_program(f"L^{{1}}_{{a=0}}[{lhs}=1;];").nests[0].body[0]
    assert [lp.var for lp in blocks.data_parallel(stmt.lhs, [PLoop(v, 0, n, "serial") for v, n in loops])] == expected


def test_an_index_that_writes_an_element_twice_is_opaque_not_spatial():
    """Group norm sums groups of channels into F_{tx,a//3}: TVM must not take `a` as data parallel
    (a scheduler would run it in parallel and race), so it is opaque, and the sum gets an init block."""
    s = sig({"A": ((3, 6, 4), "float64")}, {"C": ((3, 2), "float64")})
    program = ("B^{3}_{tx=0}L^{6}_{a=0}L^{4}_{c=0}[C^{f64,g}_{tx,a//3}=C^{f64,g}_{tx,a//3}+A^{f64,g}_{tx,a,c};];")
    text = lower_to_script(program, s, form="tensorir")
    assert "v_tx = T.axis.spatial(3, tx)" in text and "v_a = T.axis.opaque(6, a)" in text
    assert "v_c = T.axis.reduce(4, c)" in text and 'T.sblock("C_init")' in text and "T.init()" not in text
    assert any("a iterated as opaque" in n for n in plan(program, s, form="tensorir").notes)
    assert forms_disagree(program, s) == "" and schedule_rejects(lower_to_primfunc(program, s, form="tensorir")) == ""


def test_a_global_intermediate_of_one_kernel_is_allocated_outside_it_on_cuda():
    """tanh over temporaries: D and E are global and live in one kernel; CUDA allocates global memory
    outside kernels only, so their writers iterate the thread loop as opaque (TVM lifts global
    buffers above blockIdx loops, not above threadIdx ones)."""
    from leir.lower import cuda_source

    s = sig({"A": ((4, 8), "float32")}, {"C": ((4, 8), "float32")})
    program = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a});E^{f32,g}_{tx,a}=exp(-A^{f32,g}_{tx,a});"
               "C^{f32,g}_{tx,a}=(D^{f32,g}_{tx,a}-E^{f32,g}_{tx,a})/(D^{f32,g}_{tx,a}+E^{f32,g}_{tx,a});];")
    assert "v_tx = T.axis.opaque(4, tx)" in lower_to_script(program, s, "cuda", form="tensorir")
    assert "v_tx = T.axis.opaque" not in lower_to_script(program, s, "llvm", form="tensorir")
    assert "__global__" in cuda_source(program, s, form="tensorir")
