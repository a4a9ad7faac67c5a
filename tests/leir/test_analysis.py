"""Analysis: intermediate shapes, implicit initialisation, axes, read/write sets, index ranges."""
from __future__ import annotations

import math

import pytest
from tests_examples import EXAMPLES

from leir import Signature, parse_expr, parse_program
from leir.analysis import (
    affine_form,
    implicit_inits,
    index_range,
    nest_access_sets,
    reduction_axes,
    reduction_op,
    spatial_axes,
    statement_sites,
    tensor_table,
)


def by_name(examples, name):
    ex = next(e for e in examples if e["name"] == name)
    return parse_program(ex["leir"]), Signature.from_json(ex["signature"])


@pytest.fixture
def examples():
    return EXAMPLES


def test_intermediate_shapes_are_the_bounding_box_of_writes(examples):
    program, sig = by_name(examples, "conv2d_pad1_bias")
    table = tensor_table(program, sig)
    assert table["F"].shape == (1, 2, 6, 6) and table["F"].role == "intermediate"
    assert list(table)[:4] == ["A", "D", "E", "C"]  # signature order first
    program, sig = by_name(examples, "sum_dim1_keepdim")
    assert tensor_table(program, sig)["D"].shape == (2, 1, 4)  # constant subscript 0 -> extent 1


def test_shape_of_split_and_strided_writes():
    program = parse_program("L^{4}_{g=0}B^{4}_{tx=0}[E^{f32,l}_{g*4+tx}=1;E^{f32,l}_{17}=2;C^{f32,g}_{g}=E^{f32,l}_{g};];")
    sig = Signature.from_json({"tensors": [{"name": "C", "shape": [4], "dtype": "float32", "role": "output"}]})
    info = tensor_table(program, sig)["E"]
    assert (info.shape, info.scope, info.dtype) == ((18,), "l", "f32")


def test_implicit_initialisation_identities(examples):
    program, sig = by_name(examples, "softmax")
    assert implicit_inits(program, sig) == {0: -math.inf, 1: 0}
    program, sig = by_name(examples, "linear_with_bias")
    assert implicit_inits(program, sig) == {0: 0}  # the bias update accumulates, no init
    program, sig = by_name(examples, "argmax_first")
    assert implicit_inits(program, sig) == {0: -math.inf}  # C is stored first, then updated
    program, sig = by_name(examples, "cross_entropy_mean")
    assert implicit_inits(program, sig)[3] == 0  # D=D-G/4 on a 0-d output


@pytest.mark.parametrize("rhs, op", [
    ("X+A", "+"), ("X-A*C", "-"), ("X*A", "*"), ("X*A+C", "*"), ("X+A+C", "+"), ("max(X,A)", "max"),
    ("min(X,A)", "min"), ("A+X", None), ("(X+A)*C", None), ("X/A", None), ("X**2", None), ("-X+A", None),
    ("max(A,X)", None),
])
def test_reduction_op_follows_the_text_form(rhs, op):
    from leir.ast import Stmt

    x = parse_expr("X^{f32,g}_{a}")
    expr = parse_expr(rhs.replace("X", "X^{f32,g}_{a}").replace("A", "A^{f32,g}_{a}").replace("C", "C^{f32,g}_{a}"))
    assert reduction_op(Stmt(x, expr)) == op


def test_spatial_and_reduction_axes(examples):
    program, _ = by_name(examples, "max_pool2d_k2_s2")
    [site] = statement_sites(program)
    assert spatial_axes(site) == ("tx", "a", "c", "d")
    assert reduction_axes(site) == ("f", "g")


def test_access_sets_in_first_occurrence_order(examples):
    program, _ = by_name(examples, "cross_entropy_mean")
    sets = nest_access_sets(program.nests[3])
    assert sets.reads == ("D", "G", "C") and sets.writes == ("D",)


@pytest.mark.parametrize("text, rng", [
    ("c*2+f", (0, 11)), ("c-1", (-1, 3)), ("4-a", (0, 4)), ("c-c", (0, 0)), ("(c*2+f)//3", (0, 3)),
    ("c%3", (0, 2)), ("f%7", (0, 3)),
])
def test_index_ranges(text, rng):
    bounds = {"c": (0, 4), "f": (0, 3), "a": (0, 4)}
    assert index_range(parse_expr(text), bounds) == rng


def test_affine_form():
    assert affine_form(parse_expr("c*2+f-3+c")) == ({"c": 3, "f": 1}, -3)
    assert affine_form(parse_expr("c*f")) is None
    assert index_range(parse_expr("A^{i64,g}_{c}+1"), {"c": (0, 3)}) is None
