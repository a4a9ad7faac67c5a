"""No recursion limit in the core (issue 28, finding 3): sums of 10,000 terms and expressions nested
10,000 deep parse, print (byte for byte, the same tree back), compare, hash, alpha-hash, validate and
lower; a flat chain stays left-associative, so that float rounding is what the text says.

Hypothesis draws the shape of each program: a chain of operators of any length (a flat sum is a
BinOp tree as deep as it is long), or a stack of wrappers (calls, negations, parenthesised sums,
selects, gathers in subscripts) of any depth, up to 10,000."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from leir import Signature, format_program, parse_program
from leir.analysis import expression_depth, program_depth
from leir.ast import Access, BinOp, Call, Compare, Loop, Neg, Nest, Num, Program, Select, Stmt, Var, map_expr
from leir.canon import alpha_hash, canonical_names
from leir.validate import validate

SIG = Signature.from_json({"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float32", "role": "input"},
                                       {"name": "C", "shape": [4, 8], "dtype": "float32", "role": "output"}]})
LOOPS = (Loop("B", 4, "tx"), Loop("L", 8, "a"))
DEEP = 10_000


def a(column=None) -> Access:
    return Access("A", "f32", "g", (Var("tx"), Var("a") if column is None else column))


def program(rhs) -> Program:
    return Program((Nest(LOOPS, (Stmt(Access("C", "f32", "g", (Var("tx"), Var("a"))), rhs),)),))


def chain(ops: list[str], n: int):
    """A left-deep chain of n binary operations, as the parser reads `A op A op A ...`."""
    e = a()
    for i in range(n):
        op = ops[i % len(ops)]
        e = BinOp(op, e, Num(1) if op == "**" else a())
    return e


# Wrappers: each makes the expression one level (or two) deeper and keeps the program valid.
WRAPPERS = {
    "exp": lambda e: Call("exp", (e,)),
    "neg": Neg,
    "plus_one": lambda e: BinOp("+", Num(1), e),       # printed with parentheses: 1+(1+(...))
    "times": lambda e: BinOp("*", e, a()),
    "max": lambda e: Call("max", (a(), e)),
    "select": lambda e: Select(Compare((Var("a"), Num(4)), ("<",)), e, Num(0)),
    "gather_free": lambda e: BinOp("-", e, a(BinOp("%", BinOp("+", Var("a"), Num(1)), Num(8)))),
}


def nested(kinds: list[str], n: int):
    e = a()
    for i in range(n):
        e = WRAPPERS[kinds[i % len(kinds)]](e)
    return e


shapes = st.one_of(
    st.tuples(st.just("chain"), st.lists(st.sampled_from(["+", "-", "*", "/"]), min_size=1, max_size=4),
              st.integers(1, DEEP)),
    st.tuples(st.just("nest"), st.lists(st.sampled_from(sorted(WRAPPERS)), min_size=1, max_size=4),
              st.integers(1, DEEP)),
)


def build(shape):
    kind, parts, n = shape
    return program(chain(parts, n) if kind == "chain" else nested(parts, n))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes)
@example(("chain", ["+"], DEEP))
@example(("nest", ["exp"], DEEP))
@example(("nest", ["plus_one"], DEEP))
@example(("nest", ["select", "neg"], DEEP))
def test_deep_programs_round_trip_hash_and_validate(shape):
    p = build(shape)
    text = format_program(p)
    again = parse_program(text)
    assert again == p and hash(again) == hash(p)  # the same tree: a flat chain stays left-deep
    assert format_program(again) == text
    assert map_expr(p.nests[0].body[0].rhs, lambda node: node) == p.nests[0].body[0].rhs
    assert alpha_hash(again, SIG) == alpha_hash(p, SIG) == alpha_hash(canonical_names(p, SIG), SIG)
    assert validate(p, SIG) == []
    assert program_depth(p) == expression_depth(p.nests[0].body[0].rhs) >= shape[2] // 2


def test_a_flat_sum_prints_without_parentheses_and_parses_left_associative():
    text = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=" + "-".join(["A^{f32,g}_{tx,a}"] * DEEP) + ";];"
    p = parse_program(text)
    assert format_program(p) == text
    node, depth = p.nests[0].body[0].rhs, 0
    while isinstance(node, BinOp):  # ((A-A)-A)-...: the left spine holds the whole chain
        assert node.rhs == a()
        node, depth = node.lhs, depth + 1
    assert depth == DEEP - 1


def test_deep_subscripts_are_checked_like_any_other():
    deep_index = Var("a")
    for _ in range(DEEP):
        deep_index = BinOp("+", deep_index, Num(0))
    ok = program(a(deep_index))
    assert validate(ok, SIG) == []
    beyond = program(a(BinOp("+", deep_index, Num(1))))
    [problem] = validate(beyond, SIG)
    assert problem.code == "subscript-out-of-range" and "in 1..8" in problem.message


@pytest.mark.parametrize("shape", [("chain", ["+"], DEEP), ("nest", ["exp"], DEEP), ("nest", ["plus_one", "neg"], DEEP),
                                   ("nest", ["select"], DEEP)], ids=["sum", "exp", "parenthesised", "select"])
def test_deep_programs_lower_to_tir(shape):
    from leir.lower import lower_to_script

    script = lower_to_script(build(shape), SIG)
    assert script.count("T.exp(") == (DEEP if shape[1] == ["exp"] else 0)
    assert "def main(" in script


def test_a_condition_of_10000_terms_lowers():
    from leir.ast import And
    from leir.lower import lower_to_script

    cond = And(tuple(Compare((Var("a"), Num(8)), ("<",)) for _ in range(DEEP)))
    assert "T.if_then_else(" in lower_to_script(program(Select(cond, a(), Num(0))), SIG)


def test_beyond_what_lowering_handles_is_refused_by_check_and_lowering_alike():
    from leir.analysis import MAX_EXPRESSION_DEPTH
    from leir.lower import LoweringError, lower_to_primfunc

    too_deep = program(nested(["neg"], MAX_EXPRESSION_DEPTH))
    [problem] = validate(too_deep, SIG)
    assert problem.code == "too-deep" and (problem.nest, problem.statement) == (1, 1)
    with pytest.raises(LoweringError, match="levels deep"):
        lower_to_primfunc(too_deep, SIG)


@pytest.mark.slow
def test_a_sum_of_10000_terms_runs_in_its_written_order():
    """Built and run: bitwise the float32 sum accumulated left to right (the order the text states)."""
    from leir.lower import run_numpy

    rng = np.random.default_rng(0)
    values = rng.standard_normal((4, 8)).astype(np.float32)
    shifts = [int(k) for k in rng.integers(0, 8, DEEP)]
    e = a(BinOp("%", BinOp("+", Var("a"), Num(shifts[0])), Num(8)))
    for k in shifts[1:]:
        e = BinOp("+", e, a(BinOp("%", BinOp("+", Var("a"), Num(k)), Num(8))))
    out = run_numpy(program(e), SIG, {"A": values})["C"]
    expected = np.empty((4, 8), np.float32)
    for t in range(4):
        for col in range(8):
            acc = values[t, (col + shifts[0]) % 8]
            for k in shifts[1:]:
                acc = np.float32(acc + values[t, (col + k) % 8])
            expected[t, col] = acc
    assert np.array_equal(out, expected)


def _answer(n: int):
    body = "+".join(["A^{f32,g}_{tx,a}"] * n)
    original = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=" + body + ";];"
    answer = "L^{8}_{a=0}B^{4}_{tx=0}[C^{f32,g}_{tx,a}=" + body + ";];"
    response = "<think>swap the loops</think><answer>" + json.dumps(
        {"transformed_IR": answer, "applied_strategy": "loop_reorder"}) + "</answer>"
    return original, response


@pytest.mark.parametrize("n", [1_200, pytest.param(DEEP, marks=pytest.mark.slow)])
def test_eval_scores_a_long_valid_answer(n):
    """A sum past Python's recursion limit (and one of 10,000 terms, slow): scored, not internal_error."""
    from evaluation.harness import EvalOptions, Prediction, evaluate
    from gpu_tasks.pool import WorkerPool

    original, response = _answer(n)
    line = Prediction("long", SIG.to_json(), original, response)
    with WorkerPool(workers=1, timeout_s=1800) as pool:
        [result] = evaluate([line], EvalOptions(time=False), pool)
    row = result.to_json()
    assert row["status"] == "exact" and row["format_pass"] and row["equal_pass"], row
    assert row["strategy_label_pass"], row


