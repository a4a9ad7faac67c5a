"""`leir check` and lowering agree (issue 28, finding 5): on random programs whose subscripts are affine
(and sometimes not) in the loop indices, a program that validation accepts builds, and one that it
rejects only for a subscript out of range is refused by lowering for an access out of bounds.

Before, validation checked only constant subscripts and the writes of known tensors: `A_{a-5}` or
`A_{a+1000000}` passed `leir check` and failed to lower."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leir import Signature, format_program, parse_program
from leir.validate import validate

pytest.importorskip("tvm")

BOUNDS = {"subscript-out-of-range", "write-out-of-range"}


def _affine(var: str, coefficient: int, offset: int) -> str:
    term = "" if coefficient == 0 else var if coefficient == 1 else f"{coefficient}*{var}"
    if not term:
        return str(max(offset, 0))
    return term if offset == 0 else f"{term}+{offset}" if offset > 0 else f"{term}{offset}"


def _index(var: str):
    """An index expression in `var`: affine (a coefficient and an offset), or through // or %."""
    affine = st.builds(_affine, st.just(var), st.sampled_from([0, 1, 1, 1, 2]), st.integers(-3, 3))
    other = st.sampled_from([f"{var}//2", f"{var}%3", f"({var}+1)%2", f"3-{var}"])
    return st.one_of(affine, affine, other)


@st.composite
def programs(draw):
    m, n = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    p, q = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    reduce = draw(st.booleans())
    vars_ = ["tx", "a"] + (["c"] if reduce else [])

    def read(tensor="A"):
        return (f"{tensor}^{{f32,g}}_{{{draw(_index(draw(st.sampled_from(vars_))))},"
                f"{draw(_index(draw(st.sampled_from(vars_))))}}}")

    terms = [read() for _ in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):  # a read inside a branch: it may fall outside, as padding does
        terms.append(f"if_then_else(tx<{draw(st.integers(0, p))},{read()},0)")
    first = ""
    if not reduce and draw(st.booleans()):  # an intermediate written at an offset, then read back
        written, read_at = draw(st.integers(0, 2)), draw(st.integers(-1, 3))
        first = f"B^{{{p}}}_{{tx=0}}L^{{{q}}}_{{a=0}}[E^{{f32,l}}_{{tx,{_affine('a', 1, written)}}}={read()};];"
        terms.insert(0, f"E^{{f32,l}}_{{tx,{_affine('a', 1, read_at)}}}")
    rhs = "+".join(terms)
    loops = f"B^{{{p}}}_{{tx=0}}L^{{{q}}}_{{a=0}}" + (f"L^{{{draw(st.integers(1, 4))}}}_{{c=0}}" if reduce else "")
    body = "C^{f32,g}_{tx,a}=" + (f"C^{{f32,g}}_{{tx,a}}+{rhs}" if reduce else rhs)
    text = f"{first}{loops}[{body};];"
    signature = Signature.from_json({"tensors": [
        {"name": "A", "shape": [m, n], "dtype": "float32", "role": "input"},
        {"name": "C", "shape": [p, q], "dtype": "float32", "role": "output"}]})
    return parse_program(text), signature


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(programs())
def test_what_check_accepts_lowering_builds_and_what_it_refuses_for_bounds_lowering_refuses(case):
    from leir.lower import LoweringError, build, lower_to_primfunc

    program, signature = case
    problems = validate(program, signature)
    codes = {p.code for p in problems}
    if not problems:
        build(program, signature)  # raises LoweringError if they disagree
    elif codes <= BOUNDS:
        with pytest.raises(LoweringError, match="out of bounds"):
            lower_to_primfunc(program, signature)


@pytest.mark.parametrize("subscript", ["a-5", "a+1000000", "2*a", "a%3+4", "(a+1)//1"])
def test_the_issues_reads_are_refused_by_both_with_nest_and_statement(subscript):
    from leir.lower import LoweringError, lower_to_primfunc

    text = f"B^{{4}}_{{tx=0}}L^{{6}}_{{a=0}}[C^{{f32,g}}_{{tx,a}}=A^{{f32,g}}_{{tx,{subscript}}};];"
    signature = Signature.from_json({"tensors": [
        {"name": "A", "shape": [4, 6], "dtype": "float32", "role": "input"},
        {"name": "C", "shape": [4, 6], "dtype": "float32", "role": "output"}]})
    [problem] = validate(parse_program(text), signature)
    assert (problem.code, problem.nest, problem.statement) == ("subscript-out-of-range", 1, 1)
    assert problem.message.startswith(f"reads A at subscript 2 = {subscript}")
    with pytest.raises(LoweringError, match="reads A out of bounds"):
        lower_to_primfunc(text, signature)


def test_a_read_in_an_if_then_else_branch_may_fall_outside(tmp_path):
    """Padding: the branch is never evaluated where its subscript is out of range (both agree)."""
    from leir.lower import build

    text = "B^{4}_{tx=0}L^{6}_{a=0}[C^{f32,g}_{tx,a}=if_then_else(1<=a,A^{f32,g}_{tx,a-1},0);];"
    signature = Signature.from_json({"tensors": [
        {"name": "A", "shape": [4, 6], "dtype": "float32", "role": "input"},
        {"name": "C", "shape": [4, 6], "dtype": "float32", "role": "output"}]})
    assert validate(parse_program(text), signature) == []
    build(text, signature)
    assert format_program(parse_program(text)) == text


def test_a_constant_subscript_out_of_range_is_refused_by_both_even_in_a_branch():
    """A constant subscript outside its dimension is a mistake wherever it stands; `check` always
    reported it, and lowering now refuses it too (the differential test found the branch case)."""
    from leir.lower import LoweringError, lower_to_primfunc

    text = "B^{1}_{tx=0}L^{1}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{0,0}+if_then_else(tx<0,A^{f32,g}_{0,1},0);];"
    signature = Signature.from_json({"tensors": [
        {"name": "A", "shape": [1, 1], "dtype": "float32", "role": "input"},
        {"name": "C", "shape": [1, 1], "dtype": "float32", "role": "output"}]})
    [problem] = validate(parse_program(text), signature)
    assert problem.code == "subscript-out-of-range"
    with pytest.raises(LoweringError, match="reads A out of bounds: subscript 2 is 1"):
        lower_to_primfunc(text, signature)
