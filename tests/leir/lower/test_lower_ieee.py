"""Float arithmetic lowered as IEEE 754 computes it (leir/lower/ieee.py): TVM's simplifier folds
`x*0`, `x-x`, `(x+y)-y` and `(x+c)-c` as real arithmetic; a statement it would rewrite is emitted
over bound leaves, and every other statement (the published catalogue, a default lake's steps) as
before."""
from __future__ import annotations

import numpy as np
import pytest
from test_lower_oracle import golden_rows

from leir.lower import lower_to_script, run_numpy

SIG = {"tensors": [{"name": "A", "shape": [64], "dtype": "float32", "role": "input"},
                   {"name": "D", "shape": [64], "dtype": "float32", "role": "input"},
                   {"name": "C", "shape": [64], "dtype": "float32", "role": "output"}]}
A = np.linspace(-3, 3, 64, dtype=np.float32)
A[0] = np.inf
D = np.full(64, 1e10, dtype=np.float32)
D[1] = np.inf
F32 = np.float32

CASES = {
    "A*2+log(A)*0": (lambda: A * 2 + np.log(A) * F32(0)),
    "A*0": (lambda: A * F32(0)),
    "(A+10000000000.0)-10000000000.0": (lambda: (A + F32(1e10)) - F32(1e10)),
    "A*2+10000000000.0-10000000000.0": (lambda: A * 2 + F32(1e10) - F32(1e10)),
    "A-A": (lambda: A - A),
    "(A+D)-D": (lambda: (A + D) - D),
    "A+D-A": (lambda: A + D - A),
}


def leir(expression: str) -> str:
    rhs = expression.replace("A", "A^{f32,g}_{a}").replace("D", "D^{f32,g}_{a}")
    return "L^{64}_{a=0}[C^{f32,g}_{a}=" + rhs + ";];"


@pytest.mark.parametrize("form", ["plain", "tensorir"])
@pytest.mark.parametrize("expression", list(CASES))
def test_float_arithmetic_is_computed_as_written(expression, form):
    out = run_numpy(leir(expression), SIG, {"A": A, "D": D}, form=form)["C"]
    with np.errstate(all="ignore"):
        expected = CASES[expression]()
    np.testing.assert_array_equal(out, expected)  # NaN where IEEE gives NaN, the same rounding


def test_a_vector_loop_keeps_the_arithmetic_too():
    program = "V^{64}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}-A^{f32,g}_{a}+D^{f32,g}_{a}*0;];"
    out = run_numpy(program, SIG, {"A": A, "D": D})["C"]
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(out, A - A + D * F32(0))


def test_statements_the_simplifier_leaves_alone_are_lowered_as_before():
    # identities (`0+C` of a reduction, `x*1`), operations of two literals (a mean's `1/97`) and
    # canonical reorderings (`x>0` as `0<x`) fold exactly: no bindings
    for program in ["L^{64}_{a=0}[C^{f32,g}_{a}=0+A^{f32,g}_{a}*1;];",
                    "L^{64}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*(1/97);];",
                    "L^{64}_{a=0}[C^{f32,g}_{a}=if_then_else(A^{f32,g}_{a}>0,A^{f32,g}_{a},D^{f32,g}_{a});];"]:
        assert "T.Let" not in lower_to_script(program, SIG)
    assert "T.Let" in lower_to_script(leir("A-A"), SIG)


@pytest.mark.parametrize("row", golden_rows(), ids=lambda r: r["name"])
def test_the_published_catalogue_lowers_without_bindings(row):
    for form in ("plain", "tensorir"):
        assert "T.Let" not in lower_to_script(row["leir"], row["signature"], form=form)


def test_a_bfloat16_statement_is_computed_as_written_too():
    # bfloat16 loads go through their bits and every operation through a rounding Let: bound by bits
    import ml_dtypes

    sig = {"tensors": [{"name": "A", "shape": [8], "dtype": "bfloat16", "role": "input"},
                       {"name": "C", "shape": [8], "dtype": "bfloat16", "role": "output"}]}
    a = np.array([np.inf, -1, 0, 1, 2, 3, -np.inf, 5], dtype=ml_dtypes.bfloat16)
    out = run_numpy("L^{8}_{a=0}[C^{bf16,g}_{a}=A^{bf16,g}_{a}-A^{bf16,g}_{a};];", sig, {"A": a})["C"]
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(out.astype(np.float32), a.astype(np.float32) - a.astype(np.float32))


def test_a_guarded_branch_keeps_its_loads_inside_it():
    # A[a-1] is read only where a >= 1: bound outside the if_then_else, a = 0 would read A[-1]
    program = "L^{64}_{a=0}[C^{f32,g}_{a}=if_then_else(a>=1,A^{f32,g}_{a-1}-A^{f32,g}_{a-1},0);];"
    script = lower_to_script(program, SIG)
    assert "T.Let" in script and script.index("A[a - 1]") > script.index("T.if_then_else(")
    out = run_numpy(program, SIG, {"A": A, "D": D})["C"]
    with np.errstate(all="ignore"):
        expected = np.concatenate([[0], A[:-1] - A[:-1]]).astype(np.float32)
    np.testing.assert_array_equal(out, expected)
