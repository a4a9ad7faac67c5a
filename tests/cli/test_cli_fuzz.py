"""Fuzzing the command line's inputs (issue 28, item 8): mutated programs, signatures, prediction lines and
answers, and bytes that are not text, fed to the commands as files. Whatever comes in, a command ends
with exit status 0, 1 or 2, never with a traceback, and when it refuses the input it says where: a
`FILE:LINE:COL: error: ...` for syntax, an `error: ...` line naming the file or option, or JSON lines
whose errors carry their place (`line`/`column`, `nest`/`statement`, or the item's line).

The default suite runs a small sample of each; `-m slow` runs many more (and the commands that build
and run programs: lower, tokens, verify, eval)."""
from __future__ import annotations

import itertools
import json
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.main import app
from leir import format_program, parse_program
from leir.analysis import statement_sites
from leir.ast import Access, BinOp, Loop, Nest, Num, Program, Stmt, Var, map_expr, walk_expr
from tests.gpu_tasks.conftest import MATMUL, MATMUL_SIG
from tests.leir.tests_examples import EXAMPLES

FAST = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

PROGRAMS = [MATMUL] + [e["leir"] for e in EXAMPLES]
SIGNATURES = [json.dumps(MATMUL_SIG.to_json())] + [json.dumps(e["signature"]) for e in EXAMPLES]
LEIR_PIECES = list("[];{}^_=,()+-*/%<>&|.0123456789 \n\t") + [
    "**", "//", "<=", "inf", "exp(", "A", "a", "tx", "L^{4}", "B^{0}_{tx=0}", "_{a-7}", "_{a+1000000}",
    "if_then_else(", "max(", "^{f16,l}", "^{c64,g}", "-(", "A^{f32,g}_{tx,c}+" * 3, "é", "\x00", "\u2028"]
JSON_PIECES = list('{}[]":,0123456789-. \n') + [
    '"shape"', '"dtype"', '"role"', '"name"', '"tensors"', '"output"', '"input"', '"float16"', '"int64"',
    '"complex64"', "null", "true", "1e400", "-1", "1099511627776", '"A"', '"Aa"', '"x"', "[[", "]]"]


@st.composite
def mutated(draw, bases: list[str], pieces: list[str], most: int = 4) -> str:
    """A base text after a few deletions, insertions, duplications and swaps."""
    text = draw(st.sampled_from(bases))
    for _ in range(draw(st.integers(0, most))):
        pos = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["delete", "insert", "duplicate", "swap"]))
        if kind == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 6)):]
        elif kind == "insert":
            text = text[:pos] + draw(st.sampled_from(pieces)) + text[pos:]
        elif kind == "duplicate":
            text = text[:pos] + text[pos:pos + draw(st.integers(1, 12))] + text[pos:]
        elif pos + 1 < len(text):
            text = text[:pos] + text[pos + 1] + text[pos] + text[pos + 2:]
    return text



def _access(name: str, dtype: str, scope: str, indices: tuple) -> Access:
    return Access(name, dtype, scope, indices)


_indices = st.one_of(st.integers(0, 10**6).map(Num), st.sampled_from(["tx", "a", "c", "f", "bx"]).map(Var),
                     st.builds(BinOp, st.sampled_from(["+", "-", "*", "//", "%"]),
                               st.sampled_from(["tx", "a", "c"]).map(Var), st.integers(0, 2**31).map(Num)))
_values = st.one_of(
    st.sampled_from([0, 1, 2**63, 1e308, math.inf, 0.5]).map(Num), st.sampled_from(["tx", "a", "c", "q"]).map(Var),
    st.builds(_access, st.sampled_from(["A", "C", "D", "E", "Q"]), st.sampled_from(["f32", "f16", "i64", "bool", "c64"]),
              st.sampled_from(["g", "l", "s"]), st.lists(_indices, max_size=3).map(tuple)))
