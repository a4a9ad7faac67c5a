"""The lowering computes what docs/leir.md §4 says: every loop kind, implicit initialisation for any
subscripts and loop order, nested nests, gathers, scans, 0-d tensors, bare indices, operators.
Each program is built for the CPU in both forms (plain and TensorIR) and compared on several seeded
draws with the reference interpreter of `test_lower_oracle` (float64: to 1e-12)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_lower_oracle import interpret, random_inputs

from leir import Signature
from leir.lower import FORMS, build, plan, run_executable


def sig(inputs: dict, outputs: dict) -> Signature:
    """sig({"A": ((4, 6), "float64")}, {"C": ((4,), "float64")})"""
    tensors = [{"name": n, "shape": list(s), "dtype": d, "role": "input"} for n, (s, d) in inputs.items()]
    tensors += [{"name": n, "shape": list(s), "dtype": d, "role": "output"} for n, (s, d) in outputs.items()]
    return Signature.from_json({"tensors": tensors})


def check(program: str, signature: Signature, seeds=(0, 1, 2), rtol=1e-12, atol=1e-12, int_high=4):
    """Both forms (plain loops, TensorIR blocks) agree with the oracle."""
    for form in FORMS:
        ex = build(program, signature, form=form)
        for seed in seeds:
            inputs = random_inputs(signature, seed, int_high)
            got = run_executable(ex, signature, inputs)
            want = interpret(program, signature, inputs)
            for name in want:
                np.testing.assert_allclose(np.asarray(got[name], dtype=np.float64),
                                           np.asarray(want[name], dtype=np.float64), rtol=rtol, atol=atol,
                                           err_msg=f"{form} form, output {name}, seed {seed}")


def kinds(program: str, signature: Signature, target="llvm") -> list[tuple[str, str]]:
    """(LEIR var, lowered kind) of every loop of the plan, in tree order."""
    out = []

    def visit(item):
        if hasattr(item, "body") and hasattr(item, "kind"):
            out.append((item.var, item.kind))
            for b in item.body:
                visit(b)

    for it in plan(program, signature, target).items:
        visit(it)
    return out


ROWSUM = sig({"A": ((4, 6), "float64")}, {"C": ((4,), "float64")})
MAT = sig({"A": ((4, 6), "float64"), "C": ((6, 5), "float64")}, {"D": ((4, 5), "float64")})
ELEM = sig({"A": ((4, 8), "float64")}, {"C": ((4, 8), "float64")})


# --- loop kinds ------------------------------------------------------------------------------------

def test_parallel_spatial_loop_is_parallel():
    p = "P^{4}_{a=0}L^{6}_{c=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+A^{f64,g}_{a,c};];"
    assert ("a", "parallel") in kinds(p, ROWSUM)
    check(p, ROWSUM)


def test_parallel_reduction_axis_is_serial():
    p = "L^{4}_{a=0}P^{6}_{c=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+A^{f64,g}_{a,c};];"
    assert ("c", "serial") in kinds(p, ROWSUM)
    notes = plan(p, ROWSUM).notes
    assert any("same element" in n for n in notes)
    check(p, ROWSUM)


def test_parallel_outermost_reduction_axis_is_serial():
    p = "P^{6}_{c=0}V^{4}_{a=0}[C^{f64,g}_{a}=max(C^{f64,g}_{a},A^{f64,g}_{a,c});];"
    assert kinds(p, ROWSUM)[-2:] == [("c", "serial"), ("a", "vectorized")]
    check(p, ROWSUM)


def test_vectorized_innermost_loop():
    p = "L^{4}_{a=0}V^{8}_{c=0}[C^{f64,g}_{a,c}=if_then_else(A^{f64,g}_{a,c}>0,A^{f64,g}_{a,c}*2,-1);];"
    assert ("c", "vectorized") in kinds(p, ELEM)
    check(p, ELEM)


def test_vectorized_reduction_axis_is_serial():
    p = "L^{4}_{a=0}V^{6}_{c=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+A^{f64,g}_{a,c};];"
    assert ("c", "serial") in kinds(p, ROWSUM)
    check(p, ROWSUM)


def test_vectorized_outer_loop_is_serial():
    p = "V^{4}_{a=0}L^{8}_{c=0}[C^{f64,g}_{a,c}=exp(A^{f64,g}_{a,c});];"
    assert ("a", "serial") in kinds(p, ELEM)
    check(p, ELEM)


def test_unrolled_loops():
    p = "U^{4}_{a=0}U^{8}_{c=0}[C^{f64,g}_{a,c}=A^{f64,g}_{a,c}*A^{f64,g}_{a,c};];"
    assert kinds(p, ELEM) == [("a", "unroll"), ("c", "unroll")]
    check(p, ELEM)


def test_bound_loops_are_serial_on_cpu():
    p = "B^{4}_{tx=0}B^{8}_{ty=0}[C^{f64,g}_{tx,ty}=abs(A^{f64,g}_{tx,ty});];"
    assert kinds(p, ELEM) == [("tx", "serial"), ("ty", "serial")]
    check(p, ELEM)


def test_nested_parallel_loops_run_the_inner_one_serially():
    p = "P^{4}_{a=0}P^{8}_{c=0}[C^{f64,g}_{a,c}=A^{f64,g}_{a,c}+1;];"
    assert kinds(p, ELEM) == [("a", "parallel"), ("c", "serial")]
    check(p, ELEM)


def test_parallel_tiled_loop_with_compound_subscript():
    s = sig({"A": ((8, 3), "float64")}, {"C": ((8,), "float64")})
    p = "P^{2}_{g=0}L^{4}_{h=0}L^{3}_{c=0}[C^{f64,g}_{g*4+h}=C^{f64,g}_{g*4+h}+A^{f64,g}_{g*4+h,c};];"
    assert ("g", "parallel") in kinds(p, s)
    check(p, s)


def test_parallel_loop_that_writes_one_element_twice_is_serial():
    s = sig({"A": ((8,), "float64")}, {"C": ((4,), "float64")})
    p = "P^{8}_{a=0}[C^{f64,g}_{a//2}=C^{f64,g}_{a//2}+A^{f64,g}_{a};];"
    assert kinds(p, s)[-1] == ("a", "serial")  # the nest (after its fill loop)
    check(p, s)


def test_parallel_loop_with_last_write_semantics_is_serial():
    # a plain store repeated across P: the last iteration's value must win
    p = "L^{4}_{a=0}P^{6}_{c=0}[C^{f64,g}_{a}=A^{f64,g}_{a,c};];"
    assert ("c", "serial") in kinds(p, ROWSUM)
    check(p, ROWSUM)


# --- implicit initialisation (§4.4) ----------------------------------------------------------------

def test_matmul_with_reduction_loop_outermost():
    check("L^{6}_{c=0}B^{4}_{tx=0}L^{5}_{a=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];",
          MAT)


def test_matmul_with_reduction_loop_in_the_middle():
    check("P^{4}_{tx=0}L^{6}_{c=0}V^{5}_{a=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];",
          MAT)


def test_split_reduction_loop():
    s = sig({"A": ((3, 8), "float64")}, {"C": ((3,), "float64")})
    check("L^{3}_{a=0}L^{4}_{g=0}L^{2}_{h=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+A^{f64,g}_{a,g*2+h};];", s)


def test_split_spatial_loop_with_reduction_between():
    s = sig({"A": ((16, 3), "float64")}, {"C": ((16,), "float64")})
    check("L^{4}_{g=0}L^{3}_{c=0}L^{4}_{h=0}[C^{f64,g}_{g*4+h}=C^{f64,g}_{g*4+h}+A^{f64,g}_{g*4+h,c};];", s)


def test_reduction_with_offset_subscript():
    s = sig({"A": ((4, 3), "float64")}, {"C": ((5,), "float64")})
    check("L^{4}_{c=0}L^{3}_{k=0}[C^{f64,g}_{c+1}=C^{f64,g}_{c+1}+A^{f64,g}_{c,k};];", s)


def test_reduction_into_overlapping_window():
    # C_{c+k} receives from several (c, k): its first update is not at k == 0
    s = sig({"A": ((4, 3), "float64")}, {"C": ((6,), "float64")})
    check("L^{4}_{c=0}L^{3}_{k=0}[C^{f64,g}_{c+k}=max(C^{f64,g}_{c+k},A^{f64,g}_{c,k});];", s)


@pytest.mark.parametrize("form", ["C^{f64,g}_{a}*A^{f64,g}_{a,c}", "min(C^{f64,g}_{a},A^{f64,g}_{a,c})",
                                  "max(C^{f64,g}_{a},A^{f64,g}_{a,c})", "C^{f64,g}_{a}-A^{f64,g}_{a,c}"])
def test_each_identity(form):
    check(f"L^{{6}}_{{c=0}}L^{{4}}_{{a=0}}[C^{{f64,g}}_{{a}}={form};];", ROWSUM)


def test_update_of_a_written_tensor_accumulates():
    s = sig({"A": ((4, 6), "float64"), "E": ((4,), "float64")}, {"C": ((4,), "float64")})
    check("L^{4}_{a=0}L^{6}_{c=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+A^{f64,g}_{a,c};];"
          "L^{4}_{a=0}[C^{f64,g}_{a}=C^{f64,g}_{a}*E^{f64,g}_{a};];", s)


def test_scatter_add_through_a_gather_on_the_left():
    s = sig({"A": ((6,), "float64"), "I": ((6,), "int64")}, {"C": ((4,), "float64")})
    p = "P^{6}_{a=0}[C^{f64,g}_{I^{i64,g}_{a}}=C^{f64,g}_{I^{i64,g}_{a}}+A^{f64,g}_{a};];"
    assert kinds(p, s)[-1] == ("a", "serial")
    check(p, s)


# --- nests, scans, gathers, 0-d, bare indices ------------------------------------------------------

def test_nested_nests_with_a_local_accumulator():
    s = sig({"A": ((4, 8), "float64")}, {"C": ((4, 8), "float64")})
    check("B^{4}_{tx=0}[L^{8}_{a=0}[M^{f64,l}_{tx}=max(M^{f64,l}_{tx},A^{f64,g}_{tx,a});];"
          "L^{8}_{a=0}[S^{f64,l}_{tx}=S^{f64,l}_{tx}+exp(A^{f64,g}_{tx,a}-M^{f64,l}_{tx});];"
          "L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-M^{f64,l}_{tx})/S^{f64,l}_{tx};];];", s)


def test_nested_nest_accumulator_is_initialised_once():
    s = sig({"A": ((3, 4), "float64")}, {"C": ((3,), "float64")})
    check("L^{3}_{a=0}[L^{4}_{c=0}[F^{f64,g}=F^{f64,g}+A^{f64,g}_{a,c};];C^{f64,g}_{a}=F^{f64,g};];", s)


def test_statement_after_nested_nest_and_before_it():
    s = sig({"A": ((3, 4), "float64")}, {"C": ((3,), "float64")})
    check("P^{3}_{a=0}[G^{f64,s}_{a}=A^{f64,g}_{a,0}*2;L^{4}_{c=0}[F^{f64,g}_{a}=F^{f64,g}_{a}+A^{f64,g}_{a,c};];"
          "C^{f64,g}_{a}=F^{f64,g}_{a}+G^{f64,s}_{a};];", s)


def test_scan_with_explicit_boundary():
    s = sig({"D": ((2, 5), "float64")}, {"C": ((2, 5), "float64")})
    check("B^{2}_{tx=0}L^{5}_{a=0}[H^{f64,g}_{tx,a}=max(if_then_else(a-1<0,-inf,H^{f64,g}_{tx,a-1}),"
          "D^{f64,g}_{tx,a});];B^{2}_{tx=0}L^{5}_{a=0}[C^{f64,g}_{tx,a}=H^{f64,g}_{tx,a};];", s)


def test_scan_in_a_single_nest_keeps_its_intermediate_across_iterations():
    s = sig({"A": ((3, 6), "float64")}, {"C": ((3, 6), "float64")})
    check("P^{3}_{i=0}L^{6}_{a=0}[H^{f64,l}_{i,a}=if_then_else(a<1,A^{f64,g}_{i,a},H^{f64,l}_{i,a-1}+A^{f64,g}_{i,a});"
          "C^{f64,g}_{i,a}=H^{f64,l}_{i,a};];", s)


def test_gather_rows():
    s = sig({"W": ((5, 3), "float64"), "I": ((4,), "int64")}, {"C": ((4, 3), "float64")})
    check("B^{4}_{tx=0}L^{3}_{a=0}[C^{f64,g}_{tx,a}=W^{f64,g}_{I^{i64,g}_{tx},a};];", s, int_high=5)


def test_gather_with_index_arithmetic_and_int32_index():
    s = sig({"W": ((10,), "float64"), "I": ((4,), "int32")}, {"C": ((4,), "float64")})
    check("L^{4}_{a=0}[C^{f64,g}_{a}=W^{f64,g}_{I^{i32,g}_{a}*2+1};];", s, int_high=5)


def test_zero_dim_output_and_intermediate():
    s = sig({"A": ((4, 3), "float64")}, {"D": ((), "float64")})
    check("B^{4}_{tx=0}L^{3}_{a=0}[E^{f64,g}=max(E^{f64,g},A^{f64,g}_{tx,a});];"
          "B^{4}_{tx=0}L^{3}_{a=0}[D^{f64,g}=D^{f64,g}+A^{f64,g}_{tx,a}-E^{f64,g};];", s)


def test_zero_dim_input():
    s = sig({"A": ((4,), "float64"), "S": ((), "float64")}, {"C": ((4,), "float64")})
    check("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a}*S^{f64,g};];", s)


def test_bare_index_values():
    s = sig({}, {"C": ((4, 3), "float64"), "K": ((4, 3), "int64")})
    check("L^{4}_{a=0}L^{3}_{c=0}[C^{f64,g}_{a,c}=a*10+c/2;K^{i64,g}_{a,c}=a*10-c;];", s, seeds=(0,))


def test_argmax_ties_pick_the_first_index():
    s = sig({"A": ((3, 5), "float64")}, {"C": ((3,), "int64")})
    p = ("B^{3}_{tx=0}L^{5}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});C^{i64,g}_{tx}=0;];"
         "B^{3}_{tx=0}L^{5}_{a=0}[C^{i64,g}_{tx}=if_then_else(A^{f64,g}_{tx,4-a}>=D^{f64,g}_{tx},4-a,C^{i64,g}_{tx});];")
    ex = build(p, s)
    a = np.array([[1.0, 3, 3, 0, 3], [0, 0, 0, 0, 0], [-1, -2, -3, -4, -0.5]])
    np.testing.assert_array_equal(run_executable(ex, s, {"A": a})["C"], [1, 0, 4])


# --- operators -------------------------------------------------------------------------------------

@pytest.mark.parametrize("rhs", [
    "A^{f64,g}_{a,c}**2", "A^{f64,g}_{a,c}**3", "A^{f64,g}_{a,c}**-1", "abs(A^{f64,g}_{a,c})**0.5",
    "abs(A^{f64,g}_{a,c})**1.5", "2**A^{f64,g}_{a,c}", "-A^{f64,g}_{a,c}**2",
    "A^{f64,g}_{a,c}//0.7", "A^{f64,g}_{a,c}%0.7", "exp(A^{f64,g}_{a,c})", "log(abs(A^{f64,g}_{a,c}))",
    "sqrt(abs(A^{f64,g}_{a,c}))", "erf(A^{f64,g}_{a,c})", "max(A^{f64,g}_{a,c},0.25)",
    "min(A^{f64,g}_{a,c},-inf)", "if_then_else(A^{f64,g}_{a,c}>0,inf,-inf)",
    "if_then_else(1<=a<3|c==0,A^{f64,g}_{a,c},-A^{f64,g}_{a,c})",
    "if_then_else(0<A^{f64,g}_{a,c}<=1&c>=a,1,0)", "if_then_else(a!=c,a-c,(a+1)//2)",
    "A^{f64,g}_{(a+3)//2,c}+A^{f64,g}_{(a+7)%4,(c-1)%8}",
])
def test_operator(rhs):
    check(f"L^{{4}}_{{a=0}}L^{{8}}_{{c=0}}[C^{{f64,g}}_{{a,c}}={rhs};];", ELEM)


def test_integer_floor_division_and_modulo():
    s = sig({"A": ((8,), "int64")}, {"C": ((8,), "int64"), "D": ((8,), "int64")})
    p = "L^{8}_{a=0}[C^{i64,g}_{a}=(A^{i64,g}_{a}-5)//3;D^{i64,g}_{a}=(A^{i64,g}_{a}-5)%3;];"
    ex = build(p, s)
    a = np.arange(8)
    out = run_executable(ex, s, {"A": a})
    np.testing.assert_array_equal(out["C"], (a - 5) // 3)
    np.testing.assert_array_equal(out["D"], (a - 5) % 3)


def test_bool_access_as_a_condition():
    s = sig({"A": ((4, 8), "float64"), "M": ((4, 8), "bool")}, {"C": ((4, 8), "float64")})
    check("L^{4}_{a=0}L^{8}_{c=0}[C^{f64,g}_{a,c}=if_then_else(M^{bool,g}_{a,c}&A^{f64,g}_{a,c}>0,"
          "A^{f64,g}_{a,c},0);];", s)


def test_comparison_with_an_int_tensor_in_a_half_statement():
    # the index is compared as int64 (the tensor's dtype), not converted to float16 first
    s = sig({"A": ((4,), "int64")}, {"C": ((4, 3000), "float16")})
    p = "L^{4}_{a=0}L^{3000}_{c=0}[C^{f16,g}_{a,c}=if_then_else(A^{i64,g}_{a}==c,1,0);];"
    ex = build(p, s)
    a = np.array([2049, 2050, 0, 2999])
    out = run_executable(ex, s, {"A": a})["C"]
    np.testing.assert_array_equal(np.argmax(out, axis=1), a)
    assert out.sum() == 4


def test_fill_inside_the_loops_of_a_nested_nest():
    s = sig({"A": ((3, 4, 5), "float64")}, {"C": ((3, 4), "float64")})
    p = "L^{3}_{a=0}[L^{4}_{c=0}L^{5}_{d=0}[C^{f64,g}_{a,c}=C^{f64,g}_{a,c}+A^{f64,g}_{a,c,d};];];"
    check(p, s)
    (outer,) = plan(p, s).items
    assert [type(x).__name__ for x in outer.body[0].body] == ["PStore", "PLoop"]  # inside c, before d


def test_two_reductions_initialised_at_the_same_place():
    s = sig({"A": ((4, 6), "float64")}, {"C": ((4,), "float64"), "D": ((4,), "float64")})
    p = "P^{4}_{a=0}L^{6}_{c=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+A^{f64,g}_{a,c};D^{f64,g}_{a}=max(D^{f64,g}_{a},A^{f64,g}_{a,c});];"
    check(p, s)
    (loop,) = plan(p, s).items
    assert [x.identity for x in loop.body[:2]] == [0, float("-inf")]


def test_fills_of_reductions_that_cannot_be_nested_come_before_the_nest():
    p = "L^{6}_{c=0}P^{4}_{a=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+A^{f64,g}_{a,c};];"
    fill, nest = plan(p, ROWSUM).items
    assert (fill.var, fill.kind, fill.body[0].identity) == ("a", "parallel", 0)  # a fill never races
    assert (nest.var, nest.body[0].var, nest.body[0].kind) == ("c", "a", "parallel")


def test_shadowed_loop_index_is_an_error():
    from leir.lower import LoweringError

    with pytest.raises(LoweringError, match="loop index a is bound by two enclosing loops"):
        plan("L^{4}_{a=0}[L^{6}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a,a};];];", ROWSUM)


def test_index_names_that_are_python_keywords():
    s = sig({"A": ((4, 3), "float64")}, {"C": ((4, 3), "float64")})
    check("L^{4}_{if=0}L^{3}_{in=0}[C^{f64,g}_{if,in}=A^{f64,g}_{if,in}+if;];", s)


@pytest.mark.parametrize("program, signature", [
    # a spatial loop split in two: L^{4}_{g}L^{4}_{h} over g*4+h, with the reduction innermost ...
    ("L^{4}_{g=0}L^{4}_{h=0}L^{3}_{c=0}[C^{f64,g}_{g*4+h}=C^{f64,g}_{g*4+h}+A^{f64,g}_{g*4+h,c};];",
     sig({"A": ((16, 3), "float64")}, {"C": ((16,), "float64")})),
    # ... and outermost
    ("L^{3}_{c=0}L^{4}_{g=0}L^{4}_{h=0}[C^{f64,g}_{g*4+h}=max(C^{f64,g}_{g*4+h},A^{f64,g}_{g*4+h,c});];",
     sig({"A": ((16, 3), "float64")}, {"C": ((16,), "float64")})),
    # the reduction loop split in two
    ("L^{2}_{a=0}L^{4}_{g=0}L^{4}_{h=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+A^{f64,g}_{a,g*4+h};];",
     sig({"A": ((2, 16), "float64")}, {"C": ((2,), "float64")})),
    # tiled matmul: reduction tiles between the spatial tiles
    ("L^{2}_{g=0}L^{3}_{k=0}L^{2}_{h=0}L^{5}_{a=0}L^{2}_{m=0}[D^{f64,g}_{g*2+h,a}=D^{f64,g}_{g*2+h,a}"
     "+A^{f64,g}_{g*2+h,k*2+m}*C^{f64,g}_{k*2+m,a};];", MAT),
])
def test_split_and_tiled_loops(program, signature):
    check(program, signature)


MATMUL_LOOPS = {"tx": "{k}^{{4}}_{{tx=0}}", "a": "{k}^{{5}}_{{a=0}}", "c": "{k}^{{6}}_{{c=0}}"}


@pytest.mark.parametrize("order", list(itertools.permutations(MATMUL_LOOPS)), ids="-".join)
@pytest.mark.parametrize("kinds", [("P", "L", "V"), ("V", "P", "U"), ("U", "V", "P")], ids="".join)
def test_matmul_in_every_loop_order_and_kind(order, kinds):
    loops = "".join(MATMUL_LOOPS[v].format(k=k) for v, k in zip(order, kinds, strict=True))
    check(loops + "[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];", MAT, seeds=(0,))