def test_the_commands_of_the_issue_answer_deep_programs(tmp_path):
    """`leir fmt` went on past a deep line only in the README, `leir hash` and `sites` raised
    RecursionError: every line gets its answer now, and `sites` reports a strategy that fails on the
    program (the sympy-based ones, which still recurse: strategies/sympy_bridge.py) as one JSON line."""
    from typer.testing import CliRunner

    from cli.main import app

    flat = format_program(build(("chain", ["+"], DEEP)))
    deep = format_program(build(("nest", ["exp", "neg"], DEEP)))
    short = format_program(build(("chain", ["*"], 3)))
    programs = tmp_path / "programs.leir"
    programs.write_text("\n".join([flat, deep, short]) + "\n")
    signature = tmp_path / "sig.json"
    signature.write_text(json.dumps(SIG.to_json()))
    runner = CliRunner()
    fmt = runner.invoke(app, ["leir", "fmt", str(programs)])
    assert fmt.exit_code == 0 and fmt.stdout.splitlines() == [flat, deep, short]
    hashes = runner.invoke(app, ["leir", "hash", "-s", str(signature), str(programs)])
    assert hashes.exit_code == 0 and len(set(hashes.stdout.split())) == 3
    check = runner.invoke(app, ["leir", "check", "-s", str(signature), str(programs)])
    assert check.exit_code == 0 and [json.loads(x)["ok"] for x in check.stdout.splitlines()] == [True] * 3
    one = tmp_path / "flat.leir"
    one.write_text(flat)
    sites = runner.invoke(app, ["sites", str(one), "-s", str(signature)])
    rows = [json.loads(x) for x in sites.stdout.splitlines()]
    assert sites.exit_code in (0, 1) and (sites.exception is None or isinstance(sites.exception, SystemExit))
    assert any("sites" in r for r in rows) and all("sites" in r or r["exception"]["type"] for r in rows)