_loops = st.builds(Loop, st.sampled_from(["L", "P", "V", "U", "B"]), st.sampled_from([0, 1, 3, 64, 10**6, 2**40]),
                   st.sampled_from(["tx", "a", "c", "f", "ty", "bx"]))


@st.composite
def tree_mutated(draw) -> str:
    """A parseable program with one subexpression or one loop replaced: odd semantics, valid syntax."""
    program = parse_program(draw(st.sampled_from(PROGRAMS)))
    stmts = [site.stmt for site in statement_sites(program)]
    size = sum(1 for stmt in stmts for part in (stmt.lhs, stmt.rhs) for _ in walk_expr(part))
    target, replacement, seen = draw(st.integers(0, size - 1)), draw(_values), itertools.count()

    def swap(node):
        return replacement if next(seen) == target else node

    swap_stmt = lambda stmt: Stmt(stmt.lhs, map_expr(stmt.rhs, swap))  # noqa: E731
    nests = list(program.nests)
    k = draw(st.integers(0, len(nests) - 1))
    nest = nests[k]
    if draw(st.booleans()):
        loops = list(nest.loops)
        loops[draw(st.integers(0, len(loops) - 1))] = draw(_loops)
        nest = Nest(tuple(loops), nest.body)
    nests[k] = Nest(nest.loops, tuple(swap_stmt(i) if isinstance(i, Stmt) else i for i in nest.body))
    return format_program(Program(tuple(nests)))


programs = st.one_of(mutated(PROGRAMS, LEIR_PIECES), tree_mutated())
signatures = st.one_of(mutated(SIGNATURES, JSON_PIECES), st.builds(json.dumps, st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 2**41), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(
        ["tensors", "name", "shape", "dtype", "role"]), inner, max_size=5)), max_leaves=12)))
raw_bytes = st.binary(max_size=200)


def answer(ir: str, strategy: str = "loop_reorder") -> str:
    return "<think>t</think><answer>" + json.dumps({"transformed_IR": ir, "applied_strategy": strategy}) + "</answer>"


ANSWERS = [answer(MATMUL), answer(MATMUL.replace("B^{8}_{tx=0}L^{6}_{a=0}", "L^{6}_{a=0}B^{8}_{tx=0}")),
           "<think>x</think><answer>[" + json.dumps({"idx": 1, "transformed_IR": MATMUL, "applied_strategy": "a"})
           + "]</answer>", "```json\n" + answer(MATMUL) + "\n```"]
answers = mutated(ANSWERS, JSON_PIECES + LEIR_PIECES + ["<think>", "</answer>", "__import__", "```"])


@st.composite
def prediction_files(draw) -> str:
    lines = []
    for i in range(draw(st.integers(1, 3))):
        record = {"id": i, "signature": json.loads(SIGNATURES[0]), "original_IR": MATMUL, "response": draw(answers)}
        line = json.dumps(record)
        lines.append(draw(st.one_of(st.just(line), mutated([line], JSON_PIECES, 2))))
    return "\n".join(lines) + "\n"


LOCATED = re.compile(r"^(error: .+|.+:\d+:\d+: error: .+)$")


def _invoke(tmp_path, args: list[str], files: dict[str, str | bytes]):
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    return CliRunner().invoke(app, [a.format(dir=tmp_path) for a in args])


