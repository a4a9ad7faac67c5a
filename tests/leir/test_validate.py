"""Validation: one test per error kind, each with a program that has exactly that fault."""
from __future__ import annotations

import pytest

from leir import Signature, parse_program
from leir.validate import validate

MATMUL_SIG = Signature.from_json({"tensors": [
    {"name": "A", "shape": [4, 6], "dtype": "float64", "role": "input"},
    {"name": "C", "shape": [6, 5], "dtype": "float64", "role": "input"},
    {"name": "D", "shape": [4, 5], "dtype": "float64", "role": "output"}]})
MATMUL = "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"


def codes(text, sig=MATMUL_SIG):
    return [p.code for p in validate(parse_program(text), sig)]


def test_examples_are_valid(example):
    assert validate(parse_program(example["leir"]), Signature.from_json(example["signature"])) == []


@pytest.mark.parametrize("text, code", [
    # a tensor neither known nor written
    (MATMUL.replace("C^{f64,g}_{c,a}", "Q^{f64,g}_{c,a}"), "undefined-tensor"),
    # dtype disagreeing with the signature, and between two accesses of an intermediate
    (MATMUL.replace("C^{f64,g}_{c,a}", "C^{f32,g}_{c,a}"), "type-conflict"),
    ("B^{4}_{tx=0}L^{5}_{a=0}[E^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};D^{f64,g}_{tx,a}=E^{f32,g}_{tx,a};];", "type-conflict"),
    # shared/local scope on a known tensor
    (MATMUL.replace("A^{f64,g}", "A^{f64,s}"), "scope-on-known"),
    # binding names: on a non-B loop, and a B loop without one
    (MATMUL.replace("L^{5}_{a=0}", "L^{5}_{ty=0}").replace("_{tx,a}", "_{tx,ty}").replace("C^{f64,g}_{c,a}",
                                                                                            "C^{f64,g}_{c,ty}"),
     "bind-name"),
    (MATMUL.replace("B^{4}_{tx=0}", "B^{4}_{d=0}").replace("tx", "d"), "bind-name"),
    # an index used outside its loop
    (MATMUL.replace("C^{f64,g}_{c,a}", "C^{f64,g}_{f,a}"), "index-out-of-scope"),
    # a constant subscript out of range
    (MATMUL.replace("A^{f64,g}_{tx,c}", "A^{f64,g}_{tx,6}"), "subscript-out-of-range"),
    # a write of a known tensor beyond its shape
    (MATMUL.replace("L^{5}_{a=0}", "L^{6}_{a=0}").replace("C^{f64,g}_{c,a}", "C^{f64,g}_{c,0}"),
     "write-out-of-range"),
    # writing an input
    (MATMUL + "B^{4}_{tx=0}L^{6}_{a=0}[A^{f64,g}_{tx,a}=0;];", "write-to-input"),
    # wrong number of subscripts
    (MATMUL.replace("A^{f64,g}_{tx,c}", "A^{f64,g}_{tx}"), "rank-mismatch"),
    # an update form without implicit initialisation (e+X), of a tensor nobody wrote
    ("B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,c}*C^{f64,g}_{c,a}+D^{f64,g}_{tx,a};];",
     "uninitialised-read"),
    # reading an intermediate that is only written by a later nest
    ("B^{4}_{tx=0}L^{5}_{a=0}[D^{f64,g}_{tx,a}=E^{f64,g}_{tx,a};];B^{4}_{tx=0}L^{5}_{a=0}[E^{f64,g}_{tx,a}=1;];",
     "uninitialised-read"),
    # the output never written
    ("B^{4}_{tx=0}L^{5}_{a=0}[E^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];", "output-not-written"),
    # a zero extent
    (MATMUL.replace("L^{6}_{c=0}", "L^{0}_{c=0}"), "loop-extent"),
    # a loop variable shadowing an enclosing one
    ("B^{4}_{tx=0}[L^{5}_{tx=0}[D^{f64,g}_{tx,0}=1;];];", "loop-shadow"),
    # a write subscript that depends on data: the intermediate's shape cannot be inferred
    ("B^{4}_{tx=0}L^{5}_{a=0}[E^{f64,g}_{A^{f64,g}_{tx,a}}=1;D^{f64,g}_{tx,a}=E^{f64,g}_{0};];", "shape-unknown"),
])
def test_each_error_kind_is_reported(text, code):
    found = codes(text)
    assert code in found, found


