"""Seeded input draws: deterministic, kinds differ, integers stay within the ranges programs need."""
from __future__ import annotations

import numpy as np
import pytest

from gpu_tasks.inputs import draw_inputs, make_draws, numpy_dtype, plan_inputs
from leir import Signature, parse_program


def sig(*tensors) -> Signature:
    return Signature.from_json({"tensors": [
        {"name": n, "shape": list(s), "dtype": d, "role": r} for n, s, d, r in tensors]})


CROSS_ENTROPY_SIG = sig(("A", (4, 5), "float64", "input"), ("C", (4,), "int64", "input"),
                        ("D", (), "float64", "output"))
CROSS_ENTROPY = ("B^{4}_{tx=0}L^{5}_{a=0}[E^{f64,g}_{tx}=max(E^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
                 "B^{4}_{tx=0}L^{5}_{a=0}[F^{f64,g}_{tx}=F^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a}-E^{f64,g}_{tx});];"
                 "B^{4}_{tx=0}L^{5}_{a=0}[G^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-E^{f64,g}_{tx}-log(F^{f64,g}_{tx});];"
                 "B^{4}_{tx=0}[D^{f64,g}=D^{f64,g}-G^{f64,g}_{tx,C^{i64,g}_{tx}}/4;];")


def test_draws_are_deterministic_and_seed_dependent():
    program = parse_program(CROSS_ENTROPY)
    first = make_draws(CROSS_ENTROPY_SIG, [program], 3, seed=0)
    again = make_draws(CROSS_ENTROPY_SIG, [program], 3, seed=0)
    other = make_draws(CROSS_ENTROPY_SIG, [program], 3, seed=1)
    for a, b in zip(first, again, strict=True):
        assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert first[0]["A"].tobytes() != other[0]["A"].tobytes()


def test_draw_kinds_differ_and_have_their_ranges():
    s = sig(("A", (64, 64), "float32", "input"), ("C", (64, 64), "float32", "output"))
    plans = plan_inputs(s, [])
    normal, uniform, wide = (draw_inputs(s, plans, d)["A"] for d in range(3))
    assert normal.dtype == np.float32 and normal.shape == (64, 64)
    assert np.abs(uniform).max() <= 1.0 and np.abs(normal).max() > 1.0
    assert np.abs(wide).max() > 2.0 and np.abs(wide).min() >= 0.0099
    assert (wide < 0).any() and (wide > 0).any()


def test_class_indices_stay_below_the_class_count():
    plans = plan_inputs(CROSS_ENTROPY_SIG, [parse_program(CROSS_ENTROPY)])
    assert (plans["C"].low, plans["C"].high) == (0, 4)
    for d in range(6):
        c = draw_inputs(CROSS_ENTROPY_SIG, plans, d)["C"]
        assert c.dtype == np.int64 and c.min() >= 0 and c.max() <= 4


@pytest.mark.parametrize("subscript, expected", [
    ("C^{i64,g}_{tx}+1", (-1, 3)),          # X+1 in [0, 4]
    ("a+C^{i64,g}_{tx}", (0, 2)),           # a in [0, 2]: X+a in [0, 4]
    ("C^{i64,g}_{tx}-a", (2, 4)),
    ("4-C^{i64,g}_{tx}", (0, 4)),
])
def test_compound_gather_subscripts_narrow_the_range(subscript, expected):
    s = sig(("A", (4, 5), "float64", "input"), ("C", (4,), "int32", "input"),
            ("D", (4, 3), "float64", "output"))
    text = f"B^{{4}}_{{tx=0}}L^{{3}}_{{a=0}}[D^{{f64,g}}_{{tx,a}}=A^{{f64,g}}_{{tx,{subscript}}};];"
    plan = plan_inputs(s, [parse_program(text)])["C"]
    assert (plan.low, plan.high) == expected


def test_ranges_hold_for_both_programs_of_a_pair():
    s = sig(("A", (4, 5), "float64", "input"), ("C", (4,), "int64", "input"), ("D", (4,), "float64", "output"))
    wide = parse_program("B^{4}_{tx=0}[D^{f64,g}_{tx}=A^{f64,g}_{tx,C^{i64,g}_{tx}};];")
    narrow = parse_program("B^{4}_{tx=0}[D^{f64,g}_{tx}=A^{f64,g}_{tx,C^{i64,g}_{tx}+2};];")
    plan = plan_inputs(s, [wide, narrow])["C"]
    assert (plan.low, plan.high) == (0, 2)


def test_integers_used_as_values_are_small_and_bools_are_masks():
    s = sig(("A", (100,), "int32", "input"), ("M", (100,), "bool", "input"), ("C", (100,), "int32", "output"))
    program = parse_program("B^{100}_{tx=0}[C^{i32,g}_{tx}=if_then_else(M^{bool,g}_{tx},A^{i32,g}_{tx},0);];")
    inputs = make_draws(s, [program], 1)[0]
    assert inputs["A"].dtype == np.int32 and -8 <= inputs["A"].min() and inputs["A"].max() <= 8
    assert inputs["M"].dtype == np.bool_ and 0 < inputs["M"].sum() < 100


@pytest.mark.parametrize("fn", ["log", "fast_log", "sqrt"])
def test_log_sqrt_arguments_and_divisors_are_positive(fn):
    """`fast_log` too: a searched state whose log became the row kernel's fast form, verified alone
    (KernelBench's best-state check), once drew negative inputs and failed as non-finite."""
    s = sig(("A", (50,), "float32", "input"), ("E", (50,), "float32", "input"), ("F", (50,), "float32", "input"),
            ("C", (50,), "float32", "output"))
    program = parse_program(f"B^{{50}}_{{tx=0}}[C^{{f32,g}}_{{tx}}={fn}(A^{{f32,g}}_{{tx}})/E^{{f32,g}}_{{tx}}"
                            "+F^{f32,g}_{tx};];")
    for inputs in make_draws(s, [program], 3):
        assert inputs["A"].min() > 0 and inputs["E"].min() > 0 and inputs["F"].min() < 0


def test_low_precision_dtypes():
    s = sig(("A", (8,), "bfloat16", "input"), ("F", (8,), "float16", "input"), ("C", (8,), "float32", "output"))
    inputs = make_draws(s, [], 1)[0]
    assert inputs["A"].dtype == numpy_dtype("bfloat16") and inputs["F"].dtype == np.float16