def check_answer(result) -> None:
    """The property: exit 0, 1 or 2; no traceback; a refusal says where."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output[-2000:])
    assert "Traceback" not in result.output
    if result.exit_code == 2 and not result.stdout.strip():
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert lines and LOCATED.match(lines[-1]) or "Usage:" in result.stderr, result.stderr[-2000:]
    for line in result.stdout.splitlines():
        if line.startswith("{") and '"error' in line:
            row = json.loads(line)
            for error in row.get("errors", []):  # leir check: the place of each problem
                assert ("line" in error and "column" in error) or error["code"] in (
                    "output-not-written", "shape-unknown") or error.get("nest") is not None, error


# --- the default sample -----------------------------------------------------------------------------

@pytest.fixture
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@FAST
@given(program=st.one_of(programs, raw_bytes), signature=st.one_of(signatures, raw_bytes),
       command=st.sampled_from([["leir", "fmt", "{dir}/p.leir"], ["leir", "check", "-s", "{dir}/s.json", "{dir}/p.leir"],
                                ["leir", "hash", "-s", "{dir}/s.json", "{dir}/p.leir"], ["leir", "hash", "{dir}/p.leir"]]))
def test_leir_commands_answer_any_input(folder, program, signature, command):
    check_answer(_invoke(folder, command, {"p.leir": program, "s.json": signature}))


@FAST
@given(program=programs, signature=st.one_of(st.sampled_from(SIGNATURES), signatures),
       command=st.sampled_from([["sites", "{dir}/p.leir", "-s", "{dir}/s.json"],
                                ["apply", "loop_reorder", "{dir}/p.leir", "-s", "{dir}/s.json", "--no-cot"],
                                ["lower", "{dir}/p.leir", "-s", "{dir}/s.json"]]))
def test_strategy_and_lowering_commands_answer_any_program(folder, program, signature, command):
    check_answer(_invoke(folder, command, {"p.leir": program, "s.json": signature}))


@FAST
@given(batch=st.lists(st.one_of(programs.map(lambda p: json.dumps({"id": 1, "signature": json.loads(SIGNATURES[0]),
                                                                     "leir": p})),
                                mutated([json.dumps({"id": 1, "signature": json.loads(SIGNATURES[0]), "leir": MATMUL})],
                                        JSON_PIECES)), min_size=1, max_size=3))
def test_batch_commands_answer_any_lines(folder, batch):
    result = _invoke(folder, ["apply", "loop_reorder", "--batch", "{dir}/b.jsonl", "--no-cot"], {"b.jsonl": "\n".join(batch)})
    check_answer(result)


# --- slow: many more, and the commands that build and run programs ------------------------------------

@pytest.mark.slow
@SLOW
@given(program=st.one_of(programs, raw_bytes), signature=st.one_of(signatures, raw_bytes),
       command=st.sampled_from([["leir", "fmt", "{dir}/p.leir"], ["leir", "check", "-s", "{dir}/s.json", "{dir}/p.leir"],
                                ["leir", "hash", "-s", "{dir}/s.json", "{dir}/p.leir"],
                                ["sites", "{dir}/p.leir", "-s", "{dir}/s.json"],
                                ["apply", "all", "{dir}/p.leir", "-s", "{dir}/s.json", "--no-cot", "--max", "1"],
                                ["lower", "{dir}/p.leir", "-s", "{dir}/s.json"],
                                ["lower", "{dir}/p.leir", "-s", "{dir}/s.json", "--form", "tensorir"],
                                ["tokens", "{dir}/p.leir", "-s", "{dir}/s.json"]]))
def test_many_inputs_to_every_program_command(folder, program, signature, command):
    check_answer(_invoke(folder, command, {"p.leir": program, "s.json": signature}))


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(after=programs, signature=st.sampled_from(SIGNATURES[:1]))
def test_verify_answers_any_transformed_program(folder, after, signature):
    check_answer(_invoke(folder, ["verify", "-s", "{dir}/s.json", "{dir}/before.leir", "{dir}/after.leir", "-j", "1",
                                  "--timeout", "60"],
                         {"s.json": signature, "before.leir": MATMUL, "after.leir": after}))


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(predictions=st.one_of(prediction_files(), raw_bytes))
def test_eval_answers_any_prediction_file(folder, predictions):
    result = _invoke(folder, ["eval", "{dir}/pred.jsonl", "--json", "--no-time", "-j", "1", "--label-cap", "20"],
                     {"pred.jsonl": predictions})
    check_answer(result)
    if result.exit_code == 0:
        rows = [json.loads(line) for line in result.stdout.splitlines()]
        assert "summary" in rows[-1] and all(r["status"] for r in rows[:-1])
        assert all(r["error"] or r["status"] in ("exact", "close") for r in rows[:-1])