def test_problems_name_nest_and_statement():
    text = MATMUL + "B^{4}_{tx=0}L^{5}_{a=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+Q^{f64,g}_{tx};];"
    [problem] = validate(parse_program(text), MATMUL_SIG)
    assert (problem.code, problem.nest, problem.statement) == ("undefined-tensor", 2, 2)
    assert str(problem).startswith("nest 2, statement 2: Q is not in the signature")


@pytest.mark.parametrize("text", [
    # implicit initialisation forms (§4.4): X-e, X*e, max(X,e), min(X,e)
    MATMUL.replace("D^{f64,g}_{tx,a}+A", "D^{f64,g}_{tx,a}-A"),
    MATMUL.replace("D^{f64,g}_{tx,a}+A", "D^{f64,g}_{tx,a}*A"),
    "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=max(D^{f64,g}_{tx,a},A^{f64,g}_{tx,c});];",
    "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=min(D^{f64,g}_{tx,a},A^{f64,g}_{tx,c});];",
    # a scan with an explicit boundary reads earlier elements of itself: not an uninitialised read
    "B^{4}_{tx=0}L^{5}_{a=0}[D^{f64,g}_{tx,a}=max(if_then_else(a-1<0,-inf,D^{f64,g}_{tx,a-1}),A^{f64,g}_{tx,a});];",
    # a guarded read of the element itself (argmax style) after a plain store
    "B^{4}_{tx=0}L^{5}_{a=0}[D^{f64,g}_{tx,a}=0;];B^{4}_{tx=0}L^{5}_{a=0}[D^{f64,g}_{tx,a}="
    "if_then_else(A^{f64,g}_{tx,a}>0,a,D^{f64,g}_{tx,a});];",
])
def test_valid_forms_are_accepted(text):
    assert codes(text) == []


# --- mixed precision (docs/leir.md §4.5) ------------------------------------------------------------------

HALF_SIG = Signature.from_json({"tensors": [
    {"name": "A", "shape": [4, 6], "dtype": "float16", "role": "input"},
    {"name": "C", "shape": [6, 5], "dtype": "float16", "role": "input"},
    {"name": "D", "shape": [4, 5], "dtype": "float16", "role": "output"}]})
HALF_MATMUL = ("B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[E^{f32,l}_{tx,a}=E^{f32,l}_{tx,a}+A^{f16,g}_{tx,c}*C^{f16,g}_{c,a};];"
               "B^{4}_{tx=0}L^{5}_{a=0}[D^{f16,g}_{tx,a}=E^{f32,l}_{tx,a};];")


def test_a_float32_accumulator_over_float16_operands_is_valid_and_keeps_its_own_dtype():
    from leir.printer import format_program
    from leir.validate import intermediates_json

    program = parse_program(HALF_MATMUL)
    assert format_program(program) == HALF_MATMUL  # the printer keeps every access's own superscript
    assert validate(program, HALF_SIG) == []
    assert intermediates_json(program, HALF_SIG) == {"E": {"shape": [4, 5], "dtype": "float32", "scope": "l"}}


@pytest.mark.parametrize("text", [
    # one tensor, two dtypes: the accumulator read as float16 where it is written as float32
    HALF_MATMUL.replace("D^{f16,g}_{tx,a}=E^{f32,l}_{tx,a}", "D^{f16,g}_{tx,a}=E^{f16,l}_{tx,a}"),
    # a known tensor read in another dtype than the signature's (conversions belong to the statement)
    HALF_MATMUL.replace("A^{f16,g}_{tx,c}", "A^{f32,g}_{tx,c}"),
])
def test_mixed_precision_still_gives_each_tensor_one_dtype(text):
    assert "type-conflict" in codes(text, HALF_SIG)
