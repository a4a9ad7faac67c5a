"""Property tests: random trees round-trip; mutated text parses or raises LeirSyntaxError only;
the fast parser and the spec parser accept the same language."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from leir_trees import programs
from tests_examples import EXAMPLE_TEXTS

from leir import LeirSyntaxError, format_program, parse_program
from leir.parse import parse_with_spec

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(programs)
def test_random_trees_round_trip(program):
    text = format_program(program)
    assert parse_program(text) == program
    assert parse_with_spec(text) == program
    assert format_program(parse_program(text)) == text


MUTATION_CHARS = list("[];{}^_=,()+-*/%<>&|.0123456789 \n") + ["**", "//", "<=", "inf", "exp(", "A", "a", "tx", "L^{4}"]


@st.composite
def mutated_texts(draw):
    text = draw(st.one_of(st.sampled_from(EXAMPLE_TEXTS), programs.map(format_program)))
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["delete", "insert", "duplicate", "swap"]))
        if kind == "delete" and text:
            text = text[:pos] + text[pos + draw(st.integers(1, 5)):]
        elif kind == "insert":
            text = text[:pos] + draw(st.sampled_from(MUTATION_CHARS)) + text[pos:]
        elif kind == "duplicate":
            text = text[:pos] + text[pos:pos + draw(st.integers(1, 8))] + text[pos:]
        elif pos + 1 < len(text):
            text = text[:pos] + text[pos + 1] + text[pos] + text[pos + 2:]
    return text


def _outcome(parse, text):
    try:
        return ("ok", parse(text))
    except LeirSyntaxError as e:
        return ("error", (e.line, e.column))


@SETTINGS
@given(mutated_texts())
def test_mutations_parse_or_raise_syntax_error_only(text):
    fast = _outcome(parse_program, text)
    spec = _outcome(parse_with_spec, text)
    assert fast == spec  # same tree, or the same error position
    if fast[0] == "ok":
        assert parse_program(format_program(fast[1])) == fast[1]
